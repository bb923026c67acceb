"""Priority, queue timeout and a client deadline.

``priority`` picks the model's priority level (1 is the highest; levels come from
``dynamic_batching { priority_levels: N }``, and a model without levels takes every
request at its one level). ``timeout_us`` bounds how long the request may wait in the
server's queue where the model's queue policy allows an override
(``allow_timeout_override``). ``deadline_s`` is gRPC's own deadline: past it the call
fails with DEADLINE_EXCEEDED, whatever the server is doing.

    python clients/examples/priority_timeout.py --url 127.0.0.1:8001
"""

import grpc
import numpy as np

from _common import check, url_from_args
from inferd_client import Client, InferError

url = url_from_args(__doc__)
a = np.arange(16, dtype=np.int32).reshape(1, 16)

with Client(url) as client:
    result = client.infer("simple", {"INPUT0": a, "INPUT1": a}, priority=1, timeout_us=5_000_000, deadline_s=30)
    check(np.array_equal(result["OUTPUT0"], 2 * a), "a prioritised request")
    print("priority 1, queue timeout 5 s: answered")
    # A call that cannot finish in time: a stream whose client never says it is done
    # stays open until its deadline (a unary infer takes the same deadline_s).
    try:
        with client.stream(deadline_s=0.2) as stream:
            for _ in stream:
                pass
    except InferError as exc:
        print("stream with a 0.2 s deadline:", exc)
        check(exc.code == grpc.StatusCode.DEADLINE_EXCEEDED, f"DEADLINE_EXCEEDED, got {exc.code}")
    else:
        raise SystemExit("an open stream outlived its deadline")
    try:
        client.infer("simple", {"INPUT0": a, "INPUT1": a}, priority=-1)
    except (InferError, ValueError) as exc:
        print("priority -1:", exc)
    else:
        raise SystemExit("a negative priority was accepted")

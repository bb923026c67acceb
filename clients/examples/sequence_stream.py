"""A stateful sequence over one stream: ``simple_sequence`` keeps a running sum per
sequence id; ``sequence_start`` resets it, ``sequence_end`` releases its slot. Two
sequences are interleaved on the same stream and keep their own sums.

    python clients/examples/sequence_stream.py --url 127.0.0.1:8001
"""

import numpy as np

from _common import check, url_from_args
from inferd_client import Client, InferError

url = url_from_args(__doc__)
values = [1, 2, 3, 4]
sums: dict[str, list[int]] = {"a": [], "b": []}

with Client(url) as client, client.stream(deadline_s=60) as stream:
    for i, v in enumerate(values):
        for seq, (sequence_id, scale) in {"a": (1001, 1), "b": (1002, 10)}.items():
            stream.send("simple_sequence", {"INPUT": np.array([[v * scale]], dtype=np.int32)},
                        request_id=f"{seq}{i}", sequence_id=sequence_id,
                        sequence_start=i == 0, sequence_end=i == len(values) - 1)
    stream.close_send()
    for item in stream:
        if isinstance(item, InferError):
            raise SystemExit(f"a sequence request failed: {item}")
        sums[item.id[0]].append(int(item["OUTPUT"].reshape(-1)[0]))

print("running sums:", sums)
check(sums == {"a": [1, 3, 6, 10], "b": [10, 30, 60, 100]}, f"running sums {sums}")

"""A decoupled model answers one request with several responses: ``repeat_decoupled``
sends REPEAT copies of IN, then an empty response flagged final (asked for with
``triton_enable_empty_final_response``). A request it refuses (REPEAT < 0) comes back
as an InferError on the stream, which carries on.

    python clients/examples/decoupled_stream.py --url 127.0.0.1:8001
"""

import numpy as np

from _common import check, url_from_args
from inferd_client import Client, InferError

url = url_from_args(__doc__)
data = np.array([7, 8, 9], dtype=np.int32)
final = {"triton_enable_empty_final_response": True}

with Client(url) as client, client.stream(deadline_s=60) as stream:
    stream.send("repeat_decoupled", {"IN": data, "REPEAT": np.array([3], dtype=np.int32)},
                request_id="three", parameters=final)
    stream.send("repeat_decoupled", {"IN": data, "REPEAT": np.array([-1], dtype=np.int32)}, request_id="bad")
    stream.close_send()
    indices, finals, errors = [], 0, []
    for item in stream:
        if isinstance(item, InferError):
            errors.append(item.message)
        elif item.final and "OUT" not in item:
            finals += 1
        else:
            check(np.array_equal(item["OUT"], data), "OUT == IN")
            indices.append(int(item["IDX"][0]))

print(f"responses {sorted(indices)}, final flags {finals}, errors {errors}")
check(sorted(indices) == [0, 1, 2] and finals == 1, "three responses and one final flag")
check(len(errors) == 1 and "REPEAT must be >= 0" in errors[0], "the refused request's error")

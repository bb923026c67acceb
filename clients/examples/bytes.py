"""BYTES tensors: strings in, strings out (``simple_string`` returns its input).
A numpy object array of ``bytes`` or ``str`` travels as BYTES; answers come back as ``bytes``.

    python clients/examples/bytes.py --url 127.0.0.1:8001
"""

import numpy as np

from _common import check, url_from_args
from inferd_client import Client

url = url_from_args(__doc__)
words = np.array([[f"word {i}" for i in range(16)]], dtype=object)

with Client(url) as client:
    result = client.infer("simple_string", {"INPUT0": words})
    out = result["OUTPUT0"]
    print(result.datatypes["OUTPUT0"], out[0, :3])
    check(out.dtype == object and [x.decode() for x in out.reshape(-1)] == list(words.reshape(-1)), "BYTES echo")

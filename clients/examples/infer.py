"""Infer once on the example repository's ``simple`` model (INT32 add and subtract),
with the blocking client and then with the asyncio one.

    python clients/examples/infer.py --url 127.0.0.1:8001
"""

import asyncio

import numpy as np

from _common import check, url_from_args
from inferd_client import AsyncClient, Client

url = url_from_args(__doc__)
a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.ones((1, 16), dtype=np.int32)

with Client(url) as client:
    meta = client.model_metadata("simple")
    print("inputs:", [(t.name, t.datatype, t.shape) for t in meta.inputs])
    result = client.infer("simple", {"INPUT0": a, "INPUT1": b})
    print("OUTPUT0 =", result["OUTPUT0"])
    check(np.array_equal(result["OUTPUT0"], a + b) and np.array_equal(result["OUTPUT1"], a - b), "simple")


async def main() -> None:
    async with AsyncClient(url) as client:
        results = await asyncio.gather(*(client.infer("simple", {"INPUT0": a * i, "INPUT1": b}, outputs=["OUTPUT0"])
                                         for i in range(4)))
        for i, result in enumerate(results):
            check(np.array_equal(result["OUTPUT0"], a * i + b) and "OUTPUT1" not in result, f"async request {i}")
        print("4 concurrent asyncio requests answered")


asyncio.run(main())

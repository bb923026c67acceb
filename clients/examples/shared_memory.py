"""System shared memory: inputs and outputs of ``simple`` travel through one POSIX shared
memory object instead of the gRPC messages (the server must run on this host, started with
``--allow-client-shm``: client shared memory is off by default, as in Triton).

    python clients/examples/shared_memory.py --url 127.0.0.1:8001
"""

import os

import numpy as np

from _common import check, url_from_args
from inferd_client import Client, Output, ShmInput, SystemSharedMemoryRegion

url = url_from_args(__doc__)
a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.full((1, 16), 2, dtype=np.int32)
size = a.nbytes  # 64 bytes per tensor: two inputs, then two outputs, in one object
key = f"inferd_example_{os.getpid()}"

with Client(url) as client, SystemSharedMemoryRegion.create(key, 4 * size) as region:
    client.register_system_shared_memory("example_in", key, 2 * size)  # bytes [0, 128)
    client.register_system_shared_memory("example_out", key, 2 * size, offset=2 * size)  # bytes [128, 256)
    try:
        region.write(a, offset=0)
        region.write(b, offset=size)
        print("registered:", sorted(client.system_shared_memory_status()))
        result = client.infer(
            "simple",
            {"INPUT0": ShmInput("example_in", "INT32", a.shape, size),
             "INPUT1": ShmInput("example_in", "INT32", b.shape, size, offset=size)},
            outputs=[Output("OUTPUT0", region="example_out", byte_size=size),
                     Output("OUTPUT1", region="example_out", byte_size=size, offset=size)],
        )
        total = region.read("INT32", result.shapes["OUTPUT0"], offset=2 * size)
        diff = region.read("INT32", result.shapes["OUTPUT1"], offset=3 * size)
        print("OUTPUT0 from shared memory:", total)
        check(len(result) == 0, "no output data in the response itself")
        check(np.array_equal(total, a + b) and np.array_equal(diff, a - b), "outputs in shared memory")
    finally:
        client.unregister_system_shared_memory("example_in")
        client.unregister_system_shared_memory("example_out")

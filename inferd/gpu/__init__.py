"""What inferd knows about the host's GPUs, kept apart from the runtimes that use them.

- :mod:`inferd.gpu.inventory`: which CUDA devices this process can see
  (:class:`GpuInventory`; torch's view in production, a fake in tests);
- :mod:`inferd.gpu.tensor`: :class:`DeviceTensor`, a tensor that lives in device
  memory (a CUDA shared memory input, an ensemble step's output kept on its GPU),
  with a host copy for whoever needs numpy;
- :mod:`inferd.gpu.cuda_ipc`: opening a client's CUDA IPC handle (CUDA shared memory).

Nothing here imports torch or CUDA libraries at import time: a CPU host pays nothing.
"""

"""``--shared-memory system|cuda``: the input data written once into regions the server maps,
one output region per output, registered before the load and removed after it.

As perf_analyzer does: each data step's inputs lie in one input region (back to back), every
request of that step names it; each output has one region of ``--output-shared-memory-size``
bytes that all requests write into (the load measures the transfer, not the answers).

System regions are POSIX shared memory objects (``/dev/shm/<key>``, through ``os`` and
``mmap``: ``multiprocessing.shared_memory`` would register them with a resource tracker
that warns and unlinks on exit). CUDA regions are ``cudaMalloc`` memory whose IPC handle is
registered, through NVIDIA's cuda-python (``cuda-bindings``, the ``gpu`` extra), the calls
tritonclient's own CUDA shared memory utilities make.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

import numpy as np

from .inputs import ModelInfo, Placement, raw_bytes
from .options import PerfError

SHM_DIR = Path("/dev/shm")


class _SystemMemory:
    kind = "system"

    def __init__(self) -> None:
        self.keys: list[str] = []

    def allocate(self, key: str, data: bytes, size: int) -> Any:
        path = SHM_DIR / key
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self.keys.append(key)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size) as m:
                m[:len(data)] = data
        finally:
            os.close(fd)
        return key

    def register(self, client: Any, name: str, handle: Any, size: int) -> None:
        client.register_system_region(name, handle, size)

    def unregister(self, client: Any, name: str) -> None:
        client.unregister_system_region(name)

    def free(self) -> None:
        for key in self.keys:
            (SHM_DIR / key).unlink(missing_ok=True)
        self.keys.clear()


class _CudaMemory:
    kind = "cuda"
    DEVICE = 0

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime
        except ImportError:
            raise PerfError("--shared-memory cuda needs NVIDIA's cuda-python on the client: "
                            "pip install 'cuda-bindings>=12.6' (inferd's gpu extra)") from None
        self.rt = runtime
        count = self._check(runtime.cudaGetDeviceCount(), "cudaGetDeviceCount")
        if count < 1:
            raise PerfError("--shared-memory cuda needs a CUDA device on the client's host; none was found")
        self._check(runtime.cudaSetDevice(self.DEVICE), "cudaSetDevice")
        self.pointers: list[int] = []

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result if isinstance(result, tuple) else (result,)
        if err != self.rt.cudaError_t.cudaSuccess:
            raise PerfError(f"--shared-memory cuda: {what} failed: {err}")
        return rest[0] if rest else None

    def allocate(self, key: str, data: bytes, size: int) -> Any:
        rt = self.rt
        ptr = int(self._check(rt.cudaMalloc(size), "cudaMalloc"))
        self.pointers.append(ptr)
        if data:
            self._check(rt.cudaMemcpy(ptr, data, len(data), rt.cudaMemcpyKind.cudaMemcpyHostToDevice), "cudaMemcpy")
        handle = self._check(rt.cudaIpcGetMemHandle(ptr), "cudaIpcGetMemHandle")
        return bytes(handle.reserved)

    def register(self, client: Any, name: str, handle: Any, size: int) -> None:
        client.register_cuda_region(name, handle, self.DEVICE, size)

    def unregister(self, client: Any, name: str) -> None:
        client.unregister_cuda_region(name)

    def free(self) -> None:
        for ptr in self.pointers:
            self.rt.cudaFree(ptr)
        self.pointers.clear()


class SharedMemory:
    """The regions of one run; ``close`` unregisters and frees them (also after a failure)."""

    def __init__(self, kind: str, client: Any, output_size: int) -> None:
        self.memory = _SystemMemory() if kind == "system" else _CudaMemory()
        self.client = client
        self.output_size = output_size
        self.registered: list[str] = []
        self.prefix = f"inferd_perf_{os.getpid()}"

    def _region(self, suffix: str, data: bytes, size: int) -> str:
        name = f"{self.prefix}_{suffix}"
        handle = self.memory.allocate(name, data, size)
        self.memory.register(self.client, name, handle, size)
        self.registered.append(name)
        return name

    def place(self, model: ModelInfo, steps: list[dict[str, np.ndarray]]) -> list[Placement]:
        datatype = {i.name: i.datatype for i in model.inputs}
        outputs = {name: (self._region(f"out{k}", b"", self.output_size), self.output_size)
                   for k, name in enumerate(model.outputs)}
        placements = []
        for n, step in enumerate(steps):
            raws = {name: raw_bytes(array, datatype[name]) for name, array in step.items()}
            data = b"".join(raws.values())
            region = self._region(f"in{n}", data, max(len(data), 1))
            inputs, offset = {}, 0
            for name, raw in raws.items():
                inputs[name] = (region, offset, len(raw))
                offset += len(raw)
            placements.append(Placement(inputs, outputs))
        return placements

    def close(self) -> None:
        for name in self.registered:
            try:
                self.memory.unregister(self.client, name)
            except PerfError:
                pass  # the server is gone: nothing registered there any more
        self.registered.clear()
        self.memory.free()

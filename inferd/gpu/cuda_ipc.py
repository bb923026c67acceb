"""Opening a client's CUDA IPC memory handle (Triton's CUDA shared memory extension).

A client allocates device memory (``cudaMalloc``), takes its 64-byte IPC handle
(``cudaIpcGetMemHandle``) and registers it: tritonclient sends the handle's raw
bytes (gRPC ``raw_handle``; HTTP ``{"b64": ...}``). The server maps the same
memory into its own address space with ``cudaIpcOpenMemHandle`` and reads and
writes it in place.

Why cuda-python (NVIDIA's ``cuda-bindings``) and not torch: torch exposes no
public call that opens a raw IPC handle (its ``UntypedStorage._new_shared_cuda``
belongs to torch.multiprocessing's own protocol, with its reference-count
files), while ``cuda.bindings.runtime.cudaIpcOpenMemHandle`` is the CUDA call
itself, the one tritonclient's own utilities use. Once opened, the memory is
wrapped for torch through ``__cuda_array_interface__`` (zero copy), and every
copy in or out is a torch copy on the device.

:class:`FakeCudaIpc` stands in on hosts without CUDA: handles name host buffers,
so the registration rules and the region's reads and writes are exercised by the
same code with torch on the CPU.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Protocol

HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


class CudaIpcError(Exception):
    """The handle could not be opened (the message says why: CUDA's own error text)."""


class IpcMapping(Protocol):
    """Device memory opened from a handle."""

    device: str  # the torch device the memory is on ("cuda:k"; "cpu" for the fake)
    size: int  # bytes of the client's allocation the handle lies in, from the handle's address

    def tensor(self) -> Any:
        """The mapped bytes as a 1-D uint8 torch tensor on ``device`` (no copy)."""
        ...

    def close(self) -> None: ...


class CudaIpc(Protocol):
    def open(self, handle: bytes, device_id: int) -> IpcMapping:
        """Map the memory of ``handle`` on GPU ``device_id``; raises CudaIpcError."""
        ...


# -- CUDA (cuda-python) -------------------------------------------------------------------


def _runtime() -> tuple[Any, Any]:
    try:
        from cuda.bindings import driver, runtime
    except ImportError:  # cuda-python before 12.6 named its modules cuda.cuda / cuda.cudart
        from cuda import cuda as driver  # type: ignore[no-redef]
        from cuda import cudart as runtime  # type: ignore[no-redef]
    return driver, runtime


class _CudaArray:
    """The ``__cuda_array_interface__`` torch reads to view IPC memory without a copy."""

    def __init__(self, ptr: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3,
                                         "strides": None, "stream": None}


class CudaMapping:
    def __init__(self, runtime: Any, ptr: int, size: int, device_id: int) -> None:
        self._rt = runtime
        self.ptr = ptr
        self.size = size
        self.device = f"cuda:{device_id}"
        self._tensor: Any = None
        self._closed = False

    def tensor(self) -> Any:
        if self._tensor is None:
            import torch

            self._tensor = torch.as_tensor(_CudaArray(self.ptr, self.size), device=self.device)
        return self._tensor

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._tensor = None
            self._rt.cudaIpcCloseMemHandle(self.ptr)


class CudaPythonIpc:
    """The real thing; needs the ``cuda-python`` package and a GPU."""

    def __init__(self) -> None:
        self._driver, self._rt = _runtime()
        self._lock = threading.Lock()

    def _check(self, result: Any, what: str) -> Any:
        err, *rest = result
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            raise CudaIpcError(f"{what} failed: {name}")
        return rest[0] if len(rest) == 1 else tuple(rest)

    def open(self, handle: bytes, device_id: int) -> IpcMapping:
        rt, drv = self._rt, self._driver
        with self._lock:  # cudaSetDevice is per thread; keep the pair together
            self._check(rt.cudaSetDevice(device_id), f"cudaSetDevice({device_id})")
            mem = rt.cudaIpcMemHandle_t()
            # cuda-bindings >= 13 has no 'reserved' field to assign: write the 64 bytes in place.
            ctypes.memmove(mem.getPtr(), bytes(handle), HANDLE_BYTES)
            ptr = int(self._check(rt.cudaIpcOpenMemHandle(mem, rt.cudaIpcMemLazyEnablePeerAccess),
                                  "cudaIpcOpenMemHandle"))
            try:
                # The client's allocation the handle names: a registration must lie inside it.
                base, size = self._check(drv.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
                size = int(size) - (ptr - int(base))
            except Exception:
                rt.cudaIpcCloseMemHandle(ptr)
                raise
        return CudaMapping(rt, ptr, size, device_id)


# -- stand-in for tests -----------------------------------------------------------------


class _HostMapping:
    def __init__(self, owner: "FakeCudaIpc", handle: bytes, buffer: bytearray) -> None:
        self._owner = owner
        self._handle = handle
        self._buffer = buffer
        self.device = "cpu"
        self.size = len(buffer)

    def tensor(self) -> Any:
        import torch

        return torch.frombuffer(self._buffer, dtype=torch.uint8)

    def close(self) -> None:
        self._owner.closed.append(self._handle)


class FakeCudaIpc:
    """Handles that name host buffers: ``allocate(size)`` gives (handle, buffer) as a client's
    ``cudaMalloc`` + ``cudaIpcGetMemHandle`` would; the server side ``open`` maps the same bytes."""

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices
        self._buffers: dict[bytes, bytearray] = {}
        self.closed: list[bytes] = []

    def allocate(self, size: int) -> tuple[bytes, bytearray]:
        handle = len(self._buffers).to_bytes(4, "little") + b"fake-cuda-ipc".ljust(HANDLE_BYTES - 4, b"\0")
        self._buffers[handle] = bytearray(size)
        return handle, self._buffers[handle]

    def open(self, handle: bytes, device_id: int) -> IpcMapping:
        if device_id >= self.devices:
            raise CudaIpcError(f"cudaSetDevice({device_id}) failed: cudaErrorInvalidDevice")
        buffer = self._buffers.get(bytes(handle))
        if buffer is None:
            raise CudaIpcError("cudaIpcOpenMemHandle failed: cudaErrorInvalidValue")
        return _HostMapping(self, bytes(handle), buffer)

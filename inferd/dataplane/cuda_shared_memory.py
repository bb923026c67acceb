"""Triton's CUDA shared memory extension: regions of a client's device memory.

A client registers ``(name, raw_handle, device_id, byte_size)``: the 64 bytes of a
CUDA IPC handle (``cudaIpcGetMemHandle``) of memory it allocated on GPU
``device_id``. The server opens the handle once (:mod:`inferd.gpu.cuda_ipc`) and
then reads inputs from and writes outputs to that memory as it does for system
shared memory: a tensor names a region, an offset and a byte size, checked
against the registered window.

Inputs become :class:`~inferd.gpu.tensor.DeviceTensor`\\ s: each read copies the
tensor's bytes into memory the server owns on the same GPU (a device-to-device
copy, at device bandwidth), so a TorchScript instance on that GPU takes it with
no host round trip, a CPU model gets one device-to-host copy, and unregistering a
region never frees memory a queued request still reads. Outputs are copied into
the region (host-to-device, or device-to-device from a device tensor). Every copy
runs on the region's own CUDA stream and is complete when the call returns, so
the client may read its region as soon as the response arrives.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from inferd.dataplane._window import check_span, check_tensor_bytes
from inferd.dtypes import DataType, decode_bytes, element_count
from inferd.errors import InvalidArgument, Unimplemented
from inferd.facade import CudaRegionStatus
from inferd.gpu.cuda_ipc import HANDLE_BYTES, CudaIpc, CudaIpcError, IpcMapping
from inferd.gpu.tensor import DeviceTensor, torch_dtype


class CudaRegion:
    """One registered CUDA IPC allocation ``[0, byte_size)`` on GPU ``device_id``."""

    kind = "cuda"
    __slots__ = ("_torch", "name", "device_id", "byte_size", "_mapping", "_memory", "device", "_stream", "closed")

    def __init__(self, name: str, device_id: int, byte_size: int, mapping: IpcMapping) -> None:
        import torch

        self._torch = torch
        self.name = name
        self.device_id = device_id
        self.byte_size = byte_size
        self._mapping = mapping
        self._memory = mapping.tensor()[:byte_size]
        self.device = mapping.device  # the torch device of the memory ("cuda:k"; "cpu" for the fake)
        self._stream = torch.cuda.Stream(mapping.device) if mapping.device.startswith("cuda") else None
        self.closed = False

    def status(self) -> CudaRegionStatus:
        return CudaRegionStatus(self.name, self.device_id, self.byte_size)

    @contextlib.contextmanager
    def _on_stream(self) -> Iterator[None]:
        if self._stream is None:
            yield
            return
        with self._torch.cuda.stream(self._stream):
            yield
        self._stream.synchronize()

    def _span(self, offset: int, size: int, where: str) -> int:
        check_span("CUDA shared memory", self.name, self.byte_size, self.closed, offset, size, where)
        return offset

    def read(self, dtype: DataType, shape: tuple[int, ...], offset: int, size: int, where: str) -> Any:
        """The tensor at ``[offset, offset + size)``: a DeviceTensor (a BYTES tensor: host objects)."""
        start = self._span(offset, size, where)
        if dtype.name == "BYTES":
            with self._on_stream():
                host = self._memory[start:start + size].cpu()
            return decode_bytes(memoryview(host.numpy()), element_count(shape, where), where).reshape(shape)
        check_tensor_bytes(self.name, dtype, shape, size, where)
        numpy_type = dtype.numpy
        assert numpy_type is not None  # check_tensor_bytes refused the types numpy cannot hold
        with self._on_stream():
            raw = self._memory[start:start + size].clone()  # our own copy, on the region's GPU
        return DeviceTensor(raw.view(torch_dtype(self._torch, numpy_type)).reshape(shape), numpy_type)

    def write(self, data: Any, offset: int, size: int, where: str) -> None:
        """Copy an output (numpy array, DeviceTensor or encoded BYTES) to ``offset``."""
        start = self._span(offset, size, where)
        torch = self._torch
        if isinstance(data, DeviceTensor):
            source = data.data.contiguous().reshape(-1).view(torch.uint8)
        else:
            flat = np.frombuffer(data, dtype=np.uint8) if isinstance(data, (bytes, bytearray)) else (
                np.ascontiguousarray(data).reshape(-1).view(np.uint8))
            source = torch.from_numpy(flat.copy() if not flat.flags.writeable else flat)
        nbytes = int(source.numel())
        if nbytes > size:
            raise InvalidArgument(
                f"{where}: shared memory region '{self.name}': byte size {size} given for the output is too "
                f"small; the result needs {nbytes} bytes"
            )
        if nbytes:
            with self._on_stream():
                self._memory[start:start + nbytes].copy_(source)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._memory = None
            self._mapping.close()


class CudaRegistrar:
    """Opens CUDA IPC handles into :class:`CudaRegion`\\ s, with the checks and messages of registration.

    ``ipc``: builds the IPC opener on first use (cuda-python; a fake in tests); ``gpus``:
    the GPU indexes this server sees (an empty list: no CUDA here, and registration is refused)."""

    def __init__(self, gpus: Callable[[], Sequence[int]], ipc: Callable[[], CudaIpc] | None = None) -> None:
        self._gpus = gpus
        self._ipc_factory = ipc or _cuda_python
        self._ipc: CudaIpc | None = None

    def open(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> CudaRegion:
        if not name:
            raise InvalidArgument("CUDA shared memory region: a name is required")
        gpus = list(self._gpus())
        if not gpus:
            raise Unimplemented(
                f"CUDA shared memory region '{name}': this server has no CUDA device; "
                "use system shared memory (SystemSharedMemoryRegister) instead"
            )
        if device_id not in gpus:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': device_id {device_id} is not a GPU this "
                f"server sees; its GPUs are {', '.join(map(str, gpus))}"
            )
        if len(raw_handle) != HANDLE_BYTES:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': raw_handle has {len(raw_handle)} bytes; a "
                f"CUDA IPC handle (cudaIpcGetMemHandle) has {HANDLE_BYTES}"
            )
        if byte_size <= 0:
            raise InvalidArgument(f"CUDA shared memory region '{name}': byte_size must be > 0, got {byte_size}")
        ipc = self._opener(name)
        try:
            mapping = ipc.open(raw_handle, device_id)
        except CudaIpcError as exc:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': the handle cannot be opened on GPU "
                f"{device_id} ({exc}); it must come from cudaIpcGetMemHandle in another process"
            ) from None
        if byte_size > mapping.size:
            mapping.close()
            raise InvalidArgument(
                f"failed to register CUDA shared memory region '{name}': byte_size {byte_size} is larger than the "
                f"{mapping.size} bytes allocated behind the handle"
            )
        return CudaRegion(name, device_id, byte_size, mapping)

    def _opener(self, name: str) -> CudaIpc:
        if self._ipc is None:
            try:
                self._ipc = self._ipc_factory()
            except ImportError:
                raise Unimplemented(
                    f"CUDA shared memory region '{name}': this server needs the cuda-python package to open CUDA "
                    "IPC handles (pip install 'inferd[gpu]'); use system shared memory meanwhile"
                ) from None
        return self._ipc


def _cuda_python() -> CudaIpc:
    from inferd.gpu.cuda_ipc import CudaPythonIpc

    return CudaPythonIpc()

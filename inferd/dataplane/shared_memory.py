"""Triton's system shared memory extension.

A client creates a POSIX shared memory object (``shm_open(key)``, which is
``/dev/shm/<key>`` on Linux), registers a window of it under a name
(SystemSharedMemoryRegister: name, key, offset, byte_size), then sends
tensors that say "my data is in region R at offset O, B bytes" instead of
carrying the bytes, and asks for outputs to be written into a region the
same way. The server maps the window once, at registration.

Safety: a request names a *registered region*, never a key or a path, and
every tensor's offset and size must lie inside that region's window, so a
request reaches only memory its client registered. Keys are single names
under /dev/shm (no ``/`` after the leading one, no ``..``), opened without
following symlinks, and must be regular files at least as large as the
window asked for.

A frontend only checks a tensor's parameters (a plain
:class:`~inferd.types.ShmRef`, or a :class:`~inferd.types.SharedTensor` in
the request's inputs); the data plane, which holds the regions, resolves them
here before the model runs (:meth:`SharedMemoryManager.resolve`), so a
frontend needs no region of its own.

Inputs are zero-copy where that is safe: a numeric tensor becomes a
read-only ``np.frombuffer`` view on the mapping (its values are never
validated, so a client that writes the region during the request can only
change its own results). BYTES tensors are decoded into Python objects, which
copies by nature.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferd.dataplane._window import check_span, check_tensor_bytes
from inferd.dataplane.cuda_shared_memory import CudaRegion, CudaRegistrar
from inferd.dtypes import DataType, decode_bytes, element_count
from inferd.errors import AlreadyExists, InvalidArgument, NotFound
from inferd.facade import RegionStatus
from inferd.gpu.inventory import default_inventory
from inferd.types import InferenceRequest, SharedTensor, ShmRef

SHM_DIR = Path("/dev/shm")
# Triton's answer (UNIMPLEMENTED / 501) to a client's register or unregister without --allow-client-shm.
CLIENT_SHM_DISABLED = ("Client shared memory is disabled. Start the server with '--allow-client-shm=true' "
                       "to enable.")
_KEY = re.compile(r"^/?([A-Za-z0-9_.\-]{1,255})$")


class Region:
    """One registered window ``[offset, offset + byte_size)`` of a shm object, mapped."""

    kind = "system"
    __slots__ = ("name", "key", "offset", "byte_size", "_map", "_base", "closed")

    def __init__(self, name: str, key: str, offset: int, byte_size: int, mapping: mmap.mmap, base: int) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self._map = mapping
        self._base = base  # where the window starts inside the mapping (mmap offsets are page-aligned)
        self.closed = False

    def status(self) -> RegionStatus:
        return RegionStatus(self.name, self.key, self.offset, self.byte_size)

    def _span(self, offset: int, size: int, where: str) -> int:
        check_span("shared memory", self.name, self.byte_size, self.closed, offset, size, where)
        return self._base + offset

    def read(self, dtype: DataType, shape: tuple[int, ...], offset: int, size: int, where: str) -> np.ndarray:
        start = self._span(offset, size, where)
        if dtype.name == "BYTES":
            count = element_count(shape, where)
            return decode_bytes(memoryview(self._map)[start:start + size], count, where).reshape(shape)
        count = check_tensor_bytes(self.name, dtype, shape, size, where)
        array = np.frombuffer(self._map, dtype=dtype.numpy, count=count, offset=start)
        if start % array.dtype.alignment:
            # An unaligned view is legal numpy, but runtimes read tensors through
            # typed pointers and may copy (or fault) anyway; copy once, here.
            array = array.copy()
        else:
            array.flags.writeable = False  # a model must never write into the client's memory
        return array.reshape(shape)

    def write(self, data: np.ndarray | bytes, offset: int, size: int, where: str) -> None:
        start = self._span(offset, size, where)
        if isinstance(data, np.ndarray):
            data = np.ascontiguousarray(data)
            nbytes = data.nbytes
            view: Any = memoryview(data).cast("B") if nbytes else b""
        else:
            nbytes = len(data)
            view = data
        if nbytes > size:
            raise InvalidArgument(
                f"{where}: shared memory region '{self.name}': byte size {size} given for the output is too "
                f"small; the result needs {nbytes} bytes"
            )
        self._map[start:start + nbytes] = view

    def close(self) -> None:
        self.closed = True
        try:
            self._map.close()
        except BufferError:
            # Arrays of requests still in flight view the mapping: it is
            # released when the last of them is freed.
            pass


class SharedMemoryManager:
    """The registered shared memory regions, system and CUDA (dataplane/cuda_shared_memory.py), by
    name: one namespace for both kinds, as in Triton, so a tensor names a region of either."""

    def __init__(self, shm_dir: Path = SHM_DIR, cuda: CudaRegistrar | None = None) -> None:
        self.shm_dir = shm_dir
        self._regions: dict[str, Region | CudaRegion] = {}
        self._cuda = cuda or CudaRegistrar(lambda: [g.index for g in default_inventory().gpus()])

    def __len__(self) -> int:
        return len(self._regions)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not name:
            raise InvalidArgument("system shared memory region: a name is required")
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' is already registered")
        m = _KEY.match(key)
        if m is None or m.group(1) in (".", ".."):
            raise InvalidArgument(
                f"shared memory region '{name}': key '{key}' is not a shared memory object name "
                "(one name under /dev/shm, e.g. '/my_region': letters, digits, '_', '-', '.')"
            )
        if byte_size <= 0:
            raise InvalidArgument(f"shared memory region '{name}': byte_size must be > 0, got {byte_size}")
        path = self.shm_dir / m.group(1)
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidArgument(
                f"unable to open shared memory region '{name}': key '{key}': {exc.strerror}"
            ) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise InvalidArgument(f"shared memory region '{name}': key '{key}' is not a shared memory object")
            if offset + byte_size > st.st_size:
                raise InvalidArgument(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} is beyond the end "
                    f"of '{key}' ({st.st_size} bytes)"
                )
            start = offset - offset % mmap.ALLOCATIONGRANULARITY
            mapping = mmap.mmap(fd, offset + byte_size - start, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE, offset=start)
        finally:
            os.close(fd)  # the mapping keeps its own reference
        self._regions[name] = Region(name, key, offset, byte_size, mapping, offset - start)

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """A client's CUDA IPC handle (CudaSharedMemoryRegister); refused, saying why, without CUDA."""
        if name in self._regions:
            raise AlreadyExists(f"shared memory region '{name}' is already registered")
        self._regions[name] = self._cuda.open(name, raw_handle, device_id, byte_size)

    def unregister(self, name: str = "", kind: str = "system") -> None:
        """Unregister ``name``, or every region of ``kind`` when ``name`` is empty; an unknown name,
        or one of the other kind, is not an error (as Triton)."""
        names = [name] if name else [n for n, r in self._regions.items() if r.kind == kind]
        for n in names:
            region = self._regions.get(n)
            if region is not None and region.kind == kind:
                del self._regions[n]
                region.close()

    def status(self, name: str = "", kind: str = "system") -> list[Any]:
        """RegionStatus (system) or CudaRegionStatus (cuda) of every region of ``kind``, or of ``name``."""
        if not name:
            return [r.status() for r in self._regions.values() if r.kind == kind]
        region = self._regions.get(name)
        label = "cuda" if kind == "cuda" else "system"
        if region is None:
            raise NotFound(f"Unable to find {label} shared memory region: '{name}'")
        if region.kind != kind:
            other = {"cuda": "CUDA shared memory", "system": "system shared memory"}
            raise NotFound(f"The region named '{name}' is registered as {other[region.kind]}, not {other[kind]}")
        return [region.status()]

    def close(self) -> None:
        for region in self._regions.values():
            region.close()
        self._regions.clear()

    # -- tensors -------------------------------------------------------------

    def bind(self, ref: ShmRef) -> "RegionSlice":
        """The window ``ref`` names, in its registered region; the region must be
        registered and the window must lie inside it."""
        region = self._regions.get(ref.region)
        if region is None:
            raise NotFound(f"{ref.where}: Unable to find shared memory region: '{ref.region}'")
        region._span(ref.offset, ref.byte_size, ref.where)
        return RegionSlice(region, ref.offset, ref.byte_size)

    def resolve(self, request: InferenceRequest) -> None:
        """Read the request's inputs that lie in shared memory and bind its outputs
        asked for there; called by the data plane before the model sees the request."""
        inputs = request.inputs
        for name, value in list(inputs.items()):
            if isinstance(value, SharedTensor):
                ref = value.ref
                inputs[name] = self.bind(ref).read(value.datatype, value.shape, ref.where)
        devices = set()
        requested = request.requested_outputs or ()
        for r in requested:
            if isinstance(r.shared_memory, ShmRef):
                r.shared_memory = bound = self.bind(r.shared_memory)
            else:
                bound = None
            devices.add(bound.region.device if bound is not None and isinstance(bound.region, CudaRegion) else None)
        if requested and len(devices) == 1 and None not in devices:
            # Every output goes to CUDA memory on one device: a model there leaves them on it.
            request.output_device = devices.pop()


@dataclass(frozen=True, slots=True)
class RegionSlice:
    """One tensor's window of a registered region (system or CUDA): an offset in it, a byte size."""

    region: Region | CudaRegion
    offset: int
    byte_size: int

    def read(self, dtype: DataType, shape: tuple[int, ...], where: str) -> Any:
        return self.region.read(dtype, shape, self.offset, self.byte_size, where)

    def write(self, data: Any, where: str) -> None:
        self.region.write(data, self.offset, self.byte_size, where)

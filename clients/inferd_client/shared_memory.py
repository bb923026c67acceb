"""System shared memory: a POSIX shared memory object the client and a server on the
same host both map, so tensors travel without being copied into gRPC messages.

    region = SystemSharedMemoryRegion.create("my_key", 4096)
    client.register_system_shared_memory("input_data", region.key, region.byte_size)
    size = region.write(array)
    client.infer("model", {"INPUT0": ShmInput("input_data", "FP32", array.shape, size)}, ...)

The object is ``/dev/shm/<key>`` (what ``shm_open(key)`` opens on Linux). Written with
``os`` and ``mmap`` rather than ``multiprocessing.shared_memory``: before Python 3.13
the latter registers every object with a resource tracker that unlinks it when the
process exits and warns about a "leak" when another process owns it.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from inferd_client._tensors import deserialize, element_count, numpy_dtype, serialize

SHM_DIR = Path("/dev/shm")
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,255}$")


class SystemSharedMemoryRegion:
    """A mapped shm object; ``create`` makes (and on ``close(unlink=True)`` removes) one,
    ``open`` maps one another process made. Usable as a context manager."""

    def __init__(self, key: str, byte_size: int, fd: int, owner: bool) -> None:
        self.key = key
        self.byte_size = byte_size
        self._owner = owner
        try:
            self._map = mmap.mmap(fd, byte_size)
        finally:
            os.close(fd)

    @staticmethod
    def _path(key: str) -> Path:
        if not _KEY.match(key) or key.strip("/") in (".", ".."):
            raise ValueError(f"shared memory key '{key}' must be one name (letters, digits, '_', '.', '-')")
        return SHM_DIR / key.lstrip("/")

    @classmethod
    def create(cls, key: str, byte_size: int) -> "SystemSharedMemoryRegion":
        """A new object of ``byte_size`` bytes; fails if ``key`` exists."""
        if byte_size <= 0:
            raise ValueError(f"byte_size must be > 0, got {byte_size}")
        fd = os.open(cls._path(key), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, byte_size)
        except OSError:
            os.close(fd)
            raise
        return cls(key, byte_size, fd, owner=True)

    @classmethod
    def open(cls, key: str) -> "SystemSharedMemoryRegion":
        path = cls._path(key)
        fd = os.open(path, os.O_RDWR)
        return cls(key, os.fstat(fd).st_size, fd, owner=False)

    def write(self, array: np.ndarray, offset: int = 0) -> int:
        """Write ``array`` (numeric or BYTES) at ``offset``; returns the bytes written,
        the ``byte_size`` to give :class:`ShmInput`."""
        data = serialize(np.asarray(array))
        if offset < 0 or offset + len(data) > self.byte_size:
            raise ValueError(f"{len(data)} bytes at offset {offset} do not fit region '{self.key}' "
                             f"of {self.byte_size} bytes")
        self._map[offset:offset + len(data)] = data
        return len(data)

    def read(self, datatype: str, shape: Sequence[int], offset: int = 0, byte_size: int | None = None) -> np.ndarray:
        """A copy of the tensor at ``offset`` (``byte_size`` bounds a BYTES tensor; default: to the end)."""
        end = self.byte_size if byte_size is None else offset + byte_size
        if offset < 0 or end > self.byte_size:
            raise ValueError(f"[{offset}, {end}) is outside region '{self.key}' of {self.byte_size} bytes")
        if datatype != "BYTES" and byte_size is None:
            end = offset + element_count(shape) * numpy_dtype(datatype).itemsize
        return deserialize(bytes(self._map[offset:end]), datatype, shape)

    def close(self, unlink: bool | None = None) -> None:
        """Unmap; ``unlink`` (default: when this process created it) also removes the object."""
        if not self._map.closed:
            self._map.close()
        if self._owner if unlink is None else unlink:
            self._path(self.key).unlink(missing_ok=True)

    def __enter__(self) -> "SystemSharedMemoryRegion":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

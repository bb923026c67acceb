"""Pooled batch buffers: preallocated per instance, reused once nothing holds a view of them.

A batch's joined inputs are written into a buffer taken from the instance's
:class:`BufferPool` (each request copied once, into place), and a runtime that
can write into memory it is given (ONNX Runtime's IOBinding) puts its outputs
into pooled buffers too; the per-request outputs handed back are views of them.

A buffer is free again when no view of it is alive: numpy points every view
(and every view of a view) at the array that owns the memory, so the owner's
reference count says whether any response still holds part of it. Nothing has
to call "release": a response's arrays are dropped once it is encoded, a
response cache keeps copies, and a view kept longer (an ensemble's next step,
a client of the Python API) only means the pool hands out another buffer.
Each key keeps at most ``depth`` buffers; past that a batch gets a plain array
(counted in :attr:`BufferPool.overflow`), so a consumer holding views cannot
grow the pool without bound. Used by one instance, from one thread at a time.
"""

from __future__ import annotations

import sys
from typing import Hashable

import numpy as np

# One buffer for the batch executing, one for the batch assembled meanwhile, and the
# outputs of the previous batch while its responses are encoded.
DEPTH = 4


class BufferPool:
    def __init__(self, depth: int = DEPTH) -> None:
        self.depth = depth
        self._buffers: dict[Hashable, list[np.ndarray]] = {}
        self.allocated = 0  # buffers created (bytes in allocated_bytes)
        self.allocated_bytes = 0
        self.reused = 0  # takes served by a buffer already there
        self.overflow = 0  # takes served by a plain array: every buffer of the key was in use

    def take(self, key: Hashable, dtype: np.dtype, shape: tuple[int, ...], capacity: int = 0) -> np.ndarray:
        """A C-contiguous ``dtype`` array of ``shape`` in a buffer of ``key`` that no view
        holds; ``capacity``: elements to allocate at least, when a buffer must be created
        (a model's largest batch, so later batches fit)."""
        need = 1
        for d in shape:
            need *= d
        dtype = np.dtype(dtype)
        buffers = self._buffers.setdefault(key, [])
        smallest = -1
        for i in range(len(buffers)):
            # 2: the list's reference and getrefcount's argument; any more is a live view.
            if sys.getrefcount(buffers[i]) == 2 and buffers[i].dtype == dtype:
                if buffers[i].size >= need:
                    self.reused += 1
                    return buffers[i][:need].reshape(shape)
                if smallest < 0 or buffers[i].size < buffers[smallest].size:
                    smallest = i
        if smallest < 0 and len(buffers) >= self.depth:
            self.overflow += 1
            return np.empty(shape, dtype)
        buffer = np.empty(max(need, capacity), dtype)
        self.allocated += 1
        self.allocated_bytes += buffer.nbytes
        if smallest >= 0:
            buffers[smallest] = buffer  # too small for this batch: replaced by a larger one
        else:
            buffers.append(buffer)
        return buffer[:need].reshape(shape)

    def buffers(self) -> int:
        return sum(len(b) for b in self._buffers.values())

    def in_use(self) -> int:
        """Buffers some view still holds."""
        return sum(1 for bufs in self._buffers.values() for i in range(len(bufs)) if sys.getrefcount(bufs[i]) > 2)

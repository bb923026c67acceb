"""Shared-memory tensor arenas between a frontend worker and the core.

Each frontend has two arenas: *inputs* (the frontend allocates and writes each
request's tensors once; the core reads them as numpy views, in place) and
*outputs* (the core allocates and writes each response's tensors; the frontend
reads them into its wire message). An arena has exactly one allocating side,
so no lock is ever shared between processes: the other side only reads, and a
block comes back to its allocator through a control message (an input block
when the core answers the request, an output block in a ``FREE`` message once
the frontend has encoded the response).

The memory is a ``memfd_create`` file, sized once and sparse: a page costs
memory only once it is written, so an arena can be as large as the largest
message the frontend accepts while holding only what is in flight. Being an
anonymous file it has no name to leak when a process is killed, it is not
bounded by the size of a /dev/shm mount, and the fd is inherited by the worker
at spawn. Large blocks give their pages back when freed (``MADV_REMOVE``).

:class:`BuddyAllocator` is the allocation decision as plain data (offsets and
orders, no memory), unit-tested on its own; :class:`Arena` is the mapping;
:class:`ArenaWriter` joins the two for the allocating side.
"""

from __future__ import annotations

import mmap
import os
from typing import Sequence

import numpy as np

from inferd.errors import Unavailable

ALIGN = 64  # every tensor starts on a cache line: runtimes read tensors through typed, aligned pointers
MIN_ORDER = 6  # 64-byte blocks
RELEASE_BYTES = 1 << 20  # freed blocks at least this large give their pages back to the kernel
# Freed blocks under this order (1 MiB) are kept as they are, up to CACHED_PER_ORDER of each
# size, for the next allocation of their size: with a few requests in flight in a 4 GiB arena,
# a 64-byte block otherwise splits from the top and merges back, ~26 steps each way (~5 us a
# request in Python). They merge back when an allocation finds no free block.
CACHE_BELOW_ORDER = 20
CACHED_PER_ORDER = 32
Buffer = bytes | memoryview | np.ndarray  # anything with len() in bytes: a flat uint8 array, bytes, a byte view


class ArenaFull(Unavailable):
    """No free block is large enough (too much in flight, or one tensor larger than the arena):
    the request is refused as a retryable UNAVAILABLE."""


class BuddyAllocator:
    """Power-of-two blocks in ``[0, size)``; ``size`` is a power of two.

    A request for n bytes takes the smallest free block of 2**k >= n bytes,
    splitting a larger one when needed; a freed block merges with its buddy
    while the buddy is free too, so memory never fragments into unusable
    pieces. Free blocks of one order are reused last-freed first, so the same
    (already touched) pages serve a steady load; the last few freed blocks of
    each small size wait unmerged for the next allocation of that size, and
    merge only when an allocation would otherwise fail. One process owns it;
    it is never shared.
    """

    __slots__ = ("size", "min_order", "max_order", "_free", "_cache", "_used", "used_bytes")

    def __init__(self, size: int, min_order: int = MIN_ORDER) -> None:
        if size <= 0 or size & (size - 1):
            raise ValueError(f"arena size must be a power of two, got {size}")
        if size < 1 << min_order:
            raise ValueError(f"arena size {size} is below the smallest block (2**{min_order})")
        self.size = size
        self.min_order = min_order
        self.max_order = size.bit_length() - 1
        # Dicts as ordered sets: popitem() takes the last freed, del drops a merged buddy.
        self._free: list[dict[int, None]] = [{} for _ in range(self.max_order + 1)]
        self._free[self.max_order][0] = None
        self._cache: list[list[int]] = [[] for _ in range(min(self.max_order, CACHE_BELOW_ORDER))]
        self._used: dict[int, int] = {}  # offset -> order
        self.used_bytes = 0

    def order_for(self, nbytes: int) -> int:
        return max(self.min_order, (max(nbytes, 1) - 1).bit_length())

    def alloc(self, nbytes: int) -> int:
        """The offset of a block of at least ``nbytes``; raises :class:`ArenaFull`."""
        want = self.order_for(nbytes)
        cache = self._cache
        if want < len(cache) and cache[want]:
            offset = cache[want].pop()
        else:
            offset = self._split(want)
            if offset < 0 and self._uncache():
                offset = self._split(want)
            if offset < 0:
                raise ArenaFull(f"the frontend's hand-off arena has no free block of {1 << want} bytes "
                                f"({self.used_bytes} of {self.size} in use); retry later or send smaller requests")
        self._used[offset] = want
        self.used_bytes += 1 << want
        return offset

    def free(self, offset: int) -> int:
        """Give the block at ``offset`` back; returns its size. A block not in use raises KeyError."""
        order = self._used.pop(offset)
        size = 1 << order
        self.used_bytes -= size
        cache = self._cache
        if order < len(cache) and len(cache[order]) < CACHED_PER_ORDER:
            cache[order].append(offset)
        else:
            self._merge(offset, order)
        return size

    def _split(self, want: int) -> int:
        """A free block of order ``want`` taken from the free lists (splitting a larger one), or -1."""
        free = self._free
        order = want
        while order <= self.max_order and not free[order]:
            order += 1
        if order > self.max_order:
            return -1
        offset, _ = free[order].popitem()
        while order > want:  # keep the lower half, free the upper
            order -= 1
            free[order][offset + (1 << order)] = None
        return offset

    def _merge(self, offset: int, order: int) -> None:
        """Put a free block back on the free lists, merged with its buddy while that is free."""
        free = self._free
        while order < self.max_order:
            buddy = offset ^ (1 << order)
            level = free[order]
            if buddy not in level:
                break
            del level[buddy]
            offset &= ~(1 << order)
            order += 1
        free[order][offset] = None

    def _uncache(self) -> bool:
        """Merge every cached block back; whether there were any."""
        merged = False
        for order, blocks in enumerate(self._cache):
            for offset in blocks:
                self._merge(offset, order)
                merged = True
            blocks.clear()
        return merged

    def block_size(self, offset: int) -> int:
        return 1 << self._used[offset]

    def in_use(self) -> int:
        return len(self._used)


class Arena:
    """A shared mapping of one memfd; both processes map the same fd."""

    __slots__ = ("fd", "size", "buf", "_view")

    def __init__(self, fd: int, size: int) -> None:
        self.fd = fd
        self.size = size
        self.buf = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._view = memoryview(self.buf)

    @classmethod
    def create(cls, size: int, name: str = "inferd-arena") -> "Arena":
        """A new sparse arena; its fd is inheritable (pass it to the worker with ``pass_fds``)."""
        fd = os.memfd_create(name, 0)  # not MFD_CLOEXEC: the worker inherits it
        try:
            os.ftruncate(fd, size)
            return cls(fd, size)
        except BaseException:
            os.close(fd)
            raise

    def write(self, offset: int, data: Buffer) -> None:
        self._view[offset:offset + len(data)] = data  # type: ignore[assignment]

    def read(self, offset: int, nbytes: int) -> bytes:
        """A copy of ``nbytes`` at ``offset`` (the frontend's way into a wire message)."""
        return self.buf[offset:offset + nbytes]

    def view(self, offset: int, nbytes: int) -> memoryview:
        return self._view[offset:offset + nbytes]

    def array(self, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        """A read-only numpy view of ``count`` items at ``offset``: no copy."""
        array = np.frombuffer(self.buf, dtype=dtype, count=count, offset=offset)
        array.flags.writeable = False
        return array

    def release(self, offset: int, nbytes: int) -> None:
        """Let the kernel take back the pages of a freed block (both mappings then read zeros)."""
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = (offset + nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if end > start:
            self.buf.madvise(mmap.MADV_REMOVE, start, end - start)

    def close(self) -> None:
        """Unmap and close the fd. Arrays still viewing the mapping keep it alive until they go."""
        self._view.release()
        try:
            self.buf.close()
        except BufferError:
            pass  # numpy views of requests still in flight hold it; it unmaps when they are freed
        try:
            os.close(self.fd)
        except OSError:
            pass


def aligned(nbytes: int) -> int:
    return (nbytes + ALIGN - 1) & ~(ALIGN - 1)


class ArenaWriter:
    """The allocating side of one arena: one block per message, tensors laid out in it."""

    __slots__ = ("arena", "allocator")

    def __init__(self, arena: Arena) -> None:
        self.arena = arena
        self.allocator = BuddyAllocator(arena.size)

    def put(self, parts: Sequence[Buffer]) -> tuple[int, list[int]]:
        """Write ``parts`` into one new block: (block offset, each part's offset). Raises ArenaFull."""
        total = 0
        for p in parts:
            total += aligned(len(p))
        block = self.allocator.alloc(total)
        offsets = []
        at = block
        write = self.arena.write
        for p in parts:
            n = len(p)
            if n:
                write(at, p)
            offsets.append(at)
            at += aligned(n)
        return block, offsets

    def reserve(self, sizes: Sequence[int]) -> tuple[int, list[int]]:
        """One block holding ``sizes`` bytes one after another (the caller writes them): offsets."""
        block = self.allocator.alloc(sum(aligned(n) for n in sizes))
        offsets = []
        at = block
        for n in sizes:
            offsets.append(at)
            at += aligned(n)
        return block, offsets

    def free(self, block: int) -> None:
        size = self.allocator.free(block)
        if size >= RELEASE_BYTES:
            self.arena.release(block, size)

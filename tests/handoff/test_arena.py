"""inferd.ipc.arena: the buddy allocator as plain data, and arenas shared by two processes."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest

from inferd.errors import Unavailable
from inferd.ipc.arena import ALIGN, CACHED_PER_ORDER, Arena, ArenaFull, ArenaWriter, BuddyAllocator


def test_blocks_are_powers_of_two_at_least_64_bytes_and_aligned_to_their_size() -> None:
    a = BuddyAllocator(1 << 16)
    for n in (1, 64, 65, 100, 1000, 4096, 5000):
        off = a.alloc(n)
        size = a.block_size(off)
        assert size >= max(n, 64) and size & (size - 1) == 0
        assert off % size == 0
    assert a.alloc(0) % 64 == 0  # an empty tensor still gets a place


def test_blocks_never_overlap_and_freeing_everything_merges_back_to_one_block() -> None:
    rng = random.Random(7)
    a = BuddyAllocator(1 << 20)
    live: dict[int, int] = {}
    for _ in range(3000):
        if live and (rng.random() < 0.45 or a.used_bytes > (1 << 19)):
            off = rng.choice(list(live))
            assert a.free(off) == live.pop(off)
        else:
            off = a.alloc(rng.choice((16, 64, 200, 1000, 3000, 20000)))
            live[off] = a.block_size(off)
        spans = sorted((o, o + s) for o, s in live.items())
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:]))
        assert a.used_bytes == sum(live.values())
    for off in list(live):
        a.free(off)
    assert a.used_bytes == 0 and a.in_use() == 0
    assert a.alloc(1 << 20) == 0  # the whole arena is one free block again


def test_a_freed_block_is_reused_first() -> None:
    a = BuddyAllocator(1 << 16)
    first = a.alloc(64)
    second = a.alloc(64)
    a.free(second)
    assert a.alloc(64) == second
    a.free(first)
    assert a.alloc(50) == first


def test_full_arena_and_oversized_request_raise_arena_full() -> None:
    a = BuddyAllocator(1 << 12)
    with pytest.raises(ArenaFull, match="no free block of 8192 bytes") as exc:
        a.alloc(5000)
    assert isinstance(exc.value, Unavailable)  # a client sees a retryable UNAVAILABLE
    blocks = [a.alloc(1024) for _ in range(4)]
    with pytest.raises(ArenaFull):
        a.alloc(1)
    a.free(blocks[2])
    assert a.alloc(1) == blocks[2]


def test_bad_sizes_and_double_free_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        BuddyAllocator(1000)
    with pytest.raises(ValueError, match="smallest block"):
        BuddyAllocator(32)
    a = BuddyAllocator(1 << 12)
    off = a.alloc(10)
    a.free(off)
    with pytest.raises(KeyError):
        a.free(off)


def test_writer_lays_tensors_out_aligned_in_one_block() -> None:
    arena = Arena.create(1 << 20)
    try:
        w = ArenaWriter(arena)
        parts = [b"x" * 10, b"", np.arange(5, dtype=np.float32).tobytes()]
        block, offsets = w.put(parts)
        assert offsets[0] == block and all(o % ALIGN == 0 for o in offsets)
        assert arena.read(offsets[0], 10) == b"x" * 10
        view = arena.array(np.dtype(np.float32), offsets[2], 5)
        assert view.tolist() == [0, 1, 2, 3, 4] and not view.flags.writeable
        w.free(block)
        assert w.allocator.used_bytes == 0
        block2, offsets2 = w.reserve([100, 3])
        assert offsets2 == [block2, block2 + 128]
    finally:
        arena.close()


def test_a_released_large_block_reads_zeros() -> None:
    arena = Arena.create(1 << 24)
    try:
        w = ArenaWriter(arena)
        data = b"\x07" * (2 << 20)
        block, _ = w.put([data])
        w.free(block)  # >= 1 MiB: its pages go back to the kernel
        assert arena.read(block, 4096) == bytes(4096)
    finally:
        arena.close()


def test_another_process_reads_and_writes_the_same_memory() -> None:
    """The worker's side: the fd is inherited, mapped, read as numpy, and written back."""
    arena = Arena.create(1 << 20)
    try:
        w = ArenaWriter(arena)
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        block, (off,) = w.put([x.tobytes()])
        code = (
            "import sys, numpy as np\n"
            "from inferd.ipc.arena import Arena\n"
            "fd, size, off = map(int, sys.argv[1:])\n"
            "a = Arena(fd, size)\n"
            "x = a.array(np.dtype(np.float32), off, 16)\n"
            "a.write(off + 64, (x * 2).tobytes())\n"
        )
        subprocess.run([sys.executable, "-c", code, str(arena.fd), str(arena.size), str(off)],
                       check=True, pass_fds=(arena.fd,), timeout=60)
        assert arena.array(np.dtype(np.float32), off + 64, 16).tolist() == (x * 2).ravel().tolist()
    finally:
        arena.close()


def test_closing_an_arena_with_live_views_keeps_them_readable() -> None:
    arena = Arena.create(1 << 16)
    w = ArenaWriter(arena)
    _, (off,) = w.put([np.ones(4, np.int64).tobytes()])
    view = arena.array(np.dtype(np.int64), off, 4)
    arena.close()
    assert view.tolist() == [1, 1, 1, 1]


def test_freed_small_blocks_wait_unmerged_until_an_allocation_needs_them_merged() -> None:
    a = BuddyAllocator(1 << 12)  # room for 64 blocks of 64 bytes
    blocks = [a.alloc(64) for _ in range(64)]
    for off in blocks:
        a.free(off)
    assert a.used_bytes == 0 and a.in_use() == 0
    waiting = blocks[CACHED_PER_ORDER - 1]  # the last one kept unmerged (the rest merged)
    assert a.alloc(64) == waiting
    with pytest.raises(KeyError):
        a.free(blocks[0])  # waiting blocks are not in use: a double free is still refused
    a.free(waiting)
    assert a.alloc(1 << 12) == 0  # the whole arena, once the waiting blocks merge back

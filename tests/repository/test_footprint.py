"""Measuring footprints (inferd/repository/footprint.py): the gate that keeps in-process builds measured
one at a time (who waits for whom, in order; a load nested in the measured build passes), a process's
private memory, and a build's growth as malloc counts it."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import numpy as np
import pytest

from inferd.observability.procfs import private_bytes
from inferd.repository.footprint import Measure, MeasureGate, heap_bytes, rss_bytes

MiB = 2**20


async def test_a_measured_build_waits_for_shared_holders_and_holds_off_later_ones() -> None:
    gate = MeasureGate()
    order: list[str] = []
    assert await gate.acquire(False, "reading-a")  # a model's files being read

    async def take(exclusive: bool, name: str) -> None:
        await gate.acquire(exclusive, name)
        order.append(name)

    build = asyncio.ensure_future(take(True, "build-b"))
    later = asyncio.ensure_future(take(False, "reading-c"))
    await asyncio.sleep(0)
    assert order == []  # the build waits for the reading; the later reading waits behind the build (FIFO)
    gate.release(False)
    await asyncio.sleep(0)
    assert order == ["build-b"] and gate.owner == "build-b"
    gate.release(True)
    await asyncio.sleep(0)
    assert order == ["build-b", "reading-c"] and gate.owner is None and gate.shared == 1
    await asyncio.gather(build, later)


async def test_shared_holders_share() -> None:
    gate = MeasureGate()
    assert await gate.acquire(False, "a") and await gate.acquire(False, "b")
    assert gate.shared == 2


async def test_a_load_within_the_measured_build_passes_without_waiting() -> None:
    gate = MeasureGate()
    assert await gate.acquire(True, "outer")
    # The outer model's initialize loads 'inner', and waits for it: 'inner' must not wait for 'outer'.
    assert await asyncio.wait_for(gate.acquire(True, "inner", within="outer"), 1) is False
    assert await asyncio.wait_for(gate.acquire(False, "inner", within="outer"), 1) is False
    assert gate.owner == "outer" and gate.shared == 0


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    gate = MeasureGate()
    assert await gate.acquire(True, "a")
    waiter = asyncio.ensure_future(gate.acquire(True, "b"))
    after = asyncio.ensure_future(gate.acquire(False, "c"))
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    gate.release(True)
    await asyncio.sleep(0)
    assert after.done() and gate.owner is None and gate.shared == 1


def test_held_from_a_thread_waits_for_the_loop_to_grant_it() -> None:
    async def main() -> list[str]:
        gate = MeasureGate()
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        await gate.acquire(True, "first")

        def thread() -> None:
            with gate.held(loop, True, "second"):
                seen.append(f"second holds it: owner {gate.owner}")

        done = loop.run_in_executor(None, thread)
        await asyncio.sleep(0.05)
        seen.append("first releases")
        gate.release(True)
        await done
        await asyncio.sleep(0)
        seen.append(f"owner after: {gate.owner}")
        return seen

    assert asyncio.run(main()) == ["first releases", "second holds it: owner second", "owner after: None"]


def test_private_bytes_counts_what_a_child_touched_not_what_it_shares() -> None:
    if private_bytes() is None:
        pytest.skip("needs /proc/<pid>/smaps_rollup")
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(64 << 20); sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        for _ in range(500):  # until it has touched its 64 MiB (bounded)
            private = private_bytes(child.pid) or 0
            if private > 64 * MiB:
                break
            time.sleep(0.01)
        assert 64 * MiB < private < rss_bytes(child.pid)  # its interpreter's pages shared with the page cache
    finally:
        child.communicate(b"", timeout=30)
    assert private_bytes(child.pid) is None  # gone: nothing to read


def test_a_build_is_measured_by_what_malloc_still_holds_not_what_it_freed() -> None:
    if heap_bytes() is None:
        pytest.skip("needs glibc's mallinfo2")
    kept: list[np.ndarray] = []
    with Measure() as measured:
        transient = np.ones(32 * MiB // 8)  # parsed and dropped, as a model file's bytes are
        kept.append(np.ones(16 * MiB // 8))
        del transient
    assert 16 * MiB <= measured.footprint.cpu < 17 * MiB, measured.footprint.cpu / MiB
    assert kept

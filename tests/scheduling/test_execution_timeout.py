"""Issue 16, item 2: an execution past ``inferd.execution_timeout_microseconds`` fails its batch at
once with DEADLINE_EXCEEDED, its thread is retired and a new instance takes the next batches; past
``max_retired`` stuck threads the worker answers UNAVAILABLE until one returns.

The worker is driven with a FakeClock (the timeout fires when the test advances it) over instances
that block on an event the test sets: no sleeps, no timing guesses.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from inferd.backends.base import BatchResult
from inferd.clock import FakeClock
from inferd.errors import DeadlineExceeded, Unavailable
from inferd.scheduling.instances import InstanceWorker


class Blocking:
    """An instance whose executions wait for ``release`` (or answer at once when it is set)."""

    thread_only = True
    wants_requests = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.release = threading.Event()
        self.started = threading.Event()
        self.executions = 0
        self.closed = threading.Event()

    def execute(self, inputs, outputs):  # type: ignore[no-untyped-def]
        self.executions += 1
        self.started.set()
        assert self.release.wait(30)
        return BatchResult([{"out": i} for i in inputs])

    def close(self) -> None:
        self.closed.set()


async def _run(worker: InstanceWorker, inputs: list) -> object:  # type: ignore[type-arg]
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    worker.run(inputs, ["out"], lambda w, result: done.set_result(result), loop)
    return done


async def _until(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(3000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never: {what}")


def _worker(first: Blocking, built: list[Blocking], clock: FakeClock, max_retired: int = 2) -> InstanceWorker:
    def rebuild() -> Blocking:
        fresh = Blocking(f"i{len(built) + 1}")
        fresh.release.set()  # replacements answer at once
        built.append(fresh)
        return fresh

    return InstanceWorker(first, "thread", timeout_us=500_000, rebuild=rebuild, max_retired=max_retired, clock=clock)


async def test_an_overrunning_execution_fails_its_batch_and_a_new_instance_serves_the_next() -> None:
    clock, first, built = FakeClock(), Blocking("i0"), []
    worker = _worker(first, built, clock)
    pending = await _run(worker, [{"x": 1}, {"x": 2}])
    await asyncio.to_thread(first.started.wait, 10)
    clock.advance(0.4)
    assert not pending.done()  # within the limit: still running
    clock.advance(0.2)
    error = await pending
    assert isinstance(error, DeadlineExceeded)
    assert "execution_timeout_microseconds (500000 us)" in error.message and "retired" in error.message
    assert worker.retired == 1 and not worker.busy
    # The next batch waits for the new instance, then runs on it.
    nxt = await _run(worker, [{"x": 3}])
    result = await asyncio.wait_for(nxt, 10)
    assert isinstance(result, BatchResult) and result.outputs == [{"out": {"x": 3}}]
    assert worker.instance is built[0] and first.executions == 1
    # The stuck call returns at last: its late result goes nowhere, its thread closes its instance.
    first.release.set()
    await _until(lambda: worker.retired == 0, "the retired execution returned")
    await asyncio.to_thread(first.closed.wait, 10)
    worker.close()
    assert built[0].closed.is_set()


async def test_a_fast_execution_cancels_its_timer() -> None:
    clock, first = FakeClock(), Blocking("i0")
    first.release.set()
    worker = _worker(first, [], clock)
    result = await asyncio.wait_for(await _run(worker, [{"x": 1}]), 10)
    assert isinstance(result, BatchResult)
    assert clock.pending_timers() == 0
    clock.advance(10)
    assert worker.retired == 0 and worker.failed is None
    worker.close()
    assert first.closed.is_set()


async def test_past_max_retired_the_worker_refuses_until_a_stuck_one_returns() -> None:
    clock, first, built = FakeClock(), Blocking("i0"), []
    stuck = [first]

    def rebuild() -> Blocking:
        fresh = Blocking(f"i{len(stuck)}")  # every replacement hangs too
        stuck.append(fresh)
        built.append(fresh)
        return fresh

    worker = InstanceWorker(first, "thread", timeout_us=1000, rebuild=rebuild, max_retired=1, clock=clock)
    for n in range(2):
        pending = await _run(worker, [{"x": n}])
        await asyncio.to_thread(stuck[n].started.wait, 10)
        clock.advance(0.01)
        assert isinstance(await pending, DeadlineExceeded)
        if n == 0:
            await _until(lambda: not worker._rebuilding, "the first replacement is built")
    assert worker.retired == 2 and worker.failed is not None
    assert "2 executions are stuck" in worker.failed and "inferd.max_retired_instances (1)" in worker.failed
    refused = await _run(worker, [{"x": 9}])
    assert isinstance(await refused, Unavailable)  # at once: nothing is executing
    assert len(built) == 1  # no replacement past the cap
    stuck[0].release.set()  # one stuck call returns: room for a replacement again
    await _until(lambda: worker.failed is None and not worker._rebuilding, "the worker is replaced again")
    assert len(built) == 2
    built[-1].release.set()
    result = await asyncio.wait_for(await _run(worker, [{"x": 10}]), 10)
    assert isinstance(result, BatchResult)
    stuck[1].release.set()
    await _until(lambda: worker.retired == 0, "every retired execution returned")
    worker.close()


def test_a_timeout_needs_thread_mode() -> None:
    with pytest.raises(ValueError, match="needs mode 'thread'"):
        InstanceWorker(Blocking("i"), "auto", timeout_us=1000)

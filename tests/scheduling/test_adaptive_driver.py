"""The batcher driving adaptive waits, SLO admission and staged batches, on a FakeClock."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from inferd.backends.base import Assembled, BatchResult, ExecutionTimes
from inferd.backends.batching import Joined
from inferd.errors import SloRefused
from inferd.scheduling.batcher import STAGE_AT
from inferd.scheduling.estimates import PROBE_EVERY
from tests.scheduling.test_batcher import WAIT, Blocking, Recording, make, policy, result, settle, submit

US = 1e-6


async def sequential(sched, clock, n: int) -> list[bool]:  # type: ignore[no-untyped-def]
    """``n`` requests one after another (a closed loop of one client); True where one waited."""
    waited = []
    for i in range(n):
        task = submit(sched, float(i))
        await settle(2)
        waited.append(not task.done())
        clock.advance(0.001)  # past any queue delay
        await result(task)
        clock.advance(0.0005)  # the client's round trip
    return waited


async def test_adaptive_runs_a_lone_client_at_once_but_for_rare_probes():
    inst = Recording()
    sched, stats, clock = make(policy(max_queue_delay_us=500, batch_wait="adaptive"), inst)
    waited = await sequential(sched, clock, 4 * PROBE_EVERY)
    assert waited.count(True) == 4  # the probes: one head in PROBE_EVERY
    assert inst.rows() == [1] * 4 * PROBE_EVERY
    await sched.stop()


async def test_fixed_makes_every_lone_request_wait_the_whole_delay():
    inst = Recording()
    sched, _, clock = make(policy(max_queue_delay_us=500, batch_wait="fixed"), inst)
    assert await sequential(sched, clock, 5) == [True] * 5
    await sched.stop()


async def test_adaptive_waits_once_company_joins_and_batches_as_fixed_does():
    inst = Recording()
    sched, _, clock = make(policy(max_queue_delay_us=500, batch_wait="adaptive"), inst)
    first = submit(sched, 0.0)  # request 0 is a probe: it waits
    await settle()
    assert not first.done()
    second = submit(sched, 1.0)  # someone joins it
    await settle()
    clock.advance(0.0005)
    await asyncio.gather(result(first), result(second))
    assert inst.rows() == [2]
    # Company came last time: the next head waits for it too, and gets it.
    nxt = [submit(sched, 2.0)]
    await settle()
    assert not nxt[0].done()
    nxt += [submit(sched, float(v)) for v in (3.0, 4.0)]
    await settle()
    clock.advance(0.0005)
    await asyncio.gather(*map(result, nxt))
    assert inst.rows() == [2, 3]
    await sched.stop()


def slow_estimate(worker, rows: int = 2, seconds: float = 0.010) -> None:  # type: ignore[no-untyped-def]
    for _ in range(50):
        worker.estimate.observe(rows, seconds)


async def test_a_request_that_cannot_meet_the_slo_is_refused_at_once_with_the_estimate():
    inst = Blocking()
    sched, stats, clock = make(policy(max_batch_size=2, slo_us=25_000, priority_levels=2, default_priority_level=2),
                               inst, mode="thread")
    slow_estimate(sched.workers[0])  # 10 ms a batch
    running = submit(sched, 100.0)
    assert await inst.wait_started() == [100.0]  # busy for ~10 ms
    queued = [submit(sched, 1.0), submit(sched, 2.0)]  # one batch of two after it: ~20 ms, admitted
    await settle()
    refused = submit(sched, 3.0)  # a third batch: ~30 ms > 25 ms
    await settle()
    assert refused.done() and isinstance(refused.exception(), SloRefused)
    message = str(refused.exception())
    assert "latency SLO of 25000 us" in message and "estimated 30000 us" in message
    assert "2 rows queued ahead of it" in message
    # Priorities still hold: a higher priority request is estimated behind its own level only.
    urgent = submit(sched, 4.0, priority=1)
    await settle()
    assert not urgent.done()
    inst.release(3)
    await asyncio.gather(result(running), result(urgent), *map(result, queued))
    assert inst.batches == [[100.0], [4.0, 1.0], [2.0]]  # the urgent one first; a low one fills the batch
    await sched.stop()


async def test_a_batch_is_cut_so_its_oldest_request_meets_the_slo():
    inst = Recording()
    sched, _, clock = make(policy(max_batch_size=8, max_queue_delay_us=2000, slo_us=3000, batch_wait="fixed"), inst)
    worker = sched.workers[0]
    for rows in (1, 2, 4, 8) * 60:
        worker.estimate.observe(rows, (100 + 250 * rows) * US)  # 8 rows: 2.1 ms
    head = submit(sched, 0.0)
    await settle()
    clock.advance(0.0015)  # the head has 1.5 ms of its budget left
    rest = [submit(sched, float(i)) for i in range(1, 8)]
    await settle()
    # The batch filled (8 rows) but only 5 fit 1.5 ms (1.35 ms): they run; the others wait for company.
    assert inst.rows() == [5]
    clock.advance(0.002)
    await asyncio.gather(result(head), *map(result, rest))
    assert inst.rows() == [5, 3]
    await sched.stop()


class Assembling(Blocking):
    """A tensor-style instance: batches are assembled ahead of execution (on the loop)."""

    assembles_ahead = True

    def __init__(self) -> None:
        super().__init__("assembling")
        self.assembled: list[tuple[list[float], int]] = []  # (first values, batches executing then)
        self.executing = 0
        self._lock = threading.Lock()

    def assemble(self, inputs):  # type: ignore[no-untyped-def]
        self.assembled.append(([float(x["INPUT0"].flat[0]) for x in inputs], self.executing))
        joined = Joined({"INPUT0": np.concatenate([x["INPUT0"] for x in inputs])}, [len(x["INPUT0"]) for x in inputs])
        return Assembled(joined, 0)

    def execute_assembled(self, assembled, output_names):  # type: ignore[no-untyped-def]
        with self._lock:
            self.executing += 1
        try:
            data = assembled.joined.inputs["INPUT0"]
            values = [float(v) for v in data[:, 0]]
            self.started.put(values)
            if not self.gate.acquire(timeout=WAIT):
                raise RuntimeError("test never released the instance")
            self.batches.append(values)
            return BatchResult([{"OUTPUT0": data[i:i + 1] * 2} for i in range(len(values))], ExecutionTimes(1, 2, 3))
        finally:
            with self._lock:
                self.executing -= 1


async def test_a_busy_instance_takes_its_next_full_batch_late_in_its_execution():
    inst = Assembling()
    sched, _, clock = make(policy(max_batch_size=2), inst, mode="thread")
    for _ in range(20):
        sched.workers[0].estimate.observe(2, 0.100)  # 100 ms a batch
    first = [submit(sched, 0.0), submit(sched, 1.0)]
    assert await inst.wait_started() == [0.0, 1.0]
    second = [submit(sched, 2.0), submit(sched, 3.0)]  # a full batch, queued
    await settle()
    assert sched.queue_depth() == 2  # too early in the execution: it could still be overtaken
    clock.advance(STAGE_AT * 0.100 + 0.001)
    await settle()
    assert sched.queue_depth() == 0  # handed over, assembled while the first batch executes
    assert inst.assembled[-1] == ([2.0, 3.0], 1)
    partial = submit(sched, 4.0)  # one request: not a full batch, it waits for a free instance
    await settle()
    assert sched.queue_depth() == 1
    inst.release(3)
    await asyncio.gather(*map(result, first + second), result(partial))
    assert inst.batches == [[0.0, 1.0], [2.0, 3.0], [4.0]]
    await sched.stop()


async def never_staged(sched, inst: "Assembling", clock) -> None:  # type: ignore[no-untyped-def]
    """A full batch queued late in a 100 ms execution stays queued until the instance is free."""
    for _ in range(20):
        sched.workers[0].estimate.observe(2, 0.100)
    first = [submit(sched, 0.0), submit(sched, 1.0)]
    assert await inst.wait_started() == [0.0, 1.0]
    second = [submit(sched, 2.0), submit(sched, 3.0)]
    clock.advance(STAGE_AT * 0.100 + 0.001)
    await settle()
    assert sched.queue_depth() == 2  # it waits for the instance to end its execution
    inst.release(2)
    await asyncio.gather(*map(result, first + second))
    assert inst.batches == [[0.0, 1.0], [2.0, 3.0]]
    await sched.stop()


async def test_a_rate_limited_instance_is_never_handed_a_batch_while_it_executes():
    from inferd.config import RateLimitResource
    from inferd.scheduling.rate_limiter import RateLimiter

    inst = Assembling()
    sched, _, clock = make(policy(max_batch_size=2), inst, mode="thread")
    # Four units of R and an instance needing one: the limiter itself would grant a second batch.
    limiter = RateLimiter([("R", 4, 0)])
    sched.workers[0].ticket = limiter.register("m", "m_0", 0, (RateLimitResource("R", 1),), 0)
    await never_staged(sched, inst, clock)


async def test_an_instance_with_an_execution_timeout_is_never_handed_a_batch_while_it_executes():
    from inferd.scheduling.batcher import BatchScheduler
    from inferd.scheduling.instances import InstanceWorker

    inst = Assembling()
    _, stats, clock = make(policy(max_batch_size=2), inst, mode="thread")
    # Each batch's timer runs from when it is handed over: a staged one would be timed while it waits.
    worker = InstanceWorker(inst, "thread", timeout_us=10_000_000, clock=clock)
    sched = BatchScheduler("m", policy(max_batch_size=2), [worker], ["OUTPUT0"], stats, clock)
    await never_staged(sched, inst, clock)


async def test_without_any_execution_seen_no_batch_is_taken_early():
    inst = Assembling()
    sched, _, clock = make(policy(max_batch_size=2), inst, mode="thread")
    first = [submit(sched, 0.0), submit(sched, 1.0)]
    await inst.wait_started()
    second = [submit(sched, 2.0), submit(sched, 3.0)]
    clock.advance(10.0)
    await settle()
    assert sched.queue_depth() == 2
    inst.release(2)
    await asyncio.gather(*map(result, first + second))
    await sched.stop()


@pytest.mark.parametrize("mode", ["adaptive", "fixed"])
async def test_the_estimate_learns_each_instances_execution_time(mode: str):
    inst = Recording()
    sched, _, clock = make(policy(max_queue_delay_us=0, batch_wait=mode), inst, mode="thread")
    for i in range(5):
        await result(submit(sched, float(i)))
    assert sched.workers[0].estimate.count == 5
    await sched.stop()

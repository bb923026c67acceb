"""BatchScheduler (the asyncio driver) and InstanceWorker, with fake instances.

Time only moves through a FakeClock. Instances that must be "busy" block their
worker thread on a semaphore the test releases; the test waits for a worker
through its futures or a threading primitive, never by sleeping.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Sequence

import numpy as np
import pytest

from inferd.backends.base import BatchResult, ExecutionTimes, ModelInstance
from inferd.clock import FakeClock
from inferd.errors import DeadlineExceeded, InvalidArgument, ModelExecutionError, Unavailable
from inferd.observability.stats import ModelStats
from inferd.scheduling import instances as instances_module
from inferd.scheduling.batcher import DEFER_MISSES, DEFER_PROBE_EVERY, BatchScheduler
from inferd.scheduling.instances import MAX_FLIPS, PROBE_EXECUTIONS, InstanceWorker
from inferd.scheduling.policy import REJECT, BatchingPolicy, QueuePolicy
from inferd.types import InferenceRequest

WAIT = 10.0  # real seconds: only a guard against a hung test, never a pacing sleep


# -- fakes ---------------------------------------------------------------------------


class Recording(ModelInstance):
    """Doubles INPUT0; records each execution's per-request first values and thread."""

    def __init__(self, name: str = "fake") -> None:  # no ModelSpec needed
        self.name = name
        self.batches: list[list[float]] = []
        self.threads: list[int] = []
        self.fail: BaseException | None = None
        self.closed = False

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        self.batches.append([float(x["INPUT0"].flat[0]) for x in inputs])
        self.threads.append(threading.get_ident())
        if self.fail is not None:
            raise self.fail
        return BatchResult([{"OUTPUT0": x["INPUT0"] * 2} for x in inputs], ExecutionTimes(10, 20, 30))

    def rows(self) -> list[int]:
        return [len(b) for b in self.batches]

    def close(self) -> None:
        self.closed = True


class Blocking(Recording):
    """Blocks every execution until the test calls ``release()``; ``started`` gets each batch."""

    def __init__(self, name: str = "blocking") -> None:
        super().__init__(name)
        self.gate = threading.Semaphore(0)
        self.started: queue.Queue[list[float]] = queue.Queue()

    def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
        values = [float(x["INPUT0"].flat[0]) for x in inputs]
        self.started.put(values)
        if not self.gate.acquire(timeout=WAIT):
            raise RuntimeError("test never released the instance")
        return super().execute(inputs, output_names)

    def release(self, n: int = 1) -> None:
        for _ in range(n):
            self.gate.release()

    async def wait_started(self) -> list[float]:
        return await asyncio.to_thread(self.started.get, True, WAIT)


# -- helpers -------------------------------------------------------------------------


def policy(**kw) -> BatchingPolicy:
    kw.setdefault("max_batch_size", 8)
    kw.setdefault("batching", True)
    return BatchingPolicy(**kw)


def make(policy_: BatchingPolicy, *instances: ModelInstance, mode: str = "inline",
         clock: FakeClock | None = None) -> tuple[BatchScheduler, ModelStats, FakeClock]:
    clock = clock or FakeClock()
    stats = ModelStats("m", 1)
    workers = [InstanceWorker(i, mode) for i in instances]
    return BatchScheduler("m", policy_, workers, ["OUTPUT0"], stats, clock), stats, clock


def request(value: float = 0.0, rows: int = 1, **kw) -> InferenceRequest:
    data = (np.arange(rows, dtype=np.float32) + value).reshape(rows, 1).repeat(4, axis=1)
    return InferenceRequest("m", {"INPUT0": data}, **kw)


def submit(sched: BatchScheduler, value: float = 0.0, rows: int = 1, **kw) -> asyncio.Task:
    return asyncio.ensure_future(sched.infer(request(value, rows, **kw), rows))


async def settle(rounds: int = 10) -> None:
    """Let the loop run what is ready (task steps, the pump) without time passing."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def result(task: asyncio.Future):
    return await asyncio.wait_for(task, WAIT)


class DoneCounter:
    """Counts batches the scheduler has finished (its ``_done`` ran on the loop)."""

    def __init__(self, sched: BatchScheduler) -> None:
        self.count = 0
        self._changed = asyncio.Event()
        original = sched._done

        def done(worker, batch, res):  # type: ignore[no-untyped-def]
            original(worker, batch, res)
            self.count += 1
            self._changed.set()

        sched._done = done  # type: ignore[method-assign]

    async def wait(self, n: int) -> None:
        async def until() -> None:
            while self.count < n:
                self._changed.clear()
                await self._changed.wait()
        await asyncio.wait_for(until(), WAIT)


# -- batching --------------------------------------------------------------------------


async def test_concurrent_requests_are_batched():
    inst = Recording()
    sched, stats, _ = make(policy(max_batch_size=8), inst)
    tasks = [submit(sched, float(i)) for i in range(10)]
    outs = await asyncio.gather(*tasks)
    assert inst.rows() == [8, 2]
    assert inst.batches[0] == [float(i) for i in range(8)]  # arrival order inside the batch
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0 * i, np.float32))
    await sched.stop()


async def lone(sched: BatchScheduler, value: float = 1.0) -> bool:
    """Submit one request while another callback (this test's own wake-up) is
    ready on the loop; True when it waited for the rest of the loop turn
    instead of running at once on the idle fast path."""
    task = submit(sched, value)
    await asyncio.sleep(0)  # the request's first step runs, with this task's wake-up queued behind it
    waited = not task.done()
    await result(task)
    return waited


async def test_waiting_for_the_rest_of_the_turn_stops_while_requests_keep_arriving_alone():
    inst = Recording()
    sched, _, _ = make(policy(max_batch_size=8), inst)
    waited = [await lone(sched) for _ in range(DEFER_MISSES + 2 * DEFER_PROBE_EVERY)]
    assert waited[:DEFER_MISSES] == [True] * DEFER_MISSES  # each waits, and each runs alone
    rest = waited[DEFER_MISSES:]
    # Then they run at once, but for a probe every DEFER_PROBE_EVERY requests.
    probes = [i for i, w in enumerate(rest) if w]
    assert probes == [DEFER_PROBE_EVERY - 1, 2 * DEFER_PROBE_EVERY - 1]
    assert inst.rows() == [1] * len(waited)
    await sched.stop()


async def test_a_probe_that_finds_company_brings_batching_back():
    inst = Recording()
    sched, _, _ = make(policy(max_batch_size=8), inst)
    for _ in range(DEFER_MISSES):
        assert await lone(sched)
    inst.batches.clear()
    # A burst in one loop turn: the first ones run alone until the probe waits,
    # and the requests behind it share batches.
    burst = [submit(sched, float(i)) for i in range(DEFER_PROBE_EVERY + 15)]
    outs = await asyncio.gather(*burst)
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0 * i, np.float32))
    assert inst.rows() == [1] * (DEFER_PROBE_EVERY - 1) + [8, 8]
    assert await lone(sched)  # waiting paid off: lone requests wait for their turn again
    await sched.stop()


async def test_a_model_without_dynamic_batching_never_waits_for_the_turn():
    inst = Recording()
    sched, _, _ = make(policy(batching=False, max_batch_size=8), inst)
    assert [await lone(sched) for _ in range(3)] == [False] * 3
    await sched.stop()


async def test_a_configured_queue_delay_keeps_waiting_for_company():
    inst = Recording()
    clock = FakeClock()
    sched, _, _ = make(policy(max_batch_size=8, max_queue_delay_us=100), inst, clock=clock)
    for _ in range(DEFER_MISSES + DEFER_PROBE_EVERY):
        task = submit(sched)
        await asyncio.sleep(0)
        assert not task.done()
        clock.advance(0.001)  # past the delay: the lone request runs
        await result(task)
    await sched.stop()


async def test_a_lone_request_waits_out_a_configured_queue_delay():
    inst = Recording()
    clock = FakeClock()
    sched, _, _ = make(policy(max_batch_size=8, max_queue_delay_us=100), inst, clock=clock)
    assert not asyncio.get_running_loop()._ready  # nothing else ready: the idle fast path's condition
    coro = sched.infer(request(1.0), 1)
    waiting = coro.send(None)  # runs to its first suspension instead of executing at once
    assert isinstance(waiting, asyncio.Future) and inst.rows() == []
    clock.advance(0.001)  # past the delay: the lone request runs
    assert inst.rows() == [1]
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    np.testing.assert_array_equal(done.value.value["OUTPUT0"], np.full((1, 4), 2.0, np.float32))
    await sched.stop()


async def test_requests_queued_behind_a_busy_instance_run_as_one_batch():
    inst = Blocking()
    sched, stats, _ = make(policy(max_batch_size=8), inst, mode="thread")
    first = submit(sched, 100.0)
    assert await inst.wait_started() == [100.0]
    rest = [submit(sched, float(i)) for i in range(3)]
    await settle()
    assert sched.queue_depth() == 3
    inst.release(2)
    await result(first)
    await asyncio.gather(*map(result, rest))
    assert inst.batches == [[100.0], [0.0, 1.0, 2.0]]
    await sched.stop()


async def test_max_queue_delay_waits_on_the_fake_clock():
    inst = Recording()
    sched, _, clock = make(policy(max_queue_delay_us=100_000), inst)
    a = submit(sched, 1.0)
    await settle()
    b = submit(sched, 2.0)
    await settle()
    assert inst.batches == [] and clock.pending_timers() == 1
    clock.advance(0.099)
    await settle()
    assert inst.batches == [] and not a.done()
    clock.advance(0.001)
    await settle()
    assert inst.batches == [[1.0, 2.0]] and a.done() and b.done()
    await sched.stop()


# -- timeouts, deadlines, full queues --------------------------------------------------


async def test_queue_timeout_fires_while_the_only_instance_is_busy():
    inst = Blocking()
    qp = QueuePolicy(timeout_action=REJECT, default_timeout_us=50_000)
    sched, stats, clock = make(policy(default_queue_policy=qp), inst, mode="thread")
    running = submit(sched, 1.0)
    assert await inst.wait_started() == [1.0]
    waiting = submit(sched, 2.0)
    await settle()
    assert sched.queue_depth() == 1
    clock.advance(0.049)
    await settle()
    assert not waiting.done()
    clock.advance(0.001)
    await settle()
    assert waiting.done() and not running.done()  # rejected while the instance is still busy
    with pytest.raises(Unavailable, match="timed out in the queue.*50000 us"):
        waiting.result()
    inst.release()
    await result(running)
    assert inst.batches == [[1.0]]  # the rejected request never reached the instance
    assert sched.inflight() == 0 and stats.pending == 0
    await sched.stop()


async def test_client_deadline_passes_while_the_instance_is_busy():
    inst = Blocking()
    sched, _, clock = make(policy(), inst, mode="thread")
    running = submit(sched, 1.0)
    await inst.wait_started()
    late = submit(sched, 2.0, deadline=clock.now() + 0.2)
    await settle()
    clock.advance(0.2)
    await settle()
    with pytest.raises(DeadlineExceeded):
        late.result()
    inst.release()
    await result(running)
    assert inst.batches == [[1.0]]
    await sched.stop()


async def test_a_full_queue_rejects_at_once():
    inst = Blocking()
    qp = QueuePolicy(max_queue_size=1)
    sched, _, _ = make(policy(default_queue_policy=qp), inst, mode="thread")
    running = submit(sched, 1.0)
    await inst.wait_started()
    queued = submit(sched, 2.0)
    await settle()
    with pytest.raises(Unavailable, match=r"maximum queue size \(1 requests"):
        await sched.infer(request(3.0), 1)  # raises without waiting for anything
    assert sched.inflight() == 2
    inst.release(2)
    await result(running)
    await result(queued)
    assert inst.batches == [[1.0], [2.0]]
    await sched.stop()


# -- cancellation --------------------------------------------------------------------


async def test_cancelling_the_awaiting_task_drops_the_queued_request():
    inst = Blocking()
    sched, stats, _ = make(policy(), inst, mode="thread")
    running = submit(sched, 1.0)
    await inst.wait_started()
    doomed = submit(sched, 2.0)
    await settle()
    assert sched.queue_depth() == 1
    doomed.cancel()
    await settle()
    assert doomed.cancelled() and sched.queue_depth() == 0 and sched.inflight() == 1
    inst.release(2)
    await result(running)
    later = await result(submit(sched, 3.0))
    np.testing.assert_array_equal(later["OUTPUT0"], np.full((1, 4), 6.0, np.float32))
    assert inst.batches == [[1.0], [3.0]]  # 2.0 never reached the instance
    assert stats.pending == 0
    await sched.stop()


async def test_cancelling_during_the_queue_delay():
    inst = Recording()
    sched, _, clock = make(policy(max_queue_delay_us=100_000), inst)
    a, b = submit(sched, 1.0), submit(sched, 2.0)
    await settle()
    a.cancel()
    await settle()
    clock.advance(0.1)
    await settle()
    assert inst.batches == [[2.0]] and b.done()
    await sched.stop()


# -- instances -------------------------------------------------------------------------


async def test_preserve_ordering_answers_in_dispatch_order():
    first_inst, second_inst = Blocking("i0"), Blocking("i1")
    sched, _, _ = make(policy(max_batch_size=1, preserve_ordering=True), first_inst, second_inst, mode="thread")
    done = DoneCounter(sched)
    order: list[str] = []
    first, second = submit(sched, 1.0), submit(sched, 2.0)
    first.add_done_callback(lambda _: order.append("first"))
    second.add_done_callback(lambda _: order.append("second"))
    assert await first_inst.wait_started() == [1.0]
    assert await second_inst.wait_started() == [2.0]
    second_inst.release()
    await done.wait(1)  # the second batch finished executing...
    await settle()
    assert not second.done()  # ...but is held until the first one is answered
    first_inst.release()
    await result(first)
    await result(second)
    assert order == ["first", "second"]
    await sched.stop()


async def test_without_preserve_ordering_a_later_batch_may_answer_first():
    first_inst, second_inst = Blocking("i0"), Blocking("i1")
    sched, _, _ = make(policy(max_batch_size=1), first_inst, second_inst, mode="thread")
    first, second = submit(sched, 1.0), submit(sched, 2.0)
    await first_inst.wait_started()
    await second_inst.wait_started()
    second_inst.release()
    await result(second)
    assert not first.done()
    first_inst.release()
    await result(first)
    await sched.stop()


async def test_multiple_instances_run_batches_concurrently():
    insts = [Blocking(f"i{i}") for i in range(3)]
    sched, stats, _ = make(policy(max_batch_size=2), *insts, mode="thread")
    tasks = [submit(sched, float(i)) for i in range(6)]
    # Three batches of two are executing at the same time: every instance has started
    # and none has been released.
    started = sorted([await inst.wait_started() for inst in insts])
    assert started == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert sched.queue_depth() == 0 and not any(t.done() for t in tasks)
    for inst in insts:
        inst.release()
    await asyncio.gather(*map(result, tasks))
    assert stats.execution_count == 3 and stats.inference_count == 6
    await sched.stop()


# -- errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["inline", "thread"])
async def test_a_model_raising_fails_every_request_of_the_batch(mode):
    inst = Recording()
    inst.fail = RuntimeError("boom")
    sched, stats, _ = make(policy(), inst, mode=mode)
    tasks = [submit(sched, float(i)) for i in range(3)]
    done, _ = await asyncio.wait(tasks, timeout=WAIT)
    assert len(done) == 3 and inst.rows() == [3]
    for t in tasks:
        with pytest.raises(ModelExecutionError, match="model 'm' failed to execute: RuntimeError: boom"):
            t.result()
    inst.fail = None  # the instance is free again and serves the next request
    await result(submit(sched, 5.0))
    assert sched.inflight() == 0
    await sched.stop()


async def test_a_domain_error_from_the_model_reaches_the_client_as_is():
    inst = Recording()
    inst.fail = Unavailable("model 'm': the accelerator went away")
    sched, _, _ = make(policy(), inst)
    with pytest.raises(Unavailable, match="accelerator went away"):
        await result(submit(sched))
    await sched.stop()


async def test_a_per_request_error_fails_only_that_request():
    class OneBad(Recording):
        def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
            res = super().execute(inputs, output_names)
            res.outputs[1] = InvalidArgument("request 1 is bad")
            return res

    inst = OneBad()
    sched, _, _ = make(policy(), inst)
    a, b, c = (submit(sched, float(i)) for i in range(3))
    await asyncio.wait([a, b, c], timeout=WAIT)
    assert a.result() and c.result()
    with pytest.raises(InvalidArgument, match="request 1 is bad"):
        b.result()
    await sched.stop()


async def test_a_result_missing_responses_fails_the_unanswered_requests():
    class Short(Recording):
        def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
            res = super().execute(inputs, output_names)
            return BatchResult(res.outputs[:1], res.times)

    inst = Short()
    sched, _, _ = make(policy(), inst)
    a, b, c = (submit(sched, float(i)) for i in range(3))
    await settle()
    assert a.done() and b.done() and c.done()  # nobody is left waiting forever
    assert a.result()
    for t in (b, c):
        with pytest.raises(ModelExecutionError, match="returned 1 responses for a batch of 3 requests"):
            t.result()
    await sched.stop()


# -- splitting -------------------------------------------------------------------------


async def test_split_large_requests_reassembles_in_order():
    inst = Recording()
    sched, stats, _ = make(policy(max_batch_size=4, split_large_requests=True), inst)
    out = await result(submit(sched, 0.0, rows=10))
    assert inst.batches == [[0.0], [4.0], [8.0]]  # three executions, one part each, in order...
    assert stats.inference_count == 10 and sorted(stats.batch_stats) == [2, 4]  # ...of 4, 4 and 2 rows
    expected = (np.arange(10, dtype=np.float32).reshape(10, 1).repeat(4, axis=1)) * 2
    np.testing.assert_array_equal(out["OUTPUT0"], expected)
    await sched.stop()


async def test_too_large_request_without_splitting_is_refused():
    sched, _, _ = make(policy(max_batch_size=4), Recording())
    with pytest.raises(InvalidArgument, match="batch-size must be <= 4, got 10.*inferd.split_large_requests"):
        await sched.infer(request(rows=10), 10)
    await sched.stop()


async def test_a_failing_part_of_a_split_request_cancels_the_other_parts():
    inst = Blocking()
    qp = QueuePolicy(max_queue_size=2)
    sched, _, _ = make(policy(max_batch_size=2, split_large_requests=True, default_queue_policy=qp),
                       inst, mode="thread")
    running = submit(sched, 100.0)
    await inst.wait_started()
    split = submit(sched, 0.0, rows=6)  # three parts; the third does not fit in the queue
    await settle()
    with pytest.raises(Unavailable, match="maximum queue size"):
        split.result()
    assert sched.queue_depth() == 0  # the two admitted parts were dropped, not left to run
    inst.release()
    await result(running)
    assert inst.batches == [[100.0]]
    await sched.stop()


# -- statistics ------------------------------------------------------------------------


async def test_statistics_count_executions_inferences_batches_and_queue_time():
    inst = Recording()
    sched, stats, clock = make(policy(max_queue_delay_us=100_000), inst)
    tasks = [submit(sched, float(i)) for i in range(3)]
    await settle()
    tasks.append(submit(sched, 9.0, rows=2))
    await settle()
    clock.advance(0.1)
    await asyncio.gather(*map(result, tasks))
    assert stats.execution_count == 1 and stats.inference_count == 5
    assert stats.execution_count < stats.inference_count
    assert list(stats.batch_stats) == [5]
    bs = stats.batch_stats[5]
    assert (bs.compute_input.count, bs.compute_infer.ns, bs.compute_output.ns) == (1, 20, 30)
    # per request: each of the 4 requests is charged the batch's time
    assert stats.compute_infer.count == 4 and stats.compute_infer.ns == 80
    assert stats.queue.count == 4
    assert stats.queue.ns == pytest.approx(4 * 100_000_000, abs=10)  # 100 ms each, on the fake clock
    assert stats.pending == 0
    await sched.stop()


# -- InstanceWorker: where an execution runs ---------------------------------------------


async def test_inline_runs_on_the_loop_thread_and_thread_elsewhere():
    loop_thread = threading.get_ident()
    inline, threaded = Recording("inline"), Recording("thread")
    s1, _, _ = make(policy(), inline, mode="inline")
    s2, _, _ = make(policy(), threaded, mode="thread")
    for _ in range(3):
        await result(submit(s1))
        await result(submit(s2))
    assert inline.threads == [loop_thread] * 3
    assert len(set(threaded.threads)) == 1 and threaded.threads[0] != loop_thread
    assert s2.workers[0].inline is False
    await s1.stop()
    await s2.stop()
    assert inline.closed and threaded.closed


class FakeNs:
    """Stands in for the ``time`` module inside instances.py: executions cost what a test says."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns

    thread_time_ns = perf_counter_ns  # instances.py times executions in thread CPU time


class Costly(Recording):
    def __init__(self, clock: FakeNs) -> None:
        super().__init__("costly")
        self.clock = clock
        self.cost_us = 10

    def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
        self.clock.ns += self.cost_us * 1000
        return super().execute(inputs, output_names)


async def test_auto_moves_a_fast_model_inline_and_back_after_a_slow_run(monkeypatch):
    fake = FakeNs()
    monkeypatch.setattr(instances_module, "time", fake)
    inst = Costly(fake)
    sched, _, _ = make(policy(), inst, mode="auto")  # inline limit: 1000 us
    worker = sched.workers[0]
    loop_thread = threading.get_ident()
    for _ in range(PROBE_EXECUTIONS):
        assert worker.inline is False
        await result(submit(sched))
    assert worker.inline is True  # 8 fast executions measured on the thread
    assert all(t != loop_thread for t in inst.threads)
    await result(submit(sched))
    assert inst.threads[-1] == loop_thread  # now on the loop
    inst.cost_us = 20_000  # one execution past SLOW_FACTOR times the limit
    await result(submit(sched))
    assert inst.threads[-1] == loop_thread and worker.inline is False
    inst.cost_us = 10
    await result(submit(sched))
    assert inst.threads[-1] != loop_thread  # back on its thread
    await sched.stop()


async def test_auto_stays_on_its_thread_after_max_flips(monkeypatch):
    fake = FakeNs()
    monkeypatch.setattr(instances_module, "time", fake)
    inst = Costly(fake)
    sched, _, _ = make(policy(), inst, mode="auto")
    worker = sched.workers[0]
    for _ in range(MAX_FLIPS):
        for _ in range(100):  # fast runs until the worker moves onto the loop
            if worker.inline:
                break
            await result(submit(sched))
        assert worker.inline
        inst.cost_us = 20_000
        await result(submit(sched))
        assert not worker.inline
        inst.cost_us = 10
    for _ in range(100):
        await result(submit(sched))
    assert worker.inline is False  # erratic: it stays off the loop for good
    await sched.stop()


async def test_thread_and_inline_modes_never_switch(monkeypatch):
    fake = FakeNs()
    monkeypatch.setattr(instances_module, "time", fake)
    fast, slow = Costly(fake), Costly(fake)
    slow.cost_us = 20_000
    s_thread, _, _ = make(policy(), fast, mode="thread")
    s_inline, _, _ = make(policy(), slow, mode="inline")
    for _ in range(2 * PROBE_EXECUTIONS):
        await result(submit(s_thread))
        await result(submit(s_inline))
    assert s_thread.workers[0].inline is False and s_inline.workers[0].inline is True
    await s_thread.stop()
    await s_inline.stop()


async def test_stop_finishes_accepted_requests_then_closes_instances():
    inst = Blocking()
    sched, _, _ = make(policy(max_batch_size=1), inst, mode="thread")
    a, b = submit(sched, 1.0), submit(sched, 2.0)
    await inst.wait_started()
    stopping = asyncio.ensure_future(sched.stop())
    await settle()
    with pytest.raises(Unavailable, match="unloading"):
        await sched.infer(request(), 1)
    assert not stopping.done()
    inst.release(2)
    await result(stopping)
    assert a.result() and b.result() and inst.closed


# -- submit: the callback entry point (no task per request) ------------------------------


async def test_submitted_requests_of_one_turn_share_a_batch_and_resolve_their_completions():
    inst = Recording()
    sched, stats, _ = make(policy(max_batch_size=8), inst)
    loop = asyncio.get_running_loop()
    futures = [loop.create_future() for _ in range(3)]
    for i, f in enumerate(futures):
        sched.submit(request(float(i)), 1, f, more=i < 2)  # more: others follow this turn
    assert not any(f.done() for f in futures)  # held for the rest of the turn, not run alone
    outs = [await result(f) for f in futures]
    assert inst.batches == [[0.0, 1.0, 2.0]]
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0 * i, np.float32))
    assert sched.inflight() == 0 and stats.pending == 0
    await sched.stop()


async def test_a_submitted_request_cancelled_before_it_starts_never_runs_and_never_resolves():
    inst = Blocking()
    sched, stats, _ = make(policy(), inst, mode="thread")
    loop = asyncio.get_running_loop()
    running, doomed = loop.create_future(), loop.create_future()
    sched.submit(request(1.0), 1, running)
    await inst.wait_started()
    cancel = sched.submit(request(2.0), 1, doomed)
    assert sched.queue_depth() == 1 and sched.inflight() == 2
    cancel()
    assert sched.queue_depth() == 0 and sched.inflight() == 1
    inst.release(1)
    await result(running)
    await settle()
    assert not doomed.done() and inst.batches == [[1.0]]
    assert sched.inflight() == 0 and stats.pending == 0
    await sched.stop()


async def test_a_request_cancelled_while_it_executes_leaves_at_once_and_its_batch_answers_nobody():
    # stop() waits for what is in flight: a caller that went away (a client gone, a shutdown cancelling
    # its runs) must not keep it waiting on an execution that may never end.
    inst = Blocking()
    sched, stats, _ = make(policy(), inst, mode="thread")
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    cancel = sched.submit(request(1.0), 1, gone)
    await inst.wait_started()
    gone.cancel()  # what the caller does first (a ModelRun ends itself), then calls the cancel
    cancel()
    assert sched.inflight() == 0 and stats.pending == 0
    stopping = asyncio.ensure_future(sched.stop())
    await settle()
    assert not stopping.done()  # closing the instance waits for its execution, not the drain
    inst.release(1)
    await stopping
    assert inst.batches == [[1.0]]


async def test_a_request_whose_future_is_cancelled_as_its_batch_ends_leaves_the_count_once():
    # An awaiting task's cancel reaches its future at once and the scheduler's cancel a loop turn later
    # (Scheduler.infer): a batch that ends in between answers nothing, and the cancel then finds nothing.
    inst = Blocking()
    sched, stats, _ = make(policy(), inst, mode="thread")
    done = DoneCounter(sched)
    future = asyncio.get_running_loop().create_future()
    cancel = sched.submit(request(1.0), 1, future)
    await inst.wait_started()
    future.cancel()
    inst.release(1)
    await done.wait(1)
    assert sched.inflight() == 0 and stats.pending == 0
    cancel()
    assert sched.inflight() == 0 and stats.pending == 0 and sched._inflight.interactive == 0
    await sched.stop()


async def test_submit_refuses_what_infer_refuses_before_queueing():
    sched, _, _ = make(policy(max_batch_size=2), Recording())
    future = asyncio.get_running_loop().create_future()
    with pytest.raises(InvalidArgument, match="batch-size must be <= 2, got 3"):
        sched.submit(request(rows=3), 3, future)
    assert sched.inflight() == 0 and not future.done()
    await sched.stop()


# -- trains: a lone remote instance takes the ready batches at once ----------------------


class Remote(ModelInstance):
    """A remote instance (a model host, as :class:`~inferd.hosts.instance.HostedInstance` is to the
    scheduler): batches are answered when the test says; ``sends`` holds the first values of the
    batches of each write to the host (one list per write)."""

    remote = True
    trains = True

    def __init__(self, name: str = "remote") -> None:
        self.name = name
        self.pending: list[tuple[Sequence[dict[str, np.ndarray]], object]] = []
        self.sends: list[list[list[float]]] = []
        self._held: list[list[float]] | None = None
        self.refuse: BaseException | None = None  # answer every batch with this at once (an arena full)

    def submit(self, inputs, output_names, done) -> None:  # type: ignore[no-untyped-def]
        if self.refuse is not None:
            done(self.refuse)
            return
        self.pending.append((inputs, done))
        values = [float(x["INPUT0"].flat[0]) for x in inputs]
        if self._held is not None:
            self._held.append(values)
        else:
            self.sends.append([values])

    def hold(self) -> None:
        self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        if held:
            self.sends.append(held)

    def answer(self, n: int) -> None:
        """The host's results for its first ``n`` pending batches, in order."""
        for inputs, done in self.pending[:n]:
            done(BatchResult([{"OUTPUT0": x["INPUT0"] * 2} for x in inputs], ExecutionTimes(1, 2, 3)))
        del self.pending[:n]

    def execute(self, inputs, output_names):  # type: ignore[no-untyped-def]
        raise AssertionError("a remote instance is handed its batches through submit")

    def close(self) -> None:
        pass


def sizes(inst: Remote) -> list[list[int]]:
    return [[len(batch) for batch in send] for send in inst.sends]


async def test_a_lone_remote_instance_takes_the_ready_requests_in_one_train():
    inst = Remote()
    sched, stats, clock = make(policy(batching=False, max_batch_size=0), inst, mode="thread")
    tasks = [submit(sched, float(i)) for i in range(3)]
    await settle()
    # Before any execution was seen its time is unknown: one batch, no train on a guess.
    assert inst.sends == [[[0.0]]]
    tasks += [submit(sched, float(i)) for i in range(3, 12)]
    await settle()
    clock.advance(0.00005)  # 50 us an execution: TRAIN_WINDOW_S holds 20, TRAIN_MAX is 8
    inst.answer(1)
    await settle()
    assert inst.sends[1] == [[float(i)] for i in range(1, 9)]  # eight batches, one write
    clock.advance(0.0004)
    inst.answer(8)
    await settle()
    assert inst.sends[2] == [[9.0], [10.0], [11.0]]
    inst.answer(3)
    outs = await asyncio.gather(*map(result, tasks))
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out["OUTPUT0"], np.full((1, 4), 2.0 * i, np.float32))
    assert stats.execution_count == 12 and stats.inference_count == 12
    await sched.stop()


async def test_a_train_stops_at_the_window_and_takes_only_full_batches():
    inst = Remote()
    sched, _, clock = make(policy(max_batch_size=2), inst, mode="thread")
    tasks = [submit(sched, 100.0)]
    await settle()
    tasks += [submit(sched, float(i)) for i in range(9)]
    await settle()
    clock.advance(0.0004)  # 400 us a batch: the train's third would end past TRAIN_WINDOW_S (1 ms)
    inst.answer(1)
    await settle()
    assert sizes(inst) == [[1], [2, 2]]
    clock.advance(0.0008)
    inst.answer(2)
    await settle()
    assert sizes(inst) == [[1], [2, 2], [2, 2]]
    clock.advance(0.0008)
    inst.answer(2)
    await settle()
    # The one request left is a batch that could still grow: it goes alone, not behind a train.
    assert sizes(inst) == [[1], [2, 2], [2, 2], [1]]
    inst.answer(1)
    await asyncio.gather(*map(result, tasks))
    await sched.stop()


async def test_a_model_with_several_remote_instances_hands_each_one_batch_at_a_time():
    insts = [Remote("a"), Remote("b")]
    sched, _, clock = make(policy(batching=False, max_batch_size=0), *insts, mode="thread")
    tasks = [submit(sched, float(i)) for i in range(2)]
    await settle()
    tasks += [submit(sched, float(i)) for i in range(2, 8)]
    await settle()
    for _ in range(3):
        clock.advance(0.00005)
        for inst in insts:
            inst.answer(1)
        await settle()
    assert all(len(send) == 1 for inst in insts for send in inst.sends)
    assert sum(len(inst.sends) for inst in insts) == 8
    for inst in insts:
        inst.answer(len(inst.pending))
    await asyncio.gather(*map(result, tasks))
    await sched.stop()


async def test_batches_refused_at_once_end_the_train_and_leave_one_free_instance():
    inst = Remote()
    sched, _, clock = make(policy(batching=False, max_batch_size=0), inst, mode="thread")
    first = submit(sched, 0.0)
    await settle()
    refused = [submit(sched, float(i)) for i in range(1, 4)]
    await settle()
    inst.refuse = Unavailable("the host's arena is full")
    clock.advance(0.00005)
    inst.answer(1)
    await result(first)
    for task in refused:
        with pytest.raises(Unavailable):
            await result(task)
    inst.refuse = None
    # The instance is free once, not once per refused batch: of two requests on separate turns the
    # second waits for the first.
    a = submit(sched, 10.0)
    await settle()
    b = submit(sched, 11.0)
    await settle()
    assert len(inst.pending) == 1 and sched.queue_depth() == 1
    clock.advance(0.00005)
    inst.answer(1)
    await settle()
    inst.answer(1)
    await asyncio.gather(result(a), result(b))
    await sched.stop()

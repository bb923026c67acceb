"""IterativeScheduler (continuous batching's asyncio driver) with fake step models.

Steps are released by the test (:class:`ManualWorker`), so which sequences
share a step is decided by the test, not by timing.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

import numpy as np
import pytest

from inferd.backends.base import BatchResult, ExecutionTimes, ModelInstance, RequestInputs
from inferd.clock import FakeClock
from inferd.config._sequence import Control, SequencePolicy, StateSpec
from inferd.dtypes import BY_CONFIG
from inferd.errors import InvalidArgument, ModelExecutionError
from inferd.observability.stats import ModelStats
from inferd.scheduling.instances import InstanceWorker
from inferd.scheduling.iterative import IterativeScheduler
from inferd.streaming import ResponseSink, StreamEvent
from inferd.types import InferenceRequest

INT32 = BY_CONFIG["TYPE_INT32"]
WAIT = 10.0


def remaining_state() -> StateSpec:
    initial = np.zeros((1,), np.int32)
    initial.flags.writeable = False
    return StateSpec("REM_IN", "REM_OUT", INT32, (1,), initial)


class Countdown(ModelInstance):
    """A tensor step model: on START the remaining count is N, then it counts down;
    OUT = remaining after the step, DONE when it reaches 0."""

    wants_requests = False

    def __init__(self) -> None:
        self.name = "countdown"
        self.steps: list[list[dict[str, np.ndarray]]] = []

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        self.steps.append([dict(r) for r in inputs])
        outs = []
        for row in inputs:
            start = bool(row["START"].reshape(-1)[0])
            left = (row["N"] if start else row["REM_IN"]) - 1
            outs.append({"OUT": left, "DONE": left <= 0, "REM_OUT": left})
        return BatchResult(outs, ExecutionTimes(1, 2, 3))

    def close(self) -> None:
        pass


class PythonCountdown(ModelInstance):
    """What a decoupled Python model does through pb_utils: one response per step
    (with the state output in it), RESCHEDULE until the count reaches 0, then FINAL."""

    wants_requests = True

    def __init__(self, send_state: bool = True) -> None:
        self.name = "py"
        self.send_state = send_state
        self.steps: list[list[Any]] = []

    def execute(self, inputs: Sequence[dict[str, np.ndarray]], output_names: Sequence[str]) -> BatchResult:
        self.steps.append([(r.request.correlation_id, r.request.flags) for r in inputs])
        again = []
        for row in inputs:
            assert isinstance(row, RequestInputs)
            start = row.request.flags & 1
            left = (row["N"] if start else row["REM_IN"]) - 1
            outputs = {"OUT": left}
            if self.send_state:
                outputs["REM_OUT"] = left
            done = bool(left[0] <= 0)
            row.request.responder.put(StreamEvent(outputs=outputs, final=done))
            again.append(not done)
        return BatchResult([{} for _ in inputs], ExecutionTimes(), reschedule=again)

    def close(self) -> None:
        pass


class ManualWorker(InstanceWorker):
    """Runs a step when the test says so."""

    def __init__(self, instance: ModelInstance) -> None:
        super().__init__(instance, "thread")
        self.pending: list[tuple[Any, Any, Any]] = []

    def run(self, inputs, outputs, done, loop) -> None:  # type: ignore[no-untyped-def]
        self.pending.append((inputs, outputs, done))

    def release(self) -> int:
        """Execute the step waiting here; its size."""
        inputs, outputs, done = self.pending.pop(0)
        try:
            result = self.instance.execute(inputs, outputs)
        except Exception as exc:  # as InstanceWorker: the step's error, for every row
            result = exc
        done(self, result)
        return len(inputs)

    def close(self) -> None:
        pass


def policy(max_batch_size: int = 4, **kw) -> SequencePolicy:
    controls = (Control("START", "START", INT32, 0, 1), Control("READY", "READY", INT32, 0, 1),
                Control("CORRID", "CORRID", BY_CONFIG["TYPE_UINT64"]))
    return SequencePolicy(strategy="direct", max_batch_size=max_batch_size, idle_us=1_000_000, controls=controls,
                          states=(remaining_state(),), corrid_numeric=True, iterative=True, **kw)


def make(instance: ModelInstance, *, decoupled: bool = False, manual: bool = True, end: str = "DONE",
         **kw) -> tuple[IterativeScheduler, Any, ModelStats]:
    worker = ManualWorker(instance) if manual else InstanceWorker(instance, "inline")
    stats = ModelStats("countdown", 1)
    levels = {k: kw.pop(k) for k in ("priority_levels", "default_priority_level") if k in kw}
    sched = IterativeScheduler("countdown", policy(**kw), [worker], ["OUT", "DONE"], stats, FakeClock(),
                               decoupled=decoupled, end_output=end, **levels)
    return sched, worker, stats


def request(n: int, **params: Any) -> InferenceRequest:
    return InferenceRequest("countdown", {"N": np.array([[n]], np.int32)}, parameters=dict(params))


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def stream(sched: IterativeScheduler, req: InferenceRequest) -> list[int | None]:
    """Run a decoupled request; its responses' OUT values (None for an empty final)."""
    sink = ResponseSink(asyncio.get_running_loop())
    req.responder = sink
    task = asyncio.ensure_future(sched.infer(req, 1))
    got: list[int | None] = []
    while True:
        event = await asyncio.wait_for(sink.get(), WAIT)
        assert event.error is None, event.error
        got.append(None if not event.outputs else int(event.outputs["OUT"].reshape(-1)[0]))
        assert event.outputs is None or "REM_OUT" not in event.outputs  # state is the scheduler's
        if event.final:
            break
    assert await asyncio.wait_for(task, WAIT) == {}
    return got


async def test_sequences_join_and_leave_between_steps():
    model = Countdown()
    sched, worker, stats = make(model)
    a = asyncio.ensure_future(sched.infer(request(3), 1))
    b = asyncio.ensure_future(sched.infer(request(1), 1))
    await settle()
    assert worker.release() == 2  # a and b; a's next step starts at once, without b
    await settle()
    assert b.done() and int(b.result()["OUT"][0, 0]) == 0  # b left after one step
    c = asyncio.ensure_future(sched.infer(request(2), 1))
    await settle()
    assert worker.release() == 1  # a alone: c arrived while this step ran
    assert worker.release() == 2  # c joined a's last step
    assert worker.release() == 1  # c's last step
    await settle()
    assert [int(t.result()["OUT"][0, 0]) for t in (a, c)] == [0, 0]
    # The model saw START only on each sequence's first step, and its own state after.
    starts = [[int(r["START"][0, 0]) for r in step] for step in model.steps]
    assert starts == [[1, 1], [0], [0, 1], [0]]
    assert [[int(r["REM_IN"][0, 0]) for r in step] for step in model.steps] == [[0, 0], [2], [1, 0], [1]]
    assert sorted(stats.batch_stats) == [1, 2] and stats.execution_count == 4
    await sched.stop()


async def test_generated_sequence_ids_count_from_one_and_reach_corrid():
    model = Countdown()
    sched, worker, _ = make(model)
    tasks = [asyncio.ensure_future(sched.infer(request(1), 1)) for _ in range(2)]
    await settle()
    worker.release()
    await asyncio.gather(*tasks)
    assert [int(r["CORRID"][0, 0]) for r in model.steps[0]] == [1, 2]
    assert [int(r["READY"][0, 0]) for r in model.steps[0]] == [1, 1]
    await sched.stop()


async def test_decoupled_tensor_model_streams_each_step_and_marks_the_last_final():
    sched, _, _ = make(Countdown(), decoupled=True, manual=False)
    assert await stream(sched, request(3)) == [2, 1, 0]
    await sched.stop()


async def test_max_tokens_ends_the_sequence_whatever_the_model_says():
    sched, _, _ = make(Countdown(), decoupled=True, manual=False)
    assert await stream(sched, request(100, max_tokens=4)) == [99, 98, 97, 96]
    await sched.stop()


async def test_python_model_reschedules_and_its_state_is_kept_by_the_scheduler():
    model = PythonCountdown()
    sched, _, _ = make(model, decoupled=True, manual=False)
    assert await stream(sched, request(3)) == [2, 1, 0]
    assert [flags for step in model.steps for _, flags in step] == [1, 0, 0]  # START, then neither
    await sched.stop()


async def test_python_model_stopped_by_max_tokens_gets_a_final_from_the_scheduler():
    sched, _, _ = make(PythonCountdown(), decoupled=True, manual=False)
    assert await stream(sched, request(10, max_tokens=2)) == [9, 8, None]
    await sched.stop()


async def test_python_model_that_sends_no_state_fails_its_sequence():
    sched, _, _ = make(PythonCountdown(send_state=False), decoupled=True, manual=False)
    req = request(3)
    req.responder = ResponseSink(asyncio.get_running_loop())
    with pytest.raises(ModelExecutionError) as exc:
        await asyncio.wait_for(sched.infer(req, 1), WAIT)
    assert "state output(s) ['REM_OUT']" in exc.value.message and "step 1" in exc.value.message
    await sched.stop()


async def test_a_cancelled_request_frees_its_row_at_the_next_step():
    model = Countdown()
    sched, worker, _ = make(model)
    a = asyncio.ensure_future(sched.infer(request(10), 1))
    b = asyncio.ensure_future(sched.infer(request(10), 1))
    await settle()
    worker.release()
    a.cancel()  # while its second step runs
    await settle()
    assert worker.release() == 2  # the step a was part of completes...
    assert worker.release() == 1  # ...and the next one has b only
    assert sched.active_sequences() == 1 and sched.inflight() == 1
    b.cancel()
    await settle()
    assert worker.release() == 1
    await settle()
    assert sched.active_sequences() == 0 and worker.pending == []  # b left when its step completed
    await sched.stop()


async def test_waiting_requests_join_by_priority():
    model = Countdown()
    sched, worker, _ = make(model, max_batch_size=1, priority_levels=2, default_priority_level=2)
    first = asyncio.ensure_future(sched.infer(request(1), 1))
    await settle()
    low = asyncio.ensure_future(sched.infer(request(1, sequence_id=20, sequence_start=True), 1))
    high = asyncio.ensure_future(sched.infer(InferenceRequest(
        "countdown", {"N": np.array([[1]], np.int32)}, priority=1,
        parameters={"sequence_id": 30, "sequence_start": True}), 1))
    await settle()
    for _ in range(3):
        worker.release()
        await settle()
    await asyncio.gather(first, low, high)
    assert [int(step[0]["CORRID"][0, 0]) for step in model.steps] == [1, 30, 20]
    await sched.stop()


async def test_batch_job_rows_give_their_slot_to_interactive_work():
    model = Countdown()
    sched, worker, _ = make(model, max_batch_size=1)
    job = request(3)
    job.background = True
    j = asyncio.ensure_future(sched.infer(job, 1))
    await settle()
    worker.release()  # the job's first step; its second starts at once
    user = asyncio.ensure_future(sched.infer(request(1), 1))
    await settle()
    worker.release()  # the job's second step; then it is parked for the user's
    worker.release()
    await settle()
    assert user.done() and not j.done()
    worker.release()
    await settle()
    assert int(j.result()["OUT"][0, 0]) == 0  # resumed with its state: 3 steps in all
    assert [len(s) for s in model.steps] == [1, 1, 1, 1]
    assert [int(s[0]["CORRID"][0, 0]) for s in model.steps] == [1, 1, 2, 1]
    assert [int(s[0]["REM_IN"][0, 0]) for s in model.steps] == [0, 2, 0, 1]
    assert sched.background_over_foreground == 0
    await sched.stop()


@pytest.mark.parametrize("params, words", [
    ({"max_tokens": 0}, ["'max_tokens' must be an integer >= 1, got 0"]),
    ({"sequence_id": 5}, ["sequence 5", "must specify the START flag"]),
])
async def test_bad_requests_are_refused(params, words):
    sched, _, _ = make(Countdown())
    with pytest.raises(InvalidArgument) as exc:
        await sched.infer(request(1, **params), 1)
    for word in words:
        assert word in exc.value.message
    await sched.stop()


async def test_a_running_sequence_id_is_refused_and_one_row_per_request():
    sched, worker, _ = make(Countdown())
    a = asyncio.ensure_future(sched.infer(request(2, sequence_id=9, sequence_start=True), 1))
    await settle()
    with pytest.raises(InvalidArgument) as exc:
        await sched.infer(request(1, sequence_id=9, sequence_start=True), 1)
    assert "sequence 9 is already running" in exc.value.message
    with pytest.raises(InvalidArgument) as exc:
        await sched.infer(request(1), 2)
    assert "batch-size 1" in exc.value.message
    worker.release()
    worker.release()
    await a
    await sched.stop()


async def test_a_tensor_model_without_end_output_needs_max_tokens():
    sched, _, _ = make(Countdown(), end="", manual=False)
    with pytest.raises(InvalidArgument) as exc:
        await sched.infer(request(1), 1)
    assert "inferd.iterative_end_output" in exc.value.message and "max_tokens" in exc.value.message
    out = await asyncio.wait_for(sched.infer(request(10, max_tokens=3), 1), WAIT)
    assert int(out["OUT"][0, 0]) == 7
    await sched.stop()


async def test_an_execution_error_ends_every_row_of_the_step():
    model = Countdown()
    sched, worker, _ = make(model)
    model.execute = lambda inputs, names: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
    tasks = [asyncio.ensure_future(sched.infer(request(3), 1)) for _ in range(2)]
    await settle()
    worker.release()
    for t in tasks:
        with pytest.raises(ModelExecutionError) as exc:
            await t
        assert "boom" in exc.value.message
    assert sched.active_sequences() == 0
    await sched.stop()


async def test_a_stream_at_its_bound_pauses_its_sequence_while_the_others_step():
    from inferd.streaming import StreamLimits

    model = Countdown()
    sched, worker, _ = make(model, decoupled=True)
    loop = asyncio.get_running_loop()
    slow, fast = request(6), request(6)
    slow.responder = ResponseSink(loop, StreamLimits(max_responses=2), "countdown", slow)
    fast.responder = ResponseSink(loop, StreamLimits(max_responses=2), "countdown", fast)
    a = asyncio.ensure_future(sched.infer(slow, 1))
    b = asyncio.ensure_future(sched.infer(fast, 1))
    await settle()
    fast_got: list[int] = []
    for _ in range(5):  # the fast stream's client reads each response; the slow one's reads none
        assert worker.release() in (1, 2)
        await settle()
        fast_got.append(int((await asyncio.wait_for(fast.responder.get(), WAIT)).outputs["OUT"][0, 0]))
    assert fast_got == [5, 4, 3, 2, 1]
    # The slow stream holds its bound (2 responses) and its sequence took no step since:
    assert len(slow.responder) == 2 and sched.paused_sequences() == 1
    assert [len(s) for s in model.steps] == [2, 2, 1, 1, 1]
    slow_got = [int((await asyncio.wait_for(slow.responder.get(), WAIT)).outputs["OUT"][0, 0])]
    await settle()  # below its bound: resumed, for the step after fast's last (already running)
    assert worker.release() == 1
    await settle()
    assert b.done() and (await asyncio.wait_for(fast.responder.get(), WAIT)).final
    for _ in range(20):
        if a.done() and not len(slow.responder):
            break
        if worker.pending:
            worker.release()
        await settle()
        while len(slow.responder):
            event = await slow.responder.get()
            assert event.error is None, event.error
            slow_got.append(int(event.outputs["OUT"][0, 0]))
    assert slow_got == [5, 4, 3, 2, 1, 0]  # every response, in order, none refused
    assert sched.stream_pauses >= 1
    await sched.stop()


async def test_a_paused_stream_whose_client_reads_nothing_ends_after_the_stall_timeout():
    from inferd.errors import ResourceExhausted
    from inferd.streaming import StreamLimits

    model = Countdown()
    sched, worker, _ = make(model, decoupled=True)
    clock = sched._clock
    assert isinstance(clock, FakeClock)
    req = request(100)
    req.responder = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_seconds=30),
                                 "countdown", req)
    task = asyncio.ensure_future(sched.infer(req, 1))
    await settle()
    worker.release()
    await settle()
    assert worker.pending == [] and sched.paused_sequences() == 1  # one response unread: paused
    clock.advance(29)
    await settle()
    assert not task.done()
    clock.advance(1)
    await settle()
    with pytest.raises(ResourceExhausted) as exc:
        await asyncio.wait_for(task, WAIT)
    assert "--stream-stall-timeout" in exc.value.message and "--stream-max-responses" in exc.value.message
    assert sched.active_sequences() == 0 and len(model.steps) == 1
    await sched.stop()


async def test_a_paused_stream_still_ends_at_its_deadline():
    from inferd.errors import DeadlineExceeded
    from inferd.streaming import StreamLimits

    sched, worker, _ = make(Countdown(), decoupled=True)
    clock = sched._clock
    assert isinstance(clock, FakeClock)
    req = request(100)
    req.deadline = clock.now() + 5
    req.responder = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_seconds=30),
                                 "countdown", req)
    task = asyncio.ensure_future(sched.infer(req, 1))
    await settle()
    worker.release()
    await settle()
    assert sched.paused_sequences() == 1
    clock.advance(5)
    await settle()
    with pytest.raises(DeadlineExceeded) as exc:
        await asyncio.wait_for(task, WAIT)
    assert "deadline" in exc.value.message and "paused" in exc.value.message
    assert sched.active_sequences() == 0
    await sched.stop()

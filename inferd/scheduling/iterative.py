"""Continuous batching: the asyncio driver of ``sequence_batching { iterative_sequence: true }``.

As in Triton, one request is a whole sequence. A request without a
``sequence_id`` gets one (counting from 1) and starts a sequence; one that
names its own must set ``sequence_start``. The model is called once per step
with a row for each sequence taking part; :class:`IterativeQueue` decides,
between two steps, which sequences leave and which join. Each row carries the
control inputs (START on a sequence's first step only, END false, READY
true, CORRID) and its implicit state (``sequence_batching.state``: the
scheduler keeps each sequence's state outputs and feeds them back, starting
from ``initial_state``), so the model is a step function.

How a sequence goes on or ends, and where its responses go:

- a Python model (``triton_python_backend_utils``) releases a request with
  ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE`` to run it again at the next
  step, and ends it by releasing it without. Decoupled, it answers through
  the request's response sender, any number of responses a step; the state
  outputs travel in those responses and are taken out before the client sees
  them. Not decoupled, it returns None for a rescheduled request and the
  response when the sequence ends.
- a tensor step model (ONNX, TorchScript) goes on until its
  ``inferd.iterative_end_output`` output is nonzero. Decoupled, each step's
  outputs are one response (the last one final); otherwise the last step's
  outputs are the response.
- a request's ``max_tokens`` parameter ends its sequence after that many
  steps, whatever the model says; a cancelled request (its client went away)
  leaves at its instance's next step.
- a decoupled sequence whose client has not read its stream's bound
  (``--stream-max-responses`` / ``--stream-max-bytes``, the request's
  :class:`~inferd.streaming.ResponseSink` limits) is paused: it takes no step,
  keeping its slot and its state, while the other rows of its instance go on;
  the sink resumes it as soon as its client reads below the bound. A client that
  reads nothing for ``--stream-stall-timeout`` (or past the request's deadline)
  ends it there, RESOURCE_EXHAUSTED (DEADLINE_EXCEEDED), as a model held back
  by a stalled client is ended on the other paths: its slot is then free for
  the sequences waiting for one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import threading
from functools import partial
from typing import Any, Callable

import numpy as np

from inferd.backends.base import BatchResult, RequestInputs
from inferd.clock import Clock
from inferd.config._sequence import SequencePolicy
from inferd.errors import DeadlineExceeded, InferdError, InvalidArgument, ModelExecutionError, Unavailable
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import Completion, PumpedScheduler, run_task
from inferd.scheduling.instances import InstanceWorker
from inferd.scheduling.iterative_queue import CANCELLED, ENDED, LEFT, WAITING, IterativeQueue, IterSeq
from inferd.scheduling.sequence import FLAG_START, SequenceControls, SequenceId, _shape_key, sequence_params
from inferd.streaming import ResponseSink, StreamEvent, event_bytes
from inferd.types import InferenceRequest

log = logging.getLogger(__name__)

MAX_TOKENS = "max_tokens"
STALLED, DEADLINE = "stalled", "deadline"  # why a paused sequence may run out of time


def max_tokens(model: str, parameters: dict[str, Any]) -> int:
    """The request's ``max_tokens`` (0 when absent); InvalidArgument if malformed."""
    value = parameters.get(MAX_TOKENS)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"model '{model}': parameter '{MAX_TOKENS}' must be an integer >= 1, got {value!r}")
    return value


class _RowSink:
    """Stands between a Python model's response sender and the client's sink
    for one sequence: keeps the state outputs each step sends, passes the rest on.

    While its step runs (``held``), what the model sends waits here and the
    driver hands it to the client when the step is back on the loop: the
    model's thread then never wakes the loop once per response, and the loop's
    work on a step's responses overlaps the next step's. ``put`` is called on
    the instance's thread; ``captured``, ``take`` and ``deliver`` are used on the loop
    once the execution returned. A step that sends as many responses as the
    client's stream may hold has them passed on from its thread, which then
    waits for the client as a model does on the other paths: what is held here
    stays within the stream's bound."""

    __slots__ = ("client", "state_outputs", "captured", "final", "held", "_held_bytes", "_lock")

    def __init__(self, client: Any, state_outputs: frozenset[str]) -> None:
        self.client = client
        self.state_outputs = state_outputs
        self.captured: dict[str, np.ndarray] = {}
        self.final = False  # the model sent its final response
        self.held: list[StreamEvent] | None = None  # a list while a step runs
        self._held_bytes = 0
        self._lock = threading.Lock()

    def put(self, event: StreamEvent) -> None:
        outputs = event.outputs
        if outputs is not None and self.state_outputs:
            for name in self.state_outputs & outputs.keys():
                self.captured[name] = outputs.pop(name)  # the backend already copied it
            if not outputs:
                if not event.final and event.error is None:
                    return  # a response that only carried state
                event = StreamEvent(error=event.error, final=event.final)
        if event.final:
            self.final = True
        with self._lock:
            held = self.held
            if held is None:
                flush = [event]  # sent after its step, from a thread of the model's own
            else:
                held.append(event)
                self._held_bytes += event_bytes(event)
                limits = self.client.limits
                if len(held) < limits.max_responses and self._held_bytes < limits.max_bytes:
                    return
                flush, self.held, self._held_bytes = held, [], 0
        for one in flush:
            self.client.put(one)

    def on_cancel(self, callback: Any) -> None:
        """The client's sink's (a model host tells its model when the client goes)."""
        watch = getattr(self.client, "on_cancel", None)
        if watch is not None:
            watch(callback)

    def hold(self) -> None:
        """Its step is about to run."""
        self.held = []
        self._held_bytes = 0

    def take(self) -> list[StreamEvent]:
        """On the loop, when the step is back: what it sent (from now on, sends go straight on)."""
        with self._lock:
            held, self.held = self.held, None
        return held or []

    def deliver(self, events: list[StreamEvent]) -> None:
        """Hand a step's responses to the client's sink, past its bound if need be: the step
        ran because the stream had room, and the driver pauses the sequence while it has none."""
        for event in events:
            self.client.put(event, paced=True)


class _Job:
    __slots__ = ("request", "future", "enqueued", "sink", "rows", "state", "last", "error", "final_sent")

    def __init__(self, request: InferenceRequest, future: asyncio.Future, enqueued: float, sink: Any) -> None:
        self.request = request
        self.future = future
        self.enqueued = enqueued
        self.sink = sink  # the client's ResponseSink (decoupled models), else None
        self.rows: _RowSink | None = None  # a Python decoupled model's sender writes here
        self.state: dict[str, np.ndarray] | None = None  # implicit state, by state input name
        self.last: dict[str, np.ndarray] | None = None  # a non-decoupled model's latest outputs
        self.error: InferdError | None = None
        self.final_sent = False


class IterativeScheduler(PumpedScheduler):
    policy: SequencePolicy

    def __init__(
        self,
        model: str,
        policy: SequencePolicy,
        workers: list[InstanceWorker],
        output_names: list[str],
        stats: ModelStats,
        clock: Clock | None = None,
        *,
        decoupled: bool = False,
        end_output: str = "",
        priority_levels: int = 0,
        default_priority_level: int = 0,
    ) -> None:
        super().__init__(model, policy, workers, output_names, stats, clock)
        self._busy = [False] * len(workers)
        # direct: run once minimum_slot_utilization of the slots are ready; oldest:
        # once full or at a preferred size; both: or once the oldest waited the delay.
        need = (math.ceil(policy.minimum_slot_utilization * policy.slots_per_instance - 1e-9)
                if policy.strategy == "direct" else policy.max_rows)
        self._queue = IterativeQueue(len(workers), policy.slots_per_instance, policy.max_rows,
                                     need=need, delay_s=policy.max_queue_delay_s,
                                     preferred=policy.preferred_batch_sizes)
        self._python = bool(getattr(workers[0].instance, "wants_requests", False))
        self._decoupled = decoupled
        self._end_output = end_output
        self._levels = priority_levels
        self._default_level = default_priority_level or 1
        self._state_outputs = frozenset(s.output for s in policy.states)
        self._outputs = list(output_names) + [s.output for s in policy.states if s.output not in output_names]
        self._controls = SequenceControls(policy)
        self._keys = itertools.count(1)
        self._running: dict[Any, IterSeq] = {}  # sequence id -> its sequence, from admission to leaving

    # -- Scheduler -------------------------------------------------------------------

    def active_sequences(self) -> int:
        return self._queue.active()

    def paused_sequences(self) -> int:
        """Sequences holding a slot but taking no step: their clients have not read their streams' bound."""
        return self._queue.paused()

    @property
    def stream_pauses(self) -> int:
        """Times a sequence was paused for its client, since the model loaded."""
        return self._queue.pauses

    @property
    def background_over_foreground(self) -> int:
        """Steps that ran batch-job rows while interactive work waited for a slot."""
        return self._queue.background_over_foreground

    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """:meth:`Scheduler.submit`: a whole sequence (many steps) per request, run by a task."""
        return run_task(self._run(request, rows), completion)

    async def _run(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        if self._stopped:
            raise Unavailable(f"model '{self.model}' is unloading and takes no new requests")
        if rows != 1:
            raise InvalidArgument(
                f"inference request to model '{self.model}' must specify batch-size 1 due to requirements "
                "of sequence batcher"
            )
        limit = max_tokens(self.model, request.parameters)
        if not limit and not self._python and not self._end_output:
            raise InvalidArgument(
                f"model '{self.model}' names no end output (parameter inferd.iterative_end_output), so a request "
                f"must set parameter '{MAX_TOKENS}' to say when its sequence ends")
        key = self._sequence_key(request)
        request.correlation_id = key
        request.flags = FLAG_START
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        now = self._clock.now()
        job = _Job(request, future, now, request.responder if self._decoupled else None)
        if self._decoupled and self._python:
            job.rows = request.responder = _RowSink(job.sink, self._state_outputs)
        seq = IterSeq(key, level=self._level(request.priority), background=request.background,
                      shape_key=None if self._python else _shape_key(request.inputs), max_steps=limit,
                      payload=job)
        self._running[key] = seq
        self._queue.admit(seq, now)
        self._inflight.enter(request.background)
        self._schedule_pump(loop)
        try:
            return await future
        except asyncio.CancelledError:
            if self._queue.cancel(seq):
                self._schedule_pump(loop)
            raise
        finally:
            if seq.state in (WAITING, LEFT) and self._running.get(key) is seq:
                del self._running[key]  # it left before ever joining a step
            self._inflight.leave(request.background)

    def _sequence_key(self, request: InferenceRequest) -> SequenceId:
        raw = request.parameters.get("sequence_id")
        if raw is None or raw == 0 or raw == "":
            generated = next(self._keys)
            while generated in self._running:
                generated = next(self._keys)
            return generated
        key, start, _ = sequence_params(self.model, request.parameters)
        if not start:
            raise InvalidArgument(
                f"inference request for sequence {key} to model '{self.model}' must specify the START flag on the "
                "first request of the sequence")
        if key in self._running:
            raise InvalidArgument(
                f"model '{self.model}': sequence {key} is already running; with iterative_sequence each request "
                "is a whole sequence, so give each its own sequence_id (or none)")
        if isinstance(key, str) and self.policy.corrid_numeric:
            raise InvalidArgument(f"model '{self.model}': sequence id '{key}' is a string, but the CORRID control "
                                  "input holds integers; send an integer sequence_id")
        return key

    def _level(self, priority: int) -> int:
        if not self._levels:
            return 1
        return priority if 0 < priority <= self._levels else self._default_level

    # -- driving the queue ------------------------------------------------------------

    def _pump(self) -> None:
        """One decision: free instances drop, admit and maybe start a step each."""
        self._pump_scheduled = False
        if self._pumping:
            return
        self._pumping = True
        try:
            loop = asyncio.get_running_loop()
            now = self._clock.now()
            step = self._queue.step(now, [i for i, busy in enumerate(self._busy) if not busy])
            for seq in step.left:
                self._leave(seq, CANCELLED)
            for seq in step.expired:
                self._expired(seq)
            for instance, rows in step.batches:
                self._dispatch(instance, rows, now, loop)
            if any(not self._busy[i] for i, _ in step.batches):
                # An inline instance already finished its step: take the next one on
                # the next loop turn, so arrivals can join it and the loop serves others.
                self._schedule_pump(loop)
            else:
                self._alarm.arm(step.wake_at)
        finally:
            self._pumping = False

    def _dispatch(self, instance: int, rows: list[IterSeq], now: float, loop: asyncio.AbstractEventLoop) -> None:
        self._busy[instance] = True
        inputs = [self._row(seq, now) for seq in rows]
        self.workers[instance].run(inputs, self._outputs, lambda w, result: self._done(instance, rows, result), loop)

    def _row(self, seq: IterSeq, now: float) -> dict[str, np.ndarray]:
        job: _Job = seq.payload
        if job.rows is not None:
            job.rows.hold()
        first = seq.steps == 0
        if first:
            self._stats.record_queue(int((now - job.enqueued) * 1e9))
        request = job.request
        request.flags = FLAG_START if first else 0  # Triton: neither START nor END once rescheduled
        row: dict[str, np.ndarray] = RequestInputs(request) if self._python else dict(request.inputs)
        # START on the first step only; END never (the model or max_tokens ends a sequence); READY always.
        self._controls.fill(row, seq.key, start=first, end=False, state=None if first else job.state)
        return row

    def _done(self, instance: int, rows: list[IterSeq], result: BatchResult | BaseException) -> None:
        self._busy[instance] = False
        if isinstance(result, BatchResult):
            t = result.times
            self._stats.record_execution(len(rows), len(rows), t.input_ns, t.infer_ns, t.output_ns)
            outputs: list[Any] = result.outputs
            again = result.reschedule
        else:
            error = result if isinstance(result, InferdError) else ModelExecutionError(
                f"model '{self.model}' failed to execute: {type(result).__name__}: {result}")
            outputs, again = [error] * len(rows), None
        ended = []
        held: list[tuple[_RowSink, list[StreamEvent]]] = []
        for i, seq in enumerate(rows):
            out = outputs[i] if i < len(outputs) else ModelExecutionError(
                f"model '{self.model}' returned {len(outputs)} responses for a step of {len(rows)} rows")
            ended.append(self._absorb(seq, out, bool(again and again[i])))
            sink = seq.payload.rows
            if sink is not None:
                held.append((sink, sink.take()))
        now = self._clock.now()
        left = self._queue.complete(instance, rows, ended, now)
        if self._decoupled:
            self._pause_behind(rows, held, now)
        if not self._pumping:
            self._pump()  # the next step starts before this one's responses go out
        for sink, events in held:
            sink.deliver(events)
        for seq, reason in left:
            self._leave(seq, reason)

    def _absorb(self, seq: IterSeq, out: Any, rescheduled: bool) -> bool:
        """Take in one row's step: keep its state, pass its outputs on. True if the sequence ends."""
        job: _Job = seq.payload
        if isinstance(out, BaseException):
            job.error = out if isinstance(out, InferdError) else ModelExecutionError(
                f"model '{self.model}': {type(out).__name__}: {out}")
            return True
        if self._python:
            ended = not rescheduled or (job.rows is not None and job.rows.final)
            if job.rows is not None:
                out = job.rows.captured
                job.rows.captured = {}
        else:
            ended = self._end_output != "" and bool(np.any(out.get(self._end_output, 0)))
        if self._state_outputs and not ended:
            missing = sorted(self._state_outputs - out.keys())
            if missing:
                job.error = ModelExecutionError(
                    f"model '{self.model}' did not produce state output(s) {missing} for sequence {seq.key} "
                    f"in step {seq.steps + 1}" + (" (a decoupled Python model sends them in a response of the step)"
                                                  if job.rows is not None else ""))
                return True
            # The Python backend copied what its model sent; a tensor model's outputs are its own.
            job.state = {s.input: out[s.output] if job.rows is not None else np.array(out[s.output], copy=True)
                         for s in self.policy.states}
        if job.rows is not None:
            return ended  # the model sent its responses itself
        client = {k: v for k, v in out.items() if k not in self._state_outputs}
        if job.sink is None:
            if client or not self._python:
                job.last = client
            return ended
        last = ended or seq.cancelled or (seq.max_steps > 0 and seq.steps + 1 >= seq.max_steps)
        if not seq.cancelled:
            job.sink.put(StreamEvent(outputs=client, final=last), paced=True)  # paused at its bound: _pause_behind
            job.final_sent = last
        return ended

    # -- a client behind its stream: pause, resume, run out -------------------------------

    def _pause_behind(self, rows: list[IterSeq], held: list[tuple[_RowSink, list[StreamEvent]]],
                      now: float) -> None:
        """After a step: pause each row that goes on while its client's stream is at its bound
        (counting the responses of this step still to be handed over); its sink resumes it."""
        waiting = {id(sink): events for sink, events in held}
        loop = asyncio.get_running_loop()
        for seq in rows:
            if seq.state == LEFT:
                continue
            job: _Job = seq.payload
            sink = job.sink
            if not isinstance(sink, ResponseSink):
                continue
            events = waiting.get(id(job.rows), ())
            responses, nbytes = len(events), sum(map(event_bytes, events))
            # The callback is made only at the bound, and the sink drops it once called, cancelled or
            # ended, so no request's objects outlive it in a cycle.
            if not sink.at_bound(responses, nbytes) or not sink.resume_when_room(
                    responses, nbytes, partial(self._resume, seq, loop)):
                continue
            until, reason = now + sink.limits.stall_seconds, STALLED
            deadline = job.request.deadline
            if deadline is not None and deadline < until:
                until, reason = deadline, DEADLINE
            self._queue.pause(seq, until, reason)  # a resume after it left finds nothing to resume

    def _resume(self, seq: IterSeq, loop: asyncio.AbstractEventLoop) -> None:
        """``seq``'s client has read below its stream's bound (called on the loop by the sink's reader)."""
        if self._queue.resume(seq):
            self._schedule_pump(loop)

    def _expired(self, seq: IterSeq) -> None:
        """A paused sequence's client read nothing until its pause ran out: end its stream."""
        job: _Job = seq.payload
        sink = job.sink
        if seq.pause_reason == DEADLINE:
            job.error = DeadlineExceeded(
                f"model '{self.model}': sequence {seq.key}: the request's deadline passed while its stream "
                "was paused, its client not reading")
        else:
            limits = sink.limits
            job.error = sink.exhausted(
                f"and it read none for {limits.stall_seconds:g} s (--stream-stall-timeout), so the sequence "
                f"leaves after {seq.steps} steps")
        self._leave(seq, ENDED)

    def _leave(self, seq: IterSeq, reason: str) -> None:
        """``seq`` left the batch: answer its client."""
        if self._running.get(seq.key) is seq:
            del self._running[seq.key]
        job: _Job = seq.payload
        future = job.future
        if future.done():
            return
        if job.error is not None:
            future.set_exception(job.error)
            return
        if reason == CANCELLED:
            future.cancel()
            return
        if job.sink is not None:
            # A Python model that ended its sequence sends its own final response
            # (perhaps later, from another thread); otherwise end the stream here.
            if not job.final_sent and not (reason == ENDED and job.rows is not None):
                job.sink.put(StreamEvent(final=True))
            future.set_result({})
            return
        if job.last is None:
            future.set_exception(ModelExecutionError(
                f"model '{self.model}': sequence {seq.key} reached {MAX_TOKENS} ({seq.max_steps}) before the model "
                "answered; a model that is not decoupled answers once, when it ends the sequence"))
            return
        future.set_result(job.last)

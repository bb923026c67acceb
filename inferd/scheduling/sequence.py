"""Stateful sequences: Triton's sequence batcher (``sequence_batching``).

A client tags each request of a sequence with a sequence id (the request
parameters ``sequence_id``, ``sequence_start``, ``sequence_end``, as Triton
and tritonclient send them; uint64 or string). Every request of a sequence
runs on the same instance, one at a time, in arrival order.

Each instance has a number of *slots*; a sequence holds one from its START
until its END (or until it stays idle for ``max_sequence_idle_microseconds``);
sequences that find no free slot wait in a backlog, oldest first, and take the
next slot released.

- ``direct``: an instance has ``max_batch_size`` slots (1 without batching)
  and a batch row per slot: a batch carries rows 0..k for the highest slot k
  with a ready request, shaped as the request of the lowest ready slot; rows
  with nothing to run, or with a request shaped otherwise, are filler (zeros,
  READY false), so a model may keep per-slot state by row. Fillers are rows of
  the batch (its size in the statistics, as Triton reports it), not
  inferences. It runs as soon as ``minimum_slot_utilization`` of the slots
  have a request ready, whatever its shapes (at once with the default 0), or
  once the oldest ready request waited ``max_queue_delay_microseconds``.
- ``oldest``: an instance has ``max_candidate_sequences`` slots; a batch
  takes the oldest ready request of up to ``max_batch_size`` of them (one per
  sequence), run when full, when a ``preferred_batch_size`` is reached, or
  once the oldest waited ``max_queue_delay_microseconds``.

Control inputs (START, END, READY, CORRID) and implicit state (``state``: the
batcher keeps each sequence's state tensors and feeds them back; START resets
them to ``initial_state``) are added to each row's inputs by the driver.

Split as the dynamic batcher is: :class:`SequenceQueue` (sequence_queue.py)
is the pure decision (slots, backlog, idle release, which rows run next),
stepped with explicit times and unit-tested with made-up ones;
:class:`SequenceScheduler` is the asyncio driver that owns the instance
workers, builds the tensors and keeps the states.
"""

from __future__ import annotations

import asyncio
import logging
import os
from functools import partial
from typing import Any, Callable, Iterable

import numpy as np

from inferd.backends.base import BatchResult, RequestInputs
from inferd.clock import Clock
from inferd.config import CORRID, END, READY, START, SequencePolicy
from inferd.errors import InferdError, InvalidArgument, ModelExecutionError, Unavailable
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import Completion, PumpedScheduler
from inferd.scheduling.instances import InstanceWorker
from inferd.scheduling.sequence_queue import (
    BACKLOG_DELAY_ENV, DELAY_ENV, DelayHooks, Row, SeqItem, Sequence, SequenceId, SequenceQueue,
)
from inferd.types import InferenceRequest

log = logging.getLogger(__name__)

FLAG_START, FLAG_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
_UINT64 = 1 << 64


# -- request parameters -----------------------------------------------------------------


def sequence_params(model: str, parameters: dict[str, Any]) -> tuple[SequenceId, bool, bool]:
    """(sequence id, start, end) from a request's parameters; InvalidArgument if absent or malformed."""
    raw = parameters.get("sequence_id")
    if isinstance(raw, bool) or (raw is not None and not isinstance(raw, (int, str))):
        raise InvalidArgument(
            f"model '{model}': invalid value type for 'sequence_id' parameter, expected int64_param, "
            f"uint64_param or string_param, got {raw!r}"
        )
    if raw is None or raw == 0 or raw == "":
        raise InvalidArgument(
            f"inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
        )
    key: SequenceId = raw % _UINT64 if isinstance(raw, int) else raw
    return key, _flag(model, parameters, "sequence_start"), _flag(model, parameters, "sequence_end")


def _flag(model: str, parameters: dict[str, Any], name: str) -> bool:
    value = parameters.get(name, False)
    if not isinstance(value, bool):
        raise InvalidArgument(
            f"model '{model}': invalid value type for '{name}' parameter, expected bool_param, got {value!r}"
        )
    return value


# -- the asyncio driver ------------------------------------------------------------------------


class _Job:
    """A queued request and its completion (None once answered or withdrawn: it has left the in-flight count)."""

    __slots__ = ("request", "completion", "enqueued")

    def __init__(self, request: InferenceRequest, completion: Completion, enqueued: float) -> None:
        self.request = request
        self.completion: Completion | None = completion
        self.enqueued = enqueued


class _Batch:
    __slots__ = ("rows", "instance")

    def __init__(self, rows: list[Row], instance: int) -> None:
        self.rows = rows
        self.instance = instance


class SequenceScheduler(PumpedScheduler):
    policy: SequencePolicy

    def __init__(
        self,
        model: str,
        policy: SequencePolicy,
        workers: list[InstanceWorker],
        output_names: list[str],
        stats: ModelStats,
        clock: Clock | None = None,
        delay: DelayHooks | None = None,
    ) -> None:
        """``delay``: Triton's test hooks; None reads them from the environment."""
        super().__init__(model, policy, workers, output_names, stats, clock)
        self._busy = [False] * len(workers)
        if delay is None:
            delay = DelayHooks.from_env(os.environ)
        if delay.active:
            log.info("model '%s': %s=%d, %s=%d: each instance waits for that many queued requests first",
                     model, DELAY_ENV, delay.count, BACKLOG_DELAY_ENV, delay.backlog)
        self._controls = SequenceControls(policy)
        self._queue = SequenceQueue(policy, len(workers), model, delay=delay,
                                    initial_state_key=_state_key(self._controls.initial.values()))
        self._state_outputs = {s.output for s in policy.states}
        self._outputs = list(output_names) + [s.output for s in policy.states if s.output not in output_names]

    # -- Scheduler ---------------------------------------------------------

    def active_sequences(self) -> int:
        return self._queue.active()

    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """:meth:`Scheduler.submit`: the request joins its sequence's queue; the batch it runs in
        resolves ``completion``. In flight until then, or until its caller withdraws it."""
        if self._stopped:
            raise Unavailable(f"model '{self.model}' is unloading and takes no new requests")
        if rows != 1:
            raise InvalidArgument(
                f"inference request to model '{self.model}' must specify batch-size 1 due to requirements "
                "of sequence batcher"
            )
        key, start, end = sequence_params(self.model, request.parameters)
        if isinstance(key, str) and self.policy.corrid_numeric:
            raise InvalidArgument(
                f"model '{self.model}': sequence id '{key}' is a string, but the CORRID control input "
                f"'{self._controls.corrid_input}' holds integers; send an integer sequence_id"
            )
        request.correlation_id = key
        request.flags = (FLAG_START if start else 0) | (FLAG_END if end else 0)
        now = self._clock.now()
        item = SeqItem(key, start, end, _shape_key(request.inputs), _Job(request, completion, now))
        seq = self._queue.admit(item, now)  # raises for a sequence that was never started
        self._inflight.enter(request.background)
        self._schedule_pump(asyncio.get_running_loop())
        return partial(self._withdraw, item, seq)

    def _withdraw(self, item: SeqItem, seq: Sequence) -> None:
        """A caller's cancel: the request leaves now, dropped from its sequence's queue if it has not
        started; one executing runs on, and its batch answers nobody for it."""
        if self._inflight.withdraw(item.payload) and self._queue.cancel(item, seq, self._clock.now()):
            self._schedule_pump(asyncio.get_running_loop())

    # -- driving the queue ---------------------------------------------------

    def _pump(self) -> None:
        self._pump_scheduled = False
        if self._pumping:
            return
        self._pumping = True
        try:
            loop = asyncio.get_running_loop()
            while True:
                now = self._clock.now()
                step = self._queue.step(now, [i for i, busy in enumerate(self._busy) if not busy])
                for seq in step.released:
                    log.info("model '%s': sequence %s released after %d us without a request",
                             self.model, seq.key, self.policy.idle_us)
                if not step.batches:
                    self._alarm.arm(step.wake_at)
                    return
                for instance, rows in step.batches:
                    self._dispatch(instance, rows, now, loop)
        finally:
            self._pumping = False

    def _dispatch(self, instance: int, rows: list[Row], now: float, loop: asyncio.AbstractEventLoop) -> None:
        worker = self.workers[instance]
        self._busy[instance] = True
        wants_requests = getattr(worker.instance, "wants_requests", False)
        inputs: list[dict[str, np.ndarray] | None] = []
        template: dict[str, np.ndarray] | None = None
        for seq, item in rows:
            if seq is None or item is None:
                inputs.append(None)
                continue
            job = item.payload
            self._stats.record_queue(int((now - job.enqueued) * 1e9))
            row: dict[str, np.ndarray] = RequestInputs(job.request) if wants_requests else dict(job.request.inputs)
            self._controls.fill(row, item.key, start=item.start, end=item.end,
                                state=None if item.start else seq.state)
            inputs.append(row)
            if template is None:
                template = row
        assert template is not None
        filled = [self._filler(template) if row is None else row for row in inputs]
        batch = _Batch(rows, instance)
        worker.run(filled, self._outputs, lambda w, result: self._done(batch, result), loop)

    def _filler(self, template: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A direct-strategy row for a slot with nothing to run: zeros (empty strings) shaped as the
        batch's first real row, its implicit state included, READY false."""
        row = {name: np.full(a.shape, b"", dtype=np.object_) if a.dtype.kind == "O" else np.zeros(a.shape, a.dtype)
               for name, a in template.items()}
        self._controls.fill(row, 0, start=False, end=False, ready=False, state=row)
        return row

    def _done(self, batch: _Batch, result: BatchResult | BaseException) -> None:
        self._busy[batch.instance] = False
        real = [i for i, (_, item) in enumerate(batch.rows) if item is not None]
        if isinstance(result, BatchResult):
            t = result.times
            # The batch size counts the filler rows, as the model sees them (and as Triton reports it).
            self._stats.record_execution(len(batch.rows), len(real), t.input_ns, t.infer_ns, t.output_ns,
                                         filler_rows=len(batch.rows) - len(real))
            self._stats.record_memory(result.memory_delta)
            outputs: list[Any] = result.outputs
        else:
            error = result if isinstance(result, InferdError) else ModelExecutionError(
                f"model '{self.model}' failed to execute: {type(result).__name__}: {result}")
            outputs = [error] * len(batch.rows)
        for i in real:
            seq, item = batch.rows[i]
            assert seq is not None and item is not None
            out = outputs[i] if i < len(outputs) else ModelExecutionError(
                f"model '{self.model}' returned {len(outputs)} responses for a batch of {len(batch.rows)} rows")
            if isinstance(out, dict) and self._state_outputs:
                out = self._keep_state(seq, out)
            self._inflight.answer(item.payload, out)
        self._queue.complete(batch.rows, self._clock.now())
        if not self._pumping:
            self._pump()

    def _keep_state(self, seq: Sequence, out: dict[str, np.ndarray]) -> dict[str, np.ndarray] | InferdError:
        missing = [s.output for s in self.policy.states if s.output not in out]
        if missing:
            return ModelExecutionError(
                f"model '{self.model}' did not produce state output(s) {missing} for sequence {seq.key}")
        seq.state = {s.input: np.array(out[s.output], copy=True) for s in self.policy.states}
        seq.state_key = _state_key(seq.state.values())
        return {k: v for k, v in out.items() if k not in self._state_outputs}


class SequenceControls:
    """The inputs a sequence batcher adds to each row: the control inputs (START,
    END, READY, CORRID) and the implicit state (``initial_state`` or the state given)."""

    __slots__ = ("lead", "flags", "corrid", "initial")

    def __init__(self, policy: SequencePolicy) -> None:
        self.lead = (1,) if policy.max_batch_size > 0 else ()
        self.flags: list[tuple[str, str, np.ndarray, np.ndarray]] = []
        self.corrid: tuple[str, np.dtype] | None = None
        for c in policy.controls:
            if c.kind == CORRID:
                self.corrid = (c.input, c.datatype.numpy)
            else:
                shape = self.lead + (1,)
                self.flags.append((c.kind, c.input, _const(c.false, c.datatype.numpy, shape),
                                   _const(c.true, c.datatype.numpy, shape)))
        self.initial = {s.input: _frozen(s.initial.reshape(self.lead + s.initial.shape)) for s in policy.states}

    @property
    def corrid_input(self) -> str:
        return self.corrid[0] if self.corrid is not None else ""

    def fill(self, row: dict[str, np.ndarray], key: SequenceId, *, start: bool, end: bool, ready: bool = True,
             state: dict[str, np.ndarray] | None = None) -> None:
        """Add the controls and the state (``initial_state`` when ``state`` is None) to ``row``."""
        for kind, name, false, true in self.flags:
            on = start if kind == START else end if kind == END else ready
            row[name] = true if on else false
        if self.corrid is not None:
            row[self.corrid[0]] = _corrid_array(key, self.corrid[1], self.lead)
        for name, initial in self.initial.items():
            row[name] = initial if state is None else state[name]


def _const(value: object, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    return _frozen(np.full(shape, value, dtype=dtype))


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _corrid_array(key: SequenceId, dtype: np.dtype, lead: tuple[int, ...]) -> np.ndarray:
    shape = lead + (1,)
    if dtype.kind == "O":
        out = np.empty(shape, dtype=np.object_)
        out.flat[0] = key.encode() if isinstance(key, str) else str(key).encode()
        return out
    # uint64 ids wrap into the control's integer type, as Triton's casts do.
    return np.full(shape, int(key) % _UINT64, dtype=np.uint64).astype(dtype)


def _state_key(states: Iterable[np.ndarray]) -> tuple:
    """The shapes of a row's implicit state tensors (as fed: with the row's batch dimension)."""
    return tuple(np.shape(a) for a in states)


def _shape_key(inputs: dict[str, np.ndarray]) -> tuple:
    return tuple((name, a.shape) for name, a in inputs.items())


def sequence_sample(policy: SequencePolicy) -> dict[str, np.ndarray]:
    """One row of control and state inputs, for calibrating an instance at load."""
    lead = (1,) if policy.max_batch_size > 0 else ()
    out: dict[str, np.ndarray] = {}
    for c in policy.controls:
        if c.kind == CORRID:
            out[c.input] = _corrid_array(1, c.datatype.numpy, lead)
        else:
            out[c.input] = np.full(lead + (1,), c.true if c.kind == READY else c.false, dtype=c.datatype.numpy)
    for s in policy.states:
        out[s.input] = s.initial.reshape(lead + s.initial.shape)
    return out

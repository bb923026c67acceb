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

Split as the dynamic batcher is: :class:`SequenceQueue` is the pure decision
(slots, backlog, idle release, which rows run next), stepped with explicit
times and unit-tested with made-up ones; :class:`SequenceScheduler` is the
asyncio driver that owns the instance workers, builds the tensors and keeps
the states.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import os
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Sequence as Seq

import numpy as np

from inferd.backends.base import BatchResult, RequestInputs
from inferd.clock import Clock
from inferd.config import CORRID, END, READY, START, SequencePolicy
from inferd.errors import InferdError, InvalidArgument, ModelExecutionError, Unavailable
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import PumpedScheduler
from inferd.scheduling.instances import InstanceWorker
from inferd.types import InferenceRequest

log = logging.getLogger(__name__)

FLAG_START, FLAG_END = 1, 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START / _END
_UINT64 = 1 << 64
RELEASED_MEMORY = 4096  # idle-released sequence ids remembered for a clear error

SequenceId = int | str
QUEUED, DONE = 0, 1


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


# -- the pure decision --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DelayHooks:
    """Triton's test hooks (read once, at load, from the environment): hold each instance's
    first batch until ``count`` requests are queued (TRITONSERVER_DELAY_SCHEDULER) and, for
    ``direct``, ``backlog`` in the backlog (TRITONSERVER_BACKLOG_DELAY_SCHEDULER), so that a test
    decides which requests share a batch instead of racing the batcher."""

    count: int = 0
    backlog: int = 0

    @property
    def active(self) -> bool:
        return self.count > 0  # as Triton: the backlog hook acts only with the delay hook

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DelayHooks:
        return cls(_env_count(env, DELAY_ENV), _env_count(env, BACKLOG_DELAY_ENV))


DELAY_ENV = "TRITONSERVER_DELAY_SCHEDULER"
BACKLOG_DELAY_ENV = "TRITONSERVER_BACKLOG_DELAY_SCHEDULER"


def _env_count(env: Mapping[str, str], name: str) -> int:
    raw = env.get(name, "").strip()
    try:
        return max(0, int(raw)) if raw else 0
    except ValueError:
        log.warning("%s=%r is not a count; the hook stays off", name, raw)
        return 0


class SeqItem:
    """One request of a sequence, waiting or dispatched."""

    __slots__ = ("key", "start", "end", "shape_key", "arrival", "state", "payload")

    def __init__(self, key: SequenceId, start: bool = False, end: bool = False, shape_key: Hashable = None,
                 payload: Any = None) -> None:
        self.key = key
        self.start = start
        self.end = end
        self.shape_key = shape_key  # requests with different input shapes never share a batch
        self.arrival = 0.0
        self.state = QUEUED
        self.payload = payload

    def __repr__(self) -> str:
        flags = ("S" if self.start else "") + ("E" if self.end else "")
        return f"SeqItem({self.key!r}{' ' + flags if flags else ''}, arrival={self.arrival})"


class Sequence:
    """One live sequence: its slot (or a place in the backlog) and its requests."""

    __slots__ = ("key", "serial", "instance", "slot", "queue", "running", "closed", "released", "last", "state",
                 "state_key")

    def __init__(self, key: SequenceId, serial: int, state_key: Hashable = None) -> None:
        self.key = key
        self.serial = serial
        self.instance: int | None = None
        self.slot: int | None = None
        self.queue: deque[SeqItem] = deque()
        self.running = False  # a request of it is executing
        self.closed = False  # its END arrived (or it was released): no request joins it any more
        self.released = False  # it gave its slot back (or left the backlog) for good
        self.last = 0.0  # last activity: an arrival or a completion
        self.state: Any = None  # the driver's: implicit state tensors
        # The shapes of its implicit state now (the driver's, after each request): a variable-size
        # state follows the model's outputs, and rows whose states differ cannot share a batch.
        self.state_key = state_key

    def head(self) -> SeqItem | None:
        q = self.queue
        while q and q[0].state != QUEUED:
            q.popleft()
        return q[0] if q else None

    def __repr__(self) -> str:
        return f"Sequence({self.key!r}, instance={self.instance}, slot={self.slot}, queued={len(self.queue)})"


Row = tuple[Sequence | None, SeqItem | None]  # (None, None): a direct-strategy filler row


@dataclass(slots=True)
class SeqStep:
    batches: list[tuple[int, list[Row]]] = field(default_factory=list)  # (instance, rows) to run now
    released: list[Sequence] = field(default_factory=list)  # released for idling
    wake_at: float | None = None  # step again at this time if nothing else happens first


class SequenceQueue:
    """Slots, backlog and idle release of one model's sequences, and what runs next."""

    def __init__(self, policy: SequencePolicy, instances: int, model: str = "", *,
                 initial_state_key: Hashable = None, delay: DelayHooks | None = None) -> None:
        if instances < 1:
            raise ValueError("a sequence queue needs at least one instance")
        self.policy = policy
        self.model = model
        self._initial_state_key = initial_state_key  # the state shapes a START runs with
        self._delay = delay or DelayHooks()
        # Triton's test hooks hold each instance until enough requests are queued, once.
        self._held = [self._delay.active] * instances
        n = policy.slots_per_instance
        self.slots: list[list[Sequence | None]] = [[None] * n for _ in range(instances)]
        self._free = [n] * instances
        self._sequences: dict[SequenceId, Sequence] = {}
        self._backlog: deque[Sequence] = deque()
        self._idle: list[tuple[float, int, Sequence]] = []  # (release at, serial, seq), lazily deleted
        self._released: OrderedDict[SequenceId, None] = OrderedDict()
        self._serial = itertools.count()
        self._queued = 0
        self._delay_s = policy.max_queue_delay_us / 1e6
        self._idle_s = policy.idle_us / 1e6
        self._need = max(1, math.ceil(policy.minimum_slot_utilization * n - 1e-9))

    def __len__(self) -> int:
        """Requests waiting (not yet dispatched)."""
        return self._queued

    def active(self) -> int:
        """Sequences started and not yet ended or released."""
        return len(self._sequences)

    def backlog(self) -> int:
        return sum(1 for s in self._backlog if not s.released and s.slot is None)

    def sequence(self, key: SequenceId) -> Sequence | None:
        return self._sequences.get(key)

    # -- admission -------------------------------------------------------------------

    def admit(self, item: SeqItem, now: float) -> Sequence:
        """Queue ``item`` on its sequence (a START creates it); InvalidArgument when
        the sequence is unknown and the request does not start one."""
        seq = self._sequences.get(item.key)
        if seq is None:
            if not item.start:
                raise self._missing_start(item.key)
            seq = Sequence(item.key, next(self._serial), self._initial_state_key)
            self._sequences[item.key] = seq
            self._released.pop(item.key, None)
            self._place(seq, now)
        # A START for a live sequence restarts it (Triton ends the previous one
        # early): it runs after what is queued, and the driver resets its state.
        item.arrival = now
        item.state = QUEUED
        seq.queue.append(item)
        seq.last = now
        self._queued += 1
        if item.end:
            seq.closed = True
            del self._sequences[item.key]
        return seq

    def _missing_start(self, key: SequenceId) -> InvalidArgument:
        message = (f"inference request for sequence {key} to model '{self.model}' must specify the START flag "
                   "on the first request of the sequence")
        if key in self._released:
            message += (f" (sequence {key} was released after being idle for longer than "
                        f"max_sequence_idle_microseconds, {self.policy.idle_us} us)")
        return InvalidArgument(message)

    def cancel(self, item: SeqItem, seq: Sequence, now: float) -> bool:
        """Drop a queued request (its client went away). True if it was queued."""
        if item.state != QUEUED:
            return False
        item.state = DONE
        self._queued -= 1
        self._settle(seq, now)
        return True

    # -- slots ---------------------------------------------------------------------------

    def _place(self, seq: Sequence, now: float) -> None:
        """A free slot on the instance with the most free slots, or the backlog."""
        best = max(range(len(self._free)), key=lambda i: (self._free[i], -i))
        if self._free[best] == 0:
            self._backlog.append(seq)
            return
        self._assign(seq, best, self.slots[best].index(None))

    def _assign(self, seq: Sequence, instance: int, slot: int) -> None:
        self.slots[instance][slot] = seq
        self._free[instance] -= 1
        seq.instance = instance
        seq.slot = slot

    def _release(self, seq: Sequence, now: float) -> None:
        """Give up ``seq``'s slot (a backlogged sequence takes it) or its backlog place."""
        if seq.released:
            return
        seq.released = True
        seq.closed = True
        if seq.slot is None:
            return  # in the backlog: skipped there from now on
        instance, slot = seq.instance, seq.slot
        assert instance is not None
        self.slots[instance][slot] = None
        self._free[instance] += 1
        seq.slot = None
        while self._backlog:
            waiting = self._backlog.popleft()
            if waiting.released:
                continue
            self._assign(waiting, instance, slot)
            self._settle(waiting, now)
            break

    def _settle(self, seq: Sequence, now: float) -> None:
        """``seq`` has nothing queued or running: release it if it ended, else start its idle clock."""
        if seq.released or seq.running or seq.head() is not None:
            return
        if seq.closed:
            self._release(seq, now)
        elif seq.slot is not None:
            heapq.heappush(self._idle, (seq.last + self._idle_s, seq.serial, seq))

    def _idle_entry_valid(self, at: float, seq: Sequence) -> bool:
        return (not seq.released and not seq.closed and not seq.running and seq.slot is not None
                and seq.last + self._idle_s == at and seq.head() is None)

    # -- the decision ---------------------------------------------------------------------

    def step(self, now: float, free: Iterable[int]) -> SeqStep:
        """Release idle sequences; then, for each free instance, maybe form a batch."""
        out = SeqStep()
        self._reap(now, out)
        decide = self._direct if self.policy.strategy == "direct" else self._oldest
        if self.policy.strategy == "direct" and any(self._held) and self._direct_delay_met():
            # Counted across every instance before any takes a batch: all are let go together,
            # as Triton's batcher threads each see the counts the others reported while waiting.
            self._held = [False] * len(self._held)
        for instance in free:
            if self._held[instance]:
                if self.policy.strategy == "direct" or len(self._ready(instance)) < self._delay.count:
                    continue
                self._held[instance] = False
            rows = decide(instance, now, out)
            if rows:
                self._take(rows, now)
                out.batches.append((instance, rows))
        idle = self._idle
        while idle and not self._idle_entry_valid(idle[0][0], idle[0][2]):
            heapq.heappop(idle)
        if idle:
            out.wake_at = idle[0][0] if out.wake_at is None else min(out.wake_at, idle[0][0])
        return out

    def _reap(self, now: float, out: SeqStep) -> None:
        idle = self._idle
        while idle and idle[0][0] <= now:
            at, _, seq = heapq.heappop(idle)
            if not self._idle_entry_valid(at, seq):
                continue
            if self._sequences.get(seq.key) is seq:
                del self._sequences[seq.key]
            self._released[seq.key] = None
            while len(self._released) > RELEASED_MEMORY:
                self._released.popitem(last=False)
            self._release(seq, now)
            out.released.append(seq)

    def _direct_delay_met(self) -> bool:
        """Triton's TRITONSERVER_DELAY_SCHEDULER / _BACKLOG_DELAY_SCHEDULER: ``direct`` holds its
        instances until the sequences in slots (on every instance) have ``count`` requests queued and
        the backlog ``backlog`` (when set); ``oldest`` holds each instance until it has ``count``
        sequences with a request ready (its own dynamic batcher's queue), checked in :meth:`step`."""
        backlog = sum(len(s.queue) for s in self._backlog if not s.released and s.slot is None)
        return self._queued - backlog >= self._delay.count and backlog >= self._delay.backlog

    def _ready(self, instance: int) -> list[tuple[int, Sequence, SeqItem]]:
        ready = []
        for slot, seq in enumerate(self.slots[instance]):
            if seq is not None and not seq.running:
                head = seq.head()
                if head is not None:
                    ready.append((slot, seq, head))
        return ready

    def _row_key(self, seq: Sequence, item: SeqItem) -> Hashable:
        """Rows share a batch only when their input and state shapes agree."""
        return item.shape_key, self._initial_state_key if item.start else seq.state_key

    def _later(self, out: SeqStep, when: float) -> None:
        out.wake_at = when if out.wake_at is None else min(out.wake_at, when)

    def _direct(self, instance: int, now: float, out: SeqStep) -> list[Row] | None:
        """Triton's direct batch: it waits only while fewer than ``minimum_slot_utilization`` of
        the slots have a request ready (whatever its shapes) and the oldest of them has waited less
        than ``max_queue_delay_microseconds``; it spans rows 0..the highest ready slot and takes its
        shapes from the lowest ready slot, every other row (nothing ready, or other shapes) a filler."""
        ready = self._ready(instance)  # in slot order
        if not ready:
            return None
        if len(ready) < self._need:
            due = min(head.arrival for _, _, head in ready) + self._delay_s
            if now < due:
                self._later(out, due)
                return None
        key = self._row_key(ready[0][1], ready[0][2])
        rows: list[Row] = [(None, None)] * (ready[-1][0] + 1)
        for slot, seq, head in ready:
            if self._row_key(seq, head) == key:
                rows[slot] = (seq, head)
        return rows

    def _oldest(self, instance: int, now: float, out: SeqStep) -> list[Row] | None:
        ready = self._ready(instance)
        if not ready:
            return None
        ready.sort(key=lambda r: (r[2].arrival, r[1].serial))
        first = ready[0][2]
        key = self._row_key(ready[0][1], first)
        max_rows = self.policy.max_rows
        chosen = [(seq, head) for _, seq, head in ready if self._row_key(seq, head) == key][:max_rows]
        if len(chosen) >= max_rows or now >= first.arrival + self._delay_s:
            return list(chosen)
        preferred = [p for p in self.policy.preferred_batch_sizes if p <= len(chosen)]
        if preferred:
            return list(chosen[:max(preferred)])
        self._later(out, first.arrival + self._delay_s)
        return None

    def _take(self, rows: list[Row], now: float) -> None:
        for seq, item in rows:
            if seq is None or item is None:
                continue
            popped = seq.queue.popleft()
            assert popped is item
            item.state = DONE
            self._queued -= 1
            seq.running = True
            if seq.closed and seq.head() is None:
                # Its END is on its way: the slot is free for the next batch (Triton's order).
                self._release(seq, now)

    def complete(self, rows: Seq[Row], now: float) -> None:
        """The batch of ``rows`` finished executing."""
        for seq, item in rows:
            if seq is None:
                continue
            seq.running = False
            seq.last = now
            self._settle(seq, now)


# -- the asyncio driver ------------------------------------------------------------------------


class _Job:
    __slots__ = ("request", "future", "enqueued")

    def __init__(self, request: InferenceRequest, future: asyncio.Future, enqueued: float) -> None:
        self.request = request
        self.future = future
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

    async def infer(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
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
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()
        now = self._clock.now()
        item = SeqItem(key, start, end, _shape_key(request.inputs), _Job(request, future, now))
        seq = self._queue.admit(item, now)  # raises for a sequence that was never started
        self._inflight.enter()
        self._schedule_pump(loop)
        try:
            return await future
        except asyncio.CancelledError:
            if self._queue.cancel(item, seq, self._clock.now()):
                self._schedule_pump(loop)
            raise
        finally:
            self._inflight.leave()

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
            future = item.payload.future
            if future.done():
                continue
            if isinstance(out, BaseException):
                future.set_exception(out)
            else:
                future.set_result(out)
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

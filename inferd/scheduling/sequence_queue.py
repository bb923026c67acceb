"""The pure decision of the sequence batcher: slots, backlog, idle release and which rows run
next, for both strategies (:mod:`inferd.scheduling.sequence` says what each does), and Triton's
delay hooks.

:class:`SequenceQueue` is stepped with explicit times (``admit``, ``step``, ``complete``,
``cancel``) and returns plain data (:class:`SeqStep`: the batches to run, the sequences released,
when to step again); nothing here waits, reads a clock or touches a tensor, so it is unit-tested
with made-up times. The driver, :class:`~inferd.scheduling.sequence.SequenceScheduler`, runs what
it decides.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Mapping, Sequence as Seq

from inferd.config import SequencePolicy
from inferd.errors import InvalidArgument

log = logging.getLogger(__name__)

RELEASED_MEMORY = 4096  # idle-released sequence ids remembered for a clear error

SequenceId = int | str
QUEUED, DONE = 0, 1


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
        self._delay_s = policy.max_queue_delay_s
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

"""The join/leave decision of continuous (iteration-level) batching.

Triton's ``sequence_batching { iterative_sequence: true }``: one request is a
whole sequence, and the model is called once per *step* with a row for every
sequence that takes part. Between two steps of an instance, sequences that
finished (or whose client went away) leave, and waiting ones join, so a batch
never waits for its longest member.

Nothing here awaits or reads a clock: the driver
(:mod:`inferd.scheduling.iterative`) calls :meth:`IterativeQueue.step` with
the current time and the instances that are free, runs the returned rows, and
reports each step back with :meth:`IterativeQueue.complete`.

- Each instance holds up to ``slots`` sequences (``max_batch_size`` for the
  ``direct`` strategy, ``max_candidate_sequences`` for ``oldest``); a sequence
  stays on its instance from its first step to its last (a model may keep
  per-sequence state of its own). Waiting sequences join an instance when it
  steps with a free slot, in (batch work last, priority level, arrival) order.
- A step takes up to ``max_rows`` of the instance's sequences that share a
  shape, in (batch work last, level, ready since, fewest steps) order, so with
  more sequences than rows they take turns; rows are given in the order the
  sequences joined. It runs once ``need`` rows are ready
  (a ``preferred`` size suffices) or the oldest ready row has waited
  ``delay_s``; with the defaults, at once.
- Batch-job work (``background``) never holds a slot that interactive work is
  waiting for: when an interactive sequence waits and the instance is full, a
  batch-job sequence is parked (its state stays with the scheduler) and
  resumes on the same instance when a slot is free again.
- A cancelled sequence leaves at the instance's next step (``IterStep.left``);
  one cancelled while its step runs leaves when the step completes.
- A sequence whose client has fallen behind is *paused* (:meth:`IterativeQueue.pause`):
  it keeps its slot, its state and its place, and takes no step until it is
  resumed, while the instance's other sequences go on stepping. A pause has an
  end (``until``): still paused then, the sequence leaves (``IterStep.expired``,
  with the reason it was paused with); cancelled, it leaves as any other.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterable, Sequence

WAITING, RESIDENT, RUNNING, LEFT = range(4)
ENDED, LIMIT, CANCELLED = "ended", "limit", "cancelled"


class IterSeq:
    """One iterative sequence: a client request run step after step."""

    __slots__ = ("key", "level", "background", "shape_key", "max_steps", "payload", "arrival", "serial",
                 "instance", "steps", "ready_at", "state", "cancelled", "paused_until", "pause_reason")

    def __init__(self, key: Any = None, *, level: int = 1, background: bool = False, shape_key: Hashable = None,
                 max_steps: int = 0, payload: Any = None) -> None:
        self.key = key
        self.level = level  # lower runs first
        self.background = background  # batch-job work: only on capacity interactive work leaves idle
        self.shape_key = shape_key  # rows of one step share it
        self.max_steps = max_steps  # 0: until the model ends it
        self.payload = payload
        self.arrival = 0.0
        self.serial = 0
        self.instance: int | None = None  # set at its first step, kept to its last
        self.steps = 0  # steps completed
        self.ready_at = 0.0  # since when it waits for its next step
        self.state = WAITING
        self.cancelled = False
        self.paused_until: float | None = None  # paused: takes no step, and leaves if still paused then
        self.pause_reason = ""  # why it leaves if its pause runs out

    def order(self) -> tuple[bool, int, float, int, int]:
        return (self.background, self.level, self.ready_at, self.steps, self.serial)

    def __repr__(self) -> str:
        return f"IterSeq({self.key!r}, steps={self.steps}, state={self.state}, instance={self.instance})"


@dataclass(slots=True)
class IterStep:
    batches: list[tuple[int, list[IterSeq]]] = field(default_factory=list)  # (instance, rows) to run now
    joined: list[IterSeq] = field(default_factory=list)  # took a slot for the first time in this step
    left: list[IterSeq] = field(default_factory=list)  # cancelled, left without running again
    expired: list[IterSeq] = field(default_factory=list)  # paused past their pause's end: left (pause_reason)
    wake_at: float | None = None  # step again then, if nothing else happens first


class IterativeQueue:
    """The sequences of one model: waiting, resident on an instance, or parked."""

    def __init__(self, instances: int, slots: int, max_rows: int, *, need: int = 1, delay_s: float = 0.0,
                 preferred: Sequence[int] = ()) -> None:
        if instances < 1 or slots < 1 or max_rows < 1:
            raise ValueError(f"instances, slots and max_rows must be >= 1, got {instances}, {slots}, {max_rows}")
        self.slots = slots
        self.max_rows = max_rows
        self._need = max(1, need)
        self._delay_s = delay_s
        self._preferred = sorted(set(preferred))
        self._resident: list[list[IterSeq]] = [[] for _ in range(instances)]
        self._busy = [False] * instances
        self._waiting: list[tuple[tuple[bool, int, float, int, int], IterSeq]] = []  # new sequences, lazily deleted
        self._parked: list[list[IterSeq]] = [[] for _ in range(instances)]  # batch work waiting for its instance
        self._serial = itertools.count()
        self._queued = 0  # waiting or parked, not cancelled
        # Steps that ran batch-job rows while interactive work waited for a slot:
        # the accounting behind "batch work runs on idle capacity only".
        self.background_over_foreground = 0
        self.pauses = 0  # sequences paused (their client behind), since start

    def __len__(self) -> int:
        """Sequences waiting for a slot (new or parked)."""
        return self._queued

    def active(self) -> int:
        """Sequences holding a slot."""
        return sum(len(r) for r in self._resident)

    def resident(self, instance: int) -> list[IterSeq]:
        return list(self._resident[instance])

    # -- admission and cancellation -----------------------------------------------------

    def admit(self, seq: IterSeq, now: float) -> None:
        seq.arrival = seq.ready_at = now
        seq.serial = next(self._serial)
        seq.state = WAITING
        heapq.heappush(self._waiting, (seq.order(), seq))
        self._queued += 1

    def cancel(self, seq: IterSeq) -> bool:
        """The client went away: the sequence leaves (now if it waits, else at
        its instance's next step). False if it already left."""
        if seq.state == LEFT or seq.cancelled:
            return False
        seq.cancelled = True
        if seq.state == WAITING:
            seq.state = LEFT
            self._queued -= 1
            if seq.instance is not None:
                self._parked[seq.instance].remove(seq)
        return True

    def pause(self, seq: IterSeq, until: float, reason: str) -> bool:
        """Hold a resident sequence back (its client reads slower than it steps): no step until
        :meth:`resume`; if still paused at ``until``, it leaves (``IterStep.expired``). False if it
        cannot be paused (it left, waits, or is paused already)."""
        if seq.state != RESIDENT or seq.cancelled or seq.paused_until is not None:
            return False
        seq.paused_until = until
        seq.pause_reason = reason
        self.pauses += 1
        return True

    def resume(self, seq: IterSeq) -> bool:
        """A paused sequence may step again, in the place it held. False if it was not paused."""
        if seq.paused_until is None:
            return False
        seq.paused_until = None
        return seq.state == RESIDENT and not seq.cancelled

    def paused(self) -> int:
        """Resident sequences paused now."""
        return sum(1 for r in self._resident for s in r if s.paused_until is not None)

    # -- the decision -------------------------------------------------------------------

    def step(self, now: float, free: Iterable[int]) -> IterStep:
        """For each free instance: drop its cancelled sequences, let waiting ones
        join its free slots, and maybe form its next step."""
        out = IterStep()
        for instance in free:
            if self._busy[instance]:
                continue
            resident = self._resident[instance]
            for seq in [s for s in resident if s.cancelled]:
                resident.remove(seq)
                seq.state = LEFT
                out.left.append(seq)
            self._expire(instance, now, out)
            self._join(instance, now, out)
            rows = self._rows(instance, now, out)
            if rows:
                for seq in rows:
                    seq.state = RUNNING
                self._busy[instance] = True
                if any(s.background for s in rows) and self._foreground_waiting():
                    self.background_over_foreground += 1
                out.batches.append((instance, rows))
        return out

    def _expire(self, instance: int, now: float, out: IterStep) -> None:
        """Paused sequences whose pause ran out leave; the next pause to run out is a wake-up."""
        resident = self._resident[instance]
        for seq in [s for s in resident if s.paused_until is not None]:
            until = seq.paused_until
            assert until is not None
            if until <= now:
                resident.remove(seq)
                seq.state = LEFT
                seq.paused_until = None
                out.expired.append(seq)
            else:
                out.wake_at = until if out.wake_at is None else min(out.wake_at, until)

    def _next_waiting(self, instance: int) -> IterSeq | None:
        """The best sequence that may join ``instance``: a new one or one parked there."""
        waiting = self._waiting
        while waiting and waiting[0][1].state != WAITING:
            heapq.heappop(waiting)
        parked = self._parked[instance]
        new = waiting[0][1] if waiting else None
        old = min(parked, key=IterSeq.order) if parked else None
        if new is None or (old is not None and old.order() <= new.order()):
            return old
        return new

    def _join(self, instance: int, now: float, out: IterStep) -> None:
        resident = self._resident[instance]
        while True:
            candidate = self._next_waiting(instance)
            if candidate is None:
                return
            if len(resident) >= self.slots:
                if candidate.background or not self._park_one(instance):
                    return
            if candidate.instance is None:
                heapq.heappop(self._waiting)
                candidate.instance = instance
                out.joined.append(candidate)
            else:
                self._parked[instance].remove(candidate)
            candidate.state = RESIDENT
            self._queued -= 1
            resident.append(candidate)

    def _park_one(self, instance: int) -> bool:
        """Make room for interactive work: park the last batch-job sequence here."""
        batch = [s for s in self._resident[instance] if s.background]
        if not batch:
            return False
        seq = max(batch, key=lambda s: (s.level, s.arrival, s.serial))
        self._resident[instance].remove(seq)
        seq.state = WAITING
        self._parked[instance].append(seq)
        self._queued += 1
        return True

    def _foreground_waiting(self) -> bool:
        return any(s.state == WAITING and not s.background for _, s in self._waiting)

    def _rows(self, instance: int, now: float, out: IterStep) -> list[IterSeq]:
        resident = [s for s in self._resident[instance] if s.paused_until is None]
        if not resident:
            return []
        ordered = sorted(resident, key=IterSeq.order)
        head = ordered[0]
        rows = [s for s in ordered if s.shape_key == head.shape_key][:self.max_rows]
        fits = [p for p in self._preferred if p <= len(rows)]
        due = min(s.ready_at for s in rows) + self._delay_s
        if len(rows) < self._need:
            if fits:
                rows = rows[:fits[-1]]
            elif now < due:
                out.wake_at = due if out.wake_at is None else min(out.wake_at, due)
                return []
        chosen = set(map(id, rows))
        return [s for s in resident if id(s) in chosen]  # in the order they joined

    def complete(self, instance: int, rows: Sequence[IterSeq], ended: Sequence[bool],
                 now: float) -> list[tuple[IterSeq, str]]:
        """The step of ``rows`` on ``instance`` finished; ``ended[i]``: the model
        (or an error) ended row i. Returns the rows that leave, with why."""
        self._busy[instance] = False
        resident = self._resident[instance]
        left: list[tuple[IterSeq, str]] = []
        for seq, end in zip(rows, ended):
            seq.steps += 1
            seq.ready_at = now
            reason = (ENDED if end else CANCELLED if seq.cancelled
                      else LIMIT if seq.max_steps and seq.steps >= seq.max_steps else None)
            if reason is None:
                seq.state = RESIDENT
                continue
            seq.state = LEFT
            resident.remove(seq)
            left.append((seq, reason))
        return left

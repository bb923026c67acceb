"""The batch decision: priority queues plus a pure ``step(now)``.

Nothing here awaits, sleeps or reads a clock. The driver
(:mod:`inferd.scheduling.batcher`) admits requests, calls :meth:`BatchQueue.step`
with the current time whenever something changed (a request arrived, an
instance freed up, a deadline it was told about passed) and acts on the
returned :class:`Step`: run ``batch``, fail ``expired``, and step again at
``wake_at``. Unit tests drive it the same way with made-up times.

Ordering: requests are served by (effective priority level, delayed?, arrival,
sequence). Level 1 is the highest. With aging on, a request waiting for k
aging intervals counts k levels higher (never above 1), so a low-priority
request is delayed but never starved. A request whose queue timeout passed
under ``DELAY`` stays queued but behind every undelayed request of its level.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Hashable, Iterator, Sequence

from inferd.errors import DeadlineExceeded, InferdError, Unavailable
from inferd.scheduling.adaptive import Instance, admission, deadline_refusal, slo_rows, wait_until
from inferd.scheduling.estimates import ArrivalRate, ExecutionModel
from inferd.scheduling.formation import FULL, OTHER_GROUP, OVER_BUDGET, OpenBatch
from inferd.scheduling.policy import DELAY, BatchingPolicy

QUEUED, DELAYED, DONE = 0, 1, 2


class Pending:
    """One request waiting in the queue."""

    __slots__ = ("rows", "shape_key", "length", "level", "arrival", "seq", "timeout_at", "deadline", "state",
                 "payload", "received", "shed_at")

    def __init__(
        self,
        rows: int,
        shape_key: Hashable = None,
        *,
        length: int = 0,
        priority: int = 0,
        timeout_us: int = 0,
        deadline: float | None = None,
        payload: Any = None,
        received: float | None = None,
        shed_at: float | None = None,
    ) -> None:
        self.rows = rows  # batch rows this request fills (1 for a non-batching model)
        self.shape_key = shape_key  # only requests with equal keys share a batch
        self.length = length  # padded models: the request's length (rows x longest counts against a budget)
        self.level = priority  # requested; admit() turns it into a valid level
        self.arrival = 0.0
        self.seq = 0
        self.timeout_at: float | None = timeout_us / 1e6 if timeout_us > 0 else None  # relative until admitted
        self.deadline = deadline
        self.state = QUEUED
        self.payload = payload
        # When its frontend received it (None: when admitted): its wait, timeout and SLO count from there.
        self.received = received
        self.shed_at = shed_at  # the server sheds it (UNAVAILABLE) if still queued then; None: never

    def __repr__(self) -> str:
        return f"Pending(seq={self.seq}, rows={self.rows}, level={self.level}, state={self.state})"


@dataclass(slots=True)
class Step:
    batch: list[Pending] = field(default_factory=list)
    expired: list[tuple[Pending, InferdError]] = field(default_factory=list)
    wake_at: float | None = None  # step again at this time, if nothing else happens first


class _Level:
    __slots__ = ("main", "delayed", "count", "rows", "policy")

    def __init__(self, policy) -> None:  # type: ignore[no-untyped-def]
        self.main: deque[Pending] = deque()
        self.delayed: deque[Pending] = deque()
        self.count = 0
        self.rows = 0
        self.policy = policy


class BatchQueue:
    """The queues of one model and the decision of what to run next."""

    # A batch is formed by looking at most this many requests past the first
    # that cannot join it (other shapes), so a long mixed queue stays cheap.
    SCAN_FACTOR = 4

    def __init__(self, policy: BatchingPolicy, model: str = "") -> None:
        self.policy = policy
        self.model = model
        self._levels = [_Level(policy.queue_policy(i + 1)) for i in range(policy.priority_levels)]
        self._timers: list[tuple[float, int, int, Pending]] = []  # timeouts and deadlines, lazily deleted
        self._next_seq = 0
        self.size = 0  # the requests queued (len(queue), read as an attribute on the hot path: no call)
        self._aging_s = policy.aging_us / 1e6
        self._wait = policy.wait
        # Rows arriving while requests are queued: the company a waiting batch can expect.
        self.arrivals = ArrivalRate()

    def __len__(self) -> int:
        return self.size

    def depth(self, level: int | None = None) -> int:
        if level is None:
            return self.size
        return self._levels[level - 1].count

    # -- admission ---------------------------------------------------------

    def admit(self, item: Pending, now: float, instances: Sequence[Instance] = ()) -> None:
        """Queue ``item``, or raise :class:`Unavailable` if its level is full, or
        :class:`SloRefused` when, with a latency SLO, its estimated completion on
        ``instances`` (when each is expected free, its execution model) passes it, or
        :class:`DeadlineExceeded` / :class:`Unavailable` when its deadline or queue timeout
        has passed or cannot be met behind the queue (``deadline_refusal``)."""
        p = self.policy
        if item.level <= 0 or item.level > p.priority_levels:
            item.level = p.default_priority_level
        level = self._levels[item.level - 1]
        qp = level.policy
        if qp.max_queue_size and level.count >= qp.max_queue_size:
            raise Unavailable(
                f"model '{self.model}': request rejected: exceeds maximum queue size "
                f"({qp.max_queue_size} requests at priority level {item.level})"
            )
        # Its wait began when its frontend received it, not here (never later than now: another clock).
        arrival = now if item.received is None else min(item.received, now)
        if self._wait.slo_s and instances:
            ahead = sum(lv.rows for lv in self._levels[:item.level])  # its level and the higher ones
            refused = admission(self._wait, self.model, now, ahead, item.rows, p.max_rows, instances,
                                waited=now - arrival)
            if refused is not None:
                raise refused
        requested = item.timeout_at  # relative seconds or None
        timeout = qp.default_timeout_us / 1e6 if qp.default_timeout_us else None
        if requested is not None and (qp.allow_timeout_override or timeout is None):
            # A request may shorten the policy's timeout, never lengthen it.
            timeout = requested if timeout is None else min(timeout, requested)
        # What cannot be answered in time is refused here, not run for nobody: a deadline or a rejecting
        # queue timeout already passed, or out of reach behind the queue (estimated when ``instances`` given).
        start_by = arrival + timeout if timeout is not None and qp.timeout_action != DELAY else None
        if item.deadline is not None or start_by is not None:
            ahead = sum(lv.rows for lv in self._levels[:item.level])
            refused = deadline_refusal(self.model, now, item.deadline, start_by, ahead, item.rows, p.max_rows,
                                       instances)
            if refused is not None:
                raise refused
        item.arrival = arrival
        item.seq = self._next_seq
        self._next_seq += 1
        item.state = QUEUED
        item.timeout_at = arrival + timeout if timeout is not None else None
        if item.timeout_at is not None:
            heapq.heappush(self._timers, (item.timeout_at, item.seq, 0, item))
        if item.deadline is not None:
            heapq.heappush(self._timers, (item.deadline, item.seq, 1, item))
        if item.shed_at is not None:
            # The batching wait the model's config asks for (max_queue_delay) is not overload: on top.
            item.shed_at += self._wait.bound_s
            heapq.heappush(self._timers, (item.shed_at, item.seq, 2, item))
        self.arrivals.arrived(now, item.rows, self.size)
        level.main.append(item)
        level.count += 1
        level.rows += item.rows
        self.size += 1

    def lone_runs_now(self, now: float, rows: int, model: ExecutionModel) -> bool:
        """Whether a request of ``rows`` rows arriving at an empty queue would run at once
        (no company expected): the driver then runs it without queueing it. It takes a
        sequence number (probes are every PROBE_EVERY-th) and adds no queued time."""
        if self.size or not self.policy.batching:
            return False
        if wait_until(self._wait, now, self._next_seq, rows, now, self.arrivals, model) is not None:
            return False
        self._next_seq += 1
        return True

    def cancel(self, item: Pending) -> bool:
        """Drop a queued request (its client went away). True if it was queued."""
        if item.state == DONE:
            return False
        self._remove(item)
        return True

    def _remove(self, item: Pending) -> None:
        item.state = DONE
        level = self._levels[item.level - 1]
        level.count -= 1
        level.rows -= item.rows
        self.size -= 1

    # -- the decision ------------------------------------------------------

    def step(self, now: float, can_dispatch: bool, model: ExecutionModel | None = None,
             stage_at: float | None = None) -> Step:
        """Expire what timed out; then, if an instance is free, maybe form a batch.

        ``model``: the execution model of the instance the batch would run on.
        ``stage_at``: no instance is free, but one expected free then takes a batch
        to start as soon as it is (assembled meanwhile): only a batch that cannot
        grow (full, a preferred size, blocked) is formed for it."""
        out = Step()
        if not self.size and not self._timers:
            return out  # nothing queued, nothing to expire
        self._expire(now, out)
        self._compact()
        if self.size and (can_dispatch or stage_at is not None):
            self._decide(now, out, model or ExecutionModel(), None if can_dispatch else stage_at)
        self.arrivals.queued(now, self.size > 0)
        timers = self._prune_timers()
        if timers:
            out.wake_at = timers[0][0] if out.wake_at is None else min(out.wake_at, timers[0][0])
        return out

    def _prune_timers(self) -> list[tuple[float, int, int, Pending]]:
        """Drop the timers of requests that already left (dispatched, cancelled),
        so they never wake the driver: from the top, and by a rebuild when they
        are most of the heap (long client deadlines under load pile them up)."""
        timers = self._timers
        while timers and timers[0][3].state == DONE:
            heapq.heappop(timers)
        if len(timers) > 64 and len(timers) > 4 * self.size:
            self._timers = timers = [t for t in timers if t[3].state != DONE]
            heapq.heapify(timers)
        return timers

    def _expire(self, now: float, out: Step) -> None:
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, _, item = heapq.heappop(timers)
            if item.state == DONE:
                continue
            if item.deadline is not None and item.deadline <= now:
                self._remove(item)
                out.expired.append((item, DeadlineExceeded(
                    f"model '{self.model}': the request's deadline passed while it was queued")))
            elif item.shed_at is not None and item.shed_at <= now:
                self._remove(item)
                out.expired.append((item, _shed(self.model, item, now)))
            elif item.timeout_at is not None and item.timeout_at <= now and item.state == QUEUED:
                level = self._levels[item.level - 1]
                if level.policy.timeout_action == DELAY:
                    item.state = DELAYED
                    level.delayed.append(item)  # its main-deque slot is skipped from now on
                else:
                    self._remove(item)
                    limit_us = round((item.timeout_at - item.arrival) * 1e6)
                    out.expired.append((item, Unavailable(
                        f"model '{self.model}': request timed out in the queue: its queue timeout is "
                        f"{limit_us} us (timeout_action REJECT, priority level {item.level})")))

    def _compact(self) -> None:
        for level in self._levels:
            main = level.main
            while main and main[0].state != QUEUED:
                main.popleft()
            delayed = level.delayed
            while delayed and delayed[0].state != DELAYED:
                delayed.popleft()

    def _ordered(self, now: float) -> Iterator[Pending]:
        """Queued requests in service order (a k-way merge of the deques)."""
        streams: list[tuple[int, int, deque[Pending], int]] = []
        for i, level in enumerate(self._levels):
            if level.main:
                streams.append((i + 1, 0, level.main, QUEUED))
            if level.delayed:
                streams.append((i + 1, 1, level.delayed, DELAYED))
        if len(streams) == 1:
            _, _, dq, state = streams[0]
            for item in dq:
                if item.state == state:
                    yield item
            return
        iters = [(lvl, d, iter(dq), state) for lvl, d, dq, state in streams]
        heads: list[tuple[tuple[int, int, float, int], int, Pending]] = []
        for idx, (lvl, d, it, state) in enumerate(iters):
            item = _next_in(it, state)
            if item is not None:
                heads.append((self._key(item, lvl, d, now), idx, item))
        heapq.heapify(heads)
        while heads:
            _, idx, item = heapq.heappop(heads)
            yield item
            lvl, d, it, state = iters[idx]
            nxt = _next_in(it, state)
            if nxt is not None:
                heapq.heappush(heads, (self._key(nxt, lvl, d, now), idx, nxt))

    def _key(self, item: Pending, level: int, delayed: int, now: float) -> tuple[int, int, float, int]:
        if self._aging_s > 0:
            level = max(1, level - int((now - item.arrival) / self._aging_s))
        return (level, delayed, item.arrival, item.seq)

    def _decide(self, now: float, out: Step, model: ExecutionModel, stage_at: float | None) -> None:
        p = self.policy
        batch: list[Pending] = []
        best_prefix = 0  # batch[:best_prefix] fills a preferred size exactly
        skipped = 0
        blocked = False  # a request in order does not fit: waiting cannot grow the batch in order
        forming: OpenBatch | None = None
        for item in self._ordered(now):
            if forming is None:
                # The batch always starts with the request first in service order.
                forming = OpenBatch(item, p.max_rows, p.grouping.max_elements)
                batch.append(item)
                if not p.batching or forming.full:
                    break
                if forming.rows in p.preferred_batch_sizes:
                    best_prefix = 1
                continue
            verdict = forming.offer(item)
            if verdict == FULL:
                # Would overflow the rows: later requests wait for the next batch, in
                # order, so this batch cannot grow any more: run it now.
                blocked = True
                break
            if verdict in (OTHER_GROUP, OVER_BUDGET):
                # Another group, or too long for the element budget left: it heads a later
                # batch; a request after it may still fit this one.
                blocked = blocked or verdict == OVER_BUDGET
                skipped += 1
                if skipped > self.SCAN_FACTOR * p.max_rows:
                    break
                continue
            batch.append(item)
            if forming.rows in p.preferred_batch_sizes:
                best_prefix = len(batch)
            if forming.full:
                break
        if forming is None:
            return
        head = batch[0]
        if not p.batching or forming.full or (stage_at is None and now >= head.arrival + self._wait.bound_s):
            chosen = batch  # full, or waited long enough (at once when there is no delay)
        elif best_prefix:
            chosen = batch[:best_prefix]  # a preferred size is reached: run it rather than wait
        elif blocked:
            chosen = batch  # it cannot grow: waiting for the delay would only add latency
        elif stage_at is not None:
            return  # it could still grow: formed when the instance is free, with whoever came meanwhile
        else:
            until = wait_until(self._wait, head.arrival, head.seq, forming.rows, now, self.arrivals, model)
            if until is not None:
                out.wake_at = until
                return
            chosen = batch  # no company is expected in time
        if self._wait.slo_s:
            chosen = chosen[:slo_rows(self._wait, head.arrival, stage_at or now, [i.rows for i in chosen], model)]
        for item in chosen:
            self._remove(item)
        out.batch = chosen


def _shed(model: str, item: Pending, now: float) -> Unavailable:
    bound_us = round((item.shed_at - item.arrival) * 1e6)  # type: ignore[operator]
    return Unavailable(
        f"model '{model}': request shed: the server is overloaded: the request waited "
        f"{round((now - item.arrival) * 1e6)} us since its frontend received it and was still queued, past "
        f"the queue-delay target of {bound_us} us (--queue-delay-target-us, --queue-delay-interval-us; "
        "--no-shed turns shedding off); retry later")


def _next_in(it: Iterator[Pending], state: int) -> Pending | None:
    for item in it:
        if item.state == state:
            return item
    return None


def split_rows(rows: int, max_rows: int) -> list[tuple[int, int]]:
    """[start, stop) row ranges that cut a too-large request into executions."""
    if max_rows < 1:
        raise ValueError(f"max_rows must be >= 1, got {max_rows}")
    return [(start, min(start + max_rows, rows)) for start in range(0, rows, max_rows)]

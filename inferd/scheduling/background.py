"""Batch-job work on idle capacity only: a lane in front of a model's scheduler.

Every request of a model passes through its :class:`BackgroundLane`.
Interactive requests go straight to the scheduler; batch-job requests
(``request.background``, set by :mod:`inferd.batchjobs`) wait in the lane
and go on to the same scheduler, at its lowest priority level, only when
:func:`admit` says so:

- never while an interactive request of the model is in flight (queued or
  executing): batch work cannot take an instance that interactive work is
  waiting for, and an interactive request arriving meanwhile waits for at
  most the batch work already started;
- once interactive traffic has been quiet for ``gap_s``, ``trickle``
  batch requests at a time (one, by default, so an interactive arrival finds
  at most one small piece of batch work ahead of it), and at most ``duty`` of
  the time: after a batch request that took t, the next waits
  t * (1 / duty - 1). Batch work that kept the event loop busy between two
  interactive requests would make the next one wait for the loop and the
  GIL, even with no batch request running when it arrives;
- once it has been quiet for ``burst_after_s``, ``burst`` at a time, so an
  idle server fills whole batches with batch work.

:func:`admit` is the decision (plain numbers in, a count and a wake-up time
out); the lane is its thin asyncio driver. It never polls: it decides again
when a batch request arrives or leaves, when the scheduler's last interactive
request in flight is answered, and at the wake-up time.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from inferd.clock import Alarm, Clock, MonotonicClock
from inferd.scheduling.base import Completion, Scheduler, run_task
from inferd.types import InferenceRequest


@dataclass(frozen=True, slots=True)
class LanePolicy:
    gap_s: float = 0.002  # interactive quiet this long: batch work may start, `trickle` at a time
    burst_after_s: float = 1.0  # quiet this long: `burst` at a time
    trickle: int = 1
    burst: int = 8
    duty: float = 0.2  # while interactive traffic is recent: the share of time batch work may run
    overhead_s: float = 0.0003  # a batch request's cost to the loop outside the scheduler


@dataclass(slots=True)
class LaneState:
    interactive: int = 0  # interactive requests in flight (the scheduler's count, read at each decision)
    batch: int = 0  # batch requests passed on to the scheduler and not answered
    waiting: int = 0  # batch requests waiting in the lane
    last_interactive: float = -math.inf  # when one last arrived, or the last in flight was answered
    paced_until: float = -math.inf  # while trickling: no batch request starts before this


def admit(policy: LanePolicy, state: LaneState, now: float) -> tuple[int, float | None]:
    """How many waiting batch requests may go on now, and when to decide again
    (None: when a request arrives or leaves)."""
    if not state.waiting or state.interactive:
        return 0, None
    # Compared as times, not durations: the wake-up time itself must pass the test.
    start, burst = state.last_interactive + policy.gap_s, state.last_interactive + policy.burst_after_s
    if now < start:
        return 0, start
    if now >= burst:
        return max(0, min(state.waiting, policy.burst - state.batch)), None
    if now < state.paced_until:
        return 0, min(state.paced_until, burst)
    return max(0, min(state.waiting, policy.trickle - state.batch)), burst


def pace(policy: LanePolicy, state: LaneState, started: float, now: float) -> None:
    """A batch request that started at ``started`` was answered at ``now``: while
    interactive traffic is recent, the next one waits to keep batch work to ``duty``."""
    if now < state.last_interactive + policy.burst_after_s:
        cost = now - started + policy.overhead_s
        state.paced_until = max(state.paced_until, now + cost * (1.0 / policy.duty - 1.0))


class BackgroundLane(Scheduler):
    """Wraps a model's scheduler; anything else asked of it is the scheduler's."""

    def __init__(self, inner: Scheduler, policy: LanePolicy | None = None, clock: Clock | None = None,
                 lowest_priority: int = 0) -> None:
        self.inner = inner
        self.policy = policy or LanePolicy()
        self._clock = clock or MonotonicClock()
        self._lowest = lowest_priority  # the scheduler's lowest priority level (0: it has none)
        self.state = LaneState()
        inner.when_quiet(self._quiet)
        self._waiters: deque[asyncio.Future] = deque()
        self._alarm = Alarm(self._clock, self._decide)
        # Accounting, read by batch-job status and tests:
        self.admitted = 0  # batch requests passed on
        self.admitted_over_interactive = 0  # ... while interactive work was in flight: must stay 0
        self.interactive_met_batch = 0  # interactive arrivals that found batch work in the scheduler

    def __getattr__(self, name: str) -> Any:
        if name == "inner":  # not set yet: no recursion
            raise AttributeError(name)
        return getattr(self.inner, name)

    def inflight(self) -> int:
        return self.inner.inflight() + len(self._waiters)

    def problem(self) -> str | None:  # Scheduler defines it: __getattr__ would not reach the inner one
        return self.inner.problem()

    def merges_rows(self) -> int:  # likewise
        return self.inner.merges_rows()

    async def stop(self) -> None:
        self._alarm.cancel()
        await self.inner.stop()

    def interactive(self) -> int:
        return self.inner.interactive()

    def submit(self, request: InferenceRequest, rows: int, completion: Completion,
               more: bool = False) -> Callable[[], None]:
        """An interactive request goes straight on to the scheduler, which counts it in flight
        until it is answered (:meth:`_quiet` hears when none is left); a batch-job request waits
        in the lane, in a task, for :func:`admit`'s say."""
        if request.background:
            return run_task(self._batch_request(request, rows), completion)
        state = self.state
        state.last_interactive = self._clock.now()
        if state.batch:
            self.interactive_met_batch += 1
        return self.inner.submit(request, rows, completion, more)

    async def _batch_request(self, request: InferenceRequest, rows: int) -> dict[str, np.ndarray]:
        await self._admission()
        if self._lowest:
            request.priority = self._lowest
        state = self.state
        started = self._clock.now()
        try:
            return await self.inner.infer(request, rows)
        finally:
            state.batch -= 1
            pace(self.policy, state, started, self._clock.now())
            if self._waiters:
                self._decide()

    def _quiet(self) -> None:
        """The scheduler has no interactive request left in flight: batch work may follow, after the gap."""
        self.state.last_interactive = self._clock.now()
        if self._waiters:
            self._decide()

    async def _admission(self) -> None:
        """Wait until this batch request may go on; it is then counted in ``state.batch``."""
        waiter: asyncio.Future = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        self._decide()
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.cancelled():  # its caller went away while it waited
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                self.state.waiting = len(self._waiters)
            else:  # admitted, then its caller went away before it went on
                self.state.batch -= 1
                self._decide()
            raise

    def _decide(self) -> None:
        state = self.state
        state.interactive = self.inner.interactive()
        waiters = self._waiters
        state.waiting = len(waiters)
        count, wake = admit(self.policy, state, self._clock.now())
        while count and waiters:
            waiter = waiters.popleft()
            state.waiting -= 1
            if waiter.done():  # cancelled; its task takes it out of the count itself
                continue
            count -= 1
            state.batch += 1
            self.admitted += 1
            if state.interactive:
                self.admitted_over_interactive += 1
            waiter.set_result(None)
        self._alarm.arm(wake)

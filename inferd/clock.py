"""Time, injected.

Everything that waits or times out takes a :class:`Clock`. Production code
uses :class:`MonotonicClock`; tests drive a :class:`FakeClock` and never sleep.
Times are float seconds on a monotonic scale; only differences mean anything.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import time
import weakref
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds."""
        ...

    def call_at(self, when: float, callback: object) -> "TimerHandle":
        """Run ``callback()`` on the event loop once ``now() >= when``."""
        ...


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class MonotonicClock:
    """The real clock: ``time.monotonic`` and the running loop's timers.

    The loop's own clock is monotonic too, so deadlines computed from ``now()``
    can be handed to ``loop.call_at`` after converting the origin.
    """

    # time.monotonic itself, not a method calling it: the request path asks the clock 5 or 6
    # times per request, and each Python-level call costs more than the clock read.
    now = staticmethod(time.monotonic)

    def call_at(self, when: float, callback):  # type: ignore[no-untyped-def]
        loop = asyncio.get_running_loop()
        delay = when - time.monotonic()
        return loop.call_at(loop.time() + max(0.0, delay), callback)


class _FakeTimer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback) -> None:  # type: ignore[no-untyped-def]
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """A clock that moves only when a test calls :meth:`advance`.

    Timers fire synchronously inside ``advance`` in deadline order, so a test
    that advances past a deadline sees its effect at once (plus whatever
    asyncio callbacks it then lets run).
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback) -> _FakeTimer:  # type: ignore[no-untyped-def]
        timer = _FakeTimer(when, callback)
        heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, timer = heapq.heappop(self._timers)
            self._now = max(self._now, when)
            if not timer.cancelled:
                timer.callback()
        self._now = target

    def pending_timers(self) -> int:
        return sum(1 for _, _, t in self._timers if not t.cancelled)


class Alarm:
    """One pending wake-up on a :class:`Clock`, re-armed as a deadline moves.

    A scheduler asks its pure decision when to step next and arms this with
    the answer; arming the same time again costs nothing, arming None cancels.
    """

    __slots__ = ("_clock", "_callback", "_handle", "_when")

    def __init__(self, clock: Clock, callback) -> None:  # type: ignore[no-untyped-def]
        self._clock = clock
        # A scheduler's own method, held weakly: the scheduler holds its alarm, and a strong
        # reference back would make a cycle that keeps an unloaded model (its runtime's memory)
        # until a full collection. A scheduler gone needs no wake-up.
        self._callback = weakref.WeakMethod(callback) if inspect.ismethod(callback) else (lambda: callback)
        self._handle: TimerHandle | None = None
        self._when: float | None = None

    def arm(self, when: float | None) -> None:
        if when == self._when:
            return
        self.cancel()
        self._when = when
        if when is not None:
            self._handle = self._clock.call_at(when, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._when = None

    def _fire(self) -> None:
        self._handle = None
        self._when = None
        callback = self._callback()
        if callback is not None:
            callback()

"""Online estimates the batch decision reads: how fast company arrives, how long a batch takes.

Plain objects fed observations with explicit times (seconds on the scheduler's
clock); nothing here reads a clock, sleeps or awaits, so tests drive them with
made-up times. Both forget the past exponentially, so they follow a load or a
machine that changes.

:class:`ArrivalRate` learns the rows per second that arrive *while requests are
queued* (waiting for company or for an instance), not the overall rate: a closed
loop with one client has a high overall rate but never sends a second request
while its first one waits, and waiting for company there only adds latency.
Until it is :attr:`~ArrivalRate.informed`, one head request in ``PROBE_EVERY``
may wait as a probe (:func:`inferd.scheduling.adaptive.wait_until`), to notice
when company starts coming.

:class:`ExecutionModel` learns the time of an execution as ``a + c * rows`` by
exponentially weighted least squares over the executions it is shown (one per
model instance), and how far observations stray from it, for latency budgets.
"""

from __future__ import annotations

import math

# With no company expected, one head request in this many waits anyway, as a probe.
PROBE_EVERY = 16
# An execution model is trusted to say "batching saves nothing" only after this many executions,
# missed by at most this share on average: a few noisy timings fit any line.
SETTLED_AFTER = 64
SETTLED_MISS = 0.2
# After this many executions, one observation counts as at most OUTLIER_FACTOR times the prediction.
OUTLIER_AFTER = 8
OUTLIER_FACTOR = 4.0


class ArrivalRate:
    """Rows per second arriving while some request is queued.

    The driver calls :meth:`arrived` for each request it queues and :meth:`queued`
    whenever the queue turns empty or non-empty. ``horizon_s``: seconds of queued
    time over which old evidence fades to 1/e; ``prior_s``: queued time assumed
    with no arrival before any is seen (so a few rows in a short moment do not read
    as an enormous rate).
    """

    __slots__ = ("horizon_s", "prior_s", "_rows", "_time", "_since", "_period_rows", "company_last_time")

    def __init__(self, horizon_s: float = 0.05, prior_s: float = 0.0005) -> None:
        self.horizon_s = horizon_s
        self.prior_s = prior_s
        self._rows = 0.0  # decayed rows that arrived while something was queued
        self._time = 0.0  # decayed seconds during which something was queued
        self._since: float | None = None  # when the queue last turned non-empty
        self._period_rows = 0  # rows that joined during the current queued stretch
        self.company_last_time = False  # whether anyone joined the last stretch's requests

    def queued(self, now: float, busy: bool) -> None:
        """The queue is now non-empty (``busy``) or empty."""
        if busy and self._since is None:
            self._since = now
        elif not busy and self._since is not None:
            self._add_time(now - self._since)
            self._since = None
            self.company_last_time = self._period_rows > 0
            self._period_rows = 0

    def arrived(self, now: float, rows: int, queued_before: int) -> None:
        """A request of ``rows`` rows was queued, with ``queued_before`` requests already there."""
        if queued_before > 0:
            if self._since is not None:
                self._add_time(now - self._since)
                self._since = now
            self._rows += rows
            self._period_rows += rows
        self.queued(now, True)

    def _add_time(self, seconds: float) -> None:
        if seconds <= 0:
            return
        keep = math.exp(-seconds / self.horizon_s)
        self._rows *= keep
        self._time = self._time * keep + seconds

    def rate(self, now: float) -> float:
        """Rows per second expected while a request waits (0 with no evidence of company)."""
        time = self._time + (now - self._since if self._since is not None else 0.0)
        return self._rows / (time + self.prior_s)

    @property
    def informed(self) -> bool:
        """Whether the rate rests on enough queued time (half a horizon, decayed) to be trusted."""
        return self._time >= self.horizon_s / 2

class ExecutionModel:
    """Seconds one execution of ``rows`` rows takes, learned as ``a + c * rows``.

    ``decay``: the weight each new observation takes from the old ones. Until the
    observed batch sizes spread enough to fit a slope, a prediction scales the
    mean time per row of what was seen for larger batches (conservative for a
    latency budget: batching rarely costs more than proportionally) and keeps
    the mean time for smaller ones.
    """

    __slots__ = ("decay", "_s0", "_s1", "_s2", "_t0", "_t1", "_err", "_count")

    def __init__(self, decay: float = 0.05) -> None:
        self.decay = decay
        self._s0 = self._s1 = self._s2 = self._t0 = self._t1 = 0.0
        self._err = 0.0  # decayed mean of |observed - predicted| / predicted
        self._count = 0

    @property
    def count(self) -> int:
        return self._count

    @property
    def settled(self) -> bool:
        """Enough executions, predicted closely enough, for its line to decide anything
        more than a latency estimate (whether batching saves time at all)."""
        return self._count >= SETTLED_AFTER and self._err <= SETTLED_MISS

    def observe(self, rows: int, seconds: float) -> None:
        if self._count:
            expected = self.predict(rows)
            if expected > 0:
                if self._count >= OUTLIER_AFTER:
                    # One stalled execution (a preempted thread, a collection) must not make the
                    # model look several times slower: it moves the estimate by a bounded step.
                    seconds = min(seconds, OUTLIER_FACTOR * expected)
                miss = min(abs(seconds - expected) / expected, 1.0)
                self._err = miss if self._count == 1 else self._err * (1 - self.decay) + miss * self.decay
        keep = 1.0 - self.decay if self._count else 0.0
        self._s0 = self._s0 * keep + 1.0
        self._s1 = self._s1 * keep + rows
        self._s2 = self._s2 * keep + rows * rows
        self._t0 = self._t0 * keep + seconds
        self._t1 = self._t1 * keep + rows * seconds
        self._count += 1

    def coefficients(self) -> tuple[float, float] | None:
        """(a, c) once the batch sizes seen spread enough to fit a line; else None."""
        s0, s1, s2 = self._s0, self._s1, self._s2
        if s0 <= 0:
            return None
        mean = s1 / s0
        if s2 / s0 - mean * mean < 0.25:  # every batch about the same size
            return None
        det = s0 * s2 - s1 * s1
        c = (s0 * self._t1 - s1 * self._t0) / det
        a = (self._t0 - c * s1) / s0
        if c < 0:  # noise: a model does not get faster with more rows
            return self._t0 / s0, 0.0
        if a < 0:
            return 0.0, self._t1 / s2
        return a, c

    def predict(self, rows: int) -> float:
        """Expected seconds for ``rows`` rows; 0 before any observation."""
        if not self._count:
            return 0.0
        fit = self.coefficients()
        if fit is not None:
            a, c = fit
            return a + c * rows
        mean_time = self._t0 / self._s0
        mean_rows = self._s1 / self._s0
        return mean_time * max(1.0, rows / mean_rows) if mean_rows > 0 else mean_time

    def upper(self, rows: int, spread: float = 2.0) -> float:
        """A prediction ``spread`` times the usual miss above the expectation: for budgets."""
        return self.predict(rows) * (1.0 + spread * self._err)

    def fixed_cost(self) -> float | None:
        """Seconds each execution costs whatever its rows (``a``): what running two
        batches as one saves. None until a line is fitted (the batch sizes seen so far
        cannot tell)."""
        fit = self.coefficients()
        return None if fit is None else fit[0]

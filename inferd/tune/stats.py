"""The statistics ``inferd tune`` decides with: pure functions over plain lists of numbers.

**Why these.** A round on a shared 2-core host can lose half its throughput to someone else's
build, so one figure means little and its errors are heavy-tailed. Candidates are therefore
measured in pairs of rounds against the current configuration (:mod:`inferd.tune.rounds`), and
each pair gives one log ratio. Those ratios are summarised with

* the **Hodges–Lehmann estimate** (the median of the Walsh averages, ``(z_i + z_j) / 2`` for
  ``i <= j``): the median ratio's robust, efficient estimator (95% as efficient as the mean on
  normal data, and one wild round moves it little);
* its **confidence interval from the Wilcoxon signed-rank test**, exact for small ``n`` (the
  null distribution is counted, not approximated). It assumes only that the paired log ratios
  are independent and symmetric about their median, which alternating the order of the pair
  (current first, then the candidate first) makes reasonable. With ``n = 5`` pairs the interval
  is the range of the Walsh averages at 93.75%; with fewer it cannot reach 90% at all, so no
  decision is made on fewer than 5 pairs.

A paired t-test was the alternative; it is a little more powerful on normal data and misled by
exactly the rounds this host produces (one at 0.3x its neighbours). The median ratio with its
plain spread (min..max) was the other; it states no confidence.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

MIN_PAIRS = 5  # the fewest pairs whose signed-rank interval reaches 90%


def median(values: Sequence[float]) -> float:
    """The median; raises ValueError on an empty sequence."""
    if not values:
        raise ValueError("median of no values")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


@lru_cache(maxsize=256)
def _signed_rank_counts(n: int) -> tuple[int, ...]:
    """How many of the 2**n sign patterns give each signed-rank sum W+ = 0 .. n(n+1)/2."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    return tuple(counts)


def signed_rank_critical(n: int, confidence: float) -> int:
    """The number ``k`` of Walsh averages cut from each end for a two-sided ``confidence``
    interval: the largest ``k`` with P(W+ <= k - 1) <= (1 - confidence) / 2 under the null;
    0 when ``n`` is too small to reach the confidence at all."""
    if n <= 0:
        return 0
    counts = _signed_rank_counts(n)
    total = 2 ** n
    tail = (1.0 - confidence) / 2
    k, cumulative = 0, 0
    for w in range(len(counts)):
        cumulative += counts[w]
        if cumulative / total > tail:
            break
        k = w + 1
    return k


def coverage(n: int, k: int) -> float:
    """The exact two-sided coverage of the interval that cuts ``k`` Walsh averages from each end."""
    if k <= 0:
        return 1.0
    counts = _signed_rank_counts(n)
    return 1.0 - 2 * sum(counts[:k]) / 2 ** n


@dataclass(frozen=True)
class Interval:
    """A location estimate with its confidence interval, all on the scale of the inputs."""

    estimate: float
    low: float  # -inf when there are too few values for the confidence
    high: float  # +inf likewise
    n: int
    coverage: float  # the interval's exact coverage (>= the confidence asked for), 0 when unbounded

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


def hodges_lehmann(values: Sequence[float], confidence: float = 0.90) -> Interval:
    """The Hodges–Lehmann estimate of ``values``' centre and its signed-rank confidence interval.

    ``values`` are paired differences (here: log ratios); the interval is
    ``[w_(k), w_(M-k+1)]`` of the ``M = n(n+1)/2`` sorted Walsh averages, with ``k`` from
    :func:`signed_rank_critical`."""
    n = len(values)
    if n == 0:
        raise ValueError("no values to estimate from")
    walsh = sorted((values[i] + values[j]) / 2 for i in range(n) for j in range(i, n))
    estimate = median(walsh)
    k = signed_rank_critical(n, confidence)
    if k == 0:
        return Interval(estimate, -math.inf, math.inf, n, 0.0)
    return Interval(estimate, walsh[k - 1], walsh[len(walsh) - k], n, coverage(n, k))


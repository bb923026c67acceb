"""What one round measures and how pairs of rounds become ratios to the current configuration.

A **round** is one short measurement of one configuration at one load level (the load client's
warm-up window, then three measured ones): throughput, p50/p99, the server's CPU per inference
(its process tree's ticks from /proc over the round, divided by the inferences the server
counted), and how many cores *other* processes used meanwhile (the host's busy time from
/proc/stat, less the server's and the load client's own).

A **pair** is a round of the current configuration and a round of a candidate, back to back; the
order alternates from one pair to the next (current first, then candidate first), so two pairs
of one candidate form an A-B-B-A block and a drift of the host cancels. Everything the search
decides is a function of pairs: the ratio candidate / current of the objective's figure, with
the host's load taken out (:func:`adjusted_log_ratios`), summarised by
:func:`inferd.tune.stats.hodges_lehmann`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferd.tune.space import Candidate
from inferd.tune.stats import Interval, hodges_lehmann, median, theil_sen

# The others' load must span at least this many cores among the current config's rounds before
# its effect is fitted (below it, the fit would be noise); and the fitted slope is kept to the
# physically possible sign and a sane size (more load elsewhere never speeds this server up).
MIN_LOAD_SPREAD = 0.25
MAX_SLOPE = 3.0


@dataclass
class Round:
    """One configuration measured once at one level (plain data: the search's only input)."""

    candidate: Candidate
    level: float
    throughput: float  # inferences/s
    p50_us: float
    p99_us: float
    server_cpu_us: float | None = None  # server CPU per inference (None: not measurable, e.g. -u)
    others_cores: float | None = None  # cores used by other processes meanwhile (None: not known)
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    rss_mib: float | None = None
    error: str = ""
    phase: str = ""  # "scan" | "rung N" | "final" | "verify" (set by the search)

    @property
    def ok(self) -> bool:
        return not self.error and self.throughput > 0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["candidate"] = self.candidate.to_dict()
        d["label"] = self.candidate.label()
        return d


@dataclass
class Pair:
    base: Round  # the current configuration's round
    other: Round  # the candidate's
    base_first: bool


# What each objective compares: the figure of a round, and whether higher is better.
METRICS: dict[str, tuple[Callable[[Round], float | None], bool]] = {
    "throughput": (lambda r: r.throughput, True),
    "latency": (lambda r: r.p99_us, False),
    "cost": (lambda r: r.server_cpu_us, False),
}


def _log(value: float | None) -> float | None:
    return math.log(value) if value is not None and value > 0 else None


def load_slope(base_rounds: Sequence[Round], objective: str) -> float:
    """How the current config's log figure moves per core of other processes' load, fitted over
    its own rounds (:func:`~inferd.tune.stats.theil_sen`); 0 when the load did not vary enough
    or was not measured. Clamped to the direction load can push it (down for throughput, up for
    p99 and CPU per inference)."""
    figure, higher_is_better = METRICS[objective]
    points = [(r.others_cores, _log(figure(r))) for r in base_rounds if r.ok]
    points = [(x, y) for x, y in points if x is not None and y is not None]
    slope = theil_sen([x for x, _ in points], [y for _, y in points], MIN_LOAD_SPREAD) if points else None
    if slope is None:
        return 0.0
    return max(-MAX_SLOPE, min(0.0, slope)) if higher_is_better else max(0.0, min(MAX_SLOPE, slope))


def adjusted_log_ratios(pairs: Sequence[Pair], objective: str, slope: float) -> list[float]:
    """Per pair, log(candidate / current) of the objective's figure with the host's load taken
    out (``slope`` times the difference in the others' cores), signed so that > 0 is better."""
    figure, higher_is_better = METRICS[objective]
    out = []
    for p in pairs:
        a, b = _log(figure(p.base)), _log(figure(p.other))
        if a is None or b is None or not (p.base.ok and p.other.ok):
            continue
        z = b - a
        if p.base.others_cores is not None and p.other.others_cores is not None:
            z -= slope * (p.other.others_cores - p.base.others_cores)
        out.append(z if higher_is_better else -z)
    return out


def raw_log_ratios(pairs: Sequence[Pair], figure: Callable[[Round], float | None]) -> list[float]:
    out = []
    for p in pairs:
        a, b = _log(figure(p.base)), _log(figure(p.other))
        if a is not None and b is not None and p.base.ok and p.other.ok:
            out.append(b - a)
    return out


@dataclass
class Estimate:
    """A candidate's standing against the current config over some pairs."""

    pairs: int
    score: Interval  # of the adjusted log ratio, > 0 better (exp() of it: the ratio "x" the report prints)
    throughput_ratio: float | None  # median raw ratios, for the report
    p99_ratio: float | None
    cpu_ratio: float | None
    p99_us: float | None  # the candidate's p99: the current config's median p99 x the median p99 ratio
    failed: int = 0  # pairs where either round failed

    @property
    def ratio(self) -> float:
        return math.exp(self.score.estimate)

    @property
    def low(self) -> float:
        return math.exp(self.score.low) if math.isfinite(self.score.low) else 0.0

    @property
    def high(self) -> float:
        return math.exp(self.score.high) if math.isfinite(self.score.high) else math.inf

    def to_dict(self) -> dict:
        return {"pairs": self.pairs, "ratio": self.ratio, "low": self.low,
                "high": None if math.isinf(self.high) else self.high, "coverage": self.score.coverage,
                "throughput_ratio": self.throughput_ratio, "p99_ratio": self.p99_ratio,
                "cpu_ratio": self.cpu_ratio, "p99_us": self.p99_us, "failed": self.failed}


def estimate(pairs: Sequence[Pair], objective: str, slope: float, base_p99_us: float | None,
             confidence: float, p99_slope: float = 0.0) -> Estimate | None:
    """The candidate's estimate over ``pairs``; None when no pair has both rounds measured.
    ``slope``/``p99_slope``: :func:`load_slope` of the objective's figure and of p99."""
    z = adjusted_log_ratios(pairs, objective, slope)
    if not z:
        return None

    def ratio(figure: Callable[[Round], float | None]) -> float | None:
        logs = raw_log_ratios(pairs, figure)
        return math.exp(median(logs)) if logs else None

    p99 = ratio(lambda r: r.p99_us)
    # The p99 the candidate would have where the current config has its median p99: the current
    # config's median times the candidate's ratio, with the host's load taken out as for the score.
    p99_logs = adjusted_log_ratios(pairs, "latency", p99_slope)
    p99_us = (base_p99_us * math.exp(-hodges_lehmann(p99_logs, confidence).estimate)
              if base_p99_us is not None and p99_logs else None)
    return Estimate(len(z), hodges_lehmann(z, confidence), ratio(lambda r: r.throughput), p99,
                    ratio(lambda r: r.server_cpu_us), p99_us, failed=len(pairs) - len(z))


@dataclass
class Ledger:
    """Every round and pair of a run, in order: what the report and the JSON are made of."""

    rounds: list[Round] = field(default_factory=list)
    pairs: dict[Candidate, list[Pair]] = field(default_factory=dict)

    def base_rounds(self, base: Candidate, level: float) -> list[Round]:
        return [r for r in self.rounds if r.candidate == base and r.level == level]

"""What one round measures and how pairs of rounds become ratios to the current configuration.

A **round** is one short measurement of one configuration at one load level (three measured
windows of the load client): throughput, p50/p99, the server's CPU per inference (its process
tree's ticks from /proc over the windows, divided by the inferences the server counted), and how
many cores *other* processes used meanwhile (the host's busy time from /proc/stat, less the
server's and the load client's own): what the host was doing, reported beside each figure.

A **pair** is a round of the current configuration and a round of a candidate, back to back; the
order alternates from one pair to the next (current first, then candidate first), so two pairs
of one candidate form an A-B-B-A block and a drift of the host cancels. Everything the search
decides is a function of pairs: the log ratio candidate / current of the objective's figure
(:func:`log_ratios`), summarised by :func:`inferd.tune.stats.hodges_lehmann`.

Why the others' load is reported and not used to correct the ratios: on a saturated host (here,
PSI says some task waits for a CPU 97% of the time) what other processes *use* is what the
server leaves them, so it moves with the configuration. Measured on mlp at concurrency 2, a
2 ms fixed wait against no wait: 0.43x the throughput in plain pairs; "corrected" for the others'
usage, 0.77x, because the waiting configuration left the others half a core more. A correction
by that covariate would reward configurations for idling.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferd.tune.space import Candidate
from inferd.tune.stats import Interval, hodges_lehmann, median


@dataclass
class Round:
    """One configuration measured once at one level (plain data: the search's only input)."""

    candidate: Candidate
    level: float
    throughput: float  # inferences/s
    p50_us: float
    p99_us: float
    server_cpu_us: float | None = None  # server CPU per inference (None: not measurable, e.g. -u)
    others_cores: float | None = None  # cores other processes used meanwhile (None: not known)
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    rss_mib: float | None = None
    error: str = ""
    phase: str = ""  # "scan" | "rung N" | "verify" (set by the search)

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


def raw_log_ratios(pairs: Sequence[Pair], figure: Callable[[Round], float | None]) -> list[float]:
    """log(candidate / current) of ``figure`` per pair where both rounds measured it."""
    out = []
    for p in pairs:
        a, b = _log(figure(p.base)), _log(figure(p.other))
        if a is not None and b is not None and p.base.ok and p.other.ok:
            out.append(b - a)
    return out


def log_ratios(pairs: Sequence[Pair], objective: str) -> list[float]:
    """Per pair, log(candidate / current) of the objective's figure, signed so that > 0 is better."""
    figure, higher_is_better = METRICS[objective]
    return [z if higher_is_better else -z for z in raw_log_ratios(pairs, figure)]


@dataclass
class Estimate:
    """A candidate's standing against the current config over some pairs."""

    pairs: int
    score: Interval  # of the objective's log ratio, > 0 better (exp() of it: the "x" the report prints)
    throughput_ratio: float | None  # median ratios of the rounds' figures, for the report
    p99_ratio: float | None
    cpu_ratio: float | None
    p99_us: float | None  # the candidate's p99: the current config's median p99 x the p99 ratio
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


def estimate(pairs: Sequence[Pair], objective: str, base_p99_us: float | None, confidence: float) -> Estimate | None:
    """The candidate's estimate over ``pairs``; None when no pair has both rounds measured."""
    z = log_ratios(pairs, objective)
    if not z:
        return None

    def ratio(figure: Callable[[Round], float | None]) -> float | None:
        logs = raw_log_ratios(pairs, figure)
        return math.exp(hodges_lehmann(logs).estimate) if logs else None

    p99 = ratio(lambda r: r.p99_us)
    return Estimate(len(z), hodges_lehmann(z, confidence), ratio(lambda r: r.throughput), p99,
                    ratio(lambda r: r.server_cpu_us),
                    base_p99_us * p99 if base_p99_us is not None and p99 is not None else None,
                    failed=len(pairs) - len(z))


@dataclass
class Ledger:
    """Every round and pair of a run, in order: what the report and the JSON are made of."""

    rounds: list[Round] = field(default_factory=list)
    pairs: dict[Candidate, list[Pair]] = field(default_factory=dict)

    def base_rounds(self, base: Candidate, level: float) -> list[Round]:
        return [r for r in self.rounds if r.candidate == base and r.level == level]

    def base_p99(self, base: Candidate, level: float) -> float | None:
        values = [r.p99_us for r in self.base_rounds(base, level) if r.ok]
        return median(values) if values else None

"""The search behind ``inferd tune``, as pure code over a measuring function and a clock.

Not a grid: load levels are climbed one at a time (successive halving over the load, in the spirit
of Hyperband), and what is measured at each level is decided by what the level below showed.

1. **Start from what the model allows** (:func:`inferd.tune.space.space`). When the space is more
   than the time budget's first share can measure, a seeded random sample of it is taken, always
   with the repository's current configuration and Triton's default (no batching) in it.
2. **At each level** every surviving candidate is measured once.
3. **Prune what cannot win** before the next level: a candidate whose p99 is already over the
   latency budget (more load only adds queueing), and one that another candidate dominates
   (more throughput and lower p99, each by more than the noise margin); then the better half by the
   objective is kept (at least two).
4. **Stop at the time budget**, whatever level was reached: a measurement that would start after
   the budget is not started.
5. **Decide only when it is a decision**: the best and the runner-up at the deciding level are
   measured once more; when the spread between repeats is larger than the difference between them,
   no configuration is recommended (``SearchResult.recommended`` is None, and the report says why).

Objectives: ``throughput`` (the most inferences/s at any level with p99 within the budget),
``latency`` (the lowest p99 at the highest level every survivor reached), ``cost`` (the most
inferences per server CPU-second, p99 within the budget).

Why not optuna: the space is small and discrete (tens to a few hundred points), each point costs
seconds of noisy measurement, and the structure that matters (latency only grows with load, so a
loser at low load never wins at high load) is what the halving uses; a TPE sampler needs tens of
trials before it beats a random sample of such a space and knows nothing of load levels.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferd.tune.space import Candidate

OBJECTIVES = ("throughput", "latency", "cost")


@dataclass
class Measurement:
    candidate: Candidate
    level: float
    throughput: float  # inferences/s
    p50_us: float
    p95_us: float
    p99_us: float
    server_cpu_us: float | None = None  # server CPU per inference (None: not measurable, e.g. -u)
    rss_mib: float | None = None
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    repeat: bool = False
    error: str = ""

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["candidate"] = self.candidate.to_dict()
        d["label"] = self.candidate.label()
        return d


Measure = Callable[[Candidate, float], Measurement]


@dataclass
class SearchSettings:
    levels: Sequence[float]
    objective: str = "throughput"
    latency_budget_us: float = 20_000.0
    time_budget_s: float = 600.0
    seed: int = 0
    noise: float = 0.05  # relative margin under which two figures are not told apart
    first_share: float = 0.4  # of the time budget, for the first level
    estimate_s: float = 10.0  # the expected cost of one measurement, until one was timed

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if not self.levels:
            raise ValueError("at least one load level is needed")


@dataclass
class SearchResult:
    measurements: list[Measurement]
    pruned: dict[str, str]  # candidate label -> why it stopped (level, reason)
    sampled: int  # candidates measured at the first level
    space: int  # candidates the model allows
    elapsed_s: float
    stopped_by_budget: bool
    best: Candidate | None = None
    runner_up: Candidate | None = None
    deciding_level: float | None = None
    spread: float | None = None  # the largest relative difference between a measurement and its repeat
    margin: float | None = None  # the relative difference between best and runner-up
    recommended: Candidate | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)


def score(m: Measurement, objective: str, latency_budget_us: float) -> float | None:
    """Higher is better; None when the measurement cannot be chosen (failed, or over the budget)."""
    if m.error or m.throughput <= 0:
        return None
    if objective == "latency":
        return -m.p99_us
    if m.p99_us > latency_budget_us:
        return None
    if objective == "cost":
        return 1e6 / m.server_cpu_us if m.server_cpu_us else None
    return m.throughput


def dominated(a: Measurement, others: Sequence[Measurement], noise: float) -> Measurement | None:
    """Another measurement at a's level with clearly more throughput and clearly lower p99, if any."""
    for b in others:
        if b is a or b.error:
            continue
        if b.throughput > a.throughput * (1 + noise) and b.p99_us * (1 + noise) < a.p99_us:
            return b
    return None


def search(candidates: Sequence[Candidate], settings: SearchSettings, measure: Measure,
           clock: Callable[[], float], reference: Sequence[Candidate] = ()) -> SearchResult:
    """Run the search; ``reference``: candidates always measured at the first level (the current
    config, Triton's default)."""
    start = clock()
    rng = random.Random(settings.seed)
    measurements: list[Measurement] = []
    pruned: dict[str, str] = {}
    cost = [settings.estimate_s]  # the running mean cost of a measurement
    stopped = False

    def run(candidate: Candidate, level: float, until: float, repeat: bool = False) -> Measurement | None:
        """Measure, unless the measurement (at the running mean cost) would end after ``until``."""
        nonlocal stopped
        if clock() + cost[0] > until:
            stopped = True
            return None
        t0 = clock()
        m = measure(candidate, level)
        m.repeat = repeat
        cost[0] += (clock() - t0 - cost[0]) / (len(measurements) + 1)
        measurements.append(m)
        return m

    # The budget's phases: the first level gets ``first_share``; the other levels split the rest,
    # less a reserve for the two repeats that decide.
    budget = settings.time_budget_s
    end = start + budget

    def deadline(index: int) -> float:
        if index == 0 or len(settings.levels) == 1:
            share = settings.first_share if len(settings.levels) > 1 else 1.0
            return start + budget * share - (0 if len(settings.levels) > 1 else 2 * cost[0])
        later = budget * (1 - settings.first_share) - 2 * cost[0]
        return start + budget * settings.first_share + later * index / (len(settings.levels) - 1)

    # 1. What the first level can afford.
    pool = list(dict.fromkeys([*reference, *candidates]))
    affordable = max(len(reference) or 1, int(settings.time_budget_s * settings.first_share / settings.estimate_s))
    if len(pool) > affordable:
        rest = [c for c in pool if c not in reference]
        pool = list(dict.fromkeys([*reference, *rng.sample(rest, max(0, affordable - len(reference)))]))
    survivors = pool
    sampled = len(pool)
    reached: list[tuple[float, list[Measurement]]] = []
    for index, level in enumerate(settings.levels):
        at_level: list[Measurement] = []
        for candidate in survivors:
            m = run(candidate, level, deadline(index))
            if m is None:
                pruned.setdefault(candidate.label(), f"level {level:g}: not measured, its share of the time budget was spent")
                continue
            at_level.append(m)
        if not at_level:
            break
        reached.append((level, at_level))
        # 3. Prune before the next level, comparing like with like: a wait trades latency at low load
        # for batches at high load (under a closed loop a 2 ms wait at concurrency 1 costs two thirds
        # of the throughput, and wins at 16), so candidates are compared within their wait only.
        half: list[Measurement] = []
        for group in _by_wait(at_level):
            keep: list[Measurement] = []
            for m in group:
                label = m.candidate.label()
                if m.error:
                    pruned[label] = f"level {level:g}: failed ({m.error})"
                elif m.p99_us > settings.latency_budget_us and settings.objective != "latency":
                    pruned[label] = f"level {level:g}: p99 {m.p99_us:,.0f} us over the budget"
                elif (by := dominated(m, group, settings.noise)) is not None:
                    pruned[label] = f"level {level:g}: dominated by {by.candidate.label()}"
                else:
                    keep.append(m)
            ranked = sorted(keep, key=lambda m: _key(m, settings), reverse=True)
            better = ranked[:max(1, (len(ranked) + 1) // 2)]
            if better:  # a tie within the noise is no loss: below saturation all serve the offered load
                bar = _key(better[-1], settings) - abs(_key(better[-1], settings)) * settings.noise
                better += [m for m in ranked[len(better):] if _key(m, settings) >= bar]
            for m in ranked[len(better):]:
                pruned[m.candidate.label()] = f"level {level:g}: in the worse half of its wait by {settings.objective}"
            half += better
        survivors = [m.candidate for m in half]
        if not survivors:
            break

    result = SearchResult(measurements, pruned, sampled, len(candidates), clock() - start, stopped)
    best_m, second_m, deciding = _best_two(reached, settings)
    if best_m is None:
        result.reason = (f"no candidate met the latency budget ({settings.latency_budget_us:,.0f} us p99)"
                         if measurements else "the time budget allowed no measurement")
        result.elapsed_s = clock() - start
        return result
    result.best, result.deciding_level = best_m.candidate, deciding
    if second_m is None:
        result.recommended = best_m.candidate
        result.reason = "the only candidate within the budget"
        result.elapsed_s = clock() - start
        return result
    result.runner_up = second_m.candidate
    # 5. Repeat the two and compare the spread with the margin.
    again = [run(best_m.candidate, deciding, end, repeat=True), run(second_m.candidate, deciding, end, repeat=True)]
    if any(m is None for m in again):
        result.reason = "the time budget left no room to repeat the best two, so no recommendation"
        result.elapsed_s = clock() - start
        return result
    key = (lambda m: -m.p99_us) if settings.objective == "latency" else \
          (lambda m: 1e6 / m.server_cpu_us if m.server_cpu_us else 0.0) if settings.objective == "cost" else \
          (lambda m: m.throughput)
    spreads = [abs(key(a) - key(b)) / max(abs(key(a)), abs(key(b)), 1e-9) for a, b in
               ((best_m, again[0]), (second_m, again[1]))]
    best_mean = (key(best_m) + key(again[0])) / 2
    second_mean = (key(second_m) + key(again[1])) / 2
    result.spread = max(spreads)
    result.margin = (best_mean - second_mean) / max(abs(best_mean), 1e-9)
    if result.margin < result.spread:  # equal (a tie measured without spread): either is as good
        result.reason = (f"{best_m.candidate.label()} and {second_m.candidate.label()} differ by "
                         f"{result.margin:.1%}, less than the {result.spread:.1%} spread between repeats: "
                         "the measurements cannot tell them apart, so no recommendation")
    else:
        result.recommended = best_m.candidate if best_mean >= second_mean else second_m.candidate
        result.reason = (f"ahead by {result.margin:.1%} of the runner-up, more than the {result.spread:.1%} "
                         "spread between repeats")
    result.elapsed_s = clock() - start
    return result


def _key(m: Measurement, settings: SearchSettings) -> float:
    value = score(m, settings.objective, float("inf"))
    return float("-inf") if value is None else value


def _by_wait(measurements: Sequence[Measurement]) -> list[list[Measurement]]:
    groups: dict[tuple[int, str], list[Measurement]] = {}
    for m in measurements:
        c = m.candidate
        groups.setdefault((c.delay_us if c.batching else 0, c.batch_wait if c.batching and c.delay_us else ""), []).append(m)
    return list(groups.values())


def _best_two(reached: list[tuple[float, list[Measurement]]], settings: SearchSettings
              ) -> tuple[Measurement | None, Measurement | None, float]:
    """The best and runner-up measurement (distinct candidates) by the objective, and their level."""
    if not reached:
        return None, None, 0.0
    if settings.objective == "latency":
        level, pool = reached[-1]
    else:  # the best figure at any level; candidates compared at the level where the best is
        best_level = None
        best_score = float("-inf")
        for level, at in reached:
            for m in at:
                s = score(m, settings.objective, settings.latency_budget_us)
                if s is not None and s > best_score:
                    best_score, best_level = s, level
        if best_level is None:
            return None, None, 0.0
        level, pool = next((lv, at) for lv, at in reached if lv == best_level)
    ranked = sorted((m for m in pool if score(m, settings.objective, settings.latency_budget_us) is not None),
                    key=lambda m: score(m, settings.objective, settings.latency_budget_us), reverse=True)  # type: ignore[arg-type,return-value]
    if not ranked:
        return None, None, level
    return ranked[0], (ranked[1] if len(ranked) > 1 else None), level

"""The search behind ``inferd tune``, as pure code over a measuring function and a clock.

``measure(candidate, level)`` runs one round (:class:`~inferd.tune.rounds.Round`) and ``clock()``
says the time; nothing here sleeps or reads /proc, so tests drive it with a scripted load client
and a fake clock. The steps:

1. **Scan** the current configuration at the load levels, highest first, a few rounds each; the
   **target level** is the highest whose median p99 keeps the latency budget (the lowest level if
   none does; the highest for ``--objective latency``). Every comparison is made there.
2. **Candidates** are the space the model allows (:func:`inferd.tune.space.space`), less those
   that behave alike at the target concurrency (:func:`~inferd.tune.space.distinct_at`), nearest
   the current configuration first (one field changed, then two, ...; ties in a seeded order).
3. **Successive halving** (η = 3) in pairs of rounds against the current configuration: each of
   the first ``n`` candidates gets 2 pairs (an A-B-B-A block, so a drift of the host cancels),
   the best third 6 more, the best third of those 18 more, until one is left; ``n`` is as many as
   the budget allows while keeping half of it for the verification. Before each cut a candidate
   whose p99 (estimated from its pairs) misses the budget, or whose rounds failed, is dropped,
   and the report says why. (On the scripted host of tests/tune, a candidate truly 10% better
   survived the halving in 16 of 40 runs with one pair each in the first rung, in 29 of 40 with
   two, and in 21 of 40 with three, where fewer candidates fit.)
4. **The verification** (:mod:`inferd.tune.verify`): the one left against the current
   configuration in fresh pairs (its earlier pairs chose it, so they flatter it), until the budget
   ends. The decision rule (:func:`decide`), on the intervals of its ratio to the current
   configuration: the 98% one entirely above 1 -> **it wins** and is recommended (written with
   --write); the 90% one below ``1 + min_gain`` and no wider than ``±min_gain`` -> **the current
   configuration is best** (the best candidate screened does not beat it by ``min_gain``; the
   others fell behind it in the halving); otherwise **no decision**: the measurements cannot
   tell, and the report says how far they got. A change needs the stronger proof: on the
   scripted host a 90% bound named a winner in about 1 run in 30 of pure noise, the 98% one in
   none of 600 runs where no candidate was better.

Why not optuna: the space is small and discrete, and each point costs pairs of noisy rounds; what
makes a decision possible on a shared host is how rounds are spent (paired, alternating,
concentrated on few candidates, proven in fresh pairs), which a sampler does not decide. Why not the
previous design (every level, one measurement each, the best two repeated once): on this host one
measurement swings by 30-50%, so a repeat could not separate candidates 10-20% apart.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from inferd.tune.rounds import Estimate, Ledger, Pair, Round, estimate
from inferd.tune.space import Candidate, distance, distinct_at
from inferd.tune.stats import MIN_PAIRS, median

OBJECTIVES = ("throughput", "latency", "cost")
Measure = Callable[[Candidate, float], Round]


@dataclass
class SearchSettings:
    levels: Sequence[float]
    objective: str = "throughput"
    latency_budget_us: float = 20_000.0
    time_budget_s: float = 180.0
    seed: int = 0
    min_gain: float = 0.10  # "the current config is best" means no candidate is better by this much
    confidence: float = 0.90  # two-sided: the interval "the current config is best" is read from
    win_confidence: float = 0.98  # two-sided: the interval a winner must clear (its lower end, a one-sided 99%)
    eta: int = 3  # successive halving keeps the best 1/eta and gives it eta times the pairs
    first_pairs: int = 2  # each candidate's first rung: one A-B-B-A block (1 or 3 did worse: see the docstring)
    scan_rounds: int = 3
    max_verify_pairs: int = 80  # the verification stops here (a longer budget buys more candidates)
    round_estimate_s: float = 1.5  # one round's cost until rounds have been timed
    closed_loop: bool = True  # the levels are concurrencies (False: request rates)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if not self.levels:
            raise ValueError("at least one load level is needed")
        if not 0 < self.min_gain < 1:
            raise ValueError(f"min_gain must be between 0 and 1, got {self.min_gain}")


@dataclass
class LevelScan:
    level: float
    rounds: int
    throughput: float | None
    p99_us: float | None
    cpu_us: float | None


@dataclass
class CandidateReport:
    candidate: Candidate
    fate: str  # "verified" (the one the halving left) | "pruned"
    reason: str
    rung: int  # the last rung it was measured in
    estimate: Estimate | None  # over all its pairs


@dataclass
class Verification:
    candidate: Candidate
    level: float
    pairs: list[Pair]
    estimate: Estimate | None  # with the interval at ``confidence`` (what "the current config is best" reads)
    win: Estimate | None  # the same pairs, the interval at ``win_confidence`` (what a winner must clear)
    decision: str  # "winner" | "current" | "none"
    reason: str

    @property
    def passed(self) -> bool:
        return self.decision == "winner"


@dataclass
class SearchResult:
    decision: str  # "winner" (verified) | "current" | "none"
    reason: str
    recommended: Candidate | None
    target_level: float | None
    scan: list[LevelScan]
    reports: list[CandidateReport]
    never_reached: list[Candidate]
    space: int  # candidates the model allows
    distinct: int  # of them, distinct at the target level
    final: Candidate | None = None  # the one the halving left, verified
    verification: Verification | None = None
    ledger: Ledger = field(default_factory=Ledger)
    elapsed_s: float = 0.0
    stopped_by_budget: bool = False
    notes: list[str] = field(default_factory=list)
    objective: str = "throughput"

    @property
    def measured(self) -> int:
        return len(self.reports)


class Driver:
    """Runs rounds and pairs for the search: keeps the ledger, times rounds (a running mean) and
    alternates the order within pairs."""

    def __init__(self, measure: Measure, clock: Callable[[], float], base: Candidate, settings: SearchSettings) -> None:
        self.measure, self.clock, self.base, self.settings = measure, clock, base, settings
        self.ledger = Ledger()
        self.durations: list[float] = []
        self.base_first = True
        self.stopped = False

    @property
    def cost(self) -> float:
        """A round's cost: the median of those timed (the first ones also start servers and load
        clients, so a mean would overstate it), the settings' estimate before any."""
        return median(self.durations) if self.durations else self.settings.round_estimate_s

    def fits(self, rounds: int, deadline: float) -> bool:
        if self.clock() + rounds * self.cost <= deadline:
            return True
        self.stopped = True
        return False

    def round(self, candidate: Candidate, level: float, phase: str) -> Round:
        t0 = self.clock()
        r = self.measure(candidate, level)
        self.durations.append(self.clock() - t0)
        r.phase = phase
        self.ledger.rounds.append(r)
        return r

    def pair(self, candidate: Candidate, level: float, phase: str, deadline: float) -> Pair | None:
        """A round of the current config and one of ``candidate``, in alternating order; None
        (nothing run) when the two would end after ``deadline``."""
        if not self.fits(2, deadline):
            return None
        first, self.base_first = self.base_first, not self.base_first
        if first:
            a = self.round(self.base, level, phase)
            b = self.round(candidate, level, phase)
        else:
            b = self.round(candidate, level, phase)
            a = self.round(self.base, level, phase)
        p = Pair(a, b, first)
        self.ledger.pairs.setdefault(candidate, []).append(p)
        return p

    def base_p99(self, level: float) -> float | None:
        return self.ledger.base_p99(self.base, level)

    def estimate(self, pairs: Sequence[Pair], level: float, confidence: float | None = None) -> Estimate | None:
        return estimate(pairs, self.settings.objective, self.base_p99(level), confidence or self.settings.confidence)


def scan(driver: Driver, deadline: float) -> tuple[float | None, list[LevelScan], list[str]]:
    """Step 1: the current config at the levels, highest first; the target level and the notes."""
    s = driver.settings
    levels = sorted(set(s.levels), reverse=True)
    if s.objective == "latency":
        levels = levels[:1]
    out: list[LevelScan] = []
    for level in levels:
        rounds = []
        for _ in range(s.scan_rounds):
            if not driver.fits(1, deadline):
                break
            rounds.append(driver.round(driver.base, level, "scan"))
        ok = [r for r in rounds if r.ok]
        cpu = [r.server_cpu_us for r in ok if r.server_cpu_us]
        entry = LevelScan(level, len(rounds), median([r.throughput for r in ok]) if ok else None,
                          median([r.p99_us for r in ok]) if ok else None, median(cpu) if cpu else None)
        out.append(entry)
        if not ok:
            if not rounds:
                break
            continue
        if s.objective == "latency" or (entry.p99_us is not None and entry.p99_us <= s.latency_budget_us):
            return level, out, []
    measured = [e for e in out if e.p99_us is not None]
    if not measured and not any(e.rounds for e in out):
        need = (s.scan_rounds + 4 * MIN_PAIRS) * driver.cost
        return None, out, [f"the time budget ({s.time_budget_s:g} s) allows no round: a round takes about "
                           f"{driver.cost:.1f} s, and a scan with its verification needs at least about "
                           f"{need:.0f} s (--time-budget)"]
    if not measured:
        return None, out, ["the current configuration could not be measured at any level"]
    lowest = min(measured, key=lambda e: e.level)
    return lowest.level, out, [f"the current configuration misses the {s.latency_budget_us / 1e3:g} ms p99 budget at "
                                f"every level scanned; candidates are compared at the lowest, {lowest.level:g}"]


def order(candidates: Sequence[Candidate], base: Candidate, seed: int) -> list[Candidate]:
    """Nearest the current configuration first; among equally near ones an order drawn from
    ``seed`` and each candidate itself (so it does not depend on the order they came in)."""
    keyed = [(distance(c, base), random.Random(f"{seed}:{c.label()}").random(), c) for c in candidates]
    return [c for _, _, c in sorted(keyed, key=lambda t: (t[0], t[1]))]


def halving_cost(n0: int, settings: SearchSettings) -> int:
    """Pairs successive halving spends taking ``n0`` candidates down to one (the verification's not counted)."""
    cost, n, per = 0, n0, settings.first_pairs
    while n > 1:
        cost += n * per
        n, per = math.ceil(n / settings.eta), per * settings.eta
    return cost


def first_rung_size(available_pairs: int, candidates: int, settings: SearchSettings) -> int:
    """How many candidates the first rung can take, keeping half the pairs available (at most
    ``max_verify_pairs``, at least twice the 5 a decision needs) for the verification."""
    reserve = max(2 * MIN_PAIRS, min(settings.max_verify_pairs, available_pairs // 2))
    n0 = 1
    while n0 < candidates and halving_cost(n0 + 1, settings) <= available_pairs - reserve:
        n0 += 1
    return n0


def p99_limit(settings: SearchSettings, base_p99_us: float | None) -> float:
    """The p99 a candidate must keep: the budget, or where the current config itself misses the
    budget at the target level, no worse than the current config there."""
    return max(settings.latency_budget_us, base_p99_us or 0.0)


def p99_ok(est: Estimate, settings: SearchSettings, limit: float) -> bool:
    return settings.objective == "latency" or est.p99_us is None or est.p99_us <= limit


def _prune_reason(est: Estimate | None, rung: int, settings: SearchSettings, limit: float) -> str | None:
    """Why a candidate leaves before the cut: failed rounds, or a p99 over the limit (judged
    once it has 3 pairs: one pair's p99 is too noisy to drop a candidate on)."""
    if est is None:
        return f"rung {rung}: its rounds failed"
    if est.pairs >= 3 and not p99_ok(est, settings, limit):
        return f"rung {rung}: p99 ~{est.p99_us / 1e3:,.1f} ms, over {_limit_text(settings, limit)}"  # type: ignore[operator]
    return None


def _limit_text(settings: SearchSettings, limit: float) -> str:
    if limit > settings.latency_budget_us:
        return f"the current config's {limit / 1e3:,.1f} ms (itself over the {settings.latency_budget_us / 1e3:g} ms budget)"
    return f"the {settings.latency_budget_us / 1e3:g} ms budget"


def halve(driver: Driver, pool: list[Candidate], level: float, deadline: float,
          reports: dict[Candidate, CandidateReport]) -> Candidate | None:
    """Step 3: successive halving from ``pool`` down to one candidate (None: none survived)."""
    s = driver.settings
    survivors, per, rung = list(pool), s.first_pairs, 0
    while len(survivors) > 1:
        for c in survivors:
            for _ in range(per):
                if driver.pair(c, level, f"rung {rung}", deadline) is None:
                    break
        ranked = []
        limit = p99_limit(s, driver.base_p99(level))
        for c in survivors:
            pairs = driver.ledger.pairs.get(c, [])
            if not pairs:  # the budget ended the rung before it: never reached
                continue
            est = driver.estimate(pairs, level)
            errors = [p.other.error for p in pairs if p.other.error]
            why = _prune_reason(est, rung, s, limit) if est or not errors else f"rung {rung}: {errors[0]}"
            if why is not None:
                reports[c] = CandidateReport(c, "pruned", why, rung, est)
            else:
                ranked.append((est.score.estimate, c, est))  # type: ignore[union-attr]
        ranked.sort(key=lambda t: t[0], reverse=True)
        keep = max(1, math.ceil(len(ranked) / s.eta)) if ranked else 0
        for place, (_, c, est) in enumerate(ranked):
            reports[c] = CandidateReport(c, "verified" if place < keep else "pruned",
                                         "" if place < keep else
                                         f"rung {rung}: {est.ratio:.2f}x the current config over {est.pairs} "
                                         f"pair(s), placed {place + 1} of {len(ranked)}", rung, est)
        survivors = [c for _, c, _ in ranked[:keep]]
        per, rung = per * s.eta, rung + 1
        if driver.stopped:
            break
    if not survivors:
        return None
    best = survivors[0]
    if best not in reports:  # a single candidate: no rung was needed
        reports[best] = CandidateReport(best, "verified", "", -1, None)
    for c in survivors[1:]:  # the budget ended the halving early
        reports[c].fate, reports[c].reason = "pruned", f"rung {rung - 1}: the time budget ended the halving"
    return best


def decide(keep: Estimate | None, win: Estimate | None, candidate: Candidate, screened: int,
           settings: SearchSettings, limit: float) -> tuple[str, str]:
    """The rule, on the verification's fresh pairs: ("winner" | "current" | "none", why).

    ``win`` and ``keep`` are the same pairs' estimate with the interval at the confidence of each
    claim: a change is written only when the lower end of the ``win_confidence`` interval is above 1
    (a one-sided 99% bound by default: the figures must prove it); the current config is called
    best when the ``confidence`` interval (90%) lies below ``1 + min_gain`` *and* is no wider than
    ``±min_gain`` (a low estimate from pairs too noisy to resolve such a gain is no evidence)."""
    if keep is None or win is None or not keep.score.bounded:
        got = 0 if keep is None else keep.pairs
        return "none", f"the time budget left {got} pair(s) to verify {candidate.label()}, too few for an interval"

    def span(est: Estimate) -> str:
        return (f"{est.ratio:.2f}x the current config ({_pct(est.score.coverage)} interval {est.low:.2f}-{est.high:.2f}, "
                f"{est.pairs} fresh pairs)")

    latency_ok = p99_ok(keep, settings, limit)
    gain = math.log1p(settings.min_gain)
    if win.score.bounded and win.low > 1.0 and latency_ok:
        return "winner", f"{candidate.label()} measured {span(win)}: it wins by more than the spread of the pairs"
    if not latency_ok:
        return "none", (f"the best candidate, {candidate.label()}, measured {span(keep)} but its p99 "
                        f"(~{keep.p99_us / 1e3:,.1f} ms) is over {_limit_text(settings, limit)}")  # type: ignore[operator]
    precise = keep.score.high - keep.score.low <= 2 * gain
    if keep.score.high < gain and precise:
        return "current", (f"the best of {screened} candidates screened, {candidate.label()}, measured {span(keep)}: "
                           f"not {settings.min_gain:.0%} better than the current config, which stays")
    why = ("the pairs are too noisy to resolve a gain that size" if not precise
           else "the interval reaches past that gain")
    return "none", (f"the best candidate, {candidate.label()}, measured {span(keep)}: the measurements cannot tell "
                    f"whether it is {settings.min_gain:.0%} better than the current config ({why})")


def _pct(coverage: float) -> str:
    """A confidence as printed: 90%, 96.7%, 99.3%."""
    text = f"{coverage:.1%}"
    return text.replace(".0%", "%")


def search(candidates: Sequence[Candidate], base: Candidate, settings: SearchSettings, measure: Measure,
           clock: Callable[[], float], progress: Callable[[str], None] = lambda _: None) -> SearchResult:
    """Run the whole search (scan, halving, verification) within ``settings.time_budget_s``;
    ``progress`` hears a line at each step."""
    from inferd.tune.verify import verify

    start = clock()
    end = start + settings.time_budget_s
    driver = Driver(measure, clock, base, settings)
    # The scan may not take the time the verification needs at the least.
    target, scans, notes = scan(driver, end - 2 * MIN_PAIRS * 2 * driver.cost)
    result = SearchResult("none", "", None, target, scans, [], [], len(candidates), 0, ledger=driver.ledger,
                          notes=notes, objective=settings.objective)

    def finish(decision: str, reason: str) -> SearchResult:
        result.decision, result.reason = decision, reason
        base_p99 = driver.base_p99(target) if target is not None else None
        if base_p99 is not None and base_p99 > settings.latency_budget_us and settings.objective != "latency":
            result.notes.append(f"over all its rounds the current config's p99 at {target:g} was {base_p99 / 1e3:,.1f} ms, "
                                f"over the {settings.latency_budget_us / 1e3:g} ms budget: candidates were held to "
                                "no worse than that")
        result.elapsed_s, result.stopped_by_budget = clock() - start, driver.stopped
        return result

    if target is None:
        return finish("none", notes[0] if notes else "the time budget allowed no measurement")
    for entry in scans:
        progress(f"scan: the current config at {entry.level:g}: {entry.rounds} rounds, p99 "
                 + (f"{entry.p99_us / 1e3:,.1f} ms" if entry.p99_us is not None else "not measured"))
    progress(f"target level {target:g}" + (f" ({notes[0]})" if notes else ""))
    pool = order(distinct_at(list(candidates), int(target) if settings.closed_loop else None, base), base,
                 settings.seed)
    result.distinct = len(pool)
    if not pool:
        return finish("current", "the model allows no other configuration to compare with")
    available = int((end - clock()) / (2 * driver.cost))
    n0 = first_rung_size(available, len(pool), settings)
    progress(f"{len(pool)} candidates differ at {target:g}; successive halving over the first {n0} "
             f"(room for ~{available} pairs of rounds, half of them kept for the verification)")
    reports: dict[Candidate, CandidateReport] = {}
    search_end = end - max(2 * MIN_PAIRS, min(settings.max_verify_pairs, available // 2)) * 2 * driver.cost
    best = halve(driver, pool[:n0], target, search_end, reports)
    result.reports = list(reports.values())
    result.never_reached = [c for c in pool if c not in reports]
    if best is None:
        return finish("none", "every candidate measured failed or missed the latency budget" if reports
                      else "the time budget ended before a candidate was measured")
    result.final = best
    progress(f"verification: {best.label()} against the current config in fresh pairs")
    result.verification = verify(driver, best, target, end, n0)
    reports[best].estimate = driver.estimate(driver.ledger.pairs.get(best, []), target)
    if result.verification.passed:
        result.recommended = best
    return finish(result.verification.decision, result.verification.reason)

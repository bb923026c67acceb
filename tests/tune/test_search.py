"""inferd.tune.search and .verify as pure code: a scripted load client (tests/tune/fake_host.py:
throughput swinging with a wandering host load, plus a wobble per round) on a fake clock.

The decision rule, on forty seeds each: no decision on pure noise, the right candidate (and a
verified one) on a real 10% difference, the current config kept when nothing differs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from inferd.tune.rounds import Pair, Round, estimate, log_ratios
from inferd.tune.search import SearchSettings, decide, first_rung_size, halving_cost, search
from inferd.tune.space import Candidate, SpaceLimits, current, space

from .fake_host import FakeClock, FakeHost, model_config

BASE = model_config(32)
NOW = current(BASE)
BETTER = replace(NOW, instances=2)  # one field from the current config, as a real improvement often is
SEEDS = range(40)


def run(seed: int, noise: float, truth: dict[Candidate, float] | None = None, **settings: object):
    clock = FakeClock()
    host = FakeHost(clock, seed=seed, noise=noise, truth=truth or {})
    options = {"levels": [2, 8, 16], "time_budget_s": 180.0, "seed": seed, **settings}
    result = search(space(BASE, SpaceLimits(cores=2)), NOW, SearchSettings(**options), host, clock)  # type: ignore[arg-type]
    return result, host, clock


def test_no_decision_on_pure_noise() -> None:
    # Every candidate is the current config's equal and a round's own wobble (sd 0.4 in log terms,
    # on top of the host's drift) swamps any 10% difference: the rule must pick nothing and must
    # not claim the current config is best either: it cannot tell.
    outcomes = [run(seed, noise=0.4)[0] for seed in SEEDS]
    assert [r.decision for r in outcomes] == ["none"] * len(outcomes)
    assert all(r.recommended is None and "cannot tell" in r.reason for r in outcomes)
    assert all("too noisy to resolve" in r.reason for r in outcomes)
    assert all(r.verification is not None and len(r.verification.pairs) >= 20 for r in outcomes)


def test_the_right_one_on_a_real_ten_percent_difference() -> None:
    outcomes = [run(seed, noise=0.06, truth={BETTER: 1.10})[0] for seed in SEEDS]
    winners = [r for r in outcomes if r.decision == "winner"]
    assert all(r.recommended == BETTER for r in winners)  # never a wrong one
    # 29 of these 40 seeds: the misses are the first rung's screening on two pairs placing it below
    # the best third; those runs keep the current config, saying the best candidate *screened* is
    # not 10% better, which is true of what they measured.
    assert len(winners) >= 29, [r.reason for r in outcomes if r.decision != "winner"]
    assert all(r.decision == "current" and "screened" in r.reason for r in outcomes if r.decision != "winner")
    for r in winners:  # ... each proven in its own verification, in fresh pairs
        v = r.verification
        assert v is not None and v.passed and v.candidate == BETTER and len(v.pairs) >= 10
        assert all(p.other.phase == "verify" for p in v.pairs) and 1.04 < v.estimate.ratio < 1.16


def test_the_current_config_stays_when_nothing_differs() -> None:
    outcomes = [run(seed, noise=0.06)[0] for seed in SEEDS]
    assert [r.decision for r in outcomes] == ["current"] * len(outcomes)
    current_best = outcomes
    for r in current_best:  # with the evidence: the verification's interval, below +10% and narrow
        est = r.verification.estimate
        assert est is not None and est.pairs >= 10 and est.high < 1.10 and est.high / est.low <= 1.10 ** 2
        assert "not 10% better" in r.reason


def test_a_winner_that_does_not_hold_up_is_not_recommended() -> None:
    # The candidate is 20% better until the verification starts, then no better: the search picks
    # it, the fresh pairs of the verification refuse it.
    clock = FakeClock()
    host = FakeHost(clock, seed=3, noise=0.06, truth={BETTER: 1.2})
    seen: list[Round] = []

    def measure(candidate: Candidate, level: float) -> Round:
        if any(r.phase == "verify" for r in seen):  # the search tags each round once measure returns
            host.truth = {}
        seen.append(host(candidate, level))
        return seen[-1]

    result = search(space(BASE, SpaceLimits(cores=2)), NOW, SearchSettings(levels=[16], seed=3), measure, clock)
    assert result.final == BETTER and result.verification is not None
    assert not result.verification.passed and result.recommended is None and result.decision == "current"
    rungs = [p for p in result.ledger.pairs[BETTER] if p.other.phase.startswith("rung")]
    assert estimate(rungs, "throughput", None, 0.9).ratio > 1.1  # it did look better while it was


def test_the_time_budget_holds_and_every_candidate_is_accounted_for() -> None:
    result, host, clock = run(5, noise=0.06, truth={BETTER: 1.10})
    assert clock.now <= 180.0
    measured = {r.candidate for r in result.reports}
    assert len(measured) + len(result.never_reached) == result.distinct
    assert not measured & set(result.never_reached)
    assert all(r.reason for r in result.reports if r.fate == "pruned")
    assert {c for c, _ in host.calls} - {NOW} == measured  # nothing measured is left out of the report
    assert result.target_level == 16 and {lv for _, lv in host.calls} == {16}  # the scan found it at once


def test_the_scan_steps_down_to_a_level_that_keeps_the_budget() -> None:
    clock = FakeClock()
    host = FakeHost(clock, seed=1, noise=0.02)
    host.base_p99_us = 30_000.0
    result = search(space(BASE, SpaceLimits(cores=2)), NOW, SearchSettings(levels=[2, 8, 16], time_budget_s=60.0),
                    host, clock)
    assert [e.level for e in result.scan] == [16, 8, 2] and result.target_level == 2
    assert "misses the 20 ms p99 budget at every level" in result.notes[0]


def test_ratios_are_signed_so_that_above_zero_is_better() -> None:
    pair = Pair(Round(NOW, 16, 1000, 1, 8000, server_cpu_us=400), Round(BETTER, 16, 1500, 1, 4000, server_cpu_us=200),
                True)
    assert log_ratios([pair], "throughput")[0] == pytest.approx(math.log(1.5))
    assert log_ratios([pair], "latency")[0] == pytest.approx(math.log(2))  # half the p99
    assert log_ratios([pair], "cost")[0] == pytest.approx(math.log(2))  # half the CPU per inference
    failed = Pair(Round(NOW, 16, 1000, 1, 8000), Round(BETTER, 16, 0, 0, 0, error="did not load"), False)
    assert log_ratios([failed], "throughput") == []
    est = estimate([pair] * 5 + [failed], "throughput", 8000.0, 0.9)
    assert est.pairs == 5 and est.failed == 1 and est.p99_us == pytest.approx(4000)


def test_the_budget_split_keeps_half_for_the_verification() -> None:
    settings = SearchSettings(levels=[16])
    assert halving_cost(1, settings) == 0 and halving_cost(3, settings) == 6 and halving_cost(9, settings) == 36
    assert first_rung_size(80, 100, settings) == 9  # 36 pairs of halving, 40 kept for the verification
    assert first_rung_size(80, 4, settings) == 4  # never more than there are
    assert first_rung_size(12, 100, settings) == 1  # no room to halve: straight to the verification


def test_the_decision_rule_on_given_intervals() -> None:
    settings = SearchSettings(levels=[16])

    def verdict(ratios: list[float], p99: float = 5000) -> tuple[str, str]:
        pairs = [Pair(Round(NOW, 16, 1000, 1, 5000), Round(BETTER, 16, 1000 * x, 1, p99), True) for x in ratios]
        keep, win = (estimate(pairs, "throughput", 5000.0, c) for c in (0.90, 0.98))
        return decide(keep, win, BETTER, 9, settings, 20_000)

    assert verdict([1.1, 1.12, 1.09, 1.11, 1.13, 1.1, 1.08, 1.12])[0] == "winner"
    # above 1 at 90%, not at 98%: not enough to write a change, too high to call it no better
    assert verdict([0.97, 1.15, 1.05, 1.12, 0.99, 1.18, 1.08, 1.03])[0] == "none"
    assert verdict([0.99, 1.01, 1.0, 0.98, 1.02, 1.0])[0] == "current"
    wide = verdict([0.7, 1.3, 0.9, 1.2, 1.0, 0.8])
    assert wide[0] == "none" and "too noisy" in wide[1]
    few = verdict([1.1, 1.12, 1.09, 1.11])
    assert few[0] == "none" and "too few" in few[1]
    slow = verdict([1.2] * 8, p99=30_000)  # faster, but its p99 breaks the budget
    assert slow[0] == "none" and "over the 20 ms budget" in slow[1]


def test_a_budget_too_short_for_any_round_says_so_and_how_much_would_do() -> None:
    result, host, _ = run(1, noise=0.06, time_budget_s=5.0)
    assert result.decision == "none" and not host.calls
    assert "time budget (5 s) allows no round" in result.reason and "--time-budget" in result.reason
    needed = float(result.reason.split("needs at least about ")[1].split(" s")[0])
    assert run(1, noise=0.06, time_budget_s=needed + 1)[0].target_level is not None  # and that much does

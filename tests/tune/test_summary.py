"""inferd.tune.summary: the report says what was measured, pruned (and why) and never reached,
prints the verification pair by pair, and the JSON holds every round."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferd.tune import summary
from inferd.tune.search import SearchSettings, search
from inferd.tune.space import SpaceLimits, space

from .fake_host import FakeClock, FakeHost
from .test_search import BASE, BETTER, NOW


def _run(truth: dict, seed: int = 0):
    clock = FakeClock()
    settings = SearchSettings(levels=[2, 8, 16], seed=seed)
    return search(space(BASE, SpaceLimits(cores=2)), NOW, settings, FakeHost(clock, seed=seed, noise=0.06, truth=truth),
                  clock), settings


def test_the_report_accounts_for_every_candidate_and_prints_the_verification() -> None:
    result, settings = _run({BETTER: 1.10})
    assert result.decision == "winner" and result.verification is not None
    text = summary.report(result)
    pruned = [r for r in result.reports if r.fate == "pruned"]
    assert (f"the model allows {result.space}; {result.distinct} behave differently at 16; {result.measured} measured "
            f"(1 verified, {len(pruned)} pruned), {len(result.never_reached)} never reached") in text
    for rep in pruned:
        assert f"pruned: {rep.reason}" in text
    table = summary.verification_text(result.verification).splitlines()
    rows = [line for line in table if line.strip()[:1].isdigit()]
    assert len(rows) == len(result.verification.pairs) >= 5
    assert table[-1].startswith(f"{BETTER.label()} WINS")
    assert "other processes used" in text and "current config at 16" in text
    assert summary.decision_line(result).startswith(f"decision: {BETTER.label()}")


def test_the_json_holds_the_decision_and_every_round(tmp_path: Path) -> None:
    result, settings = _run({})
    doc = json.loads(summary.to_json(result, settings, {"model": "m"}))
    assert doc["decision"] == result.decision == "current" and doc["recommended"] is None
    assert len(doc["rounds"]) == len(result.ledger.rounds)
    assert {r["phase"] for r in doc["rounds"]} >= {"scan", "rung 0", "verify"}
    assert set(doc["pruned"]) == {r.candidate.label() for r in result.reports if r.fate == "pruned"}
    assert len(doc["never_reached"]) == len(result.never_reached)
    v = doc["verification"]
    assert v["decision"] == "current" and not v["passed"] and v["estimate"]["pairs"] >= 10 and v["estimate"]["high"] < 1.1
    assert v["win_estimate"]["low"] < v["estimate"]["low"]  # the same pairs, the winner's wider interval
    assert len(v["pairs"]) == v["estimate"]["pairs"]
    assert summary.decision_line(result).startswith("decision: the current config is best")


def test_the_plot_is_drawn_where_matplotlib_is_installed(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib (pip install 'inferd[perf]')")
    result, settings = _run({BETTER: 1.10})
    summary.plot(result, settings, tmp_path / "tune.png")
    assert (tmp_path / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

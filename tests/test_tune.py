"""inferd tune: the search as pure code on a fake clock and a model of a server, the space a model
allows, the config it writes loading, and one short real run against a server."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from inferd._proto import model_config_pb2 as mc
from inferd.config import parse_config_text
from inferd.tune import summary
from inferd.tune.search import Measurement, SearchSettings, search
from inferd.tune.space import Candidate, SpaceLimits, batch_sizes, current, space

BASE = parse_config_text("""
name: "m"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
""", model="m")


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class FakeServer:
    """A deterministic model of a server: capacity grows with batch size and instances, a wait adds
    latency at low load, and p99 climbs as the load nears capacity. Each measurement costs 10 s."""

    def __init__(self, clock: FakeClock, cost_s: float = 10.0, noise: float = 0.0) -> None:
        self.clock, self.cost_s, self.noise = clock, cost_s, noise
        self.calls: list[tuple[Candidate, float]] = []

    def truth(self, c: Candidate, level: float) -> tuple[float, float]:
        """(throughput, p99) under a closed loop of ``level`` clients: each request takes 1 ms plus the
        wait; the capacity grows with the instances and the batch size; latency is Little's law."""
        service_us = 1000.0 + c.delay_us
        capacity = 1000.0 * c.instances * (1 + (c.max_batch_size ** 0.5 if c.batching else 0))
        throughput = min(level * 1e6 / service_us, capacity)
        return throughput, 1.5 * level * 1e6 / throughput

    def __call__(self, c: Candidate, level: float) -> Measurement:
        self.calls.append((c, level))
        self.clock.now += self.cost_s
        throughput, p99 = self.truth(c, level)
        repeat_of = sum(1 for cc, lv in self.calls if cc == c and lv == level) - 1
        wobble = 1 + (self.noise if repeat_of % 2 else -self.noise)
        return Measurement(c, level, throughput * wobble, p99 / 2, p99 * 0.9, p99, server_cpu_us=100.0 / c.instances)


def test_the_search_chooses_what_the_model_of_the_server_says_is_best() -> None:
    clock = FakeClock()
    server = FakeServer(clock)
    candidates = space(BASE, SpaceLimits(cores=2))
    settings = SearchSettings(levels=[1, 4, 16], latency_budget_us=20_000, time_budget_s=100_000, estimate_s=10)
    result = search(candidates, settings, server, clock, reference=[current(BASE)])
    # With room to measure everything, the winner is the best throughput within budget at any level.
    best = max(((server.truth(c, lv)[0], c) for c in candidates for lv in settings.levels
                if server.truth(c, lv)[1] <= 20_000), key=lambda t: t[0])[1]
    assert result.recommended == best
    assert result.sampled == len(candidates)  # all of it fitted the first level's share
    assert result.margin is not None and result.spread == 0.0


def test_what_cannot_win_at_low_load_is_not_measured_at_high_load() -> None:
    clock = FakeClock()
    server = FakeServer(clock)
    candidates = space(BASE, SpaceLimits(cores=2))
    settings = SearchSettings(levels=[4, 16], latency_budget_us=5000, time_budget_s=100_000, estimate_s=10)
    result = search(candidates, settings, server, clock)
    low = {c for c, lv in server.calls if lv == 4}
    high = {m.candidate for m in result.measurements if m.level == 16 and not m.repeat}
    over = {c for c in low if server.truth(c, 4)[1] > 5000}  # too little capacity: no batching on 1 instance
    assert over and not over & high
    assert all(result.pruned[c.label()].startswith("level 4: p99") for c in over)
    dominated = {c for c in low if result.pruned.get(c.label(), "").startswith("level 4: dominated by")}
    assert dominated and not dominated & high
    assert len(high) < len(low)
    # ... and what was pruned could not have won: the best at 16 among all candidates is among the measured.
    best_16 = max((c for c in candidates if server.truth(c, 16)[1] <= 5000), key=lambda c: server.truth(c, 16)[0])
    assert server.truth(best_16, 16)[0] == max(server.truth(c, 16)[0] for c in high)


def test_the_time_budget_stops_the_search() -> None:
    clock = FakeClock()
    server = FakeServer(clock, cost_s=10)
    settings = SearchSettings(levels=[1, 4, 16], time_budget_s=200, estimate_s=10)
    result = search(space(BASE, SpaceLimits(cores=2)), settings, server, clock, reference=[current(BASE)])
    assert clock.now <= 200 and len(server.calls) <= 20
    assert result.stopped_by_budget
    assert result.sampled == 8  # the first level's share: 40% of 200 s at 10 s a measurement
    assert current(BASE) in {c for c, _ in server.calls}  # the reference is always in the sample
    assert {lv for _, lv in server.calls} >= {1, 4}  # later levels still got their share


def test_no_recommendation_when_repeats_spread_more_than_the_candidates_differ() -> None:
    clock = FakeClock()
    server = FakeServer(clock, noise=0.3)  # the repeat reads 30% off the first measurement
    settings = SearchSettings(levels=[1, 4], time_budget_s=100_000, estimate_s=10)
    result = search(space(BASE, SpaceLimits(cores=2)), settings, server, clock)
    assert result.best is not None and result.recommended is None
    assert result.spread is not None and result.margin is not None and result.margin <= result.spread
    assert "cannot tell them apart" in result.reason


def test_the_seed_decides_the_sample() -> None:
    runs = []
    for seed in (1, 1, 2):
        clock = FakeClock()
        server = FakeServer(clock)
        settings = SearchSettings(levels=[1], time_budget_s=200, estimate_s=10, seed=seed)
        search(space(BASE, SpaceLimits(cores=2)), settings, server, clock)
        runs.append([c for c, _ in server.calls])
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_the_space_follows_what_the_model_allows() -> None:
    assert batch_sizes(32) == [4, 8, 16, 32] and batch_sizes(6) == [4, 6] and batch_sizes(1) == [1]
    candidates = space(BASE, SpaceLimits(cores=2))
    assert {c.max_batch_size for c in candidates if c.batching} == {4, 8, 16, 32}
    assert {c.instances for c in candidates} == {1, 2}
    assert all(c.batch_wait == "adaptive" for c in candidates if c.delay_us == 0)
    unbatched = mc.ModelConfig()
    unbatched.CopyFrom(BASE)
    unbatched.max_batch_size = 0
    assert {c.batching for c in space(unbatched, SpaceLimits(cores=4))} == {False}
    assert len(space(unbatched, SpaceLimits(cores=4))) == 4
    gpu = space(BASE, SpaceLimits(cores=1, gpus=1, frontend_workers=(0, 2)))
    assert {c.kind for c in gpu} == {"KIND_CPU", "KIND_GPU"} and {c.frontend_workers for c in gpu} == {0, 2}


def test_a_candidate_applied_to_a_config_reads_back_as_itself() -> None:
    c = Candidate(True, 16, 500, "fixed", (16,), 2, "KIND_CPU")
    config = c.apply(BASE)
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [16]
    assert config.parameters["inferd.batch_wait"].string_value == "fixed"
    assert current(config) == c
    plain = Candidate(batching=False, instances=1).apply(BASE)
    assert not plain.HasField("dynamic_batching") and plain.max_batch_size == 32
    assert current(plain) == replace(Candidate(batching=False), instances=1)


def test_written_config_loads_and_the_old_one_is_kept(example_repository: Path, tmp_path: Path) -> None:
    shutil.copytree(example_repository / "simple", tmp_path / "simple")
    old = (tmp_path / "simple" / "config.pbtxt").read_text()
    base = parse_config_text(old, model="simple")
    chosen = Candidate(True, 8, 100, "fixed", (8,), 2).apply(base)
    assert "max_queue_delay_microseconds: 100" in summary.config_diff(base, chosen, "simple")
    kept = summary.write_config(tmp_path / "simple", chosen)
    assert kept.read_text() == old
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", "check", str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "simple: READY" in proc.stdout


@pytest.mark.server
@pytest.mark.fixed_mode  # the run chooses its server's mode (--frontend-workers 0)
def test_a_short_real_run_measures_loads_and_reports(example_repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "simple", repo / "simple")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", "tune", "-m", "simple", "--model-repository",
                           str(repo), "--time-budget", "20s", "-p", "300", "--concurrency-range", "2",
                           "--out", str(out), "--frontend-workers", "0"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr  # 3: no recommendation (noise), said why
    doc = json.loads((out / "tune.json").read_text())
    assert doc["measured"] >= 1 and doc["space"] > doc["sampled"] >= 2
    # How many candidates 20 s measures depends on the machine's load; every sampled candidate is either
    # measured or says why it was not (its share of the budget spent, pruned, dominated).
    labels = {m["label"] for m in doc["measurements"]}
    assert len(labels | set(doc["pruned"])) >= doc["sampled"], doc
    assert doc["measured"] >= 2 or doc["stopped_by_budget"], doc
    measured = [m for m in doc["measurements"] if not m["error"]]
    assert measured and all(m["throughput"] > 0 and m["server_cpu_us"] > 0 for m in measured)
    assert {m["label"] for m in doc["measurements"]} >= {"no batching, 1xCPU, workers 0"}
    assert (out / "tune.png").stat().st_size > 0
    assert ("chosen:" in proc.stdout) == (proc.returncode == 0) and doc["reason"]

"""inferd.tune.space: the candidates a model allows, which of them a load can tell apart, and the
order the search takes them in; a candidate written into a config reads back as itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from inferd._proto import model_config_pb2 as mc
from inferd.config import parse_config_text
from inferd.tune import summary
from inferd.tune.search import order
from inferd.tune.space import (Candidate, SpaceLimits, as_seen_at, batch_sizes, current, distance, distinct_at,
                               space)

from .fake_host import model_config

BASE = model_config(64)
NOW = current(BASE)


def test_the_space_follows_what_the_model_allows() -> None:
    assert batch_sizes(32) == [4, 8, 16, 32] and batch_sizes(6) == [4, 6] and batch_sizes(1) == [1]
    candidates = space(BASE, SpaceLimits(cores=2))
    assert {c.max_batch_size for c in candidates if c.batching} == {4, 8, 16, 32, 64}
    assert {c.instances for c in candidates} == {1, 2}
    assert all(c.batch_wait == "adaptive" for c in candidates if c.delay_us == 0)
    unbatched = mc.ModelConfig()
    unbatched.CopyFrom(BASE)
    unbatched.max_batch_size = 0
    assert {c.batching for c in space(unbatched, SpaceLimits(cores=4))} == {False}
    assert len(space(unbatched, SpaceLimits(cores=4))) == 4
    gpu = space(BASE, SpaceLimits(cores=1, gpus=1, frontend_workers=(0, 2)))
    assert {c.kind for c in gpu} == {"KIND_CPU", "KIND_GPU"} and {c.frontend_workers for c in gpu} == {0, 2}


def test_what_a_closed_loop_cannot_tell_apart_is_measured_once() -> None:
    # With 16 clients never more than 16 requests wait: sizes 32 and 64 both never fill (the
    # batch runs when the wait ends), a preferred size of 32 is never reached; 16 does fill.
    assert as_seen_at(replace(NOW, max_batch_size=32), 16) == as_seen_at(NOW, 16)
    assert as_seen_at(replace(NOW, max_batch_size=16), 16) != as_seen_at(NOW, 16)
    assert as_seen_at(replace(NOW, delay_us=500, preferred=(32,)), 16) == as_seen_at(replace(NOW, delay_us=500), 16)
    candidates = space(BASE, SpaceLimits(cores=2))
    at16 = distinct_at(candidates, 16, NOW)
    assert NOW not in at16 and len(at16) < len(candidates) - 1
    assert len({as_seen_at(c, 16) for c in at16}) == len(at16)  # one of each kind
    # of a group the one nearest the current config stays: 64 (the current size), not 32
    assert replace(NOW, delay_us=100) in at16 and replace(NOW, max_batch_size=32, delay_us=100) not in at16
    assert len(distinct_at(candidates, 2, NOW)) < len(at16)
    assert len(distinct_at(candidates, None, NOW)) == len(candidates) - 1  # an open loop: all differ


def test_the_search_takes_the_nearest_candidates_first() -> None:
    assert distance(NOW, NOW) == 0
    assert distance(NOW, replace(NOW, instances=2)) == 1
    assert distance(NOW, replace(NOW, delay_us=500)) == 1  # an adaptive wait: one step from none
    assert distance(NOW, replace(NOW, delay_us=500, batch_wait="fixed")) == 2  # a fixed one: two
    assert distance(NOW, Candidate(batching=False)) == 1
    ordered = order(distinct_at(space(BASE, SpaceLimits(cores=2)), 16, NOW), NOW, seed=0)
    steps = [distance(c, NOW) for c in ordered]
    assert steps == sorted(steps) and steps[0] == 1
    assert order(ordered[::-1], NOW, seed=0) == ordered and order(ordered, NOW, seed=1) != ordered


def test_a_candidate_applied_to_a_config_reads_back_as_itself() -> None:
    c = Candidate(True, 16, 500, "fixed", (16,), 2, "KIND_CPU")
    config = c.apply(BASE)
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(config.dynamic_batching.preferred_batch_size) == [16]
    assert config.parameters["inferd.batch_wait"].string_value == "fixed"
    assert current(config) == c
    plain = Candidate(batching=False, instances=1).apply(BASE)
    assert not plain.HasField("dynamic_batching") and plain.max_batch_size == 64
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

"""inferd.host: the CPU budget a container's cgroup quota allows."""

from __future__ import annotations

import os
from pathlib import Path

from inferd.host import cgroup_cpu_quota, cpu_budget


def test_cgroup_v2_quota_caps_the_budget(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 CPUs
    assert cgroup_cpu_quota(tmp_path) == 1.5
    assert cpu_budget(tmp_path) == min(2, len(os.sched_getaffinity(0)))


def test_cgroup_v2_without_a_quota_leaves_the_affinity_mask(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    assert cpu_budget(tmp_path) == len(os.sched_getaffinity(0))


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) == 1.0
    assert cpu_budget(tmp_path) == 1


def test_cgroup_v1_unlimited_and_no_cgroup(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path) is None  # no files at all
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_cpu_quota(tmp_path) is None
    assert cpu_budget(tmp_path) >= 1

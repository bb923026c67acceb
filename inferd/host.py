"""What the host gives this process: how many CPUs it may really use.

``os.cpu_count()`` counts the machine's cores. In a container with a CPU
limit (a Kubernetes pod asking for 2 CPUs on a 64-core node), the process
may use far fewer, and runtime thread pools sized from the core count
oversubscribe the quota and get throttled. The budget is the smallest of
the cores this process may run on (its affinity mask) and the cgroup's CPU
quota (cgroup v2 ``cpu.max``, or v1 ``cpu.cfs_quota_us``/``cpu.cfs_period_us``),
rounded up.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cpu_budget(cgroup_root: Path = CGROUP_ROOT) -> int:
    """CPUs this process can use (>= 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cgroup_root)
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The cgroup's CPU quota in CPUs, or None when it sets none (or there is no cgroup)."""
    try:
        quota, period = (cgroup_root / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "200000 100000"
        if quota == "max":
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((cgroup_root / "cpu" / "cpu.cfs_quota_us").read_text())  # v1: -1 when unlimited
        period_us = int((cgroup_root / "cpu" / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None

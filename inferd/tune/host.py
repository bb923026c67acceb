"""What /proc says about a round: the host's busy CPU time, the server's process tree, and from
them how many cores other processes used while a configuration was measured.

On a shared host the throughput a round gets follows the load of everything else running; that
load is measured here and reported beside each round (not used to correct the ratios: see
:mod:`inferd.tune.rounds` for why). Linux only; elsewhere (or with ``-u`` and no server process
to read) the figures are None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from inferd.observability.procfs import PROC, TICK, tree_usage


def host_busy_s(proc: Path = PROC) -> float | None:
    """CPU seconds all cores spent busy since boot (/proc/stat's first line less idle and iowait)."""
    try:
        with open(proc / "stat") as fh:
            fields = fh.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(values) - values[3] - values[4]) / TICK


@dataclass(frozen=True)
class Mark:
    """The moment a window ended: time, the host's busy CPU, the server tree's CPU and RSS."""

    t: float
    host_s: float | None
    server_s: float | None
    rss_mib: float | None


def mark(server_pid: int | None, proc: Path = PROC) -> Mark:
    cpu = rss = None
    if server_pid is not None:
        cpu, rss = tree_usage(server_pid, proc)
    return Mark(time.monotonic(), host_busy_s(proc), cpu, rss)


@dataclass(frozen=True)
class Usage:
    """Between two marks: the server's CPU seconds and the cores everything else used."""

    seconds: float
    server_s: float | None
    others_cores: float | None
    rss_mib: float | None


def usage(start: Mark, end: Mark, client_cpu_s: float) -> Usage:
    """The span from ``start`` to ``end``; ``client_cpu_s``: the load client's CPU over it (its
    own, not others')."""
    seconds = max(end.t - start.t, 1e-9)
    server = end.server_s - start.server_s if end.server_s is not None and start.server_s is not None else None
    others = None
    if end.host_s is not None and start.host_s is not None and server is not None:
        others = max(0.0, end.host_s - start.host_s - server - client_cpu_s) / seconds
    return Usage(seconds, server, others, end.rss_mib)

"""What /proc says of a process tree: each process's CPU time and resident memory.

Read by the tools that measure a running server from outside (``inferd tune``'s runs,
the benchmarks' ``bench/proc_cpu.py``): the server's processes are the root (the core),
every process below it (frontend workers, found through /proc's parent links), and the
members of its process group when it leads one. And by a model host of itself: its private
memory, the model's footprint (:func:`private_bytes`). Linux only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

PROC = Path("/proc")
TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # clock ticks per second
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of /proc/<pid>/stat read here."""

    pid: int
    ppid: int
    pgrp: int
    ticks: int  # utime + stime: every thread of the process, since it started
    start: int  # start time in ticks after boot: with the pid, names one process even if the pid is reused
    rss_pages: int = 0  # resident set size, in pages
    state: str = field(default="", compare=False)  # R, S, D, Z...: "Z" has exited and closed its files


def read_stat(pid: int, proc: Path = PROC) -> Stat | None:
    """The process's stat, or None when it is gone (or not readable)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return parse_stat(text)


def parse_stat(text: str) -> Stat:
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    pid = int(text[:text.index(" ")])
    fields = text[text.rindex(")") + 2:].split()
    # fields[0] is field 3 (state): ppid is field 4, pgrp 5, utime 14, stime 15, starttime 22, rss 24.
    return Stat(pid=pid, ppid=int(fields[1]), pgrp=int(fields[2]),
                ticks=int(fields[11]) + int(fields[12]), start=int(fields[19]), rss_pages=int(fields[21]),
                state=fields[0])


def all_stats(proc: Path = PROC) -> list[Stat]:
    """Every process's stat (those that ended while being read are left out)."""
    out = []
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = read_stat(int(entry.name), proc)
            if stat is not None:
                out.append(stat)
    return out


def group_members(pgid: int, proc: Path = PROC) -> list[int]:
    """The running (not zombie: a zombie has closed its files) processes whose group is ``pgid``."""
    return [s.pid for s in all_stats(proc) if s.pgrp == pgid and s.state != "Z"]


def server_tree(root: int, stats: Iterable[Stat]) -> list[Stat]:
    """``root``, every process below it, and its process group's members when it leads one; by pid."""
    stats = list(stats)
    children: dict[int, list[Stat]] = {}
    by_pid = {}
    for s in stats:
        children.setdefault(s.ppid, []).append(s)
        by_pid[s.pid] = s
    if root not in by_pid:
        return []
    found = {root: by_pid[root]}
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child.pid not in found:
                found[child.pid] = child
                todo.append(child.pid)
    if by_pid[root].pgrp == root:
        for s in stats:
            if s.pgrp == root:
                found.setdefault(s.pid, s)
    return sorted(found.values(), key=lambda s: s.pid)


def tree_usage(root: int, proc: Path = PROC) -> tuple[float, float]:
    """(CPU seconds, resident MiB) of ``root``'s tree (:func:`server_tree`), summed; (0, 0) when it is gone."""
    tree = server_tree(root, all_stats(proc))
    return sum(s.ticks for s in tree) / TICK, sum(s.rss_pages for s in tree) * PAGE / 2**20


def private_bytes(pid: int | str = "self") -> int | None:
    """A process's private memory (its unique set: the pages no other process maps, resident or
    swapped out) in bytes, from ``/proc/<pid>/smaps_rollup``; None where that cannot be read. Costs
    a walk of the process's page tables (about 5 ms for a 100 MiB host here): read it once a load
    has ended, not per request."""
    total = 0
    found = False
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith((b"Private_Clean:", b"Private_Dirty:", b"Swap:")):
                    total += int(line.split()[1]) * 1024
                    found = True
    except (OSError, IndexError, ValueError):
        return None
    return total if found else None

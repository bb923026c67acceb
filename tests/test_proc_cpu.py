"""bench/proc_cpu.py: /proc parsing, the process tree (inferd/observability/procfs.py's, which inferd
tune reads too), per-window reports, and a live process tree."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from bench import proc_cpu
from bench.proc_cpu import CpuMeter, Snapshot, Stat, parse_stat, report, server_tree


def _stat_line(pid: int, comm: str, ppid: int, pgrp: int, utime: int, stime: int, start: int) -> str:
    # Fields 3.. of /proc/<pid>/stat, as the kernel writes them (52 fields in all).
    rest = ["S", ppid, pgrp, pgrp, 0, -1, 4194560, 0, 0, 0, 0, utime, stime, 0, 0, 20, 0, 3, 0, start]
    rest += [0] * 30
    return f"{pid} ({comm}) " + " ".join(map(str, rest)) + "\n"


def test_parse_stat_reads_ticks_past_a_command_name_with_spaces_and_parentheses() -> None:
    s = parse_stat(_stat_line(41, "python (x) y", ppid=7, pgrp=7, utime=120, stime=30, start=999))
    assert s == Stat(pid=41, ppid=7, pgrp=7, ticks=150, start=999)


def test_parse_stat_reads_the_resident_pages() -> None:
    line = _stat_line(41, "x", ppid=7, pgrp=7, utime=1, stime=2, start=3).split(" ")
    line[23] = "777"  # field 24: rss, in pages
    assert parse_stat(" ".join(line)).rss_pages == 777


def test_tree_usage_sums_cpu_and_memory_over_a_live_tree() -> None:
    from inferd.observability.procfs import PAGE, tree_usage

    me = proc_cpu.read_stat(os.getpid())
    assert me is not None and me.rss_pages > 0
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        cpu, rss_mib = tree_usage(os.getpid())
        assert cpu >= me.ticks / proc_cpu.TICK
        assert rss_mib > me.rss_pages * PAGE / 2**20  # this process and its child
    finally:
        child.kill()
        child.wait()
    assert tree_usage(2**22 + 1) == (0.0, 0.0)  # no such process


def test_parse_stat_of_this_process_matches_os_times() -> None:
    me = proc_cpu.read_stat(os.getpid())
    assert me is not None
    t = os.times()
    assert abs(me.ticks / proc_cpu.TICK - (t.user + t.system)) < 0.05


def test_server_tree_is_root_descendants_and_its_group() -> None:
    stats = [
        Stat(1, 0, 1, 0, 0),
        Stat(10, 1, 10, 5, 0),     # the core, leading its group
        Stat(11, 10, 10, 5, 0),    # a frontend
        Stat(12, 11, 10, 5, 0),    # below a frontend
        Stat(13, 1, 10, 5, 0),     # reparented to init, still in the group
        Stat(20, 1, 20, 5, 0),     # unrelated
    ]
    assert [s.pid for s in server_tree(10, stats)] == [10, 11, 12, 13]
    assert server_tree(99, stats) == []


def test_report_divides_each_process_cpu_by_the_window_inferences() -> None:
    tick = proc_cpu.TICK
    before = Snapshot(0.0, 1000, {(10, 1): ("core", 0), (11, 2): ("frontend 0", 100), (12, 3): ("frontend 1", 5)})
    after = Snapshot(10.0, 3000, {(10, 1): ("core", tick // 10), (11, 2): ("frontend 0", 100 + tick),
                                  (14, 9): ("frontend 1", tick // 2)})
    r = report(before, after)
    assert r.inferences == 2000 and r.seconds == 10.0
    by_role = {p.role: p for p in r.processes if not p.note.startswith("gone")}
    assert by_role["core"].cpu_s == pytest.approx(0.1)
    assert by_role["core"].per_inference_us == pytest.approx(50.0)
    assert by_role["frontend 0"].per_inference_us == pytest.approx(500.0)
    # A frontend restarted in the window counts from zero; the one it replaced is gone.
    assert by_role["frontend 1"].note == "started in the window"
    assert by_role["frontend 1"].cpu_s == pytest.approx(0.5)
    assert [p.pid for p in r.processes if p.note.startswith("gone")] == [12]
    assert r.processes[0].role == "core"
    assert r.per_inference_us("frontend") == pytest.approx(750.0)
    assert r.per_inference_us() == pytest.approx(800.0)
    assert "us/inference" in r.table()


def test_report_with_no_inferences_gives_zero_per_inference() -> None:
    s = Snapshot(0.0, 5, {(10, 1): ("core", 0)})
    assert report(s, Snapshot(1.0, 5, {(10, 1): ("core", 50)})).per_inference_us() == 0.0


def test_meter_over_a_live_parent_and_a_busy_child() -> None:
    """A parent whose child burns 0.5 s of CPU inside the window: the child is found through
    /proc, named as a frontend from its command line, and charged what it burned."""
    child_code = ("import sys, time\n"
                  "sys.stdin.readline()\n"  # the window has begun
                  "t = time.process_time()\n"
                  "while time.process_time() - t < 0.5: pass\n"
                  "print('done', flush=True)\n"
                  "time.sleep(60)\n")
    parent_code = ("import subprocess, sys, time\n"
                   f"child = subprocess.Popen([sys.executable, '-c', {child_code!r}, "
                   "'-m', 'inferd.serve.worker_process', '--index', '3'])\n"
                   "print(child.pid, flush=True)\n"
                   "time.sleep(60)\n")
    # The child inherits the parent's stdin and stdout: these pipes.
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    child = int(parent.stdout.readline())  # type: ignore[union-attr]
    try:
        count = iter(range(0, 10**6, 100))
        meter = CpuMeter(parent.pid, lambda: next(count))
        before = meter.sample()
        assert len(before.processes) == 2
        parent.stdin.write("go\n")  # type: ignore[union-attr]
        parent.stdin.flush()  # type: ignore[union-attr]
        assert parent.stdout.readline().strip() == "done"  # type: ignore[union-attr]
        r = meter.since(before)
        roles = {p.role: p for p in r.processes}
        assert set(roles) == {"core", "frontend 3"}
        assert r.inferences == 100
        assert 0.45 <= roles["frontend 3"].cpu_s <= 0.7
        assert roles["frontend 3"].per_inference_us == pytest.approx(roles["frontend 3"].cpu_s / 100 * 1e6)
    finally:
        os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()

"""The benchmark harness outlives a server that stops answering: a stuck perf_analyzer run is killed with
what it started (bench/bench.py), and front_door notices a server that died (bench/proc_cpu.py alive).
Triton 2.51 crashed under gRPC streams here and left perf_analyzer waiting for ever (bench/RESULTS.md
front_door_streams)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench.bench import run_perf_analyzer
from bench.proc_cpu import alive
from conftest import until


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return not alive(pid)  # a zombie until its parent (init here) reaps it


def test_a_stuck_perf_analyzer_is_killed_with_what_it_started(tmp_path: Path) -> None:
    # A wrapper, as PERF_ANALYZER may be, whose child never ends: the child must go too.
    script = tmp_path / "perf_analyzer"
    script.write_text(f"#!/bin/sh\nsleep 60 &\necho $! > {tmp_path}/child\nwait\n")
    script.chmod(0o755)
    started = time.monotonic()
    assert run_perf_analyzer([str(script)], timeout=1.0) is None
    assert time.monotonic() - started < 30
    child = int((tmp_path / "child").read_text())
    assert until(lambda: _gone(child), timeout=30)


def test_a_run_that_ends_gives_its_output_and_status(tmp_path: Path) -> None:
    r = run_perf_analyzer([sys.executable, "-c", "import sys; print('Throughput: 1'); sys.exit(3)"], timeout=30)
    assert r is not None
    assert r.returncode == 3 and "Throughput: 1" in r.stdout


def test_alive_tells_a_running_process_from_a_zombie_and_a_missing_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        assert alive(child.pid)
    finally:
        child.stdin.close()  # type: ignore[union-attr]
    assert until(lambda: not alive(child.pid), timeout=30)  # exited, not reaped yet: a zombie
    child.wait()
    assert not alive(child.pid)

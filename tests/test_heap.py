"""inferd.observability.heap: malloc_trim gives back what a burst left behind, and the thread's settings."""

from __future__ import annotations

import subprocess
import sys

import pytest

from inferd.observability import heap

# In a fresh process: 200 MiB in 1 KiB blocks (malloc'd: above pymalloc's 512-byte limit), then all
# freed but every 64th block, which pins the heap's top so that glibc cannot shrink it by itself.
# RSS (KiB) after the frees, then after one malloc_trim(0).
_BURST = """
import sys
from inferd.observability import heap

def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1])

blocks = [bytes(1024) for _ in range(200 * 1024)]
kept = blocks[::64]
del blocks
before = rss()
released = heap.malloc_trim()()
print(before, rss(), released, len(kept))
"""


@pytest.mark.skipif(heap.malloc_trim() is None, reason="not glibc: no malloc_trim")
def test_trim_gives_back_the_pages_a_burst_freed() -> None:
    proc = subprocess.run([sys.executable, "-c", _BURST], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    before, after, released, _ = map(int, proc.stdout.split())
    assert released == 1
    assert before - after > 100 * 1024, (before, after)  # most of the 200 MiB (a page of 4 blocks keeps 1 in 16)


def test_interval_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(heap.ENV, raising=False)
    assert heap.interval_from_env() == heap.DEFAULT_INTERVAL_S
    monkeypatch.setenv(heap.ENV, "0")
    assert heap.start() is None  # off
    for bad in ("soon", "-1"):
        monkeypatch.setenv(heap.ENV, bad)
        with pytest.raises(SystemExit, match=f"{heap.ENV} must be"):
            heap.interval_from_env()


@pytest.mark.skipif(heap.malloc_trim() is None, reason="not glibc: no malloc_trim")
def test_the_thread_runs_as_a_daemon_and_stops() -> None:
    thread = heap.start(interval_s=0.01)
    assert thread is not None and thread.daemon and thread.is_alive()
    thread.stop.set()  # type: ignore[attr-defined]
    thread.join(timeout=10)
    assert not thread.is_alive()


# In a fresh process: eight threads allocate at once (malloc'd bytes, above pymalloc's limit) after the
# arenas were capped (or not); glibc's malloc_stats() then lists one "Arena N:" per arena on stderr.
_THREADS = """
import ctypes, sys, threading
from inferd.observability import heap

print(heap.limit_arenas(int(sys.argv[1])) if sys.argv[1] != "none" else None, flush=True)
start = threading.Barrier(8)

def work():
    start.wait()
    for _ in range(2000):
        kept = [bytes(4096) for _ in range(16)]
        del kept

threads = [threading.Thread(target=work) for _ in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
ctypes.CDLL(None).malloc_stats()
"""


def _arenas(arg: str) -> tuple[str, int]:
    env = {k: v for k, v in __import__("os").environ.items() if k != "MALLOC_ARENA_MAX"}
    proc = subprocess.run([sys.executable, "-c", _THREADS, arg], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip(), sum(line.startswith("Arena ") for line in proc.stderr.splitlines())


@pytest.mark.skipif(heap.malloc_trim() is None, reason="not glibc: no mallopt")
def test_the_arena_cap_holds_threads_to_that_many_arenas() -> None:
    capped, arenas = _arenas("2")
    assert capped == "2" and 1 <= arenas <= 2, arenas
    # The control: the same threads without the cap get arenas of their own (8 per core allowed).
    assert _arenas("none")[1] > 2


def test_the_arena_cap_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    monkeypatch.setenv(heap.ARENA_ENV, "0")
    assert heap.limit_arenas() is None  # 0: glibc's default kept
    monkeypatch.setenv(heap.ARENA_ENV, "many")
    with pytest.raises(SystemExit, match="INFERD_MALLOC_ARENA_MAX must be a whole number"):
        heap.limit_arenas()
    monkeypatch.setenv(heap.ARENA_ENV, "-1")
    with pytest.raises(SystemExit, match=">= 0"):
        heap.limit_arenas()
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")  # glibc's own: the operator's choice, already applied
    monkeypatch.setenv(heap.ARENA_ENV, "2")
    assert heap.limit_arenas() is None

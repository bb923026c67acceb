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

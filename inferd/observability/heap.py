"""Give freed heap memory back to the system: a thread that calls glibc's ``malloc_trim(0)`` now and then.

glibc keeps the memory a process frees for its own reuse; free pages inside its heaps are returned
to the system only when the top of a heap is free, or when ``malloc_trim`` is called. A server
whose requests come in bursts (many in flight while the machine is starved, few after) keeps the
peak in its RSS that way: the soak measured 15 MiB given back by one call in the core after a burst
(bench/RESULTS.md, soak), with nothing leaked. So every server process (the core, one-process
server and frontend workers) starts :func:`start` as it starts: a daemon thread calling
``malloc_trim(0)`` every ``INFERD_MALLOC_TRIM_INTERVAL`` seconds (30 by default; 0 turns it off).
The call runs outside the GIL (ctypes releases it), takes a few milliseconds on a heap of some
hundred MiB, and holds each malloc arena's lock only while it walks that arena.

Nothing happens where the C library is not glibc (musl, macOS): ``malloc_trim`` is glibc's own.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
from collections.abc import Callable

ENV = "INFERD_MALLOC_TRIM_INTERVAL"
DEFAULT_INTERVAL_S = 30.0
log = logging.getLogger("inferd.heap")


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` as a function returning 1 when memory was released, or None without glibc."""
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


def interval_from_env() -> float:
    raw = os.environ.get(ENV, "")
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"inferd: {ENV} must be a number of seconds (0: off), got {raw!r}") from None
    if value < 0:
        raise SystemExit(f"inferd: {ENV} must be >= 0 (0: off), got {raw!r}")
    return value


def start(interval_s: float | None = None) -> threading.Thread | None:
    """Start the trimming thread (daemon: it never holds the process up at exit); None when off or not glibc."""
    interval = interval_from_env() if interval_s is None else interval_s
    trim = malloc_trim() if interval > 0 else None
    if trim is None:
        return None
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(interval):
            trim()

    thread = threading.Thread(target=run, name="inferd-malloc-trim", daemon=True)
    thread.stop = stop  # type: ignore[attr-defined]  # tests end it
    thread.start()
    return thread

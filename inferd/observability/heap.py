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

Fewer malloc arenas (:func:`limit_arenas`, called first): glibc gives each thread that allocates
while another holds an arena's lock an arena of its own, up to 8 per core, and grpc's completion-queue
threads, the instance threads and the trim thread all allocate. Memory freed in one arena is reused
only by the threads that land on it, so a frontend worker's heap crept up with the soak's mix (about
30 bytes per request with a priority model's 100 ms waits in it, none with glibc's arenas limited to
2; the trim gives back only what lies at an arena's top). Every server process therefore caps them at
``INFERD_MALLOC_ARENA_MAX`` (2 by default; 0 leaves glibc's default) unless glibc's own
``MALLOC_ARENA_MAX`` is set, which glibc reads itself. The Python heap allocates under the GIL and
ONNX Runtime from its own arena, so two arenas cost no measurable contention here.

Nothing happens where the C library is not glibc (musl, macOS): ``malloc_trim`` and ``mallopt`` are glibc's.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
from collections.abc import Callable

ENV = "INFERD_MALLOC_TRIM_INTERVAL"
DEFAULT_INTERVAL_S = 30.0
ARENA_ENV = "INFERD_MALLOC_ARENA_MAX"
DEFAULT_ARENAS = 2
M_ARENA_MAX = -8  # mallopt's parameter number (glibc malloc.h)
log = logging.getLogger("inferd.heap")


def _glibc(function: str):  # type: ignore[no-untyped-def]
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return getattr(ctypes.CDLL(name), function)
    except (OSError, AttributeError):
        return None


def limit_arenas(count: int | None = None) -> int | None:
    """Cap glibc's malloc arenas for the threads that start from now on (``count``, else
    ``INFERD_MALLOC_ARENA_MAX``, else 2); the cap set, or None (off, glibc's own variable set, not glibc)."""
    if count is None:
        if "MALLOC_ARENA_MAX" in os.environ:  # the operator's, and glibc has already applied it
            return None
        raw = os.environ.get(ARENA_ENV, "")
        try:
            count = int(raw) if raw else DEFAULT_ARENAS
        except ValueError:
            raise SystemExit(f"inferd: {ARENA_ENV} must be a whole number of arenas (0: glibc's default), "
                             f"got {raw!r}") from None
        if count < 0:
            raise SystemExit(f"inferd: {ARENA_ENV} must be >= 0 (0: glibc's default), got {raw!r}")
    mallopt = _glibc("mallopt") if count else None
    if mallopt is None:
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return count if mallopt(M_ARENA_MAX, count) == 1 else None


@functools.cache  # one handle: a CDLL made per call is a new ctypes type (cyclic garbage) and a find_library
def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` as a function returning 1 when memory was released, or None without glibc."""
    trim = _glibc("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


def trim_now() -> None:
    """``malloc_trim(0)`` once (ctypes drops the GIL meanwhile); nothing where the C library is not glibc."""
    trim = malloc_trim()
    if trim is not None:
        trim()


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

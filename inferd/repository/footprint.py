"""What a model holds in memory: measured around its load.

A model's footprint is what the process gained while its instances were
created: on the host, the larger of the bytes malloc handed out and did not
get back (glibc's ``mallinfo2``, every arena: ONNX Runtime's and torch's CPU
allocators and numpy allocate there, and neither runtime exposes an allocator
figure for host memory to Python) and the resident set's growth
(``/proc/self/statm``: what the process really gained, fragmentation
included, but nothing when the load reused pages a freed model left mapped);
per GPU, what torch's caching
allocator holds (``torch.cuda.memory_allocated``, when torch is already
imported and CUDA is initialised; ONNX Runtime's CUDA arena is not visible
from Python, so a GPU ONNX model is counted by its host side only). The
measurement is only meaningful when loads do not overlap, so the on-demand
driver (:mod:`inferd.repository.demand`) loads one model at a time.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes(pid: int | str = "self") -> int:
    """The resident set of a process now, in bytes (0 where /proc cannot be read)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    return fn  # type: ignore[no-any-return]


_MALLINFO = _mallinfo2()


def heap_bytes() -> int | None:
    """Bytes malloc has handed out and not had back, over every arena (glibc's mallinfo2: in-use
    chunks plus mmapped ones); None where it is not glibc. Unlike the resident set it counts a load
    that reuses pages a freed model left mapped."""
    if _MALLINFO is None:
        return None
    info = _MALLINFO()
    return int(info.uordblks + info.hblkhd)


def gpu_bytes() -> dict[int, int]:
    """Bytes torch's CUDA allocator holds per device; empty when torch or CUDA is not in use
    (it is never imported or initialised here)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    try:
        if not torch.cuda.is_initialized():
            return {}
        return {i: int(torch.cuda.memory_allocated(i)) for i in range(torch.cuda.device_count())}
    except Exception:  # a broken driver must not fail a load
        return {}


@dataclass(frozen=True, slots=True)
class Footprint:
    """Bytes one loaded model holds: host (``cpu``) and per GPU index."""

    cpu: int = 0
    gpus: dict[int, int] = field(default_factory=dict)

    def usage(self) -> tuple[tuple[str, int, int], ...]:
        """As ModelStatistics' memory_usage: (type, id, byte_size) entries."""
        return (("CPU", 0, self.cpu),) + tuple(("GPU", i, n) for i, n in sorted(self.gpus.items()) if n)

    def plus(self, other: "Footprint") -> "Footprint":
        gpus = {i: self.gpus.get(i, 0) + other.gpus.get(i, 0) for i in {*self.gpus, *other.gpus}}
        return Footprint(self.cpu + other.cpu, gpus)


class Measure:
    """Resident memory before and after a load: ``with Measure() as m: load()``, then ``m.footprint``."""

    def __init__(self, since: "Measure | None" = None) -> None:
        """``since``: count from where that (earlier) measurement started, as one span: reading a model's
        files and building it, measured apart, counted the reading's transient buffers (the resident
        set grew by them, then the build reused those pages) as well as the build: ~2x what stays."""
        self.footprint = Footprint()
        self.allocated = Footprint()
        self._since = since

    def __enter__(self) -> "Measure":
        since = self._since
        if since is not None:
            self._heap, self._rss, self._gpus = since._heap, since._rss, since._gpus
            return self
        self._heap = heap_bytes()
        self._rss = rss_bytes()
        self._gpus = gpu_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        gpus = gpu_bytes()
        heap = heap_bytes()
        rss = rss_bytes() - self._rss
        heap = heap - self._heap if heap is not None and self._heap is not None else None
        gpu = {i: max(0, n - self._gpus.get(i, 0)) for i, n in gpus.items()}
        self.footprint = Footprint(max(0, rss, heap or 0), gpu)
        # Without the resident set: for the first load of a runtime, whose one-time set-up (thread pools,
        # libraries paged in: ~35 MiB for ONNX Runtime here) grows the resident set but is not the model's.
        self.allocated = Footprint(max(0, heap if heap is not None else rss), gpu)


def file_bytes(model_dir: Path) -> int:
    """The size of a model folder's files: the least a loaded model can hold (its weights), the
    estimate before its first load is measured."""
    total = 0
    for root, _dirs, files in os.walk(model_dir):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total

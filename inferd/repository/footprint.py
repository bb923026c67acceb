"""What a model holds in memory, measured at its load.

A model in a host process (:mod:`inferd.hosts`) holds what its host holds of
its own: the host's private pages (``Private_Clean + Private_Dirty`` in
``/proc/<pid>/smaps_rollup``, the unique set size), which the host reads
itself, at its lowest priority, once its instances are created and warmed up
(:func:`inferd.observability.procfs.private_bytes`). Not its RSS: hosts are
forked by a zygote that imported the interpreter, numpy and the backends, and
those pages, shared by every host, count in each host's RSS (about 50 MiB
here) although the tree holds them once; what a host adds to the tree is its
private pages (measured: within 10% of the growth of the tree's summed PSS,
where the RSS counted a 5 MiB model as 76 MiB).

A model in this process holds what the process gained while its instances
were created (:class:`Measure`): the bytes malloc handed out and did not get
back, over every arena (glibc's ``mallinfo2``: ONNX Runtime's and torch's CPU
allocators and numpy allocate there; neither runtime gives Python a figure of
its own). Not the resident set's growth: glibc keeps what a load parsed and
freed (the model file's bytes, a protobuf copy of the weights: up to 2x the
weights) resident for later allocations, and gives it back, or reuses pages
another model freed, when it sees fit, so a load's RSS growth measured 0 to
1.6x its model here, where malloc's figure stayed within 1% of its in-use
memory; free pages are given back (``malloc_trim``) after each build, so the
tree holds what the footprint says. Python's own small-object arenas are not
malloc's: an in-process Python model's small objects are not counted (host it:
Python models are hosted by default). Per GPU, what torch's caching allocator
gained (``torch.cuda.memory_allocated``, when torch is already imported and
CUDA is initialised; ONNX Runtime's CUDA arena is not visible from Python, so a
GPU ONNX model is counted by its host side only). The
process-wide figures are the model's only if nothing else grows or frees
memory in this process meanwhile, so such builds are measured one at a time
(:class:`MeasureGate`): nothing is lost by it, since a runtime's build holds
the GIL (ONNX Runtime's whole session build does) and in-process builds did
not run in parallel anyway. Builds in hosts are not held by it, nor (beyond a
shared hold) a rebuild from the files and config an earlier build measured:
malloc's figure was the same for every build of the same model, so an
on_demand reload takes it again and builds beside other loads
(``ModelManager._known_footprint``; not Python models, whose ``initialize``
may load others).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import sys
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator

from inferd.observability.heap import trim_now

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
    """What this process gained during a build: ``with Measure() as m: build()``, then ``m.footprint``:
    the bytes malloc handed out and did not get back (every arena), or the resident set's growth where
    the C library is not glibc; per GPU, torch's allocator's growth. Free heap pages are given back
    after (what the build parsed and freed leaves the tree). Meaningful only while nothing else in
    this process loads or unloads a model (:class:`MeasureGate`)."""

    def __init__(self) -> None:
        self.footprint = Footprint()

    def __enter__(self) -> "Measure":
        self._heap = heap_bytes()
        self._rss = rss_bytes()
        self._gpus = gpu_bytes()
        return self

    def __exit__(self, *exc: object) -> None:
        heap = heap_bytes()
        gpus = gpu_bytes()
        trim_now()
        grown = heap - self._heap if heap is not None and self._heap is not None else rss_bytes() - self._rss
        gpu = {i: max(0, n - self._gpus.get(i, 0)) for i, n in gpus.items()}
        self.footprint = Footprint(max(0, grown), gpu)


class MeasureGate:
    """Builds measured in this process run one at a time (:class:`Measure` reads process-wide
    figures); on the event loop. A measured build holds it alone (:meth:`acquire` ``exclusive``); what
    would change this process's memory meanwhile holds it shared: reading a model's config and files
    (the ONNX backend builds a session to read a signature), unloading an in-process model. FIFO, so
    a build waiting for it is not passed by later shared holders.

    A load asked for by the model whose build holds it alone (``within``: a Python model's
    ``pb_utils.load_model`` from its ``initialize``, which waits for that load) goes through without
    waiting (the holder waits for it, so nothing else moves) and what it measures is recorded in
    :attr:`nested`, for the holder to take out of its own figure."""

    def __init__(self) -> None:
        self.owner: str | None = None  # the model whose build holds it alone
        self.shared = 0
        self.nested: dict[str, int] = {}  # owner -> bytes measured by the loads made within its build
        self._queue: deque[tuple[bool, str, asyncio.Future[None]]] = deque()

    async def acquire(self, exclusive: bool, name: str, within: str | None = None) -> bool:
        """Wait for the gate (on the loop); True when it was taken (release it), False when ``within``
        names the holder (nested: nothing to release)."""
        if within is not None and within == self.owner:
            return False
        if not self._queue and self._free(exclusive):
            self._take(exclusive, name)
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (exclusive, name, future)
        self._queue.append(entry)
        try:
            await future
        except asyncio.CancelledError:
            if entry in self._queue:
                self._queue.remove(entry)
            elif future.done() and not future.cancelled():
                self.release(exclusive)  # granted as it was cancelled
            self._grant()
            raise
        return True

    def release(self, exclusive: bool) -> None:
        if exclusive:
            self.owner = None
        else:
            self.shared -= 1
        self._grant()

    @contextlib.asynccontextmanager
    async def holding(self, exclusive: bool, name: str, within: str | None = None):  # type: ignore[no-untyped-def]
        taken = await self.acquire(exclusive, name, within)
        try:
            yield
        finally:
            if taken:
                self.release(exclusive)

    @contextlib.contextmanager
    def held(self, loop: asyncio.AbstractEventLoop, exclusive: bool, name: str,
             within: str | None = None) -> Iterator[None]:
        """:meth:`holding` from a loader thread: waits here while the loop grants it."""
        taken = asyncio.run_coroutine_threadsafe(self.acquire(exclusive, name, within), loop).result()
        try:
            yield
        finally:
            if taken:
                loop.call_soon_threadsafe(self.release, exclusive)

    def _free(self, exclusive: bool) -> bool:
        return self.owner is None and (not exclusive or self.shared == 0)

    def _take(self, exclusive: bool, name: str) -> None:
        if exclusive:
            self.owner = name
        else:
            self.shared += 1

    def _grant(self) -> None:
        while self._queue:
            exclusive, name, future = self._queue[0]
            if future.done():  # cancelled meanwhile
                self._queue.popleft()
                continue
            if not self._free(exclusive):
                return
            self._queue.popleft()
            self._take(exclusive, name)
            future.set_result(None)

"""Python's cyclic garbage collector kept off what lives as long as the process: :func:`freeze`.

A full (generation 2) collection walks every object the collector tracks, and a server process
tracks hundreds of thousands that never become garbage: the modules it imported (numpy, grpc and
protobuf's descriptors, ONNX Runtime's and torch's bindings), their classes and functions. While it
walks them the GIL is held, so the event loop, and every request on it, waits: measured in the
server's process under on-demand loads (bench/RESULTS.md many_models), full collections took 10 to
68 ms, the longest pauses of its loop (its p99 lag was 2 ms).

:func:`freeze` collects once and moves every object tracked so far into the collector's permanent
generation (``gc.freeze``), which later collections skip: each process calls it once its start-up
objects exist and before it holds anything that may later become garbage in a cycle (the serving
process before it loads a model: a frozen object left in a cycle is never collected, so an unloaded
model's cycles would stay; a model host after its one model is loaded, since it exits with it).
Frozen objects are still freed by reference counting, and the collector still collects all that is
made afterwards. A server stopped inside a process that lives on (a test, a benchmark) calls
:func:`thaw`, so that its own objects, frozen with the rest, can be collected once dropped. In the
host zygote it also keeps the collector from writing into objects every host shares with it through
fork (their pages stay shared, not copied), as Python's ``gc.freeze`` notes say.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger("inferd.collector")


def freeze() -> int:
    """Collect, then put every tracked object in the permanent generation; how many it now holds."""
    gc.collect()
    gc.freeze()
    count = gc.get_freeze_count()
    log.debug("%d objects frozen out of the cyclic collector's collections", count)
    return count


def thaw() -> None:
    """Everything frozen back into the collector's oldest generation."""
    gc.unfreeze()

"""A memory-growth diagnostic: ``INFERD_TRACEMALLOC=DIR`` makes a server process trace its allocations.

Set in the environment of ``inferd serve`` (frontend workers inherit it), it makes each process
start :mod:`tracemalloc` as it starts (``INFERD_TRACEMALLOC_FRAMES`` frames per allocation, 8 by
default) and, on each ``SIGUSR2``, write a snapshot to ``DIR/<role>-<pid>-<n>.snap``. Two snapshots
of one process taken some requests apart are compared with ``python -m inferd.observability.memtrace
OLD NEW``, which prints the allocation sites that grew most. Next to each snapshot,
``<name>.gc.json`` holds the garbage collector's counters then; with ``INFERD_TRACEMALLOC_COLLECT=1``
a full collection follows each snapshot and says how many unreachable objects it found (garbage in
reference cycles waits for a full collection, which a large heap makes rare). Tracing slows a
process down several times: it is for finding a leak, never for serving.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import signal
import sys
import tracemalloc
from pathlib import Path
from types import FrameType

ENV = "INFERD_TRACEMALLOC"
FRAMES_ENV = "INFERD_TRACEMALLOC_FRAMES"
COLLECT_ENV = "INFERD_TRACEMALLOC_COLLECT"


def install(role: str) -> Path | None:
    """Start tracing and dump a snapshot on every SIGUSR2 when ``INFERD_TRACEMALLOC`` names a folder.

    Called once as a server process starts (the core or one-process server in ``cli``, a frontend
    worker in its ``main``), before its event loop runs. The handler runs in the main thread between
    two bytecodes; a snapshot of a busy process takes a second or so and holds that process meanwhile.
    """
    folder = os.environ.get(ENV)
    if not folder:
        return None
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    tracemalloc.start(int(os.environ.get(FRAMES_ENV, "8")))
    counter = itertools.count()
    collect = os.environ.get(COLLECT_ENV, "") not in ("", "0")

    def dump(_signum: int, _frame: FrameType | None) -> None:
        path = out / f"{role}-{os.getpid()}-{next(counter)}.snap"
        snapshot = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__),))
        tmp = path.with_suffix(".tmp")
        snapshot.dump(str(tmp))
        facts: dict[str, object] = {"count": gc.get_count(), "stats": gc.get_stats(),
                                    "objects": len(gc.get_objects())}
        if collect:
            facts["collected"] = gc.collect()
        path.with_suffix(".gc.json").write_text(json.dumps(facts))
        tmp.replace(path)  # a reader never sees half a snapshot

    signal.signal(signal.SIGUSR2, dump)
    return out


def top_growth(old: Path, new: Path, limit: int = 25, key: str = "traceback") -> list[str]:
    """The allocation sites that grew most from ``old`` to ``new`` (two snapshots of one process)."""
    before = tracemalloc.Snapshot.load(str(old))
    after = tracemalloc.Snapshot.load(str(new))
    lines = []
    for stat in after.compare_to(before, key)[:limit]:
        lines.append(f"{stat.size_diff:+,} B in {stat.count_diff:+,} blocks (now {stat.size:,} B)")
        lines.extend("    " + line for line in stat.traceback.format())
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.observability.memtrace", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--limit", type=int, default=25)
    parser.add_argument("--key", choices=("traceback", "lineno", "filename"), default="traceback")
    args = parser.parse_args(argv)
    print("\n".join(top_growth(args.old, args.new, args.limit, args.key)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

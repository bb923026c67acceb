"""The event loop a server process runs (``inferd serve --event-loop``): uvloop where it is
installed, asyncio's own loop otherwise.

Everything on the request path is loop work: grpc.aio's completion-queue wake-ups, uvicorn's
transports, the control channel between a frontend worker and the core, the batcher's steps.
uvloop does that work in C (its transports, ``call_soon`` and the loop iteration itself): measured,
the default process mode spent 0.75-0.94x the CPU per inference on it and served 1.12-1.21x as
much at c=16 on two machines; one process moved either way with the machine (0.77x to 1.17x at c=1,
0.96x to 1.08x at c=16; bench/RESULTS.md, request_cpu, which serves on both loops in one run). grpc.aio, uvicorn and
the channel run the same on both loops; ``--event-loop asyncio`` keeps the standard one (to rule
the loop out when debugging, or where uvloop does not build).

A frontend worker runs the loop its core runs (:func:`running` names it for the worker's command
line), so one server never mixes them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, TypeVar

KINDS = ("uvloop", "asyncio")  # what a process runs
CHOICES = ("auto", *KINDS)  # what --event-loop takes
T = TypeVar("T")


def resolve(choice: str = "auto") -> str:
    """``"uvloop"`` or ``"asyncio"`` for ``choice`` (one of :data:`CHOICES`); ValueError when
    uvloop is asked for by name and cannot be imported."""
    if choice not in CHOICES:
        raise ValueError(f"event loop must be one of {', '.join(CHOICES)}, got {choice!r}")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError as exc:
        if choice == "uvloop":
            raise ValueError(f"--event-loop uvloop needs the uvloop package ({exc}); install it "
                             "(pip install uvloop) or choose --event-loop asyncio") from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], kind: str) -> T:
    """``asyncio.run(main)`` on the loop ``kind`` (as :func:`resolve` returns it)."""
    factory = None
    if kind == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running() -> str:
    """The kind of the running loop: ``"uvloop"`` or ``"asyncio"``."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"

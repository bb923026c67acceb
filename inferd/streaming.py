"""Responses that arrive one by one: decoupled models and streaming inference.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a
request with zero, one or many responses, from any thread, whenever it likes,
and marks the last one final (or sends a final flag with no response). The
data plane gives such a request a :class:`ResponseSink` (``request.responder``);
the backend puts :class:`StreamEvent` s into it, thread-safely; the data
plane reads them on the event loop, shapes them, and yields
:class:`StreamResponse` s to the frontend (``DataPlane.infer_stream``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.errors import InferdError


@dataclass(slots=True)
class StreamEvent:
    """What a backend puts in a sink: one response's outputs or error, and/or the final flag."""

    outputs: dict[str, np.ndarray] | None = None
    error: InferdError | None = None
    final: bool = False


@dataclass(slots=True)
class StreamResponse:
    """What ``DataPlane.infer_stream`` yields: a response (an ``InferenceResponse``),
    or an error, or neither (an empty final marker); ``final`` on the last."""

    response: Any = None
    error: InferdError | None = None
    final: bool = False


class ResponseSink:
    """A request's responses, from any thread to the event loop, in order."""

    __slots__ = ("_loop", "_queue", "closed", "cancelled")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[StreamEvent] = asyncio.Queue()
        self.closed = False  # the final event was put
        self.cancelled = False  # nobody reads any more (the client went away)

    def put(self, event: StreamEvent) -> None:
        """Deliver ``event``; callable from any thread. Events after the final one are dropped."""
        if self.closed:
            return
        if event.final:
            self.closed = True
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            self._queue.put_nowait(event)
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop closed: the server stopped, nobody reads
            pass

    async def get(self) -> StreamEvent:
        return await self._queue.get()

"""Responses that arrive one by one: decoupled models and streaming inference.

A decoupled model (``model_transaction_policy { decoupled: true }``) answers a
request with zero, one or many responses, from any thread, whenever it likes,
and marks the last one final (or sends a final flag with no response). The
data plane gives such a request a :class:`ResponseSink` (``request.responder``);
the backend puts :class:`StreamEvent` s into it, thread-safely; the data
plane reads them on the event loop, shapes them, and yields
:class:`StreamResponse` s to the frontend (``DataPlane.infer_stream``).

A sink is bounded (:class:`StreamLimits`): a model that sends faster than its
client reads waits in ``put`` (on its own thread) until the client catches up,
so what one stream holds in the server never passes the limits, whatever the
model sends. The frontends pull a response from the sink only once the one
before it is on its way to the client, so the bound reaches back from the
client's socket to the model. Once the client has gone (``cancel``), puts
return at once and drop what they carry, and a waiting one is released.

A producer on the loop that can hold itself back (the iterative scheduler,
which pauses a sequence instead of stepping it) asks :meth:`ResponseSink.resume_when_room`
after each step and puts with ``paced=True``: it then never waits nor fails, the
stream passes its bound by at most what one step sent, and the reader calls it
back once the client has read below the bound.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from inferd.errors import InferdError, ResourceExhausted

# Defaults that protect a default install: a stream holds at most this many responses the
# client has not read yet (a token stream runs hundreds ahead before its model waits) and at
# most this many bytes of them (a thousand streams of the admission cap stay within a
# small host's memory); a model kept waiting longer than the stall timeout by a client that
# reads nothing ends the stream (RESOURCE_EXHAUSTED) so its instance is free again.
DEFAULT_MAX_RESPONSES = 256
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_STALL_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """How far a stream's client may fall behind its model (``inferd serve --stream-*``)."""

    max_responses: int = DEFAULT_MAX_RESPONSES
    max_bytes: int = DEFAULT_MAX_BYTES
    stall_seconds: float = DEFAULT_STALL_SECONDS

    def __post_init__(self) -> None:
        if self.max_responses < 1:
            raise ValueError(f"--stream-max-responses must be >= 1, got {self.max_responses}")
        if self.max_bytes < 1:
            raise ValueError(f"--stream-max-bytes must be >= 1, got {self.max_bytes}")
        if self.stall_seconds <= 0:
            raise ValueError(f"--stream-stall-timeout must be > 0 seconds, got {self.stall_seconds}")


@dataclass(slots=True)
class StreamEvent:
    """What a backend puts in a sink: one response's outputs or error, and/or the final flag.
    ``sent_ns``: when the model sent it (``perf_counter_ns``), for the response statistics."""

    outputs: dict[str, np.ndarray] | None = None
    error: InferdError | None = None
    final: bool = False
    sent_ns: int = 0


@dataclass(slots=True)
class StreamResponse:
    """What ``DataPlane.infer_stream`` yields: a response (an ``InferenceResponse``),
    or an error, or neither (an empty final marker); ``final`` on the last."""

    response: Any = None
    error: InferdError | None = None
    final: bool = False


def event_bytes(event: StreamEvent) -> int:
    outputs = event.outputs
    if not outputs:
        return 0
    return sum(a.nbytes for a in outputs.values() if isinstance(a, np.ndarray))


class ResponseSink:
    """A request's responses, from any thread to the event loop, in order, bounded.

    ``put`` is called by the model's code (its instance thread, a thread of its own, or the
    loop); ``get`` by the one reader, on the loop. The reader's loop is woken once per wait,
    not once per response, so a model sending in a tight loop cannot flood it."""

    __slots__ = ("_loop", "limits", "_lock", "_room", "_events", "_bytes", "_waiter", "closed", "cancelled",
                 "model", "request", "started_ns", "_resume", "_on_cancel")

    def __init__(self, loop: asyncio.AbstractEventLoop, limits: StreamLimits | None = None, model: str = "",
                 request: Any = None) -> None:
        self._loop = loop
        self.limits = limits or StreamLimits()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)  # a put waiting for the reader
        self._events: deque[tuple[StreamEvent, int]] = deque()
        self._bytes = 0
        self._waiter: asyncio.Future[None] | None = None  # the reader, waiting for an event
        self.closed = False  # the final event was put
        self.cancelled = False  # nobody reads any more (the client went away)
        self.model = model
        self.request = request  # an InferenceRequest: marked cancelled with the stream, for the model to see
        self.started_ns = 0  # when the request reached its model (the backend sets it)
        self._resume: Callable[[], None] | None = None  # a paced producer held back: called once there is room
        self._on_cancel: list[Callable[[], None]] = []

    def __len__(self) -> int:
        return len(self._events)

    def _full(self, nbytes: int) -> bool:
        limits = self.limits
        events = self._events
        return bool(events) and (len(events) >= limits.max_responses or self._bytes + nbytes > limits.max_bytes)

    def at_bound(self, responses: int = 0, nbytes: int = 0) -> bool:
        """Whether the stream holds its bound of unread responses or bytes, counting ``responses``
        more of ``nbytes`` about to be put."""
        limits = self.limits
        return len(self._events) + responses >= limits.max_responses or self._bytes + nbytes >= limits.max_bytes

    def resume_when_room(self, responses: int, nbytes: int, resume: Callable[[], None]) -> bool:
        """For a producer that holds itself back (on the loop): True if the stream is at its
        bound, counting ``responses`` more of ``nbytes`` it is about to put; ``resume`` is then
        called once, on the loop, by the reader that takes the stream below the bound (never
        if the stream is cancelled or ended first). False: there is room, and nothing will be called."""
        with self._lock:
            if self.cancelled or self.closed or not self.at_bound(responses, nbytes):
                return False
            self._resume = resume
            return True

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once when the stream is cancelled (at once if it is already), on whichever
        thread cancels it and under the sink's lock: it must only hand the news on (a model host's
        sender is told through its channel)."""
        with self._lock:
            if not self.cancelled:
                self._on_cancel.append(callback)
                return
        callback()

    def put(self, event: StreamEvent, *, paced: bool = False) -> None:
        """Deliver ``event``; callable from any thread. Waits (off the loop) while the stream
        holds its limit of unread responses; on the loop, a full stream fails instead
        (RESOURCE_EXHAUSTED). A final event is never held back, nor one put ``paced`` by a
        producer that holds itself back (:meth:`resume_when_room`). Events after the final
        one, and every event once the stream is cancelled, are dropped."""
        if not event.sent_ns:
            event.sent_ns = time.perf_counter_ns()
        nbytes = event_bytes(event)
        with self._lock:
            if self.closed or self.cancelled:
                return
            if not event.final and not paced and self._full(nbytes):
                event = self._wait_for_room(event, nbytes)
                if event is None:
                    return
                nbytes = event_bytes(event)
            if event.final:
                self.closed = True
                self._resume = None  # nothing more to produce
            self._events.append((event, nbytes))
            self._bytes += nbytes
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._wake(waiter)

    def _wait_for_room(self, event: StreamEvent, nbytes: int) -> StreamEvent | None:
        """Called with the lock held and the stream full: wait for the reader. Returns the
        event to append (the one given, or the error that ends the stream), or None to drop it."""
        on_loop = _running_loop() is self._loop
        if not on_loop:
            deadline = time.monotonic() + self.limits.stall_seconds
            while self._full(nbytes) and not self.cancelled:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._room.wait(left)
            if self.cancelled:
                return None
            if not self._full(nbytes):
                return event
        # The reader has not kept up: the stream ends here, and the model sees it as cancelled.
        self._mark_cancelled()
        return StreamEvent(error=self._exhausted(on_loop), final=True, sent_ns=event.sent_ns)

    def _exhausted(self, on_loop: bool) -> ResourceExhausted:
        why = ("and the model sent another from the server's event loop, where it cannot wait" if on_loop else
               f"and it read none for {self.limits.stall_seconds:g} s (--stream-stall-timeout)")
        return self.exhausted(why)

    def exhausted(self, why: str) -> ResourceExhausted:
        """The error that ends a stream whose client fell behind: what waits, the limits, and ``why``."""
        limits = self.limits
        return ResourceExhausted(
            f"model '{self.model}': the stream's client fell behind: {len(self._events)} responses "
            f"({self._bytes} bytes) were waiting to be read, the limit is {limits.max_responses} responses "
            f"(--stream-max-responses) or {limits.max_bytes} bytes (--stream-max-bytes), {why}")

    def _wake(self, waiter: asyncio.Future[None]) -> None:
        if _running_loop() is self._loop:
            if not waiter.done():
                waiter.set_result(None)
            return
        try:
            self._loop.call_soon_threadsafe(_resolve, waiter)
        except RuntimeError:  # the loop closed: the server stopped, nobody reads
            pass

    async def get(self) -> StreamEvent:
        """The next event (on the loop; one reader). Frees its room for a waiting put."""
        while True:
            with self._lock:
                if self._events:
                    event, nbytes = self._events.popleft()
                    self._bytes -= nbytes
                    self._room.notify()
                    resume = self._resume
                    if resume is None or self.at_bound(0, 0):
                        return event
                    self._resume = None
                    break
                waiter = self._waiter = self._loop.create_future()
            await waiter
        resume()  # the lock released: it may put at once
        return event

    def cancel(self) -> None:
        """The client went away: drop what waits, release a waiting put, refuse the rest."""
        with self._lock:
            self._mark_cancelled()
            self._events.clear()
            self._bytes = 0
            self._resume = None

    def _mark_cancelled(self) -> None:
        self.cancelled = True
        if self.request is not None:
            self.request.cancelled = True  # what request.is_cancelled() / sender.is_cancelled() read
        self._room.notify_all()
        callbacks, self._on_cancel = self._on_cancel, []
        for callback in callbacks:
            callback()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None

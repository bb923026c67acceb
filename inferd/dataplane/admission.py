"""Server-wide admission: caps on the requests inside the server and on their bytes.

Triton's ``max_queue_size`` bounds one model's queue at one priority level;
nothing bounds the server as a whole, so a burst spread over models (or a few
huge tensors) could still fill memory. :class:`Admission` counts every client
request the data plane has accepted and not yet answered (queued or executing,
over every model, from every frontend and process) and the bytes of its input
tensors, and refuses one that would pass either cap with UNAVAILABLE and the
reason, at once, before it costs anything more: a client is expected to back
off and retry (it is the same answer as a full model queue).

A request larger than the byte cap by itself is still admitted when nothing
else is inside: the transport already holds it (its size is bounded by the
message-size limits), and refusing it would make it fail forever.

Tensors in a client's shared memory cost the server no memory and are not
counted. BLS calls and ensemble steps are part of a request already admitted
and are never refused here (refusing them could deadlock a model that waits
on them).

The decision is plain arithmetic on two counters (no clock, no loop); the
data plane calls :meth:`admit` and :meth:`release` around each request, on
the event loop, so no lock is needed. :meth:`idle` lets a stop wait, without
polling, until nothing accepted is left unanswered.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Mapping

import numpy as np

from inferd.errors import Unavailable

# Defaults that protect a default install: a few times what the busiest CPU model here
# answers in a second (~2,000/s), so a burst waits at most about half a second in the
# server instead of piling up without bound; and a quarter of a small host's memory for
# the tensors of the requests waiting.
DEFAULT_MAX_REQUESTS = 1024
DEFAULT_MAX_BYTES = 512 * 1024 * 1024


def request_bytes(inputs: Mapping[str, object]) -> int:
    """The bytes the server holds for a request's input tensors (none for shared-memory ones)."""
    total = 0
    for array in inputs.values():
        if isinstance(array, np.ndarray):
            if array.dtype == np.object_:
                # BYTES elements: the Python objects' payloads, not the pointer array.
                total += array.nbytes + sum(len(x) for x in array.flat if isinstance(x, (bytes, str)))
            else:
                total += array.nbytes
    return total


class Admission:
    """The requests accepted and not answered, their input bytes, and the caps on both.

    ``max_requests`` / ``max_bytes``: 0 means no cap."""

    __slots__ = ("max_requests", "max_bytes", "requests", "bytes", "refused", "elsewhere", "_idle")

    def __init__(self, max_requests: int = DEFAULT_MAX_REQUESTS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_requests < 0 or max_bytes < 0:
            raise ValueError(f"admission caps must be >= 0, got {max_requests} requests, {max_bytes} bytes")
        self.max_requests = max_requests
        self.max_bytes = max_bytes
        self.requests = 0
        self.bytes = 0
        self.refused = 0  # requests refused by a cap, since start (a frontend worker's refusals too)
        # Refusals another process counts itself, read when asked (the gRPC front's bound on held calls)
        self.elsewhere: Callable[[], int] | None = None
        self._idle: asyncio.Event | None = None

    def admit(self, nbytes: int, model: str) -> None:
        """Count a request of ``nbytes`` in, or raise :class:`Unavailable` saying which cap it meets."""
        if self.max_requests and self.requests >= self.max_requests:
            self.refused += 1
            raise Unavailable(
                f"model '{model}': request rejected: the server is overloaded: {self.requests} requests are "
                f"already queued or executing (--max-queued-requests {self.max_requests}); retry later")
        if self.max_bytes and self.requests and self.bytes + nbytes > self.max_bytes:
            self.refused += 1
            raise Unavailable(
                f"model '{model}': request rejected: the server is overloaded: its {nbytes} bytes of inputs would "
                f"pass the {self.max_bytes} bytes queued requests may hold (--max-queued-bytes; {self.bytes} held "
                "now); retry later")
        self.requests += 1
        self.bytes += nbytes

    def refused_total(self) -> int:
        """Every request refused for overload: this process's count and what ``elsewhere`` says."""
        return self.refused + (self.elsewhere() if self.elsewhere is not None else 0)

    def count_refused(self, n: int) -> None:
        """``n`` requests a frontend worker refused itself for overload (its share of the requests
        cap, its hand-off arena full): counted with this server's own refusals."""
        self.refused += n

    def release(self, nbytes: int) -> None:
        """A request admitted with ``nbytes`` was answered (or failed)."""
        self.requests -= 1
        self.bytes -= nbytes
        if not self.requests and self._idle is not None:
            self._idle.set()
            self._idle = None

    async def idle(self) -> None:
        """Return once no admitted request is left unanswered (at once if none is)."""
        if self.requests:
            if self._idle is None:
                self._idle = asyncio.Event()
            await self._idle.wait()

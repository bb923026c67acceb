"""A frontend worker's requests in flight at the core.

Each request gets a number (``rid``) and an entry here until the core's final
message for it arrives: a future for a one-response request, a queue for a
stream request. The entry owns the request's input block: it is freed when the
final message comes, never before (the core reads the inputs in place until
then), even for a request whose client went away. Output blocks the frontend
has read are gathered and go back in one FREE message with the next write to
the core (the next requests' turn), so a frontend never wakes the core for
frees alone: not while busy, nor once idle (the core needs no room for a frontend
that sends nothing). Only many gathered blocks, or an idle frontend's large ones
(whose pages the core gives back to the kernel), go back at once.
"""

from __future__ import annotations

import asyncio
from typing import Any

from inferd import errors
from inferd.errors import InferdError, Unavailable
from inferd.handoff import wire
from inferd.handoff.arena import RELEASE_BYTES, ArenaWriter
from inferd.handoff.channel import Channel

CORE_GONE = "inferd's core process went away; the request was not answered"
FREE_BATCH = 256  # gathered output blocks that are sent back without waiting for a request to carry them


def error_from(kind: str, message: str) -> InferdError:
    """The domain error a core's ERROR message names (kind: an inferd.errors class name)."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, InferdError):
        return cls(message)
    return errors.ModelExecutionError(message)


class Stream:
    """The messages answering one stream request, in order; the last is final."""

    __slots__ = ("queue", "abandoned")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[Any] | InferdError] = asyncio.Queue()
        self.abandoned = False


class Pending:
    """Requests sent to the core and not finally answered, by request number."""

    def __init__(self, channel: Channel, inputs: ArenaWriter) -> None:
        self.channel = channel
        self.inputs = inputs
        self._loop = asyncio.get_running_loop()
        self._next = 0
        # rid -> [future or Stream, input block or NO_BLOCK]
        self._entries: dict[int, list[Any]] = {}
        self._freed: list[int] = []
        self._freed_bytes = 0  # what they held: an idle frontend sends large ones back at once
        self._idle = asyncio.Event()
        self._idle.set()
        self.lost: InferdError | None = None  # set once the core is gone: nothing more is sent
        channel.before_flush(self._send_frees)

    def __len__(self) -> int:
        return len(self._entries)

    def next_rid(self) -> int:
        self._next += 1
        return self._next

    # -- sending ------------------------------------------------------------------

    def unary(self, rid: int, message: list[Any], block: int) -> asyncio.Future:
        """Send an INFER; the future resolves with the final RESPONSE message (or raises)."""
        fut = self._loop.create_future()
        self._send(rid, message, fut, block)
        return fut

    def stream(self, rid: int, message: list[Any], block: int) -> Stream:
        stream = Stream()
        self._send(rid, message, stream, block)
        return stream

    def _send(self, rid: int, message: list[Any], waiter: Any, block: int) -> None:
        if self.lost is not None:
            if block != wire.NO_BLOCK:
                self.inputs.free(block)
            raise self.lost
        self._entries[rid] = [waiter, block]
        self._idle.clear()
        self.channel.send(message)

    def cancel(self, rid: int) -> None:
        """The client went away: tell the core (the entry stays until its final message)."""
        entry = self._entries.get(rid)
        if entry is None:
            return
        if isinstance(entry[0], Stream):
            entry[0].abandoned = True
        self.channel.send([wire.CANCEL, rid])

    def credit(self, rid: int, n: int) -> None:
        """A stream's client took ``n`` more responses: the core may send as many more."""
        if self.lost is None and rid in self._entries:
            self.channel.send([wire.CREDIT, rid, n])

    def release(self, reply: list[Any]) -> None:
        """A RESPONSE's output block has been read: it goes back with the next write to the core."""
        block = reply[wire.R_BLOCK]
        if block != wire.NO_BLOCK:
            self._freed.append(block)
            self._freed_bytes += sum(o[wire.T_NBYTES] for o in reply[wire.R_OUTPUTS])
            if len(self._freed) >= FREE_BATCH or (not self._entries and self._freed_bytes >= RELEASE_BYTES):
                self.channel.wake()

    def _send_frees(self) -> None:
        if self._freed:
            self.channel.send([wire.FREE, self._freed])
            self._freed = []
            self._freed_bytes = 0

    # -- receiving (Channel.on_message) -----------------------------------------------

    def on_response(self, msg: list[Any]) -> None:
        """RESPONSE, ERROR or FINAL from the core."""
        rid = msg[1]
        entry = self._entries.get(rid)
        if entry is None:
            if msg[0] == wire.RESPONSE:
                self.release(msg)  # nobody waits for it (cannot happen unless the core errs)
            return
        final = msg[0] == wire.FINAL or msg[2]
        if final:
            del self._entries[rid]
            if entry[1] != wire.NO_BLOCK:
                self.inputs.free(entry[1])
            if not self._entries:
                self._idle.set()
        waiter = entry[0]
        if isinstance(waiter, Stream):
            if waiter.abandoned:
                if msg[0] == wire.RESPONSE:
                    self.release(msg)
                return
            waiter.queue.put_nowait(msg)
        elif waiter.done():  # cancelled by its client
            if msg[0] == wire.RESPONSE:
                self.release(msg)
        elif msg[0] == wire.ERROR:
            waiter.set_exception(error_from(msg[3], msg[4]))
        else:
            waiter.set_result(msg)

    def fail_all(self, error: InferdError | None = None) -> None:
        """The core is gone: every request in flight fails (UNAVAILABLE), and so does any later one."""
        self.lost = error or Unavailable(CORE_GONE)
        entries, self._entries = self._entries, {}
        for waiter, _ in entries.values():
            if isinstance(waiter, Stream):
                waiter.queue.put_nowait(self.lost)
            elif not waiter.done():
                waiter.set_exception(self.lost)
        self._idle.set()

    async def idle(self) -> None:
        """Return once nothing is in flight (a drain waits on this)."""
        await self._idle.wait()

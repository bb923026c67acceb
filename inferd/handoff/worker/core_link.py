"""A frontend worker's link to its core: channel, arenas, requests in flight, calls, mirrored state.

The worker owns no model and no setting: inference goes to the core through
the arenas (:class:`InFlight`), every other request is a call answered by the
core (:meth:`CoreLink.call`), and the little state the worker needs on every
request (is tracing on, what health says) is pushed by the core in STATE
messages when it changes, so the hot path never asks.

Requests in flight (:class:`InFlight`):
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
import logging
import pickle
import socket
from typing import Any

from inferd import errors
from inferd.errors import InferdError, Unavailable
from inferd.facade import DRAINING
from inferd.handoff import wire
from inferd.ipc.arena import RELEASE_BYTES, Arena, ArenaWriter
from inferd.ipc.channel import Channel

log = logging.getLogger(__name__)

CORE_GONE = "inferd's core process went away; the request was not answered"
FREE_BATCH = 256  # gathered output blocks that are sent back without waiting for a request to carry them


def error_from(kind: str, message: str) -> InferdError:
    """The domain error a core's ERROR message names (kind: an inferd.errors class name)."""
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, InferdError):
        return cls(message)
    return errors.ModelExecutionError(message)


class InFlightStream:
    """The messages answering one stream request, in order; the last is final."""

    __slots__ = ("queue", "abandoned")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[list[Any] | InferdError] = asyncio.Queue()
        self.abandoned = False


class InFlight:
    """Requests sent to the core and not finally answered, by request number."""

    def __init__(self, channel: Channel, inputs: ArenaWriter) -> None:
        self.channel = channel
        self.inputs = inputs
        self._loop = asyncio.get_running_loop()
        self._next = 0
        # rid -> [future or InFlightStream, input block or NO_BLOCK]
        self._entries: dict[int, list[Any]] = {}
        self._freed: list[int] = []
        self._freed_bytes = 0  # what they held: an idle frontend sends large ones back at once
        self._idle = asyncio.Event()
        self._idle.set()
        # Final answers were delivered and the handlers they wake run in the coming loop turn: what
        # those send goes out together at the turn's end, never the first of them at once alone.
        self._answering = False
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

    def stream(self, rid: int, message: list[Any], block: int) -> InFlightStream:
        stream = InFlightStream()
        self._send(rid, message, stream, block)
        return stream

    def _send(self, rid: int, message: list[Any], waiter: Any, block: int) -> None:
        if self.lost is not None:
            if block != wire.NO_BLOCK:
                self.inputs.free(block)
            raise self.lost
        entries = self._entries
        entries[rid] = [waiter, block]
        self._idle.clear()
        # Blocks freed since the last write go ahead of the request, not behind it: the core then reads
        # a lone request as its read's last message (Channel.more false) and runs it on its idle fast
        # path; with a FREE behind it every lone request waited a loop turn there for company.
        self._send_frees()
        # The only request in flight, and not sent by a handler that answers just woke (a lone client's next
        # request, or the first after a quiet spell): no other request of this turn is likely to join its
        # write, so it goes at once (with the FREE just queued ahead of it) instead of a loop turn later.
        self.channel.send(message, at_once=len(entries) == 1 and not self._answering)

    def cancel(self, rid: int, ended: bool = False) -> None:
        """The client went away: tell the core (the entry stays until its final message). ``ended``:
        the stream's consumer stopped on purpose (``InferenceRequest.ended_by_client``)."""
        entry = self._entries.get(rid)
        if entry is None:
            return
        if isinstance(entry[0], InFlightStream):
            entry[0].abandoned = True
        self.channel.send([wire.CANCEL, rid, True] if ended else [wire.CANCEL, rid])

    def sent(self, rid: int, start_ns: int | None, end_ns: int | None) -> None:
        """A traced request's answer was sent (its frontend trace timestamps; None: it never was)."""
        if self.lost is None:
            self.channel.send([wire.SENT, rid, start_ns, end_ns])

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
        self._deliver(msg)
        if self._answering and not self.channel.more:
            # The read's last message: queued after every wake-up its answers scheduled, so it runs
            # after the handlers they resume.
            self._loop.call_soon(self._answered)

    def _deliver(self, msg: list[Any]) -> None:
        rid = msg[1]
        entry = self._entries.get(rid)
        if entry is None:
            if msg[0] == wire.RESPONSE:
                self.release(msg)  # nobody waits for it (cannot happen unless the core errs)
            return
        final = msg[0] == wire.FINAL or msg[2]
        if final:
            self._answering = True
            del self._entries[rid]
            if entry[1] != wire.NO_BLOCK:
                self.inputs.free(entry[1])
            if not self._entries:
                self._idle.set()
        waiter = entry[0]
        if isinstance(waiter, InFlightStream):
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

    def _answered(self) -> None:
        self._answering = False

    def fail_all(self, error: InferdError | None = None) -> None:
        """The core is gone: every request in flight fails (UNAVAILABLE), and so does any later one."""
        self.lost = error or Unavailable(CORE_GONE)
        entries, self._entries = self._entries, {}
        for waiter, _ in entries.values():
            if isinstance(waiter, InFlightStream):
                waiter.queue.put_nowait(self.lost)
            elif not waiter.done():
                waiter.set_exception(self.lost)
        self._idle.set()

    async def idle(self) -> None:
        """Return once nothing is in flight (a drain waits on this)."""
        await self._idle.wait()



class CoreLink:
    """The worker's end of the hand-off (one per worker process)."""

    def __init__(self, channel: Channel, config: dict[str, Any]) -> None:
        self.channel = channel
        self.config = config
        self.index: int = config.get("index", 0)
        self.inputs = ArenaWriter(Arena(*config["inputs"]))
        self.outputs = Arena(*config["outputs"])
        self.in_flight = InFlight(channel, self.inputs)
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = 0
        self.draining = False
        # At most --max-queued-requests in flight from this worker (0: no cap): what waits here or in the
        # hand-off is bounded before the core's own, server-wide cap counts it.
        self.max_pending: int = config.get("max_pending", 0)
        self.max_queued: int = config.get("max_queued_requests", 0)
        self.tracing = False  # the core's tracing is on for some model: send trace carriers
        self.drain_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.core_draining = False  # the core sent DRAIN: it will say CLOSE when the whole server is drained
        self.close_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.recycle_requested: asyncio.Future = asyncio.get_running_loop().create_future()  # its grace
        self._refused = 0  # refused here for overload, not yet told to the core
        channel.before_flush(self._send_refused)
        self.update_state(config.get("state") or {})

    @classmethod
    async def connect(cls, sock: socket.socket, timeout: float = 60.0) -> "CoreLink":
        """Open the channel and wait for the core's CONFIG."""
        loop = asyncio.get_running_loop()
        configured: asyncio.Future = loop.create_future()
        box: list[CoreLink] = []

        def on_message(msg: list[Any]) -> None:
            if box:
                box[0].on_message(msg)
            elif msg[0] == wire.CONFIG and not configured.done():
                box.append(cls(channel, msg[1]))
                configured.set_result(box[0])

        channel = await Channel.open(sock, on_message, "core")
        assert channel.closed is not None
        done, _ = await asyncio.wait([configured, channel.closed], timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if configured not in done:
            raise SystemExit("frontend worker: the core sent no configuration")
        link = configured.result()
        channel.closed.add_done_callback(lambda _: link._core_gone())  # type: ignore[union-attr]
        return link

    # -- messages from the core ----------------------------------------------------------

    def on_message(self, msg: list[Any]) -> None:
        kind = msg[0]
        if kind in (wire.RESPONSE, wire.ERROR, wire.FINAL):
            self.in_flight.on_response(msg)
        elif kind == wire.REPLY:
            fut = self._calls.pop(msg[1], None)
            if fut is not None and not fut.done():
                if msg[2]:
                    fut.set_result(pickle.loads(msg[3]))
                else:
                    fut.set_exception(error_from(*msg[3]))
        elif kind == wire.STATE:
            self.update_state(msg[1])
        elif kind == wire.DRAIN:
            self.core_draining = True
            if not self.drain_requested.done():
                self.drain_requested.set_result(msg[1])
        elif kind == wire.CLOSE:
            if not self.close_requested.done():
                self.close_requested.set_result(None)
        elif kind == wire.RECYCLE:
            if not self.recycle_requested.done():
                self.recycle_requested.set_result(msg[1])
        else:
            log.warning("frontend %d: unknown message kind %r from the core", self.index, kind)

    def update_state(self, state: dict[str, Any]) -> None:
        if "tracing" in state:
            self.tracing = bool(state["tracing"])

    def _core_gone(self) -> None:
        self.in_flight.fail_all(Unavailable(CORE_GONE))
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(Unavailable(CORE_GONE))
        self._calls.clear()
        if not self.drain_requested.done():
            self.drain_requested.set_result(None)  # None: no grace, the core is gone
        if not self.close_requested.done():
            self.close_requested.set_result(None)

    @property
    def core_gone(self) -> bool:
        return self.in_flight.lost is not None

    # -- calls to the core ------------------------------------------------------------------

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the core's side (the control plane: never per inference)."""
        if self.in_flight.lost is not None:
            raise self.in_flight.lost
        self._next_call += 1
        cid = self._next_call
        fut = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        self.channel.send([wire.CALL, cid, method, pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)])
        try:
            return await fut
        finally:
            self._calls.pop(cid, None)

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise Unavailable(DRAINING)
        if self.in_flight.lost is not None:
            raise self.in_flight.lost

    def refuse_if_full(self, model: str) -> None:
        """Refuse (UNAVAILABLE) a request past the requests this worker may hold in flight, before its
        tensors are copied or anything is sent."""
        if self.max_pending and len(self.in_flight) >= self.max_pending:
            self.count_refused()
            raise Unavailable(
                f"model '{model}': request rejected: the server is overloaded: this frontend worker already "
                f"holds {len(self.in_flight)} requests in flight (--max-queued-requests {self.max_queued}); "
                "retry later")

    def count_refused(self) -> None:
        """A request this worker refused itself for overload (past its in-flight cap, or with its
        input arena full): the core counts it with its own refusals, told in a REFUSED message that
        rides on this turn's write."""
        self._refused += 1
        self.channel.wake()

    def _send_refused(self) -> None:
        if self._refused and self.in_flight.lost is None:
            self.channel.send([wire.REFUSED, self._refused])
            self._refused = 0

    def hello(self) -> None:
        import os

        self.channel.send([wire.HELLO, self.index, os.getpid()])

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
has read are gathered and go back in one Free message with the next write to
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
import time
from typing import Any

from inferd import errors
from inferd.errors import Draining, InferdError, Unavailable
from inferd.facade import DRAINING, TraceCarrier
from inferd.handoff.messages import (
    NO_BLOCK, Call, Cancel, Close, Config, Credit, Drain, Error, Final, Free, FrontendStamp, Hello, Infer, InputTensor,
    OutputRequest, Recycle, Refused, Reply, Response, Sent, State, ToWorker,
)
from inferd.ipc.arena import RELEASE_BYTES, Arena, ArenaFull, ArenaWriter, Buffer
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
        self.queue: asyncio.Queue[Response | Error | Final | InferdError] = asyncio.Queue()
        self.abandoned = False


class InFlight:
    """Requests sent to the core and not finally answered, by request number."""

    def __init__(self, channel: Channel, inputs: ArenaWriter) -> None:
        self.channel = channel
        self.inputs = inputs
        self._loop = asyncio.get_running_loop()
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

    # -- sending ------------------------------------------------------------------

    def unary(self, message: Infer, block: int) -> asyncio.Future:
        """Send an Infer; the future resolves with the final Response (or raises)."""
        fut = self._loop.create_future()
        self._send(message, fut, block)
        return fut

    def stream(self, message: Infer, block: int) -> InFlightStream:
        """Send a stream's Infer; its answers come in the stream's queue, the last one final."""
        stream = InFlightStream()
        self._send(message, stream, block)
        return stream

    def _send(self, message: Infer, waiter: Any, block: int) -> None:
        if self.lost is not None:
            if block != NO_BLOCK:
                self.inputs.free(block)
            raise self.lost
        entries = self._entries
        entries[message.rid] = [waiter, block]
        self._idle.clear()
        # Blocks freed since the last write go ahead of the request, not behind it: the core then reads
        # a lone request as its read's last message (Channel.more false) and runs it on its idle fast
        # path; with a Free behind it every lone request waited a loop turn there for company.
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
        self.channel.send(Cancel(rid, ended))

    def sent(self, rid: int, start_ns: int | None, end_ns: int | None) -> None:
        """A traced request's answer was sent (its frontend trace timestamps; None: it never was)."""
        if self.lost is None:
            self.channel.send(Sent(rid, start_ns, end_ns))

    def credit(self, rid: int, n: int) -> None:
        """A stream's client took ``n`` more responses: the core may send as many more."""
        if self.lost is None and rid in self._entries:
            self.channel.send(Credit(rid, n))

    def release(self, reply: Response) -> None:
        """A Response's output block has been read: it goes back with the next write to the core."""
        block = reply.block
        if block != NO_BLOCK:
            self._freed.append(block)
            self._freed_bytes += sum(o.nbytes for o in reply.outputs)
            if len(self._freed) >= FREE_BATCH or (not self._entries and self._freed_bytes >= RELEASE_BYTES):
                self.channel.wake()

    def _send_frees(self) -> None:
        if self._freed:
            self.channel.send(Free(self._freed))
            self._freed = []
            self._freed_bytes = 0

    # -- receiving (Channel.on_message) -----------------------------------------------

    def on_response(self, msg: Response | Error | Final) -> None:
        """Response, Error or Final from the core."""
        self._deliver(msg)
        if self._answering and not self.channel.more:
            # The read's last message: queued after every wake-up its answers scheduled, so it runs
            # after the handlers they resume.
            self._loop.call_soon(self._answered)

    def _deliver(self, msg: Response | Error | Final) -> None:
        rid = msg.rid
        entry = self._entries.get(rid)
        if entry is None:
            if type(msg) is Response:
                self.release(msg)  # nobody waits for it (cannot happen unless the core errs)
            return
        if msg.final:
            self._answering = True
            del self._entries[rid]
            if entry[1] != NO_BLOCK:
                self.inputs.free(entry[1])
            if not self._entries:
                self._idle.set()
        waiter = entry[0]
        if isinstance(waiter, InFlightStream):
            if waiter.abandoned:
                if type(msg) is Response:
                    self.release(msg)
                return
            waiter.queue.put_nowait(msg)
        elif waiter.done():  # cancelled by its client
            if type(msg) is Response:
                self.release(msg)
        elif type(msg) is Error:
            waiter.set_exception(error_from(msg.kind, msg.message))
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
        self._next_rid = 0
        self._calls: dict[int, asyncio.Future] = {}
        self._next_call = 0
        self.draining = False
        # At most --max-queued-requests in flight from this worker (0: no cap): what waits here or in the
        # hand-off is bounded before the core's own, server-wide cap counts it.
        self.max_pending: int = config.get("max_pending", 0)
        self.max_queued: int = config.get("max_queued_requests", 0)
        # The core's tracing is on for some model: send trace carriers (then pushed in State messages).
        self.tracing = bool((config.get("state") or {}).get("tracing"))
        self.drain_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.core_draining = False  # the core sent Drain: it will say Close when the whole server is drained
        self.close_requested: asyncio.Future = asyncio.get_running_loop().create_future()
        self.recycle_requested: asyncio.Future = asyncio.get_running_loop().create_future()  # its grace
        self._refused = 0  # refused here for overload, not yet told to the core
        channel.before_flush(self._send_refused)

    @classmethod
    async def connect(cls, sock: socket.socket, timeout: float = 60.0) -> "CoreLink":
        """Open the channel and wait for the core's Config."""
        loop = asyncio.get_running_loop()
        configured: asyncio.Future = loop.create_future()
        box: list[CoreLink] = []

        def on_message(msg: ToWorker) -> None:
            if box:
                box[0].on_message(msg)
            elif type(msg) is Config and not configured.done():
                box.append(cls(channel, msg.options))
                configured.set_result(box[0])

        channel = await Channel.open(sock, on_message, "core", receives=ToWorker)
        assert channel.closed is not None
        done, _ = await asyncio.wait([configured, channel.closed], timeout=timeout,
                                     return_when=asyncio.FIRST_COMPLETED)
        if configured not in done:
            raise SystemExit("frontend worker: the core sent no configuration")
        link = configured.result()
        channel.closed.add_done_callback(lambda _: link._core_gone())  # type: ignore[union-attr]
        return link

    # -- messages from the core ----------------------------------------------------------

    def on_message(self, msg: ToWorker) -> None:
        # type() comparisons, not a match statement: its class patterns cost the hot path ~10x more.
        if type(msg) is Response or type(msg) is Error or type(msg) is Final:
            self.in_flight.on_response(msg)
        elif type(msg) is Reply:
            fut = self._calls.pop(msg.cid, None)
            if fut is not None and not fut.done():
                if msg.value is not None:
                    fut.set_result(pickle.loads(msg.value))
                else:
                    fut.set_exception(error_from(msg.kind, msg.message))
        elif type(msg) is State:
            self.tracing = msg.tracing
        elif type(msg) is Drain:
            self.core_draining = True
            if not self.drain_requested.done():
                self.drain_requested.set_result(msg.grace)
        elif type(msg) is Close:
            if not self.close_requested.done():
                self.close_requested.set_result(None)
        elif type(msg) is Recycle:
            if not self.recycle_requested.done():
                self.recycle_requested.set_result(msg.grace)
        else:  # a second Config
            log.warning("frontend %d: an unexpected %s from the core", self.index, type(msg).__name__)

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

    # -- requests to the core ----------------------------------------------------------------

    def infer(self, model: str, version: str, request_id: str, parameters: dict[str, Any] | None,
              inputs: list[InputTensor], outputs: list[OutputRequest] | None, flags: int, deadline: float | None,
              received_ns: int, openai_prompt_tokens: int | None, trace_carrier: TraceCarrier | None,
              placed: list[InputTensor], parts: list[Buffer], protocol: str, decoded_ns: int) -> tuple[int, Infer]:
        """(input block, Infer): the one place an Infer is built, for the gRPC edge and the proxy alike.
        Its fields come in the struct's order, then what this adds to them; positional, because 15 keyword
        arguments cost this call ~900 instructions more (callgrind), on every request.

        ``parts`` (the bytes of the ``placed`` inputs, in order) are copied into one new block of the input
        arena and the inputs get their places; the block is the caller's to free once the core's final
        answer comes, or at once if sending fails (InFlight does both). A full arena refuses the request
        UNAVAILABLE (ArenaFull), counted with the core's overload refusals. While the core traces, the
        request carries its trace context and, for a unary gRPC / HTTP request (``protocol``, else ""), its
        frontend stamp: ``decoded_ns``, or now (once its tensors are in the arena) when 0."""
        block = NO_BLOCK
        if parts:
            try:
                block, offsets = self.inputs.put(parts)
            except ArenaFull:
                self.count_refused()
                raise
            for tensor, offset, part in zip(placed, offsets, parts):
                tensor.offset = offset
                tensor.nbytes = len(part)
        trace = frontend = None
        if self.tracing:
            if trace_carrier is not None:
                trace = dict(trace_carrier())
            if protocol:
                frontend = FrontendStamp(protocol, decoded_ns or time.monotonic_ns())
        self._next_rid += 1
        # Positional, in the struct's field order (rid first): ~500 instructions less than keywords.
        return block, Infer(self._next_rid, model, version, request_id, parameters, inputs, outputs, flags, deadline,
                            trace, received_ns, openai_prompt_tokens, frontend)

    # -- calls to the core ------------------------------------------------------------------

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method`` on the core's side (the control plane: never per inference)."""
        if self.in_flight.lost is not None:
            raise self.in_flight.lost
        self._next_call += 1
        cid = self._next_call
        fut = asyncio.get_running_loop().create_future()
        self._calls[cid] = fut
        self.channel.send(Call(cid, method, pickle.dumps((args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)))
        try:
            return await fut
        finally:
            self._calls.pop(cid, None)

    def refuse_if_draining(self) -> None:
        if self.draining:
            raise Draining(DRAINING)
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
        input arena full): the core counts it with its own refusals, told in a Refused message that
        rides on this turn's write."""
        self._refused += 1
        self.channel.wake()

    def _send_refused(self) -> None:
        if self._refused and self.in_flight.lost is None:
            self.channel.send(Refused(self._refused))
            self._refused = 0

    def hello(self) -> None:
        """Tell the core this worker serves (its ports are bound)."""
        import os

        self.channel.send(Hello(self.index, os.getpid()))

"""The control channel between a frontend worker and the core: one unix socket pair.

Messages are msgpack arrays (plain lists of str/int/float/bool/bytes/None and
dicts of those: no pickling, no Python objects, no tensor bytes) written back
to back on a stream socket; msgpack's streaming unpacker finds the message
boundaries itself, so there is no framing of our own to get wrong. Sending
only appends to a buffer: the buffer is written once per event-loop turn, so
the requests a busy frontend decodes in one turn (and the responses the core
finishes in one) cost one ``send`` and one wake-up of the peer between them;
a sender that knows it sends nothing else this turn writes at once
(``send(msg, at_once=True)``), saving the loop iteration a deferred write costs.

The channel is an asyncio Protocol, not a stream: bytes go from the loop's
socket read straight to the unpacker and each message to ``on_message``, with
no task or future per message.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any, Callable

import msgpack

log = logging.getLogger(__name__)

SOCKET_BUFFER = 4 << 20  # a turn's batch of messages fits: the writer rarely waits for the reader
MAX_MESSAGE = 64 << 20  # a control message this large is a bug (tensors never travel here)


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(core's end, worker's end). The worker's end is inheritable, for ``pass_fds``."""
    core, worker = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (core, worker):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    worker.set_inheritable(True)
    return core, worker


class Channel(asyncio.Protocol):
    """One end of the control channel.

    ``on_message(msg)`` is called on the loop for every message, in order;
    it must not block. ``closed`` resolves (with None) when the peer goes
    away or the channel is closed; messages sent after that are dropped.
    """

    def __init__(self, on_message: Callable[[list[Any]], None], name: str = "channel") -> None:
        self.name = name
        self.on_message = on_message
        self._packer = msgpack.Packer(autoreset=False, use_bin_type=True)
        self._unpacker = msgpack.Unpacker(raw=False, use_list=True, max_buffer_size=MAX_MESSAGE,
                                          strict_map_key=False)
        self._transport: asyncio.Transport | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._flush_pending = False
        self._scheduled = False  # a deferred flush is queued on the loop
        self._before_flush: list[Callable[[], None]] = []
        self.closed: asyncio.Future[None] | None = None
        self.sent = 0  # messages, for tests and benchmarks
        self.writes = 0  # socket writes: sent / writes is the batching achieved
        self.received = 0
        # While on_message runs: other messages of the same read follow this one (a receiver
        # may hold work back to do it once for all of them).
        self.more = False
        self._delivering = False  # in data_received: what its handlers send is written as it ends
        # While open() runs, what arrives waits in the unpacker: uvloop reads the socket before
        # connect_accepted_socket returns, and the caller's handler may need the channel.
        self._opening = False

    @classmethod
    async def open(cls, sock: socket.socket, on_message: Callable[[list[Any]], None],
                   name: str = "channel") -> "Channel":
        loop = asyncio.get_running_loop()
        sock.setblocking(False)

        def opening() -> Channel:
            channel = cls(on_message, name)
            channel._opening = True
            return channel

        _, channel = await loop.connect_accepted_socket(opening, sock)
        loop.call_soon(channel._opened)  # after the caller has the channel in hand
        return channel

    def _opened(self) -> None:
        self._opening = False
        if self._transport is not None:
            self._deliver()

    # -- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self.closed = self._loop.create_future()

    def data_received(self, data: bytes) -> None:
        self._unpacker.feed(data)
        if not self._opening:
            self._deliver()

    def _deliver(self) -> None:
        handle = self.on_message
        self._delivering = True
        try:
            messages = list(self._unpacker)
            last = len(messages) - 1
            for i, msg in enumerate(messages):
                self.received += 1
                self.more = i < last
                try:
                    handle(msg)
                except Exception:  # one bad message must not stop the channel
                    log.exception("%s: failed to handle a control message (kind %r)", self.name,
                                  msg[0] if isinstance(msg, list) and msg else msg)
        finally:
            self.more = self._delivering = False
        if self._flush_pending:
            # Answers made while handling this read (a core's inline model) go out now, in one
            # write, rather than a loop turn later: one loop iteration (and epoll call) less a wake.
            self._flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def eof_received(self) -> bool:
        return False  # close our end too

    # -- sending --------------------------------------------------------------------

    def send(self, msg: list[Any], at_once: bool = False) -> None:
        """Queue ``msg``; it is written with everything else sent in this loop turn (sent by a
        handler of a read, as that read's handling ends).

        ``at_once``: the sender knows nothing else will be sent this turn (the first request
        to an idle peer, the last answer of an idle endpoint): write now, with what is queued,
        rather than in a loop iteration of its own a turn later. A lone client's request so
        costs each side one loop iteration (and epoll call) less, and reaches the peer that much
        sooner. Inside a read's handling it changes nothing: that read's answers still go out
        together as its handling ends."""
        if self._transport is None:
            return
        self._packer.pack(msg)
        self.sent += 1
        if at_once and not self._delivering:
            self._flush()
            return
        if not self._flush_pending:
            self._flush_pending = True
            if not self._delivering:
                self._schedule()

    def before_flush(self, hook: Callable[[], None]) -> None:
        """``hook()`` runs just before each write, to add what it has gathered (e.g. one FREE
        message for every block freed in the turn)."""
        self._before_flush.append(hook)

    def wake(self) -> None:
        """Make sure a write happens this turn (a before-flush hook has something to send)."""
        if not self._flush_pending and self._transport is not None:
            self._flush_pending = True
            if not self._delivering:
                self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._deferred_flush)  # type: ignore[union-attr]

    def _deferred_flush(self) -> None:
        # A write made at once since (send(at_once=True)) may have taken what this turn queued:
        # then nothing is left to write, and the before-flush hooks must not write alone.
        self._scheduled = False
        if self._flush_pending:
            self._flush()

    def _flush(self) -> None:
        self._flush_pending = True
        for hook in self._before_flush:  # while _flush_pending holds, their sends join this write
            hook()
        self._flush_pending = False
        packer = self._packer
        data = packer.bytes()
        if not data:
            return
        packer.reset()
        transport = self._transport
        if transport is not None:
            transport.write(data)
            self.writes += 1

    def flush_now(self) -> None:
        """Write what is queued at once (before a process exits)."""
        self._flush()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


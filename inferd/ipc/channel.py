"""A control channel between two of inferd's processes: one unix socket pair.

The channel is generic: each end names the type of the messages it receives
(``receives``, e.g. a tagged union of msgspec structs, or ``Any`` for plain
msgpack values) and sends whatever msgspec encodes (structs, lists, dicts of
str/int/float/bool/bytes/None: no pickling, no Python objects, no tensor
bytes). Sending only appends the encoded message to the frame being built:
the frame is written once per event-loop turn, so the requests a busy frontend
decodes in one turn (and the responses the core finishes in one) cost one
``send`` and one wake-up of the peer between them; a sender that knows it
sends nothing else this turn writes at once (``send(msg, at_once=True)``),
saving the loop iteration a deferred write costs.

On the socket, a write is one frame: a 4-byte big-endian length, then the
turn's messages as one msgpack array (an array32 header, so the header's size
is fixed, then the messages back to back). The receiving end decodes a whole
frame in one call (``msgspec.msgpack.Decoder(list[receives])``, in C, typed)
and hands its messages to ``on_message`` one by one, in order; a frame that
does not decode to ``receives`` is a broken peer: logged, and the channel
closed.

The channel is an asyncio Protocol, not a stream: bytes go from the loop's
socket read straight to the decoder and each message to ``on_message``, with
no task or future per message.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import Any, Callable

import msgspec

log = logging.getLogger(__name__)

SOCKET_BUFFER = 4 << 20  # a turn's batch of messages fits: the writer rarely waits for the reader
# A frame this large is a bug or a corrupt length (tensors never travel here): the largest legitimate
# one carries a Call with a batch job's file, which the HTTP frontend caps (64 MiB by default).
MAX_FRAME = 256 << 20
_LENGTH = struct.Struct(">I")  # a frame's length, not counting these 4 bytes
_HEADER = struct.Struct(">IBI")  # the length, then msgpack's array32 header: 0xdd and the message count
_ARRAY32 = 0xDD
_ENCODER = msgspec.msgpack.Encoder()


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

    ``on_message(msg)`` is called on the loop for every message, in order, decoded
    to ``receives``; it must not block. ``closed`` resolves (with None) when the peer
    goes away or the channel is closed; messages sent after that are dropped.
    """

    def __init__(self, on_message: Callable[[Any], None], name: str = "channel", *, receives: Any) -> None:
        self.name = name
        self.on_message = on_message
        self._decode = msgspec.msgpack.Decoder(list[receives]).decode  # type: ignore[valid-type]
        self._encode = _ENCODER.encode
        self._frame = bytearray(_HEADER.size)  # the frame being built: its header's room, then the messages
        self._framed = 0  # messages sent before it (``sent`` counts them all)
        self._partial = bytearray()  # the start of a frame whose end has not arrived yet
        self._inbox: list[Any] = []  # decoded, not yet delivered (while open() runs)
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
        # While open() runs, what arrives waits in the inbox: uvloop reads the socket before
        # connect_accepted_socket returns, and the caller's handler may need the channel.
        self._opening = False

    @classmethod
    async def open(cls, sock: socket.socket, on_message: Callable[[Any], None], name: str = "channel", *,
                   receives: Any) -> "Channel":
        """The channel over ``sock``, delivering each message it receives, decoded to ``receives``
        (a type msgspec decodes: a tagged union of the peer's message structs, or ``Any``)."""
        loop = asyncio.get_running_loop()
        sock.setblocking(False)

        def opening() -> Channel:
            channel = cls(on_message, name, receives=receives)
            channel._opening = True
            return channel

        _, channel = await loop.connect_accepted_socket(opening, sock)
        loop.call_soon(channel._opened)  # after the caller has the channel in hand
        return channel

    def _opened(self) -> None:
        self._opening = False
        inbox, self._inbox = self._inbox, []
        if self._transport is not None and inbox:
            self._deliver(inbox)

    # -- asyncio.Protocol -----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._loop = asyncio.get_running_loop()
        self.closed = self._loop.create_future()

    def data_received(self, data: bytes) -> None:
        n = len(data)
        if n >= 4 and not self._partial and _LENGTH.unpack_from(data)[0] == n - 4:
            # The usual read: one whole frame, one peer's write.
            try:
                messages = self._decode(data[4:])
            except msgspec.DecodeError as exc:  # ValidationError too: a message not of `receives`
                self._broken(f"a frame that does not decode: {exc}")
                return
        else:
            messages = self._frames(data)
        if self._opening:
            self._inbox += messages
        elif messages:
            self._deliver(messages)

    def _frames(self, data: bytes) -> list[Any]:
        """The messages of every whole frame in what has arrived; the start of a frame whose end has
        not arrived yet waits for the next read."""
        partial = self._partial
        if partial:  # a frame larger than a read: gathered until its end arrives
            partial += data
            data = partial  # type: ignore[assignment]
        at, end = 0, len(data)
        messages: list[Any] = []
        while end - at >= 4:
            size = _LENGTH.unpack_from(data, at)[0]
            if size > MAX_FRAME:
                self._broken(f"a frame of {size} bytes, over the {MAX_FRAME} a channel takes", messages)
                return []
            if end - at - 4 < size:
                break
            try:
                messages += self._decode(memoryview(data)[at + 4:at + 4 + size])
            except msgspec.DecodeError as exc:  # ValidationError too: a message not of `receives`
                self._broken(f"a frame that does not decode: {exc}", messages)
                return []
            at += 4 + size
        if partial:
            del partial[:at]
        elif at < end:
            self._partial = bytearray(memoryview(data)[at:])
        return messages

    def _broken(self, what: str, before: list[Any] | None = None) -> None:
        """The peer sent what no peer of ours sends: the messages ``before`` it are delivered, and the
        channel closes (both ends then see it end: a worker's requests fail, the core restarts it)."""
        log.error("%s: the peer sent %s; closing the channel", self.name, what)
        self._partial = bytearray()
        if before:
            if self._opening:
                self._inbox += before
            else:
                self._deliver(before)
        if self._transport is not None:
            self._transport.close()

    def _deliver(self, messages: list[Any]) -> None:
        handle = self.on_message
        self._delivering = True
        try:
            last = len(messages) - 1
            for i, msg in enumerate(messages):
                self.received += 1
                self.more = i < last
                try:
                    handle(msg)
                except Exception:  # one bad message must not stop the channel
                    log.exception("%s: failed to handle a control message (%s)", self.name, _kind(msg))
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

    def send(self, msg: Any, at_once: bool = False) -> None:
        """Queue ``msg`` (encoded now: a message that cannot be encoded raises here, and the frame
        keeps only the others); it is written with everything else sent in this loop turn (sent by a
        handler of a read, as that read's handling ends).

        ``at_once``: the sender knows nothing else will be sent this turn (the first request
        to an idle peer, the last answer of an idle endpoint): write now, with what is queued,
        rather than in a loop iteration of its own a turn later. A lone client's request so
        costs each side one loop iteration (and epoll call) less, and reaches the peer that much
        sooner. Inside a read's handling it changes nothing: that read's answers still go out
        together as its handling ends."""
        if self._transport is None:
            return
        self._frame += self._encode(msg)  # encoded whole before it joins the frame
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
        count = self.sent - self._framed
        if not count:
            return
        # A new frame for the next turn: the transport may keep this one until the socket takes it all.
        frame, self._frame, self._framed = self._frame, bytearray(_HEADER.size), self.sent
        _HEADER.pack_into(frame, 0, len(frame) - 4, _ARRAY32, count)
        transport = self._transport
        if transport is not None:
            transport.write(frame)
            self.writes += 1

    def flush_now(self) -> None:
        """Write what is queued at once (before a process exits)."""
        self._flush()

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()


def _kind(msg: Any) -> str:
    """A message's kind, for a log line: its struct's name, or a plain list's first item."""
    if isinstance(msg, list):
        return repr(msg[0]) if msg else "[]"
    return type(msg).__name__

"""Length-prefixed frames over a stream socket: a model host's link to the core.

Each frame is a 4-byte little-endian length, then that many bytes (one msgspec-encoded message of
:mod:`inferd.hosts.protocol`, decoded straight into its type). Unlike the frontends' batched
:class:`~inferd.ipc.channel.Channel` (msgpack arrays, one write per loop turn), every frame is written
at once: a host's messages are one per batch or response, and each is awaited by the other side.
:class:`FrameChannel` reads (and writes, on its loop); :class:`FrameReader` reads on a thread of its own
from a blocking socket; :class:`FrameWriter` writes from any thread straight to the socket, for a process
whose messages are made on threads other than its loop's.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import threading
from typing import Callable

log = logging.getLogger(__name__)

HEADER = 4
MAX_FRAME = 64 << 20  # a control message this large is a bug (tensors travel in the arenas)


def frame(data: bytes) -> bytes:
    if len(data) > MAX_FRAME:
        raise ValueError(f"a {len(data)}-byte control message is over the {MAX_FRAME}-byte limit")
    return len(data).to_bytes(HEADER, "little") + data


class FrameChannel(asyncio.Protocol):
    """One end of a framed link, on the running loop: ``on_frame(bytes)`` for every frame, in order (it must
    not block); ``closed`` resolves when the peer goes away or the channel is closed."""

    def __init__(self, on_frame: Callable[[bytes], None], name: str) -> None:
        self.on_frame = on_frame
        self.name = name
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] | None = None

    @classmethod
    async def open(cls, sock: socket.socket, on_frame: Callable[[bytes], None], name: str) -> "FrameChannel":
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        _, channel = await loop.connect_accepted_socket(lambda: cls(on_frame, name), sock)
        return channel

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        start, end = 0, len(buf)
        while end - start >= HEADER:
            n = int.from_bytes(buf[start:start + HEADER], "little")
            if n > MAX_FRAME:
                log.error("%s: a %d-byte frame is over the limit; closing the link", self.name, n)
                self.close()
                return
            if end - start - HEADER < n:
                break
            body = bytes(buf[start + HEADER:start + HEADER + n])
            start += HEADER + n
            try:
                self.on_frame(body)
            except Exception:  # one bad message must not stop the link
                log.exception("%s: failed to handle a message", self.name)
        del buf[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self.closed is not None and not self.closed.done():
            self.closed.set_result(None)

    def eof_received(self) -> bool:
        return False

    def send(self, data: bytes) -> None:
        """Write one frame now (on the loop); dropped once the link is closed."""
        if self._transport is not None:
            self._transport.write(frame(data))

    def send_many(self, items: list[bytes]) -> None:
        """Write several frames in one write (on the loop)."""
        if self._transport is not None:
            self._transport.write(b"".join(frame(data) for data in items))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class FrameReader:
    """Reads frames from a blocking socket on the calling thread (a model host's model thread reads its
    batches itself: no loop to wake, no hand-off between threads)."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def ready(self) -> bool:
        """Whether a whole frame is already here (:meth:`read` would not wait)."""
        buf = self._buf
        return len(buf) >= HEADER and len(buf) - HEADER >= int.from_bytes(buf[:HEADER], "little")

    def read(self) -> bytes | None:
        """The next frame, waiting for it; None once the peer has closed the socket."""
        buf = self._buf
        while True:
            if len(buf) >= HEADER:
                n = int.from_bytes(buf[:HEADER], "little")
                if n > MAX_FRAME:
                    raise ValueError(f"a {n}-byte frame is over the {MAX_FRAME}-byte limit")
                if len(buf) - HEADER >= n:
                    body = bytes(buf[HEADER:HEADER + n])
                    del buf[:HEADER + n]
                    return body
            try:
                data = self._sock.recv(1 << 16)
            except OSError:
                return None
            if not data:
                return None
            buf += data


class FrameWriter:
    """Writes frames straight to a socket from any thread, each at once, in the order the calls take its
    lock, waiting while the socket's buffer is full. The :class:`FrameChannel` on the same socket then
    only reads: nothing else may write to it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = False

    def send(self, data: bytes) -> None:
        self._write(frame(data))

    def send_many(self, items: list[bytes]) -> None:
        """Several frames in one write."""
        self._write(b"".join(frame(data) for data in items))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        with self._lock:
            if self.closed:
                return
            try:
                while view:
                    try:
                        n = self._sock.send(view)
                    except BlockingIOError:  # the socket is the loop's, non-blocking: wait for room
                        select.select([], [self._sock], [])
                        continue
                    view = view[n:]
            except OSError:  # the peer has gone: nothing to deliver to
                self.closed = True

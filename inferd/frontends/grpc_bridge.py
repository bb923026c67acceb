"""ModelInfer and ModelStreamInfer as gRPC over HTTP/1.1, as Envoy hands them over: the cheap half of the gRPC front.

With the gRPC front (:mod:`inferd.serve.grpc_front`) Envoy terminates the clients' HTTP/2 and TLS, and
sends each unary, uncompressed ``ModelInfer`` as an HTTP/1.1 POST on a unix socket served here, and each
uncompressed ``ModelStreamInfer`` stream as one too, its body and its answer's chunked and full duplex;
every other call (health, reflection, the other RPCs, a compressed call) reaches the process's own
grpc.aio port through Envoy unchanged. grpc.aio spends ~160-175 us of CPU per unary call in its own
layers (bench/RESULTS.md request_cpu); a request here costs an httptools parse, a protobuf parse and one
write.

The call runs exactly the handler grpc.aio would run: the port's guarded ``ModelInfer`` (restricted
groups, the shutdown gate, the door) over the same servicer, handed a :class:`BridgeContext` that
answers what a handler asks of grpc.aio's context (metadata from the request headers, the deadline
from ``grpc-timeout``, the peer from ``x-forwarded-for``). The body is the call's gRPC message as sent,
its 5-byte frame header first (chunked: HTTP/2 carries no length). The answer is gRPC's too, which
Envoy's router translates to HTTP/2 with no filter of its own (the cluster has HTTP/1.1 trailers on):

- a message: ``200``, ``content-type: application/grpc``, the framed ``ModelInferResponse`` as one chunk,
  and the trailer ``grpc-status: 0``;
- an error: headers only, with ``grpc-status`` and the percent-encoded ``grpc-message``: a trailers-only
  answer, as grpc.aio sends one, which clients and proxies may retry (a gRPC call is committed once a
  message or trailers follow its headers).

(Envoy's gRPC-HTTP/1.1 reverse bridge filter, which this used at first, needs a header rewrite after it to
keep an error's status and message: two filters a call that Envoy's router alone does without.)

A stream runs the port's guarded ``ModelStreamInfer`` as grpc.aio would, over the same servicer: its
requests are the whole gRPC frames of the request body as they come (a frame split over chunks waits for
its rest), its ``context.write`` writes each answer as the next chunk of the answer's body (and waits
while Envoy's buffer for it is full), the client's half-close ends its requests, and its status goes in
the answer's trailers (headers only, as grpc.aio answers, when it ends before any message). A compressed
frame or one past the message limit ends it INTERNAL or RESOURCE_EXHAUSTED; its ``grpc-timeout`` ends it
DEADLINE_EXCEEDED, as grpc.aio does. Measured against the same streams through grpc.aio
(perf_analyzer --streaming, concurrency 16, the default mode on two cores): identity 1.64x the
throughput at 0.54x the CPU per inference, mlp 1.74x at 0.56x; beside Triton 2.51, 1.08-1.13x its
throughput at 1.05-1.09x its CPU (bench/RESULTS.md, front_door_streams).

A client that cancels, or whose deadline passes, makes Envoy reset the upstream connection: the
connection's request is cancelled here, as grpc.aio cancels a handler.

Why hand-written over httptools and not an ASGI server: Envoy is the only client, on a private socket,
sending one request at a time per keep-alive connection; uvicorn's scope, receive and send per request
cost more than this whole module's per-request work. httptools (the parser uvicorn itself uses) does the
HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from typing import Any, Awaitable, Callable
from urllib.parse import quote

import grpc
import httptools

from inferd._proto import grpc_service_pb2 as pb
from inferd.frontends.grpc_service import Undecodable, _decoder
from inferd.frontends.status import Metadata

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/grpc"  # the answers': Envoy passes them on as gRPC's
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
MODEL_STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"

FRAME = struct.Struct(">BI")  # a gRPC message's frame header: compressed flag, length
_TIMEOUT_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}


def grpc_timeout(value: str) -> float | None:
    """Seconds from a ``grpc-timeout`` header (``100m``, ``5S``: at most 8 digits and a unit), None when
    it is not one."""
    scale = _TIMEOUT_UNITS.get(value[-1:])
    digits = value[:-1]
    if scale is None or not digits.isdigit() or len(digits) > 8:
        return None
    return int(digits) * scale


class Aborted(Exception):
    """What :meth:`BridgeContext.abort` raises, as grpc.aio's abort does: the call ends with this status."""

    def __init__(self, code: grpc.StatusCode, details: str, metadata: Metadata = ()) -> None:
        super().__init__(code, details)
        self.code = code
        self.details = details
        self.metadata = metadata


class _Metadatum:
    __slots__ = ("key", "value")

    def __init__(self, key: str, value: str) -> None:
        self.key = key
        self.value = value


class BridgeContext:
    """What a unary handler asks of grpc.aio's ``ServicerContext``, answered from a bridged request."""

    __slots__ = ("_headers", "_deadline", "_cancelled")

    def __init__(self, headers: dict[str, str]) -> None:
        self._headers = headers
        timeout = headers.get("grpc-timeout")
        seconds = grpc_timeout(timeout) if timeout else None
        self._deadline = None if seconds is None else time.monotonic() + seconds
        self._cancelled = False

    def invocation_metadata(self) -> tuple[_Metadatum, ...]:
        # Binary metadata (-bin) reaches a handler as bytes in grpc.aio; the handlers here read only text.
        return tuple(_Metadatum(k, v) for k, v in self._headers.items() if not k.endswith("-bin"))

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def cancelled(self) -> bool:
        return self._cancelled

    def peer(self) -> str:
        """The client's address as grpc.aio writes a peer (``ipv4:1.2.3.4``; Envoy forwards no port)."""
        address = self._headers.get("x-forwarded-for", "").rsplit(",", 1)[-1].strip()
        if not address:
            return "unknown (through the gRPC front)"
        return ("ipv6:" if ":" in address else "ipv4:") + address

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Metadata = ()) -> None:
        raise Aborted(code, details, trailing_metadata)


class BridgeStreamContext(BridgeContext):
    """A bridged stream's context: :class:`BridgeContext`, and ``write`` (each message one chunk of the
    answer's body, as it comes; awaited while Envoy reads too slowly)."""

    __slots__ = ("_connection",)

    def __init__(self, headers: dict[str, str], connection: "_Connection") -> None:
        super().__init__(headers)
        self._connection = connection

    async def write(self, message: Any) -> None:
        await self._connection.send(message)


Handler = Callable[[Any, Any], Awaitable[Any]]


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: " + CONTENT_TYPE.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n"
_END = b"0\r\ngrpc-status: 0\r\n\r\n"  # the last chunk, and the trailer of a call that succeeded
_REFUSAL = b"HTTP/1.1 200 OK\r\ncontent-type: " + CONTENT_TYPE.encode() + b"\r\ncontent-length: 0\r\n"


def answer(message: Any) -> bytes:
    """A message's response: the framed message in one chunk, then the trailer ``grpc-status: 0``."""
    return b"".join((_HEAD, _chunk(message), _END))


def refusal(code: grpc.StatusCode, details: str, metadata: Metadata = ()) -> bytes:
    """An error's response: headers only, with the status, message and ``metadata`` (text: the keys and
    values :func:`inferd.frontends.status.error_headers` gives): gRPC's trailers-only answer."""
    return _REFUSAL + _status(code, details, metadata)


def _status(code: grpc.StatusCode, details: str, metadata: Metadata = ()) -> bytes:
    """The header lines of a call's status (an error's trailers-only headers, or a stream's trailers),
    and the blank line that ends them."""
    message = quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")  # gRPC's percent-encoding
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in metadata)
    return b"".join((extra, b"grpc-status: %d\r\ngrpc-message: %s\r\n\r\n" % (code.value[0], message.encode())))


def _chunk(message: Any) -> bytes:
    """A message as one chunk of a chunked body: its gRPC frame."""
    body = message.SerializeToString()
    return b"".join((b"%x\r\n" % (len(body) + FRAME.size), FRAME.pack(0, len(body)), body, b"\r\n"))


class _Connection(asyncio.Protocol):
    """One keep-alive connection from Envoy: one request at a time (Envoy never pipelines); a unary call,
    answered once its body has come, or a stream, served as its body comes (:class:`_Stream`)."""

    def __init__(self, bridge: "BridgePort") -> None:
        self.bridge = bridge
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.size = 0
        self.task: asyncio.Task | None = None
        self.context: BridgeContext | None = None
        self.stream: _Stream | None = None  # the stream this request is, while its body comes
        self._writable: asyncio.Future | None = None  # set while the transport's buffer is full

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.bridge.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.bridge.connections.discard(self)
        self.resume_writing()
        if self.task is not None and not self.task.done():  # Envoy reset the call: the client left
            if self.context is not None:
                self.context._cancelled = True
            self.task.cancel()

    def pause_writing(self) -> None:
        self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def send(self, message: Any) -> None:
        """A stream's message, written as the next chunk of its answer; waits while Envoy reads too slowly.
        Raises ConnectionResetError once the connection is gone (the client left)."""
        transport = self.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("the gRPC front closed the stream's connection")
        stream = self.stream
        assert stream is not None
        if not stream.started:
            stream.started = True
            transport.write(_HEAD)
        transport.write(_chunk(message))
        if self._writable is not None:
            await self._writable

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            log.warning("gRPC front: a malformed request from Envoy (%s); its connection is closed", exc)
            assert self.transport is not None
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body, self.size, self.stream = b"", {}, [], 0, None

    def on_headers_complete(self) -> None:
        if self.url != _STREAM_URL or not self._idle():
            return
        self.stream = stream = _Stream()
        self.context = context = BridgeStreamContext(self.headers, self)
        self.task = asyncio.get_running_loop().create_task(self._serve_stream(context, stream))

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        if self.stream is not None:
            self._frames(self.stream, body)
            return
        self.size += len(body)
        if self.size <= self.bridge.max_message_bytes + FRAME.size:
            self.body.append(body)

    def on_message_complete(self) -> None:
        stream = self.stream
        if stream is not None:  # the client's half-close: the stream's requests end here
            if stream.pending:
                self._fail(stream, grpc.StatusCode.INTERNAL, "the stream's body ended inside a gRPC message frame")
            else:
                stream.inbox.put_nowait(None)
            return
        if not self._idle():
            return
        self.context = BridgeContext(self.headers)
        self.task = asyncio.get_running_loop().create_task(self._serve(self.url, self.context, self.body, self.size))

    def _idle(self) -> bool:
        """Whether the connection's last call has ended; if not, a second request came on a busy connection
        (Envoy does not pipeline): it is closed."""
        if self.task is None or self.task.done():
            return True
        log.error("gRPC front: a second request on a busy connection (Envoy does not pipeline); closing it")
        assert self.transport is not None
        self.transport.close()
        return False

    def _frames(self, stream: "_Stream", body: bytes) -> None:
        """The stream's whole gRPC frames so far, decoded into its inbox; a partial one kept for the next
        piece of body (at most one message's bytes: a frame announcing more than the limit ends the stream).
        Once the bridge has ended the stream, the rest of its body is dropped unread."""
        if stream.failed is not None:
            return
        data = stream.pending + body if stream.pending else body
        start, end = 0, len(data)
        limit = self.bridge.max_message_bytes
        decode = self.bridge.decode_stream
        while end - start >= FRAME.size:
            compressed, length = FRAME.unpack_from(data, start)
            if compressed:
                self._fail(stream, grpc.StatusCode.INTERNAL, "the gRPC front sent a compressed message on a stream "
                                                             "without grpc-encoding")
                return
            if length > limit:  # gRPC's own words and status for a message too large
                self._fail(stream, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Received message larger than max ({length} vs. {limit})")
                return
            stop = start + FRAME.size + length
            if stop > end:
                break
            stream.inbox.put_nowait(decode(data[start + FRAME.size:stop]))
            start = stop
        stream.pending = data[start:] if start else data

    def _fail(self, stream: "_Stream", code: grpc.StatusCode, details: str) -> None:
        """End the stream with this status: its handler is cancelled, down to its requests' models."""
        stream.pending = b""
        if stream.failed is None:
            stream.failed = (code, details)
            if self.task is not None:
                # Soon, not now: the task may not have taken its first step yet (its frames came with its
                # headers), and a task cancelled before it starts runs none of its code, so would never
                # answer. Its first step was scheduled before this, so it runs first.
                asyncio.get_running_loop().call_soon(self.task.cancel)

    async def _serve_stream(self, context: BridgeStreamContext, stream: "_Stream") -> None:
        """The stream's handler (the port's guarded ModelStreamInfer), then its status as the trailer."""
        bridge = self.bridge
        bridge.enter()
        ending: tuple[grpc.StatusCode, str, Metadata] | None = None
        try:
            async with asyncio.timeout(context.time_remaining()):  # None: no deadline
                await bridge.stream_handler(stream.requests(), context)
        except TimeoutError:  # grpc.aio ends a stream past its deadline the same way
            ending = (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", ())
        except Aborted as exc:
            ending = (exc.code, exc.details, exc.metadata)
        except asyncio.CancelledError:
            if stream.failed is None:
                return  # the client left, or the port stopped: nothing to answer
            ending = (*stream.failed, ())
        except Exception:  # a bug: the client still gets a status
            log.exception("gRPC front: a bridged stream's handler failed")
            ending = (grpc.StatusCode.INTERNAL, "the server failed to serve the stream", ())
        finally:
            bridge.leave()
        if ending is None:
            tail = _END if stream.started else _HEAD + _END
        else:
            tail = b"0\r\n" + _status(*ending) if stream.started else refusal(*ending)
        self._finish(tail, with_head=not stream.started)

    def _finish(self, tail: bytes, with_head: bool = True) -> None:
        """Write a call's last bytes (``with_head``: its whole answer, head included). On a closing port it
        is the last answer on this connection: said in its head where it has one, and the connection closed."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if self.bridge.closing:  # Envoy sends no call more on it
            if with_head:
                tail = tail.replace(b"\r\n", b"\r\nconnection: close\r\n", 1)
            transport.write(tail)
            transport.close()
        else:
            transport.write(tail)

    async def _serve(self, url: bytes, context: BridgeContext, body: list[bytes], size: int) -> None:
        bridge = self.bridge
        bridge.enter()
        try:
            response = await bridge.respond(url, context, body, size)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if context.cancelled() or (task is not None and task.cancelling()):
                return  # the client left, or the port stopped: nothing to answer
            # the handler's own: the deadline the client sent has passed (grpc.aio answers it the same way)
            response = refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        finally:
            bridge.leave()
        self._finish(response)


_STREAM_URL = MODEL_STREAM_INFER.encode()


class _Stream:
    """A bridged stream's requests as its body brings them: whole frames decoded into ``inbox`` (None
    there: the client's half-close)."""

    __slots__ = ("inbox", "pending", "started", "failed")

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.pending = b""  # the start of a frame whose rest has not come yet
        self.started = False  # the answer's head is written: its status goes in the trailer
        self.failed: tuple[grpc.StatusCode, str] | None = None  # why the bridge ended it

    async def requests(self) -> Any:
        inbox = self.inbox
        while (message := await inbox.get()) is not None:
            yield message


class BridgePort:
    """The bridged ModelInfer and ModelStreamInfer on a unix socket at ``path``; ``handler`` and
    ``stream_handler`` are the port's guarded ``ModelInfer`` and ``ModelStreamInfer`` (what grpc.aio
    runs for the same calls)."""

    def __init__(self, path: str, handler: Handler, max_message_bytes: int, stream_handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.stream_handler = stream_handler
        self.max_message_bytes = max_message_bytes
        self.decode = _decoder("ModelInfer", pb.ModelInferRequest)
        self.decode_stream = _decoder("ModelStreamInfer", pb.ModelInferRequest)  # its errors name the stream's RPC
        self.connections: set[_Connection] = set()
        self.busy = 0
        self.idle: asyncio.Event | None = None
        self.closing = False
        self._server: asyncio.AbstractServer | None = None

    def enter(self) -> None:
        """A call (or stream) is being served: :meth:`close` gives it the grace."""
        self.busy += 1

    def leave(self) -> None:
        self.busy -= 1
        if not self.busy and self.idle is not None:
            self.idle.set()

    async def start(self) -> None:
        try:
            os.unlink(self.path)  # left by an earlier process of this pid (the port publishes it under its slot's name)
        except FileNotFoundError:
            pass
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: _Connection(self), self.path, backlog=4096)

    async def respond(self, url: bytes, context: BridgeContext, body: list[bytes], size: int) -> bytes:
        if url != MODEL_INFER.encode():
            return refusal(grpc.StatusCode.UNIMPLEMENTED, f"the gRPC front bridges only {MODEL_INFER}, "
                                                          f"not {url.decode('latin-1')}")
        if size - FRAME.size > self.max_message_bytes:  # gRPC's own words and status for a message too large
            return refusal(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"Received message larger than max ({size - FRAME.size} vs. {self.max_message_bytes})")
        data = body[0] if len(body) == 1 else b"".join(body)
        if len(data) < FRAME.size or data[0] != 0 or FRAME.unpack_from(data)[1] != len(data) - FRAME.size:
            return refusal(grpc.StatusCode.INTERNAL, "the gRPC front sent a body that is not one uncompressed gRPC "
                                                     "message frame")
        request = self.decode(data[FRAME.size:])
        try:
            if isinstance(request, Undecodable):
                raise Aborted(grpc.StatusCode.INVALID_ARGUMENT, request.error.message)
            return answer(await self.handler(request, context))
        except Aborted as exc:
            return refusal(exc.code, exc.details, exc.metadata)

    async def close(self, grace: float) -> None:
        """Stop listening, give the calls being served up to ``grace`` seconds, then close every connection
        (a call still running is cancelled: Envoy answers its client UNAVAILABLE)."""
        if self._server is None:
            return
        self._server.close()
        self._server = None
        self.closing = True
        for connection in list(self.connections):  # idle ones close now (a call Envoy sent meanwhile is
            if connection.task is None or connection.task.done():  # retried on another process)
                if connection.transport is not None:
                    connection.transport.close()
        if self.busy:
            self.idle = asyncio.Event()
            try:
                await asyncio.wait_for(self.idle.wait(), max(grace, 0.0))
            except TimeoutError:
                log.error("gRPC front: %d bridged call(s) still running past the grace: cancelled", self.busy)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()

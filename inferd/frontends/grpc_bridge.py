"""Unary ModelInfer as gRPC over HTTP/1.1, as Envoy hands it over: the cheap half of the gRPC front.

With the gRPC front (:mod:`inferd.serve.grpc_front`) Envoy terminates the clients' HTTP/2 and TLS, and
sends each unary, uncompressed ``ModelInfer`` as an HTTP/1.1 POST on a unix socket served here; every
other call (streams, health, reflection, the other RPCs, a compressed request) reaches the process's own
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


Handler = Callable[[Any, Any], Awaitable[Any]]


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: " + CONTENT_TYPE.encode() + b"\r\ntransfer-encoding: chunked\r\n\r\n"
_OK_TRAILER = b"\r\n0\r\ngrpc-status: 0\r\n\r\n"
_REFUSAL = b"HTTP/1.1 200 OK\r\ncontent-type: " + CONTENT_TYPE.encode() + b"\r\ncontent-length: 0\r\n"


def answer(message: Any) -> bytes:
    """A message's response: the framed message in one chunk, then the trailer ``grpc-status: 0``."""
    body = message.SerializeToString()
    return b"".join((_HEAD, b"%x\r\n" % (len(body) + FRAME.size), FRAME.pack(0, len(body)), body, _OK_TRAILER))


def refusal(code: grpc.StatusCode, details: str, metadata: Metadata = ()) -> bytes:
    """An error's response: headers only, with the status, message and ``metadata`` (text: the keys and
    values :func:`inferd.frontends.status.error_headers` gives): gRPC's trailers-only answer."""
    message = quote(details, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")  # gRPC's percent-encoding
    extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in metadata)
    return b"".join((_REFUSAL, extra, b"grpc-status: %d\r\ngrpc-message: %s\r\n\r\n" % (code.value[0], message.encode())))


class _Connection(asyncio.Protocol):
    """One keep-alive connection from Envoy: one request at a time (Envoy never pipelines)."""

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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.bridge.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.bridge.connections.discard(self)
        if self.task is not None and not self.task.done():  # Envoy reset the call: the client left
            if self.context is not None:
                self.context._cancelled = True
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            log.warning("gRPC front: a malformed request from Envoy (%s); its connection is closed", exc)
            assert self.transport is not None
            self.transport.close()

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body, self.size = b"", {}, [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self.size += len(body)
        if self.size <= self.bridge.max_message_bytes + FRAME.size:
            self.body.append(body)

    def on_message_complete(self) -> None:
        if self.task is not None and not self.task.done():
            log.error("gRPC front: a second request on a busy connection (Envoy does not pipeline); closing it")
            assert self.transport is not None
            self.transport.close()
            return
        self.context = BridgeContext(self.headers)
        self.task = asyncio.get_running_loop().create_task(self._serve(self.url, self.context, self.body, self.size))

    async def _serve(self, url: bytes, context: BridgeContext, body: list[bytes], size: int) -> None:
        bridge = self.bridge
        bridge.busy += 1
        try:
            response = await bridge.respond(url, context, body, size)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if context.cancelled() or (task is not None and task.cancelling()):
                return  # the client left, or the port stopped: nothing to answer
            # the handler's own: the deadline the client sent has passed (grpc.aio answers it the same way)
            response = refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        finally:
            bridge.busy -= 1
            if not bridge.busy and bridge.idle is not None:
                bridge.idle.set()
        transport = self.transport
        if transport is not None and not transport.is_closing():
            if bridge.closing:  # the last answer on this connection: Envoy sends no call more on it
                response = response.replace(b"\r\n", b"\r\nconnection: close\r\n", 1)
                transport.write(response)
                transport.close()
            else:
                transport.write(response)


class BridgePort:
    """The bridged ModelInfer on a unix socket at ``path``; ``handler`` is the port's guarded
    ``ModelInfer`` (what grpc.aio runs for the same call)."""

    def __init__(self, path: str, handler: Handler, max_message_bytes: int) -> None:
        self.path = path
        self.handler = handler
        self.max_message_bytes = max_message_bytes
        self.decode = _decoder("ModelInfer", pb.ModelInferRequest)
        self.connections: set[_Connection] = set()
        self.busy = 0
        self.idle: asyncio.Event | None = None
        self.closing = False
        self._server: asyncio.AbstractServer | None = None

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

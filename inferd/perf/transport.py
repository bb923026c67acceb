"""How a worker sends one request, per protocol: ``connect``, ``caller(slot)`` (an async
function taking the pre-serialized payload, raising on a failed request), ``with_sequence``
(the payload with a sequence's id and flags added) and ``close``.

gRPC: ModelInfer on raw unary-unary callables (no serializer, no deserializer). In a closed
loop at most :data:`SLOTS_PER_CHANNEL` slots share a channel (one HTTP/2 connection), as
tritonclient's C++ library shares a channel among at most six clients
(``TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT``), so ``--concurrency-range 16`` opens the three
connections perf_analyzer opens and the server sees the same arrival over them. With
``--streaming`` each slot has its own ModelStreamInfer call (perf_analyzer: one stream per
context); the open loop sends all its requests on one stream. Responses are matched to
requests by the request id, which the transport appends to the payload.

HTTP: POST /v2/models/.../infer with aiohttp, each request in flight on its own keep-alive
connection, as each perf_analyzer context has its own curl handle.

Appending to the serialized request is how one pre-built payload takes per-request fields:
protobuf parses concatenated messages as one merged message (a later scalar wins, map
entries are added), so ``payload + ModelInferRequest(id=...).SerializeToString()`` is the
request with that id.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import tempfile
from collections import deque
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from inferd._proto import grpc_service_pb2 as pb

from .options import PerfError, TlsOptions

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
STREAM_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"
SLOTS_PER_CHANNEL = 6
# HTTP status -> the gRPC status the worker records (the records keep one code space).
_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED, 500: grpc.StatusCode.INTERNAL, 501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                   ("grpc.use_local_subchannel_pool", 1)]  # its own connection, not one shared by channels


def grpc_code(status: int) -> int:
    return _STATUS.get(status, grpc.StatusCode.UNKNOWN).value[0]


class HttpStatusError(Exception):
    """A non-200 HTTP answer, recorded under the gRPC status of the same meaning."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(status)
        self.code = grpc_code(status)
        self.details = f"HTTP {status}: {body.decode(errors='replace').strip()[:500]}"


class StreamError(Exception):
    """A request a stream answered with ``error_message`` (the stream carries on), or one
    whose stream ended before its answer came."""

    def __init__(self, details: str, code: grpc.StatusCode = grpc.StatusCode.UNKNOWN) -> None:
        super().__init__(details)
        self.code = code.value[0]
        self.details = details


# --------------------------------------------------------------------------- TLS


def _read(path: str | None) -> bytes | None:
    return Path(path).read_bytes() if path else None


def grpc_credentials(tls: TlsOptions) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(_read(tls.root_certificates), _read(tls.private_key),
                                        _read(tls.certificate_chain))


def _pem_file(path: str, kind: str, what: str) -> str:
    """A DER certificate or key as a PEM file (Python's ssl loads PEM only)."""
    if kind == "PEM":
        return path
    data = Path(path).read_bytes()
    if what == "certificate":
        pem = ssl.DER_cert_to_PEM_cert(data).encode()
    else:
        try:
            from cryptography.hazmat.primitives import serialization
        except ImportError:
            raise PerfError("--ssl-https-private-key-type DER needs the 'cryptography' package to convert the key; "
                            "pip install cryptography, or give a PEM key") from None
        key = serialization.load_der_private_key(data, password=None)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    out = tempfile.NamedTemporaryFile(prefix="inferd-perf-", suffix=".pem", delete=False)
    with out:
        out.write(pem)
    return out.name


def https_context(tls: TlsOptions) -> ssl.SSLContext:
    """perf_analyzer's --ssl-https-* as an SSLContext (verify-host 1 and 2 both check the name)."""
    context = ssl.create_default_context(cafile=tls.root_certificates)
    context.check_hostname = tls.verify_peer and tls.verify_host
    if not tls.verify_peer:
        context.verify_mode = ssl.CERT_NONE
    if tls.certificate_chain and tls.private_key:
        cert = _pem_file(tls.certificate_chain, tls.certificate_type, "certificate")
        key = _pem_file(tls.private_key, tls.private_key_type, "key")
        context.load_cert_chain(cert, key)
    return context


# --------------------------------------------------------------------------- gRPC


def grpc_channel(url: str, tls: TlsOptions | None, options: list, aio: bool = True) -> Any:
    module: Any = grpc.aio if aio else grpc
    if tls is None:
        return module.insecure_channel(url, options=options)
    return module.secure_channel(url, grpc_credentials(tls), options=options)


class _Stream:
    """One ModelStreamInfer call: requests written as they come, answers matched by id."""

    def __init__(self, channel: grpc.aio.Channel, metadata: tuple, prefix: str) -> None:
        method = channel.stream_stream(STREAM_PATH, request_serializer=None, response_deserializer=None,
                                       _registered_method=True)
        self.call = method(metadata=metadata or None)
        self.prefix = prefix
        self.next_id = 0
        self.pending: dict[str, asyncio.Future] = {}
        self.order: deque[str] = deque()  # for an answer without an id: the oldest request
        self.reader: asyncio.Task | None = None
        self.write_lock = asyncio.Lock()

    async def __call__(self, payload: bytes) -> None:
        if self.reader is None:
            self.reader = asyncio.get_running_loop().create_task(self._read())
        self.next_id += 1
        request_id = f"{self.prefix}{self.next_id}"
        future = asyncio.get_running_loop().create_future()
        self.pending[request_id] = future
        self.order.append(request_id)
        async with self.write_lock:
            await self.call.write(payload + pb.ModelInferRequest(id=request_id).SerializeToString())
        await future

    async def _read(self) -> None:
        error: BaseException = StreamError("the stream ended before the request was answered")
        try:
            while True:
                raw = await self.call.read()
                if raw is grpc.aio.EOF:
                    break
                msg = pb.ModelStreamInferResponse.FromString(raw)
                request_id = msg.infer_response.id
                if request_id not in self.pending:
                    # an answer naming no request (a server that drops ids on errors) settles the
                    # oldest; a later response to a request already settled (decoupled) is skipped
                    if request_id or not self.order:
                        continue
                    request_id = self.order[0]
                future = self.pending.pop(request_id)
                try:
                    self.order.remove(request_id)
                except ValueError:
                    pass
                if future.done():
                    continue
                if msg.error_message:
                    future.set_exception(StreamError(msg.error_message))
                else:
                    future.set_result(None)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the call failed: every request still waiting fails with it
            error = exc
        for future in self.pending.values():
            if not future.done():
                future.set_exception(error)
        self.pending.clear()
        self.order.clear()

    async def close(self) -> None:
        try:
            await self.call.done_writing()
        except Exception:  # the call is already over
            pass
        if self.reader is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.reader), 10)
            except (asyncio.TimeoutError, Exception):
                self.reader.cancel()
        self.call.cancel()


class GrpcTransport:
    """ModelInfer over grpc.aio channels, each shared by at most SLOTS_PER_CHANNEL slots, or
    with ``streaming`` one ModelStreamInfer call per slot."""

    def __init__(self, url: str, tls: TlsOptions | None = None, headers: list[tuple[str, str]] | None = None,
                 streaming: bool = False, index: int = 0) -> None:
        self.url = url
        self.tls = tls
        self.metadata = tuple(headers or ())
        self.streaming = streaming
        self.index = index
        self.calls: list = []
        self.channels: list = []
        self.streams: dict[int, _Stream] = {}

    def _add_channel(self):  # type: ignore[no-untyped-def]
        options = [*CHANNEL_OPTIONS, ("inferd.perf.channel", len(self.channels))]  # distinct args: its own
        channel = grpc_channel(self.url, self.tls, options)
        self.channels.append(channel)
        unary = channel.unary_unary(INFER_PATH, request_serializer=None, response_deserializer=None,
                                    _registered_method=True)
        metadata = self.metadata or None
        self.calls.append(unary if metadata is None else (lambda payload: unary(payload, metadata=metadata)))
        return channel

    async def connect(self, timeout: float) -> None:
        await asyncio.wait_for(self._add_channel().channel_ready(), timeout)

    def caller(self, slot: int):  # type: ignore[no-untyped-def]
        while len(self.calls) <= slot // SLOTS_PER_CHANNEL:
            self._add_channel()
        if not self.streaming:
            return self.calls[slot // SLOTS_PER_CHANNEL]
        if slot not in self.streams:
            self.streams[slot] = _Stream(self.channels[slot // SLOTS_PER_CHANNEL], self.metadata,
                                         f"w{self.index}s{slot}-")
        return self.streams[slot]

    @staticmethod
    def with_sequence(payload: bytes, sequence_id: int, start: bool, end: bool) -> bytes:
        extra = pb.ModelInferRequest()
        extra.parameters["sequence_id"].int64_param = sequence_id
        extra.parameters["sequence_start"].bool_param = start
        extra.parameters["sequence_end"].bool_param = end
        return payload + extra.SerializeToString()

    async def close(self) -> None:
        for stream in self.streams.values():
            await stream.close()
        for channel in self.channels:
            await channel.close()


# --------------------------------------------------------------------------- HTTP


def http_base(url: str, tls: TlsOptions | None) -> str:
    if url.startswith(("http://", "https://")):
        return url
    return f"{'https' if tls is not None else 'http'}://{url}"


class HttpTransport:
    """POST /v2/models/.../infer with aiohttp; a keep-alive connection per request in flight."""

    def __init__(self, url: str, path: str, tls: TlsOptions | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        self.base = http_base(url, tls)
        self.infer_url = self.base + path
        self.tls = tls
        self.headers = dict(headers or ())
        self.session = None

    async def connect(self, timeout: float) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, ssl=https_context(self.tls) if self.tls is not None else True)
        self.session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None),
                                             headers=self.headers)
        async with self.session.get(self.base + "/v2/health/live", timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            await r.read()

    def caller(self, slot: int):  # type: ignore[no-untyped-def]
        return self.post

    async def post(self, payload: tuple[bytes, int]) -> None:
        body, header_length = payload
        assert self.session is not None
        async with self.session.post(self.infer_url, data=body,
                                     headers={"Inference-Header-Content-Length": str(header_length)}) as response:
            data = await response.read()
            if response.status != 200:
                raise HttpStatusError(response.status, data)

    @staticmethod
    def with_sequence(payload: tuple[bytes, int], sequence_id: int, start: bool,
                      end: bool) -> tuple[bytes, int]:
        body, header_length = payload
        header = json.loads(body[:header_length])
        header.setdefault("parameters", {}).update(
            {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end})
        text = json.dumps(header, separators=(",", ":")).encode()
        return text + body[header_length:], len(text)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

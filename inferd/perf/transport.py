"""How a worker sends one request, per protocol: ``connect``, ``caller(slot)`` (an async
function taking the pre-serialized payload, raising on a failed request) and ``close``.

gRPC: ModelInfer on raw unary-unary callables (no serializer, no deserializer). In a closed
loop at most :data:`SLOTS_PER_CHANNEL` slots share a channel (one HTTP/2 connection), as
tritonclient's C++ library shares a channel among at most six clients
(``TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT``), so ``--concurrency-range 16`` opens the three
connections perf_analyzer opens and the server sees the same arrival over them.

HTTP: POST /v2/models/.../infer with aiohttp, each request in flight on its own keep-alive
connection, as each perf_analyzer context has its own curl handle.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"
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


class GrpcTransport:
    """ModelInfer over grpc.aio channels, each shared by at most SLOTS_PER_CHANNEL slots."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.calls: list = []
        self.channels: list = []

    def _add_channel(self):  # type: ignore[no-untyped-def]
        options = [*CHANNEL_OPTIONS, ("inferd.perf.channel", len(self.channels))]  # distinct args: its own
        channel = grpc.aio.insecure_channel(self.url, options=options)
        self.channels.append(channel)
        self.calls.append(channel.unary_unary(INFER_PATH, request_serializer=None, response_deserializer=None,
                                              _registered_method=True))
        return channel

    async def connect(self, timeout: float) -> None:
        await asyncio.wait_for(self._add_channel().channel_ready(), timeout)

    def caller(self, slot: int):  # type: ignore[no-untyped-def]
        while len(self.calls) <= slot // SLOTS_PER_CHANNEL:
            self._add_channel()
        return self.calls[slot // SLOTS_PER_CHANNEL]

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


class HttpTransport:
    """POST /v2/models/.../infer with aiohttp; a keep-alive connection per request in flight."""

    def __init__(self, url: str, path: str) -> None:
        base = url if url.startswith(("http://", "https://")) else f"http://{url}"
        self.base = base
        self.infer_url = base + path
        self.session = None

    async def connect(self, timeout: float) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None))
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

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

"""The asyncio client: the same calls as :class:`inferd_client.Client`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from inferd_client._messages import (
    InferError, InferResult, Inputs, ModelMetadata, Outputs, ParameterValue, RegionStatus, ServerMetadata,
    build_request, decode_response, decode_stream_response, model_metadata, region_statuses, server_metadata,
)
from inferd_client._proto import grpc_service_pb2 as pb
from inferd_client._proto import grpc_service_pb2_grpc as pb_grpc
from inferd_client._proto import model_config_pb2 as mc
from inferd_client._sync import MAX_MESSAGE_BYTES, channel_options


class AsyncClient:
    """An asyncio KServe v2 / Triton gRPC client (``grpc.aio``); create it inside the
    event loop that uses it. Failures raise :class:`InferError`."""

    def __init__(self, url: str = "127.0.0.1:8001", *, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.url = url
        self._channel = grpc.aio.insecure_channel(url, options=channel_options(max_message_bytes))
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, method: str, request: Any, deadline_s: float | None = None) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=deadline_s)
        except grpc.RpcError as exc:
            raise InferError.from_rpc(exc) from None

    async def is_live(self) -> bool:
        return bool((await self._call("ServerLive", pb.ServerLiveRequest())).live)

    async def is_ready(self) -> bool:
        return bool((await self._call("ServerReady", pb.ServerReadyRequest())).ready)

    async def is_model_ready(self, name: str, version: str = "") -> bool:
        return bool((await self._call("ModelReady", pb.ModelReadyRequest(name=name, version=version))).ready)

    async def server_metadata(self) -> ServerMetadata:
        return server_metadata(await self._call("ServerMetadata", pb.ServerMetadataRequest()))

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return model_metadata(await self._call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)))

    async def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return (await self._call("ModelConfig", pb.ModelConfigRequest(name=name, version=version))).config

    async def infer(
        self,
        model: str,
        inputs: Inputs,
        *,
        outputs: Outputs | None = None,
        version: str = "",
        request_id: str = "",
        priority: int = 0,
        timeout_us: int = 0,
        sequence_id: int | str = 0,
        sequence_start: bool = False,
        sequence_end: bool = False,
        parameters: Mapping[str, ParameterValue] | None = None,
        deadline_s: float | None = None,
    ) -> InferResult:
        request = build_request(
            model, inputs, outputs=outputs, version=version, request_id=request_id, priority=priority,
            timeout_us=timeout_us, sequence_id=sequence_id, sequence_start=sequence_start,
            sequence_end=sequence_end, parameters=parameters,
        )
        return decode_response(await self._call("ModelInfer", request, deadline_s))

    def stream(self, *, deadline_s: float | None = None) -> "AsyncStream":
        return AsyncStream(self._stub, deadline_s)

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        await self._call("SystemSharedMemoryRegister",
                         pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size))

    async def unregister_system_shared_memory(self, name: str = "") -> None:
        await self._call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name))

    async def system_shared_memory_status(self, name: str = "") -> dict[str, RegionStatus]:
        return region_statuses(
            await self._call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name=name)))


class AsyncStream:
    """:class:`inferd_client.Stream` for asyncio: ``send`` queues a request, ``async for``
    yields :class:`InferResult` or :class:`InferError` as responses arrive, and
    ``close_send`` ends the requests."""

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub, deadline_s: float | None) -> None:
        self._requests: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()
        self._closed = False
        self._call = stub.ModelStreamInfer(self._request_iterator(), timeout=deadline_s)

    async def _request_iterator(self) -> AsyncIterator[pb.ModelInferRequest]:
        while (item := await self._requests.get()) is not None:
            yield item

    def send(self, model: str, inputs: Inputs, **options: Any) -> None:
        if self._closed:
            raise RuntimeError("send() after close_send()")
        self._requests.put_nowait(build_request(model, inputs, **options))

    def close_send(self) -> None:
        if not self._closed:
            self._closed = True
            self._requests.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator["InferResult | InferError"]:
        try:
            async for msg in self._call:
                yield decode_stream_response(msg)
        except grpc.RpcError as exc:
            raise InferError.from_rpc(exc) from None
        finally:
            self.close_send()

    def cancel(self) -> None:
        self.close_send()
        self._call.cancel()

    async def __aenter__(self) -> "AsyncStream":
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is None:
            self.close_send()
        else:
            self.cancel()

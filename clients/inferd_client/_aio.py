"""The asyncio client: the same calls as :class:`inferd_client.Client`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

import grpc

from inferd_client import _calls as calls
from inferd_client._calls import Call, LogValue, TraceValue
from inferd_client._messages import (
    CudaRegionStatus, InferError, InferResult, Inputs, ModelMetadata, ModelStatistics, Outputs, ParameterValue,
    RegionStatus, RepositoryModel, ServerMetadata, build_request, decode_stream_response,
)
from inferd_client._proto import grpc_service_pb2 as pb
from inferd_client._proto import grpc_service_pb2_grpc as pb_grpc
from inferd_client._proto import model_config_pb2 as mc
from inferd_client._sync import MAX_MESSAGE_BYTES, channel_options, make_channel

T = TypeVar("T")


class AsyncClient:
    """An asyncio KServe v2 / Triton gRPC client (``grpc.aio``): :class:`inferd_client.Client`'s
    calls, awaited; create it inside the event loop that uses it. Failures raise :class:`InferError`.
    TLS: ``ssl=True`` (or any of the PEM files) uses a secure channel; ``root_certificates``
    (the CA to trust; default the system's), ``private_key`` and ``certificate_chain`` (the
    client's, for mutual TLS) are file paths. ``headers`` go as metadata on every call.
    """

    def __init__(self, url: str = "127.0.0.1:8001", *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 ssl: bool = False, root_certificates: str | None = None, private_key: str | None = None,
                 certificate_chain: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        self.url = url
        self._channel = make_channel(url, True, channel_options(max_message_bytes), ssl, root_certificates,
                                     private_key, certificate_chain)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._metadata = tuple((k.lower(), v) for k, v in (headers or {}).items()) or None

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _run(self, call: Call[T], deadline_s: float | None = None) -> T:
        try:
            response = await getattr(self._stub, call.method)(call.request, timeout=deadline_s,
                                                              metadata=self._metadata)
        except grpc.RpcError as exc:
            raise InferError.from_rpc(exc) from None
        return call.decode(response)

    # -- health and metadata ----------------------------------------------------------

    async def is_live(self) -> bool:
        return await self._run(calls.server_live())

    async def is_ready(self) -> bool:
        return await self._run(calls.server_ready())

    async def is_model_ready(self, name: str, version: str = "") -> bool:
        return await self._run(calls.model_ready(name, version))

    async def server_metadata(self) -> ServerMetadata:
        return await self._run(calls.get_server_metadata())

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return await self._run(calls.get_model_metadata(name, version))

    async def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return await self._run(calls.model_config(name, version))

    async def model_statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        """Statistics of ``name`` (every model when empty), per version."""
        return await self._run(calls.model_statistics(name, version))

    # -- inference --------------------------------------------------------------------

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
        """Run ``model`` on ``inputs`` (name -> numpy array, or :class:`ShmInput`).
        ``outputs``: names (or :class:`Output`) to return; default all."""
        return await self._run(calls.infer(
            model, inputs, outputs=outputs, version=version, request_id=request_id, priority=priority,
            timeout_us=timeout_us, sequence_id=sequence_id, sequence_start=sequence_start,
            sequence_end=sequence_end, parameters=parameters,
        ), deadline_s)

    def stream(self, *, deadline_s: float | None = None) -> "AsyncStream":
        """A ModelStreamInfer stream (see :class:`AsyncStream`); use it as a context manager."""
        return AsyncStream(self._stub, deadline_s, self._metadata)

    # -- model repository -------------------------------------------------------------

    async def repository_index(self, ready: bool = False) -> tuple[RepositoryModel, ...]:
        """The repository's models and their states (only the ready ones with ``ready``)."""
        return await self._run(calls.repository_index(ready))

    async def load_model(self, name: str, config: str | Mapping[str, Any] | None = None,
                   files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) ``name``; ``config`` (JSON text or a dict) overrides its config.pbtxt,
        ``files`` (``"1/model.onnx"`` -> bytes) replace its version folders' files."""
        await self._run(calls.load_model(name, config, files))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._run(calls.unload_model(name, unload_dependents))

    # -- trace and log settings -------------------------------------------------------

    async def get_trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        return await self._run(calls.trace_settings(model, None))

    async def update_trace_settings(self, settings: Mapping[str, TraceValue | None], model: str = "") -> dict[str, TraceValue]:
        """Set trace settings (``trace_level``, ``trace_rate``, ``trace_count``, ``log_frequency``,
        ``trace_file``, ...), globally or for ``model``; a None value clears that setting."""
        return await self._run(calls.trace_settings(model, settings))

    async def get_log_settings(self) -> dict[str, LogValue]:
        return await self._run(calls.log_settings(None))

    async def update_log_settings(self, settings: Mapping[str, LogValue]) -> dict[str, LogValue]:
        """Set log settings (``log_info``, ``log_verbose_level``, ``log_format``, ...)."""
        return await self._run(calls.log_settings(settings))

    # -- shared memory ----------------------------------------------------------------

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """Register ``byte_size`` bytes at ``offset`` of the shm object ``key`` as region ``name``."""
        await self._run(calls.register_system_shm(name, key, byte_size, offset))

    async def unregister_system_shared_memory(self, name: str = "") -> None:
        """Unregister region ``name``; every region when ``name`` is empty."""
        await self._run(calls.unregister_system_shm(name))

    async def system_shared_memory_status(self, name: str = "") -> dict[str, RegionStatus]:
        return await self._run(calls.system_shm_status(name))

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register CUDA memory by its ``cudaIpcGetMemHandle`` bytes (see :mod:`inferd_client.cuda_shared_memory`)."""
        await self._run(calls.register_cuda_shm(name, raw_handle, device_id, byte_size))

    async def unregister_cuda_shared_memory(self, name: str = "") -> None:
        await self._run(calls.unregister_cuda_shm(name))

    async def cuda_shared_memory_status(self, name: str = "") -> dict[str, CudaRegionStatus]:
        return await self._run(calls.cuda_shm_status(name))


class AsyncStream:
    """:class:`inferd_client.Stream` for asyncio: ``send`` queues a request, ``async for``
    yields :class:`InferResult` or :class:`InferError` as responses arrive, and
    ``close_send`` ends the requests."""

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub, deadline_s: float | None,
                 metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        self._requests: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()
        self._closed = False
        self._call = stub.ModelStreamInfer(self._request_iterator(), timeout=deadline_s, metadata=metadata)

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

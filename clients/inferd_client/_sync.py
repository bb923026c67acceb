"""The blocking client: one gRPC channel, the KServe v2 RPCs as typed methods."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

import grpc

from inferd_client._messages import (
    InferError, InferResult, Inputs, ModelMetadata, Outputs, ParameterValue, RegionStatus, ServerMetadata,
    build_request, decode_response, decode_stream_response, model_metadata, region_statuses, server_metadata,
)
from inferd_client._proto import grpc_service_pb2 as pb
from inferd_client._proto import grpc_service_pb2_grpc as pb_grpc
from inferd_client._proto import model_config_pb2 as mc

MAX_MESSAGE_BYTES = 2**31 - 1


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


class Client:
    """A blocking KServe v2 / Triton gRPC client.

    ``deadline_s`` on a call is gRPC's deadline for it (DEADLINE_EXCEEDED when it passes);
    every failure is raised as :class:`InferError` with the server's message and status.
    Thread-safe: one client may serve many threads (gRPC channels are).
    """

    def __init__(self, url: str = "127.0.0.1:8001", *, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.url = url
        self._channel = grpc.insecure_channel(url, options=channel_options(max_message_bytes))
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, request: Any, deadline_s: float | None = None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=deadline_s)
        except grpc.RpcError as exc:
            raise InferError.from_rpc(exc) from None

    # -- health and metadata ----------------------------------------------------------

    def is_live(self) -> bool:
        return bool(self._call("ServerLive", pb.ServerLiveRequest()).live)

    def is_ready(self) -> bool:
        return bool(self._call("ServerReady", pb.ServerReadyRequest()).ready)

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return bool(self._call("ModelReady", pb.ModelReadyRequest(name=name, version=version)).ready)

    def server_metadata(self) -> ServerMetadata:
        return server_metadata(self._call("ServerMetadata", pb.ServerMetadataRequest()))

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return model_metadata(self._call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version)))

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self._call("ModelConfig", pb.ModelConfigRequest(name=name, version=version)).config

    # -- inference --------------------------------------------------------------------

    def infer(
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
        request = build_request(
            model, inputs, outputs=outputs, version=version, request_id=request_id, priority=priority,
            timeout_us=timeout_us, sequence_id=sequence_id, sequence_start=sequence_start,
            sequence_end=sequence_end, parameters=parameters,
        )
        return decode_response(self._call("ModelInfer", request, deadline_s))

    def stream(self, *, deadline_s: float | None = None) -> "Stream":
        """A ModelStreamInfer stream (see :class:`Stream`); use it as a context manager."""
        return Stream(self._stub, deadline_s)

    # -- system shared memory ---------------------------------------------------------

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """Register ``byte_size`` bytes at ``offset`` of the shm object ``key`` as region ``name``."""
        self._call("SystemSharedMemoryRegister",
                   pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size))

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Unregister region ``name``; every region when ``name`` is empty."""
        self._call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name))

    def system_shared_memory_status(self, name: str = "") -> dict[str, RegionStatus]:
        return region_statuses(self._call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name=name)))


_END = object()


class Stream:
    """One bidirectional ModelStreamInfer call.

    ``send`` queues a request (same arguments as :meth:`Client.infer`); iterating yields
    each response as it arrives, an :class:`InferResult` or, for a request that failed, an
    :class:`InferError` (the stream carries on). ``close_send`` says no more requests will
    come; iteration then ends once the server has answered them all. A decoupled model may
    answer one request with any number of responses (``result.final`` marks the last one
    when the request set ``triton_enable_empty_final_response``).
    """

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub, deadline_s: float | None) -> None:
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._responses = stub.ModelStreamInfer(self._request_iterator(), timeout=deadline_s)

    def _request_iterator(self) -> Iterator[pb.ModelInferRequest]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item  # type: ignore[misc]

    def send(self, model: str, inputs: Inputs, **options: Any) -> None:
        if self._closed.is_set():
            raise RuntimeError("send() after close_send()")
        self._requests.put(build_request(model, inputs, **options))

    def close_send(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._requests.put(_END)

    def __iter__(self) -> Iterator["InferResult | InferError"]:
        try:
            for msg in self._responses:
                yield decode_stream_response(msg)
        except grpc.RpcError as exc:
            raise InferError.from_rpc(exc) from None
        finally:
            self.close_send()  # the call is over: let gRPC's request thread return

    def cancel(self) -> None:
        """Abandon the stream: the server stops sending."""
        self.close_send()
        self._responses.cancel()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.close_send()
        else:
            self.cancel()

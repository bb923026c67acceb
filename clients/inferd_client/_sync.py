"""The blocking client: one gRPC channel, the KServe v2 RPCs as typed methods."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Mapping
from types import TracebackType
from pathlib import Path
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

MAX_MESSAGE_BYTES = 2**31 - 1


T = TypeVar("T")


def channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes)]


def make_channel(url: str, aio: bool, options: list, ssl: bool, root_certificates: str | None,
                 private_key: str | None, certificate_chain: str | None) -> Any:
    """An insecure channel, or a TLS one when ``ssl`` or any certificate file is given."""
    module: Any = grpc.aio if aio else grpc
    if not (ssl or root_certificates or private_key or certificate_chain):
        return module.insecure_channel(url, options=options)
    if (private_key is None) != (certificate_chain is None):
        raise ValueError("mutual TLS needs both private_key and certificate_chain")

    def read(path: str | None) -> bytes | None:
        return Path(path).read_bytes() if path else None

    credentials = grpc.ssl_channel_credentials(read(root_certificates), read(private_key), read(certificate_chain))
    return module.secure_channel(url, credentials, options=options)


class Client:
    """A blocking KServe v2 / Triton gRPC client.

    ``deadline_s`` on a call is gRPC's deadline for it (DEADLINE_EXCEEDED when it passes);
    every failure is raised as :class:`InferError` with the server's message and status.
    Thread-safe: one client may serve many threads (gRPC channels are).
    TLS: ``ssl=True`` (or any of the PEM files) uses a secure channel; ``root_certificates``
    (the CA to trust; default the system's), ``private_key`` and ``certificate_chain`` (the
    client's, for mutual TLS) are file paths. ``headers`` go as metadata on every call.
    """

    def __init__(self, url: str = "127.0.0.1:8001", *, max_message_bytes: int = MAX_MESSAGE_BYTES,
                 ssl: bool = False, root_certificates: str | None = None, private_key: str | None = None,
                 certificate_chain: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        self.url = url
        self._channel = make_channel(url, False, channel_options(max_message_bytes), ssl, root_certificates,
                                     private_key, certificate_chain)
        self._stub = pb_grpc.GRPCInferenceServiceStub(self._channel)
        self._metadata = tuple((k.lower(), v) for k, v in (headers or {}).items()) or None

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, call: Call[T], deadline_s: float | None = None) -> T:
        try:
            response = getattr(self._stub, call.method)(call.request, timeout=deadline_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise InferError.from_rpc(exc) from None
        return call.decode(response)

    # -- health and metadata ----------------------------------------------------------

    def is_live(self) -> bool:
        return self._run(calls.server_live())

    def is_ready(self) -> bool:
        return self._run(calls.server_ready())

    def is_model_ready(self, name: str, version: str = "") -> bool:
        return self._run(calls.model_ready(name, version))

    def server_metadata(self) -> ServerMetadata:
        return self._run(calls.get_server_metadata())

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return self._run(calls.get_model_metadata(name, version))

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self._run(calls.model_config(name, version))

    def model_statistics(self, name: str = "", version: str = "") -> tuple[ModelStatistics, ...]:
        """Statistics of ``name`` (every model when empty), per version."""
        return self._run(calls.model_statistics(name, version))

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
        return self._run(calls.infer(
            model, inputs, outputs=outputs, version=version, request_id=request_id, priority=priority,
            timeout_us=timeout_us, sequence_id=sequence_id, sequence_start=sequence_start,
            sequence_end=sequence_end, parameters=parameters,
        ), deadline_s)

    def stream(self, *, deadline_s: float | None = None) -> "Stream":
        """A ModelStreamInfer stream (see :class:`Stream`); use it as a context manager."""
        return Stream(self._stub, deadline_s, self._metadata)

    # -- model repository -------------------------------------------------------------

    def repository_index(self, ready: bool = False) -> tuple[RepositoryModel, ...]:
        """The repository's models and their states (only the ready ones with ``ready``)."""
        return self._run(calls.repository_index(ready))

    def load_model(self, name: str, config: str | Mapping[str, Any] | None = None,
                   files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) ``name``; ``config`` (JSON text or a dict) overrides its config.pbtxt,
        ``files`` (``"1/model.onnx"`` -> bytes) replace its version folders' files."""
        self._run(calls.load_model(name, config, files))

    def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self._run(calls.unload_model(name, unload_dependents))

    # -- trace and log settings -------------------------------------------------------

    def get_trace_settings(self, model: str = "") -> dict[str, TraceValue]:
        return self._run(calls.trace_settings(model, None))

    def update_trace_settings(self, settings: Mapping[str, TraceValue | None], model: str = "") -> dict[str, TraceValue]:
        """Set trace settings (``trace_level``, ``trace_rate``, ``trace_count``, ``log_frequency``,
        ``trace_file``, ...), globally or for ``model``; a None value clears that setting."""
        return self._run(calls.trace_settings(model, settings))

    def get_log_settings(self) -> dict[str, LogValue]:
        return self._run(calls.log_settings(None))

    def update_log_settings(self, settings: Mapping[str, LogValue]) -> dict[str, LogValue]:
        """Set log settings (``log_info``, ``log_verbose_level``, ``log_format``, ...)."""
        return self._run(calls.log_settings(settings))

    # -- shared memory ----------------------------------------------------------------

    def register_system_shared_memory(self, name: str, key: str, byte_size: int, offset: int = 0) -> None:
        """Register ``byte_size`` bytes at ``offset`` of the shm object ``key`` as region ``name``."""
        self._run(calls.register_system_shm(name, key, byte_size, offset))

    def unregister_system_shared_memory(self, name: str = "") -> None:
        """Unregister region ``name``; every region when ``name`` is empty."""
        self._run(calls.unregister_system_shm(name))

    def system_shared_memory_status(self, name: str = "") -> dict[str, RegionStatus]:
        return self._run(calls.system_shm_status(name))

    def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Register CUDA memory by its ``cudaIpcGetMemHandle`` bytes (see :mod:`inferd_client.cuda_shared_memory`)."""
        self._run(calls.register_cuda_shm(name, raw_handle, device_id, byte_size))

    def unregister_cuda_shared_memory(self, name: str = "") -> None:
        self._run(calls.unregister_cuda_shm(name))

    def cuda_shared_memory_status(self, name: str = "") -> dict[str, CudaRegionStatus]:
        return self._run(calls.cuda_shm_status(name))


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

    def __init__(self, stub: pb_grpc.GRPCInferenceServiceStub, deadline_s: float | None,
                 metadata: tuple[tuple[str, str], ...] | None = None) -> None:
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._responses = stub.ModelStreamInfer(self._request_iterator(), timeout=deadline_s, metadata=metadata)

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

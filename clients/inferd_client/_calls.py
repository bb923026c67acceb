"""The gRPC codec both clients share: every call as (RPC name, request message, decoder).

:class:`inferd_client.Client` runs a :class:`Call` and returns ``call.decode(response)``;
:class:`inferd_client.AsyncClient` awaits the same call. Neither builds a message itself, so
the two halves cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from inferd_client._messages import (
    INFERENCE_STATS, BatchStatistics, CudaRegionStatus, InferResult, ModelMetadata, ModelStatistics, RegionStatus,
    RepositoryModel, ServerMetadata, StatDuration, build_request, decode_response, model_metadata, region_statuses,
    server_metadata,
)
from inferd_client._proto import grpc_service_pb2 as pb
from inferd_client._proto import model_config_pb2 as mc

T = TypeVar("T")

LogValue = bool | int | str
TraceValue = str | list[str]


@dataclass(frozen=True, slots=True)
class Call(Generic[T]):
    method: str
    request: Any
    decode: Callable[[Any], T]


def _none(_: Any) -> None:
    return None


def server_live() -> Call[bool]:
    return Call("ServerLive", pb.ServerLiveRequest(), lambda r: bool(r.live))


def server_ready() -> Call[bool]:
    return Call("ServerReady", pb.ServerReadyRequest(), lambda r: bool(r.ready))


def model_ready(name: str, version: str) -> Call[bool]:
    return Call("ModelReady", pb.ModelReadyRequest(name=name, version=version), lambda r: bool(r.ready))


def get_server_metadata() -> Call[ServerMetadata]:
    return Call("ServerMetadata", pb.ServerMetadataRequest(), server_metadata)


def get_model_metadata(name: str, version: str) -> Call[ModelMetadata]:
    return Call("ModelMetadata", pb.ModelMetadataRequest(name=name, version=version), model_metadata)


def model_config(name: str, version: str) -> Call[mc.ModelConfig]:
    return Call("ModelConfig", pb.ModelConfigRequest(name=name, version=version), lambda r: r.config)


def infer(model: str, inputs: Any, **options: Any) -> Call[InferResult]:
    return Call("ModelInfer", build_request(model, inputs, **options), decode_response)


def _duration(d: Any) -> StatDuration:
    return StatDuration(int(d.count), int(d.ns))


def _statistics(r: pb.ModelStatisticsResponse) -> tuple[ModelStatistics, ...]:
    return tuple(
        ModelStatistics(
            s.name, s.version, int(s.last_inference), int(s.inference_count), int(s.execution_count),
            {k: _duration(getattr(s.inference_stats, k)) for k in INFERENCE_STATS},
            tuple(BatchStatistics(int(b.batch_size), _duration(b.compute_input), _duration(b.compute_infer),
                                  _duration(b.compute_output)) for b in s.batch_stats),
        )
        for s in r.model_stats
    )


def model_statistics(name: str, version: str) -> Call[tuple[ModelStatistics, ...]]:
    return Call("ModelStatistics", pb.ModelStatisticsRequest(name=name, version=version), _statistics)


def repository_index(ready: bool) -> Call[tuple[RepositoryModel, ...]]:
    return Call("RepositoryIndex", pb.RepositoryIndexRequest(ready=ready),
                lambda r: tuple(RepositoryModel(m.name, m.version, m.state, m.reason) for m in r.models))


def load_model(name: str, config: str | Mapping[str, Any] | None, files: Mapping[str, bytes] | None) -> Call[None]:
    """``config``: a JSON model configuration (text or a dict) that overrides the repository's
    config.pbtxt; ``files``: ``"file:1/model.onnx"``-style paths -> contents, loaded with it."""
    request = pb.RepositoryModelLoadRequest(model_name=name)
    if config is not None:
        request.parameters["config"].string_param = config if isinstance(config, str) else json.dumps(config)
    for path, content in (files or {}).items():
        key = path if path.startswith("file:") else f"file:{path}"
        request.parameters[key].bytes_param = bytes(content)
    return Call("RepositoryModelLoad", request, _none)


def unload_model(name: str, unload_dependents: bool) -> Call[None]:
    request = pb.RepositoryModelUnloadRequest(model_name=name)
    if unload_dependents:
        request.parameters["unload_dependents"].bool_param = True
    return Call("RepositoryModelUnload", request, _none)


def _trace_settings(r: pb.TraceSettingResponse) -> dict[str, TraceValue]:
    out: dict[str, TraceValue] = {}
    for key, value in r.settings.items():
        values = list(value.value)
        out[key] = values if key == "trace_level" or len(values) != 1 else values[0]
    return out


def trace_settings(model: str, settings: Mapping[str, TraceValue | None] | None) -> Call[dict[str, TraceValue]]:
    """Read (``settings`` None) or update the trace settings; a None value resets that setting
    (to the global one, for a model)."""
    request = pb.TraceSettingRequest(model_name=model)
    for key, value in (settings or {}).items():
        entry = request.settings[key]
        if value is not None:
            entry.value.extend([value] if isinstance(value, str) else [str(v) for v in value])
    return Call("TraceSetting", request, _trace_settings)


def _log_value(v: Any) -> LogValue:
    kind = v.WhichOneof("parameter_choice")
    return getattr(v, kind) if kind else ""


def log_settings(settings: Mapping[str, LogValue] | None) -> Call[dict[str, LogValue]]:
    request = pb.LogSettingsRequest()
    for key, value in (settings or {}).items():
        entry = request.settings[key]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.uint32_param = value
        else:
            entry.string_param = str(value)
    return Call("LogSettings", request, lambda r: {k: _log_value(v) for k, v in r.settings.items()})


def register_system_shm(name: str, key: str, byte_size: int, offset: int) -> Call[None]:
    return Call("SystemSharedMemoryRegister",
                pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=offset, byte_size=byte_size), _none)


def unregister_system_shm(name: str) -> Call[None]:
    return Call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name), _none)


def system_shm_status(name: str) -> Call[dict[str, RegionStatus]]:
    return Call("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name=name), region_statuses)


def register_cuda_shm(name: str, raw_handle: bytes, device_id: int, byte_size: int) -> Call[None]:
    return Call("CudaSharedMemoryRegister",
                pb.CudaSharedMemoryRegisterRequest(name=name, raw_handle=raw_handle, device_id=device_id,
                                                   byte_size=byte_size), _none)


def unregister_cuda_shm(name: str) -> Call[None]:
    return Call("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name=name), _none)


def cuda_shm_status(name: str) -> Call[dict[str, CudaRegionStatus]]:
    return Call("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest(name=name),
                lambda r: {k: CudaRegionStatus(v.name, int(v.device_id), int(v.byte_size)) for k, v in r.regions.items()})

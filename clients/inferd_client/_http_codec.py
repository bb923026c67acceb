"""The HTTP/REST codec both HTTP clients share: every call as (method, path, JSON body or
bytes, decoder), and the inference request and response in Triton's binary tensor extension
(a JSON header followed by the tensors' raw bytes, its length in
``Inference-Header-Content-Length``).

:class:`inferd_client.HttpClient` sends an :class:`HttpCall` with ``http.client``;
:class:`inferd_client.AsyncHttpClient` with aiohttp. Neither encodes a request itself.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import grpc
import numpy as np

from inferd_client._messages import (
    INFERENCE_STATS, BatchStatistics, CudaRegionStatus, InferError, InferResult, Inputs, ModelMetadata,
    ModelStatistics, Output, Outputs, ParameterValue, RegionStatus, RepositoryModel, ServerMetadata, ShmInput,
    StatDuration, TensorMetadata,
)
from inferd_client._tensors import datatype_of, deserialize, numpy_dtype, serialize

T = TypeVar("T")
HEADER_LENGTH = "Inference-Header-Content-Length"

# HTTP status -> the gRPC status of the same meaning, so InferError.code reads the same on both
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ALREADY_EXISTS,
          429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED, 500: grpc.StatusCode.INTERNAL,
          501: grpc.StatusCode.UNIMPLEMENTED, 503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]  # lower-case names
    body: bytes


@dataclass(frozen=True, slots=True)
class HttpCall(Generic[T]):
    method: str
    path: str
    decode: Callable[[Reply], T]
    body: bytes | None = None
    headers: dict[str, str] = field(default_factory=dict)
    ok: tuple[int, ...] = (200,)  # statuses that are answers; others raise InferError


def error_of(reply: Reply) -> InferError:
    text = reply.body.decode(errors="replace").strip()
    try:
        text = str(json.loads(text).get("error", text))
    except (ValueError, AttributeError):
        pass
    return InferError(text or f"HTTP {reply.status}", _CODES.get(reply.status, grpc.StatusCode.UNKNOWN), reply.status)


def _json(reply: Reply) -> Any:
    return json.loads(reply.body) if reply.body else {}


def _none(reply: Reply) -> None:
    return None


def _post(path: str, doc: Any, decode: Callable[[Reply], T]) -> HttpCall[T]:
    return HttpCall("POST", path, decode, json.dumps(doc).encode(), {"Content-Type": "application/json"})


def model_path(name: str, version: str = "") -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version else "")


def _ready(path: str) -> HttpCall[bool]:
    return HttpCall("GET", path, lambda r: r.status == 200, ok=(200, 400, 404, 503))


def server_live() -> HttpCall[bool]:
    return _ready("/v2/health/live")


def server_ready() -> HttpCall[bool]:
    return _ready("/v2/health/ready")


def model_ready(name: str, version: str) -> HttpCall[bool]:
    return _ready(model_path(name, version) + "/ready")


def get_server_metadata() -> HttpCall[ServerMetadata]:
    def decode(r: Reply) -> ServerMetadata:
        d = _json(r)
        return ServerMetadata(d.get("name", ""), d.get("version", ""), tuple(d.get("extensions", ())))

    return HttpCall("GET", "/v2", decode)


def get_model_metadata(name: str, version: str) -> HttpCall[ModelMetadata]:
    def tensors(items: Any) -> tuple[TensorMetadata, ...]:
        return tuple(TensorMetadata(t["name"], t["datatype"], tuple(int(d) for d in t.get("shape", ()))) for t in items)

    def decode(r: Reply) -> ModelMetadata:
        d = _json(r)
        return ModelMetadata(d["name"], tuple(str(v) for v in d.get("versions", ())), d.get("platform", ""),
                             tensors(d.get("inputs", ())), tensors(d.get("outputs", ())))

    return HttpCall("GET", model_path(name, version), decode)


def model_config(name: str, version: str) -> HttpCall[dict[str, Any]]:
    return HttpCall("GET", model_path(name, version) + "/config", _json)


def _duration(d: Mapping[str, Any] | None) -> StatDuration:
    d = d or {}
    return StatDuration(int(d.get("count", 0)), int(d.get("ns", 0)))


def model_statistics(name: str, version: str) -> HttpCall[tuple[ModelStatistics, ...]]:
    def decode(r: Reply) -> tuple[ModelStatistics, ...]:
        return tuple(
            ModelStatistics(
                s["name"], s.get("version", ""), int(s.get("last_inference", 0)), int(s.get("inference_count", 0)),
                int(s.get("execution_count", 0)),
                {k: _duration(s.get("inference_stats", {}).get(k)) for k in INFERENCE_STATS},
                tuple(BatchStatistics(int(b["batch_size"]), _duration(b.get("compute_input")),
                                      _duration(b.get("compute_infer")), _duration(b.get("compute_output")))
                      for b in s.get("batch_stats", ())),
            )
            for s in _json(r).get("model_stats", ())
        )

    return HttpCall("GET", (model_path(name, version) if name else "/v2/models") + "/stats", decode)


def repository_index(ready: bool) -> HttpCall[tuple[RepositoryModel, ...]]:
    return _post("/v2/repository/index", {"ready": ready}, lambda r: tuple(
        RepositoryModel(m["name"], m.get("version", ""), m.get("state", ""), m.get("reason", "")) for m in _json(r)))


def load_model(name: str, config: str | Mapping[str, Any] | None, files: Mapping[str, bytes] | None) -> HttpCall[None]:
    params: dict[str, Any] = {}
    if config is not None:
        params["config"] = config if isinstance(config, str) else json.dumps(config)
    for path, content in (files or {}).items():
        params[path if path.startswith("file:") else f"file:{path}"] = base64.b64encode(bytes(content)).decode()
    return _post(f"/v2/repository/models/{quote(name, safe='')}/load", {"parameters": params} if params else {}, _none)


def unload_model(name: str, unload_dependents: bool) -> HttpCall[None]:
    body = {"parameters": {"unload_dependents": True}} if unload_dependents else {}
    return _post(f"/v2/repository/models/{quote(name, safe='')}/unload", body, _none)


def trace_settings(model: str, settings: Mapping[str, Any] | None) -> HttpCall[dict[str, Any]]:
    path = (model_path(model) if model else "/v2") + "/trace/setting"
    if settings is None:
        return HttpCall("GET", path, _json)
    return _post(path, dict(settings), _json)


def log_settings(settings: Mapping[str, Any] | None) -> HttpCall[dict[str, Any]]:
    if settings is None:
        return HttpCall("GET", "/v2/logging", _json)
    return _post("/v2/logging", dict(settings), _json)


def _region(kind: str, name: str, action: str) -> str:
    return f"/v2/{kind}/region/{quote(name, safe='')}/{action}" if name else f"/v2/{kind}/{action}"


def register_system_shm(name: str, key: str, byte_size: int, offset: int) -> HttpCall[None]:
    return _post(_region("systemsharedmemory", name, "register"),
                 {"key": key, "offset": offset, "byte_size": byte_size}, _none)


def unregister_system_shm(name: str) -> HttpCall[None]:
    return _post(_region("systemsharedmemory", name, "unregister"), {}, _none)


def system_shm_status(name: str) -> HttpCall[dict[str, RegionStatus]]:
    return HttpCall("GET", _region("systemsharedmemory", name, "status"), lambda r: {
        d["name"]: RegionStatus(d["name"], d["key"], int(d.get("offset", 0)), int(d["byte_size"])) for d in _json(r)})


def register_cuda_shm(name: str, raw_handle: bytes, device_id: int, byte_size: int) -> HttpCall[None]:
    return _post(_region("cudasharedmemory", name, "register"),
                 {"raw_handle": {"b64": base64.b64encode(raw_handle).decode()}, "device_id": device_id,
                  "byte_size": byte_size}, _none)


def unregister_cuda_shm(name: str) -> HttpCall[None]:
    return _post(_region("cudasharedmemory", name, "unregister"), {}, _none)


def cuda_shm_status(name: str) -> HttpCall[dict[str, CudaRegionStatus]]:
    return HttpCall("GET", _region("cudasharedmemory", name, "status"), lambda r: {
        d["name"]: CudaRegionStatus(d["name"], int(d.get("device_id", 0)), int(d["byte_size"])) for d in _json(r)})


# --------------------------------------------------------------------------- inference


def _shm_params(region: str, byte_size: int, offset: int) -> dict[str, Any]:
    out: dict[str, Any] = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset:
        out["shared_memory_offset"] = offset
    return out


def infer(model: str, inputs: Inputs, *, outputs: Outputs | None = None, version: str = "", request_id: str = "",
          priority: int = 0, timeout_us: int = 0, sequence_id: int | str = 0, sequence_start: bool = False,
          sequence_end: bool = False, parameters: Mapping[str, ParameterValue] | None = None) -> HttpCall[InferResult]:
    """POST .../infer with the tensors as binary data after the JSON header."""
    params: dict[str, Any] = dict(parameters or {})
    if priority:
        params["priority"] = priority
    if timeout_us:
        params["timeout"] = timeout_us
    if sequence_id:
        params.update(sequence_id=sequence_id, sequence_start=sequence_start, sequence_end=sequence_end)
    tensors, raws = [], []
    for name, value in inputs.items():
        if isinstance(value, ShmInput):
            tensors.append({"name": name, "shape": [int(d) for d in value.shape], "datatype": value.datatype,
                            "parameters": _shm_params(value.region, value.byte_size, value.offset)})
            continue
        array = np.asarray(value)
        raw = serialize(array)
        raws.append(raw)
        tensors.append({"name": name, "shape": [int(d) for d in array.shape], "datatype": datatype_of(array),
                        "parameters": {"binary_data_size": len(raw)}})
    header: dict[str, Any] = {"inputs": tensors}
    if request_id:
        header["id"] = request_id
    if outputs:
        wanted = []
        for item in outputs:
            out = item if isinstance(item, Output) else Output(item)
            p: dict[str, Any] = (_shm_params(out.region, out.byte_size, out.offset) if out.region is not None
                                 else {"binary_data": True})
            if out.class_count:
                p["classification"] = out.class_count
            wanted.append({"name": out.name, "parameters": p})
        header["outputs"] = wanted
    else:
        params["binary_data_output"] = True
    if params:
        header["parameters"] = params
    text = json.dumps(header, separators=(",", ":")).encode()
    return HttpCall("POST", model_path(model, version) + "/infer", decode_infer, text + b"".join(raws),
                    {HEADER_LENGTH: str(len(text)), "Content-Type": "application/octet-stream"})


def decode_infer(reply: Reply) -> InferResult:
    length = reply.headers.get(HEADER_LENGTH.lower())
    split = int(length) if length is not None else len(reply.body)
    doc = json.loads(reply.body[:split])
    binary = memoryview(reply.body)[split:]
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    pos = 0
    for out in doc.get("outputs", ()):
        name, datatype = out["name"], out["datatype"]
        shape = tuple(int(d) for d in out.get("shape", ()))
        datatypes[name], shapes[name] = datatype, shape
        p = out.get("parameters", {})
        if "binary_data_size" in p:
            size = int(p["binary_data_size"])
            arrays[name] = deserialize(bytes(binary[pos:pos + size]), datatype, shape)
            pos += size
        elif "data" in out:
            data = out["data"]
            if datatype == "BYTES":
                flat = np.empty(len(data), dtype=np.object_)
                flat[:] = [d.encode() if isinstance(d, str) else bytes(d) for d in data]
                arrays[name] = flat.reshape(shape)
            else:
                arrays[name] = np.asarray(data, dtype=numpy_dtype(datatype)).reshape(shape)
        # else: written to shared memory
    return InferResult(model_name=doc.get("model_name", ""), model_version=doc.get("model_version", ""),
                       id=doc.get("id", ""), outputs=arrays, datatypes=datatypes, shapes=shapes,
                       parameters=dict(doc.get("parameters", {})))

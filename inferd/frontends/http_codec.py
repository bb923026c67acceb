"""KServe v2 HTTP/REST bodies <-> numpy, done once per request at the HTTP edge.

The JSON side of the protocol, plus Triton's binary tensor data extension: a
request whose ``Inference-Header-Content-Length`` header says how many leading
bytes of the body are JSON carries the rest as the raw data of the inputs
that give ``parameters.binary_data_size``, in input order; a response does
the same for outputs asked for with ``binary_data`` (or, by default, with the
request's ``binary_data_output``). Raw data uses the gRPC framing
(:mod:`inferd.frontends.grpc_codec`): little-endian values, BYTES elements 4-byte
length-prefixed. JSON ``data`` may be flat or nested; BYTES elements are
strings. A tensor whose parameters name a registered system shared memory
region (``shared_memory_region`` / ``_offset`` / ``_byte_size``) is read from
(input) or written to (output, by the data plane) that region, with the checks
gRPC makes; such an output carries no data in the response, as Triton's.

Nothing here depends on the web framework: bytes and header values in,
:class:`InferenceRequest` out; :class:`InferenceResponse` in, body parts out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.dtypes import BY_NAME, DataType, datatype_problem, element_count, encode_bytes, from_numpy
from inferd.errors import InvalidArgument
from inferd.frontends.grpc_codec import array_from_raw, int_param, parse_version, shm_ref
from inferd.frontends.parameters import check_request_parameters
from inferd.types import InferenceRequest, InferenceResponse, RequestedOutput, SharedTensor

if TYPE_CHECKING:
    from inferd.observability.stats import ModelStatistics

HEADER_LENGTH = "inference-header-content-length"

# Request parameters that shape the HTTP answer; they are not passed to the model.
_PROTOCOL_PARAMS = ("binary_data_output",)
# Triton's HTTP_MAX_JSON_NESTING_DEPTH: tensor 'data' nested this deep or deeper is refused (#8172).
MAX_JSON_DEPTH = 100
TOO_DEEP = f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"
# json.dumps with arguments builds an encoder per call; this one is built once.
dumps = json.JSONEncoder(separators=(",", ":")).encode


@dataclass(slots=True)
class HttpInferRequest:
    """A decoded request, and how each output is to be sent back."""

    request: InferenceRequest
    binary_default: bool = False  # the request's binary_data_output
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output, when it says


# -- requests --------------------------------------------------------------


def split_body(body: bytes, header_length: str | None) -> tuple[bytes | memoryview, memoryview]:
    """The JSON part of a body and the binary part after it."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(body):
        raise InvalidArgument(
            f"Inference-Header-Content-Length is '{header_length}' but the request body has {len(body)} bytes; "
            "it must give the length of the JSON header that starts the body"
        )
    view = memoryview(body)
    return view[:n], view[n:]


def load_json(data: bytes | memoryview, what: str) -> Any:
    try:
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidArgument(f"{what}: the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidArgument(f"{what}: {TOO_DEEP}: the JSON body nests arrays or objects too deeply") from None


def decode_infer_request(model: str, version: str, body: bytes, header_length: str | None = None) -> HttpInferRequest:
    """An inference request from its body (JSON header, then any binary data).

    A tensor that names a registered system shared memory region
    (``shared_memory_region`` / ``_offset`` / ``_byte_size`` parameters) is left
    as a reference for the data plane, with the checks gRPC makes (:func:`codec.shm_ref`)."""
    head, binary = split_body(body, header_length)
    doc = load_json(head, f"inference request for model '{model}'")
    if not isinstance(doc, dict):
        raise InvalidArgument(f"inference request for model '{model}': the JSON body must be an object")
    request = InferenceRequest(model_name=model, inputs={}, model_version=parse_version(model, version))
    rid = doc.get("id", "")
    if not isinstance(rid, str):
        raise InvalidArgument(f"model '{model}': request 'id' must be a string, got {rid!r}")
    request.id = rid
    out = HttpInferRequest(request)

    params = _object(doc.get("parameters"), f"model '{model}': request 'parameters'")
    if params:
        check_request_parameters(model, params, "http")
        binary_default = params.get("binary_data_output", False)
        if not isinstance(binary_default, bool):
            raise InvalidArgument(f"model '{model}': request parameter 'binary_data_output' must be a boolean")
        out.binary_default = binary_default
        request.parameters = {k: v for k, v in params.items() if k not in _PROTOCOL_PARAMS}
        request.priority = int_param(model, params, "priority")
        request.timeout_us = int_param(model, params, "timeout")

    inputs = doc.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidArgument(f"model '{model}': the request must have an 'inputs' array")
    offset = 0
    for i, t in enumerate(inputs):
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise InvalidArgument(f"model '{model}': inputs[{i}] must be an object with a 'name'")
        name = t["name"]
        where = f"input '{name}' for model '{model}'"
        if name in request.inputs:
            raise InvalidArgument(f"{where}: the input is given twice")
        dtype = BY_NAME.get(t.get("datatype"))  # type: ignore[arg-type]
        if dtype is None:
            raise InvalidArgument(f"{where}: {datatype_problem(t.get('datatype'))}")
        shape = _shape(t.get("shape"), where)
        tparams = _object(t.get("parameters"), f"{where}: 'parameters'")
        ref = shm_ref(tparams, where) if tparams else None
        size = tparams.get("binary_data_size") if tparams else None
        if ref is not None:
            if "data" in t or size is not None:
                raise InvalidArgument(
                    f"{where}: the input is in shared memory region '{ref.region}'; it must not also "
                    "give 'data' or 'binary_data_size'"
                )
            request.inputs[name] = SharedTensor(ref, dtype, shape)  # type: ignore[assignment]
            request.shared_memory = True
        elif size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise InvalidArgument(f"{where}: 'binary_data_size' must be a non-negative integer, got {size!r}")
            if "data" in t:
                raise InvalidArgument(f"{where}: give either 'data' or 'binary_data_size', not both")
            if offset + size > len(binary):
                raise InvalidArgument(
                    f"{where}: 'binary_data_size' is {size} but only {len(binary) - offset} bytes of binary data "
                    "remain after the JSON header (is Inference-Header-Content-Length set?)"
                )
            request.inputs[name] = array_from_raw(binary[offset:offset + size], dtype, shape, where)  # type: ignore[arg-type]
            offset += size
        elif "data" in t:
            request.inputs[name] = array_from_json(t["data"], dtype, shape, where)
        else:
            raise InvalidArgument(f"{where}: the input has neither 'data' nor 'binary_data_size'")
    if offset != len(binary):
        raise InvalidArgument(
            f"model '{model}': {len(binary) - offset} bytes of binary data left over after the inputs "
            f"(their binary_data_size add up to {offset})"
        )

    outputs = doc.get("outputs")
    if outputs is not None:
        if not isinstance(outputs, list):
            raise InvalidArgument(f"model '{model}': 'outputs' must be an array")
        requested = []
        for i, o in enumerate(outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise InvalidArgument(f"model '{model}': outputs[{i}] must be an object with a 'name'")
            r = RequestedOutput(o["name"])
            oparams = _object(o.get("parameters"), f"output '{r.name}' for model '{model}': 'parameters'")
            if oparams:
                r.shared_memory = shm_ref(oparams, f"output '{r.name}' for model '{model}'")
                if r.shared_memory is not None:
                    request.shared_memory = True
                flag = oparams.get("binary_data")
                if flag is not None:
                    if not isinstance(flag, bool):
                        raise InvalidArgument(
                            f"output '{r.name}' for model '{model}': 'binary_data' must be a boolean, got {flag!r}"
                        )
                    out.binary[r.name] = flag
                r.parameters = {k: v for k, v in oparams.items() if k != "binary_data"}
                r.class_count = int_param(model, oparams, "classification")
            requested.append(r)
        request.requested_outputs = requested or None
    return out


def _object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise InvalidArgument(f"{where}: 'shape' must be an array of integers, got {value!r}")
    if any(d < 0 for d in value):
        raise InvalidArgument(f"{where}: shape {value} has a negative dimension")
    return tuple(value)


def _flatten(data: Any, where: str) -> list[Any]:
    """``data``'s values in row-major order, however it nests (Triton reads them so); a value or array
    :data:`MAX_JSON_DEPTH` levels below ``data`` itself is refused, in Triton's words."""
    if not isinstance(data, list):
        return [data]
    if not any(isinstance(x, list) for x in data):
        return data
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for x in stack[-1]:
            if len(stack) >= MAX_JSON_DEPTH:  # x lies len(stack) levels below data
                raise InvalidArgument(f"{where}: {TOO_DEEP} in 'data'")
            if isinstance(x, list):
                stack.append(iter(x))
                break
            out.append(x)
        else:
            stack.pop()
    return out


def array_from_json(data: Any, dtype: DataType, shape: tuple[int, ...], where: str) -> np.ndarray:
    """A JSON ``data`` value (flat or nested, row-major) as an array of ``shape``."""
    count = element_count(shape, where, dtype.itemsize)
    flat = _flatten(data, where)
    if len(flat) != count:
        raise InvalidArgument(f"{where}: {len(flat)} values in 'data' for shape {list(shape)}, expecting {count}")
    name = dtype.name
    if name == "BYTES":
        out = np.empty(count, dtype=np.object_)
        for i, x in enumerate(flat):
            if not isinstance(x, str):
                raise InvalidArgument(f"{where}: BYTES data must be strings, element {i} is {x!r}")
            out[i] = x.encode()
        return out.reshape(shape)
    if dtype.numpy is None:
        raise InvalidArgument(f"{where}: data type {name} is not supported on this server")
    if count == 0:
        return np.empty(shape, dtype=dtype.numpy)
    try:
        values = np.asarray(flat)
    except (ValueError, TypeError, OverflowError):
        values = np.asarray(flat, dtype=np.object_)
    kind = values.dtype.kind
    if name == "BOOL":
        if kind != "b":
            raise InvalidArgument(f"{where}: BOOL data must be true/false, got {_first_bad(flat, bool)!r}")
    elif dtype.numpy.kind in "iu":
        if kind in "iu":
            lo, hi = int(values.min()), int(values.max())
        else:  # numpy found no one integer type for them all (values past int64), or not integers
            bad = _first_bad(flat, int)
            if not (isinstance(bad, int) and not isinstance(bad, bool)):
                raise InvalidArgument(f"{where}: {name} data must be integers, got {bad!r}")
            lo, hi = min(flat), max(flat)
            values = np.asarray(flat, dtype=np.object_)
        info = np.iinfo(dtype.numpy)
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise InvalidArgument(f"{where}: value {bad} is out of range for {name} ({info.min}..{info.max})")
    elif kind not in "iuf":
        raise InvalidArgument(f"{where}: {name} data must be numbers, got {_first_bad(flat, float)!r}")
    try:
        with np.errstate(over="raise", invalid="ignore"):  # NaN and infinities given as such pass
            return values.astype(dtype.numpy, copy=False).reshape(shape)
    except FloatingPointError:
        finfo = np.finfo(dtype.numpy)
        raise InvalidArgument(f"{where}: a value is out of range for {name} (magnitude at most {float(finfo.max):g})"
                              ) from None


def _first_bad(flat: list[Any], kind: type) -> Any:
    for x in flat:
        if kind is bool:
            ok = isinstance(x, bool)
        elif kind is int:
            ok = isinstance(x, int) and not isinstance(x, bool)
        else:
            ok = isinstance(x, (int, float)) and not isinstance(x, bool)
        if not ok:
            return x
    return flat[0]


# -- responses -------------------------------------------------------------


def encode_infer_response(response: InferenceResponse, how: HttpInferRequest) -> tuple[bytes, int | None]:
    """The response body, and the JSON header's length when binary data follows it (else None)."""
    outputs = []
    chunks: list[bytes] = []
    binary_default, binary = how.binary_default, how.binary
    requested = how.request.requested_outputs
    in_shm = {r.name for r in requested if r.shared_memory is not None} if requested else None
    for name, array in response.outputs.items():
        wire = "BYTES" if array.dtype.kind in "OSU" else from_numpy(array.dtype).name
        out: dict[str, Any] = {"name": name, "datatype": wire, "shape": list(array.shape)}
        if in_shm and name in in_shm:
            pass  # written to the client's region by the data plane: no data here, as Triton
        elif binary.get(name, binary_default):
            raw = encode_bytes(array) if wire == "BYTES" else array.tobytes()
            out["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            out["data"] = json_values(array, wire, name, response.model_name)
        outputs.append(out)
    doc: dict[str, Any] = {"model_name": response.model_name, "model_version": str(response.model_version)}
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs
    head = dumps(doc).encode()
    if not chunks:
        return head, None
    return b"".join([head, *chunks]), len(head)


def json_values(array: np.ndarray, wire: str, name: str, model: str) -> list[Any]:
    flat = array.reshape(-1)
    if wire == "BYTES":
        try:
            return [x.decode() if isinstance(x, bytes) else str(x) for x in flat]
        except UnicodeDecodeError:
            raise InvalidArgument(
                f"output '{name}' of model '{model}' holds BYTES that are not valid UTF-8 and cannot be sent "
                "as JSON; ask for it with \"binary_data\": true"
            ) from None
    if wire == "BF16":
        flat = flat.astype(np.float32)
    return flat.tolist()


# -- other JSON answers ----------------------------------------------------


def _duration(d: Any) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics_json(models: list[ModelStatistics]) -> dict[str, Any]:
    """The statistics extension's answer for ``models`` (snapshots of loaded model versions)."""
    # Imported here: a frontend worker that answers no statistics request never loads the snapshots'
    # module, and a reply that carries snapshots has loaded it already (unpickling them).
    from inferd.observability.stats import RESPONSE_FIELDS

    out = []
    for s in models:
        out.append({
            "name": s.name,
            "version": str(s.version),
            "last_inference": s.last_inference_ms,
            "inference_count": s.inference_count,
            "execution_count": s.execution_count,
            "inference_stats": {
                "success": _duration(s.success),
                "fail": _duration(s.fail),
                "queue": _duration(s.queue),
                "compute_input": _duration(s.compute_input),
                "compute_infer": _duration(s.compute_infer),
                "compute_output": _duration(s.compute_output),
                "cache_hit": _duration(s.cache_hit),
                "cache_miss": _duration(s.cache_miss),
            },
            "batch_stats": [
                {
                    "batch_size": b.batch_size,
                    "compute_input": _duration(b.compute_input),
                    "compute_infer": _duration(b.compute_infer),
                    "compute_output": _duration(b.compute_output),
                }
                for b in s.batch_stats
            ],
            "response_stats": {
                key: {field: _duration(getattr(r, field)) for field in RESPONSE_FIELDS}
                for key, r in s.response_stats.items()
            },
            "memory_usage": [{"type": kind, "id": device, "byte_size": size} for kind, device, size in s.memory_usage],
        })
    return {"model_stats": out}

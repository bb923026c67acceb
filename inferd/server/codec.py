"""Protobuf <-> numpy, done once per request at the gRPC edge.

Raw contents become numpy arrays without copying (``np.frombuffer`` over the
request's bytes); BYTES tensors use the protocol's 4-byte little-endian
length-prefixed framing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from inferd._proto import grpc_service_pb2 as pb
from inferd.dtypes import BY_NAME, DataType, decode_bytes, encode_bytes
from inferd.errors import InvalidArgument, Unimplemented
from inferd.types import InferenceRequest, InferenceResponse, RequestedOutput

if TYPE_CHECKING:
    from inferd.server.shared_memory import SharedMemoryManager

_TYPED_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def param_value(p: pb.InferParameter) -> object:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else None


def set_param(target: pb.InferParameter, value: object) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def parse_version(model: str, version: str) -> int:
    if not version:
        return 0
    try:
        value = int(version)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidArgument(f"model '{model}': version must be a non-negative integer, got '{version}'")
    return value


def array_from_raw(raw: bytes, dtype: DataType, shape: tuple[int, ...], where: str) -> np.ndarray:
    count = 1
    for d in shape:
        count *= d
    if dtype.name == "BYTES":
        return decode_bytes(raw, count, where).reshape(shape)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgument(
            f"{where}: unexpected total byte size {len(raw)} for shape {list(shape)} of {dtype.name}, expecting {expected}"
        )
    if dtype.numpy is None:
        raise InvalidArgument(f"{where}: data type {dtype.name} is not supported on this server")
    return np.frombuffer(raw, dtype=dtype.numpy).reshape(shape)


def array_from_contents(t: pb.ModelInferRequest.InferInputTensor, dtype: DataType, shape: tuple[int, ...], where: str) -> np.ndarray:
    field = _TYPED_FIELD.get(dtype.name)
    if field is None:
        raise InvalidArgument(f"{where}: data type {dtype.name} has no typed contents field; send it as raw_input_contents")
    values = getattr(t.contents, field)
    count = 1
    for d in shape:
        count *= d
    if len(values) != count:
        raise InvalidArgument(f"{where}: {len(values)} values in contents for shape {list(shape)}, expecting {count}")
    if dtype.name == "BYTES":
        out = np.empty(count, dtype=np.object_)
        out[:] = list(values)
        return out.reshape(shape)
    try:
        return np.array(values, dtype=dtype.numpy).reshape(shape)
    except OverflowError:
        # int_contents/uint_contents carry 32-bit values for the 8- and 16-bit types.
        info = np.iinfo(dtype.numpy)
        bad = next((v for v in values if not info.min <= v <= info.max), None)
        raise InvalidArgument(
            f"{where}: value {bad} in contents is out of range for {dtype.name} ({info.min}..{info.max})"
        ) from None


_SHM_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def _refuse_shared_memory(model: str, kind: str, name: str, params) -> None:  # type: ignore[no-untyped-def]
    # Without a shared memory manager (a caller that does not serve the
    # extension), data left in a region must not be silently taken as empty
    # contents (or results silently sent inline).
    for key in _SHM_KEYS:
        if key in params:
            raise Unimplemented(
                f"{kind} '{name}' for model '{model}': parameter '{key}': shared memory is not supported "
                "by this inferd version; send the tensor data in the request"
            )


def _shm_ref(shm: "SharedMemoryManager | None", model: str, kind: str, name: str, params: dict):  # type: ignore[no-untyped-def]
    """The tensor's shared memory reference (a ShmRef), or None; ``params``: plain values."""
    if shm is None:
        _refuse_shared_memory(model, kind, name, params)
        return None
    return shm.ref(params, f"{kind} '{name}' for model '{model}'")


def decode_infer_request(msg: pb.ModelInferRequest, shm: "SharedMemoryManager | None" = None) -> InferenceRequest:
    """The request as plain data; ``shm`` resolves tensors in registered shared memory regions."""
    model = msg.model_name
    raw = msg.raw_input_contents
    in_shm: dict[str, object] = {}
    for t in msg.inputs:
        if t.parameters:
            ref = _shm_ref(shm, model, "input", t.name, {k: param_value(v) for k, v in t.parameters.items()})
            if ref is not None:
                in_shm[t.name] = ref
    for o in msg.outputs:
        if o.parameters and shm is None:
            _refuse_shared_memory(model, "output", o.name, o.parameters)
    if raw and len(raw) != len(msg.inputs) - len(in_shm):
        raise InvalidArgument(
            f"model '{model}': {len(raw)} raw_input_contents for {len(msg.inputs) - len(in_shm)} inputs"
            + (" not in shared memory" if in_shm else "")
            + "; give one raw content per input, in order"
        )
    inputs: dict[str, np.ndarray] = {}
    ri = 0
    for t in msg.inputs:
        where = f"input '{t.name}' for model '{model}'"
        dtype = BY_NAME.get(t.datatype)
        if dtype is None:
            raise InvalidArgument(f"{where}: unknown data type '{t.datatype}'")
        shape = tuple(t.shape)
        if any(d < 0 for d in shape):
            raise InvalidArgument(f"{where}: shape {list(shape)} has a negative dimension")
        if t.name in inputs:
            raise InvalidArgument(f"{where}: the input is given twice")
        if in_shm and t.name in in_shm:
            if t.HasField("contents"):
                raise InvalidArgument(f"{where}: contents field must not be specified for an input in shared memory")
            inputs[t.name] = in_shm[t.name].read(dtype, shape, where)  # type: ignore[attr-defined]
        elif raw:
            if t.HasField("contents"):
                raise InvalidArgument(
                    f"{where}: contents field must not be specified when using raw_input_contents"
                )
            inputs[t.name] = array_from_raw(raw[ri], dtype, shape, where)
            ri += 1
        else:
            inputs[t.name] = array_from_contents(t, dtype, shape, where)
    request = InferenceRequest(
        model_name=model,
        inputs=inputs,
        model_version=parse_version(model, msg.model_version),
        id=msg.id,
    )
    if msg.parameters:
        params = {k: param_value(v) for k, v in msg.parameters.items()}
        request.parameters = params
        request.priority = int_param(model, params, "priority")
        request.timeout_us = int_param(model, params, "timeout")
    if msg.outputs:
        requested = []
        for o in msg.outputs:
            r = RequestedOutput(o.name)
            if o.parameters:
                r.parameters = {k: param_value(v) for k, v in o.parameters.items()}
                r.class_count = int_param(model, r.parameters, "classification")
                r.shared_memory = _shm_ref(shm, model, "output", o.name, r.parameters)
            requested.append(r)
        request.requested_outputs = requested
    return request


def int_param(model: str, params: dict[str, object], key: str) -> int:
    """A request parameter that must be a non-negative integer (priority, timeout, ...); 0 when absent."""
    value = params.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"model '{model}': request parameter '{key}' must be a non-negative integer, got {value!r}")
    return value


def encode_infer_response(response: InferenceResponse,
                          requested: list[RequestedOutput] | None = None) -> pb.ModelInferResponse:
    """``requested``: the request's outputs; those written to shared memory carry no data here."""
    msg = pb.ModelInferResponse(
        model_name=response.model_name, model_version=str(response.model_version), id=response.id
    )
    in_shm = {r.name for r in requested if r.shared_memory is not None} if requested else None
    raw = msg.raw_output_contents
    for name, array in response.outputs.items():
        out = msg.outputs.add()
        out.name = name
        if array.dtype.kind in "OSU":
            out.datatype = "BYTES"
        else:
            out.datatype = _NUMPY_NAME.get(array.dtype) or _dtype_name(array.dtype)
        out.shape.extend(array.shape)
        if in_shm and name in in_shm:
            # As Triton: an (empty) raw entry for every output keeps them aligned by index.
            raw.append(b"")
        elif out.datatype == "BYTES":
            raw.append(encode_bytes(array))
        else:
            raw.append(array.tobytes())
    for key, value in response.parameters.items():
        set_param(msg.parameters[key], value)
    return msg


_NUMPY_NAME = {t.numpy: t.name for t in BY_NAME.values() if t.numpy is not None}


def _dtype_name(dtype: np.dtype) -> str:
    from inferd.dtypes import from_numpy

    return from_numpy(dtype).name

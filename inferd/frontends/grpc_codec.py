"""Protobuf <-> numpy, done once per request at the gRPC edge.

Raw contents become numpy arrays without copying (``np.frombuffer`` over the
request's bytes); BYTES tensors use the protocol's 4-byte little-endian
length-prefixed framing.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from inferd._proto import grpc_service_pb2 as pb
from inferd.dtypes import BY_NAME, DataType, datatype_problem, decode_bytes, element_count, encode_bytes
from inferd.errors import InvalidArgument
from inferd.frontends.parameters import check_request_parameters
from inferd.types import InferenceRequest, InferenceResponse, RequestedOutput, SharedTensor, ShmRef

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
        raise InvalidArgument(  # Triton's words first: its clients match on them
            f"failed to get model version from specified version string '{version}' for model '{model}'; "
            "a version is a non-negative integer, or empty for the model's latest")
    return value


def array_from_raw(raw: bytes, dtype: DataType, shape: tuple[int, ...], where: str) -> np.ndarray:
    count = element_count(shape, where, dtype.itemsize)
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
    count = element_count(shape, where, dtype.itemsize)
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


PARAM_REGION = "shared_memory_region"
PARAM_OFFSET = "shared_memory_offset"
PARAM_BYTE_SIZE = "shared_memory_byte_size"


def shm_ref(params: Mapping[str, object], where: str) -> ShmRef | None:
    """The shared memory reference in a tensor's parameters (plain values), or None.

    Only the parameters are checked here; the data plane finds the region and
    checks that offset and byte size lie inside it."""
    name = params.get(PARAM_REGION)
    if name is None:
        for key in (PARAM_OFFSET, PARAM_BYTE_SIZE):
            if key in params:
                raise InvalidArgument(f"{where}: parameter '{key}' given without '{PARAM_REGION}'")
        return None
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{where}: parameter '{PARAM_REGION}' must be a region name, got {name!r}")
    size = params.get(PARAM_BYTE_SIZE)
    offset = params.get(PARAM_OFFSET, 0)
    if type(size) is not int or size < 0 or type(offset) is not int or offset < 0:
        if size is None:
            raise InvalidArgument(f"{where}: shared memory region '{name}': parameter '{PARAM_BYTE_SIZE}' is required")
        _non_negative(size, PARAM_BYTE_SIZE, name, where)
        _non_negative(offset, PARAM_OFFSET, name, where)
    return ShmRef(name, offset, size, where)  # type: ignore[arg-type]


def _non_negative(value: object, key: str, region: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(
            f"{where}: shared memory region '{region}': parameter '{key}' must be a non-negative integer, got {value!r}"
        )
    return value


def mixed_contents(name: str, model: str) -> str:
    """Triton's words for typed contents given beside raw_input_contents (its example clients match them)."""
    return (f"contents field must not be specified when using raw_input_contents for '{name}' for model "
            f"'{model}'; send every input as raw_input_contents, or every one in its contents")


def decode_infer_request(msg: pb.ModelInferRequest) -> InferenceRequest:
    """The request as plain data. Tensors in shared memory are left as references
    (:class:`SharedTensor` inputs, :class:`ShmRef` outputs) for the data plane."""
    model = msg.model_name
    raw = msg.raw_input_contents
    in_shm: dict[str, ShmRef] = {}
    for t in msg.inputs:
        if t.parameters:
            ref = shm_ref({k: param_value(v) for k, v in t.parameters.items()}, f"input '{t.name}' for model '{model}'")
            if ref is not None:
                in_shm[t.name] = ref
    if raw:  # before the count: a client mixing the two is told so (Triton's words, clients match them)
        for t in msg.inputs:  # a loop, not next(<genexpr>): no generator per request
            if t.HasField("contents") and t.name not in in_shm:
                raise InvalidArgument(mixed_contents(t.name, model))
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
        dtype, shape = tensor_type(t.datatype, t.shape, where)
        if t.name in inputs:
            raise InvalidArgument(f"{where}: the input is given twice")
        if in_shm and t.name in in_shm:
            if t.HasField("contents"):
                raise InvalidArgument(f"{where}: contents field must not be specified for an input in shared memory")
            inputs[t.name] = SharedTensor(in_shm[t.name], dtype, shape)  # type: ignore[assignment]
        elif raw:
            inputs[t.name] = array_from_raw(raw[ri], dtype, shape, where)
            ri += 1
        else:
            inputs[t.name] = array_from_contents(t, dtype, shape, where)
    request = InferenceRequest(
        model_name=model,
        inputs=inputs,
        model_version=parse_version(model, msg.model_version),
        id=msg.id,
        shared_memory=bool(in_shm),
    )
    if msg.parameters:
        params = {k: param_value(v) for k, v in msg.parameters.items()}
        check_request_parameters(model, params, "grpc")
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
                r.shared_memory = shm_ref(r.parameters, f"output '{o.name}' for model '{model}'")
                if r.shared_memory is not None:
                    request.shared_memory = True
            requested.append(r)
        request.requested_outputs = requested
    return request


def tensor_type(datatype: str, shape: Any, where: str) -> tuple[DataType, tuple[int, ...]]:
    """A tensor's wire data type and shape, checked: a known type, no negative dimension."""
    dtype = BY_NAME.get(datatype)
    if dtype is None:
        raise InvalidArgument(f"{where}: {datatype_problem(datatype)}")
    dims = tuple(shape)
    if dims and min(dims) < 0:  # not any(<genexpr>): a generator's resumptions cost more than the check
        raise InvalidArgument(f"{where}: shape {list(dims)} has a negative dimension")
    return dtype, dims


def int_param(model: str, params: dict[str, object], key: str) -> int:
    """A request parameter that must be a non-negative integer (priority, timeout, ...); 0 when absent."""
    value = params.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"model '{model}': request parameter '{key}' must be a non-negative integer, got {value!r}")
    return value


def encode_infer_response(response: InferenceResponse, requested: list[RequestedOutput] | None = None,
                          into: pb.ModelInferResponse | None = None) -> pb.ModelInferResponse:
    """``requested``: the request's outputs; those written to shared memory carry no data here.
    ``into``: an empty message to fill (a stream response's ``infer_response``: no copy of the outputs)."""
    msg = pb.ModelInferResponse() if into is None else into
    msg.model_name, msg.model_version, msg.id = response.model_name, str(response.model_version), response.id
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

"""A frontend worker's gRPC edge: ModelInferRequest -> INFER, RESPONSE -> ModelInferResponse.

The worker does not decode tensors: each ``raw_input_contents`` entry is copied
once, as it is, into the request's input block, and the core makes it a numpy
array in the model's shape while it validates it (one pass, in the core). Only
what needs the protobuf message is done here: matching raw contents to inputs,
turning typed ``contents`` into bytes (rare: tritonclient and perf_analyzer send
raw), and reading parameters into plain values. Outputs come back the same
way: each one's bytes are copied from the output block into
``raw_output_contents``, and the block is freed.
"""

from __future__ import annotations

from typing import Any

from inferd._proto import grpc_service_pb2 as pb
from inferd.dtypes import encode_bytes
from inferd.errors import InvalidArgument
from inferd.handoff import wire
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.frontends.grpc_codec import mixed_contents, param_value, set_param
from inferd.frontends.parameters import check_request_parameters

SHM_REGION = "shared_memory_region"


def params_of(parameters: Any) -> dict[str, object] | None:
    if not parameters:
        return None
    return {k: param_value(v) for k, v in parameters.items()}


def infer_message(rid: int, msg: pb.ModelInferRequest, inputs: ArenaWriter, flags: int = 0,
                  deadline: float | None = None, trace: dict | None = None,
                  received_ns: int = 0) -> tuple[int, list[Any]]:
    """(input block, INFER message). The block holds the tensors given inline; it is the
    caller's to free once the core's final answer comes (or at once if sending fails).
    ``received_ns``: when the frontend received it (CLOCK_MONOTONIC ns)."""
    model = msg.model_name
    request_params = params_of(msg.parameters)
    if request_params:  # before the input block is taken: a refused request holds none
        check_request_parameters(model, request_params, "grpc")
    raw = msg.raw_input_contents
    tensors: list[list[Any]] = []
    parts: list[bytes] = []
    in_shm = 0
    for t in msg.inputs:
        params = params_of(t.parameters) if t.parameters else None
        if params is not None and SHM_REGION in params:
            in_shm += 1
            if t.HasField("contents"):
                raise InvalidArgument(f"input '{t.name}' for model '{model}': contents field must not be "
                                      "specified for an input in shared memory")
            tensors.append([t.name, t.datatype, list(t.shape), wire.NOT_IN_ARENA, 0, params])
            continue
        if raw:
            if t.HasField("contents"):
                raise InvalidArgument(mixed_contents(t.name, model))
        else:
            parts.append(_contents_bytes(model, t))
        tensors.append([t.name, t.datatype, list(t.shape), None, 0, params])  # placed below
    if raw:
        if len(raw) != len(tensors) - in_shm:
            raise InvalidArgument(
                f"model '{model}': {len(raw)} raw_input_contents for {len(tensors) - in_shm} inputs"
                + (" not in shared memory" if in_shm else "") + "; give one raw content per input, in order")
        parts = list(raw)
    block = wire.NO_BLOCK
    if parts:
        block, offsets = inputs.put(parts)
        i = 0
        for t in tensors:
            if t[wire.T_OFFSET] is None:
                t[wire.T_OFFSET] = offsets[i]
                t[wire.T_NBYTES] = len(parts[i])
                i += 1
    outputs = None
    if msg.outputs:
        outputs = [[o.name, params_of(o.parameters)] for o in msg.outputs]
    message = [wire.INFER, rid, model, msg.model_version, msg.id, request_params, tensors,
               outputs, flags, deadline, trace, received_ns, None]  # None: not a /v1 request
    return block, message


def _contents_bytes(model: str, t: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """Typed ``contents`` as the bytes raw contents would have carried."""
    from inferd.frontends.grpc_codec import array_from_contents, tensor_type

    where = f"input '{t.name}' for model '{model}'"
    dtype, shape = tensor_type(t.datatype, t.shape, where)
    array = array_from_contents(t, dtype, shape, where)
    return encode_bytes(array) if dtype.name == "BYTES" else array.tobytes()


def fill_response(msg: pb.ModelInferResponse, reply: list[Any], outputs: Arena) -> None:
    """Fill the wire response from a RESPONSE message; the caller releases its block after (InFlight.release)."""
    msg.model_name = reply[wire.R_MODEL]
    msg.model_version = str(reply[wire.R_VERSION])
    msg.id = reply[wire.R_ID]
    raw = msg.raw_output_contents
    add = msg.outputs.add
    read = outputs.read
    for name, datatype, shape, offset, nbytes in reply[wire.R_OUTPUTS]:
        out = add()
        out.name = name
        out.datatype = datatype
        out.shape.extend(shape)
        # An output written to the client's shared memory still gets its (empty) raw entry,
        # as Triton does, so raw contents stay aligned with outputs by index.
        raw.append(read(offset, nbytes) if offset != wire.NOT_IN_ARENA else b"")
    params = reply[wire.R_PARAMS]
    if params:
        for key, value in params.items():
            set_param(msg.parameters[key], value)

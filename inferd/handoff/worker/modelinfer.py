"""A frontend worker's gRPC edge: ModelInferRequest -> Infer, Response -> ModelInferResponse.

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
from inferd.facade import TraceCarrier
from inferd.frontends.grpc_codec import mixed_contents, param_value, set_param
from inferd.frontends.parameters import check_request_parameters
from inferd.handoff.messages import NOT_IN_ARENA, Infer, InputTensor, OutputRequest, Response
from inferd.handoff.worker.core_link import CoreLink
from inferd.ipc.arena import Arena

SHM_REGION = "shared_memory_region"


def params_of(parameters: Any) -> dict[str, object] | None:
    if not parameters:
        return None
    return {k: param_value(v) for k, v in parameters.items()}


def infer_message(link: CoreLink, msg: pb.ModelInferRequest, deadline: float | None = None,
                  trace_carrier: TraceCarrier | None = None, received_ns: int = 0) -> tuple[int, Infer]:
    """(input block, Infer) for a ModelInferRequest, built by :meth:`CoreLink.infer` (its input
    block holds the tensors given inline: see there). ``received_ns``: when the frontend received
    it (CLOCK_MONOTONIC ns)."""
    model = msg.model_name
    request_params = params_of(msg.parameters)
    if request_params:  # before the input block is taken: a refused request holds none
        check_request_parameters(model, request_params, "grpc")
    raw = msg.raw_input_contents
    tensors: list[InputTensor] = []
    placed: list[InputTensor] = []  # the inputs whose bytes go into the block
    parts: list[bytes] = []
    for t in msg.inputs:
        params = params_of(t.parameters) if t.parameters else None
        if params is not None and SHM_REGION in params:
            if t.HasField("contents"):
                raise InvalidArgument(f"input '{t.name}' for model '{model}': contents field must not be "
                                      "specified for an input in shared memory")
            tensors.append(InputTensor(t.name, t.datatype, list(t.shape), NOT_IN_ARENA, 0, params))
            continue
        if raw:
            if t.HasField("contents"):
                raise InvalidArgument(mixed_contents(t.name, model))
        else:
            parts.append(_contents_bytes(model, t))
        tensor = InputTensor(t.name, t.datatype, list(t.shape), NOT_IN_ARENA, 0, params)  # placed by link.infer
        tensors.append(tensor)
        placed.append(tensor)
    if raw:
        if len(raw) != len(placed):
            in_shm = len(tensors) - len(placed)
            raise InvalidArgument(
                f"model '{model}': {len(raw)} raw_input_contents for {len(placed)} inputs"
                + (" not in shared memory" if in_shm else "") + "; give one raw content per input, in order")
        parts = list(raw)
    outputs = None
    if msg.outputs:
        outputs = [OutputRequest(o.name, params_of(o.parameters)) for o in msg.outputs]
    return link.infer(model, msg.model_version, msg.id, request_params, tensors, outputs, 0, deadline,
                      received_ns, None, trace_carrier, placed, parts, "grpc", 0)  # None: not a /v1 request


def _contents_bytes(model: str, t: pb.ModelInferRequest.InferInputTensor) -> bytes:
    """Typed ``contents`` as the bytes raw contents would have carried."""
    from inferd.frontends.grpc_codec import array_from_contents, tensor_type

    where = f"input '{t.name}' for model '{model}'"
    dtype, shape = tensor_type(t.datatype, t.shape, where)
    array = array_from_contents(t, dtype, shape, where)
    return encode_bytes(array) if dtype.name == "BYTES" else array.tobytes()


def fill_response(msg: pb.ModelInferResponse, reply: Response, outputs: Arena) -> None:
    """Fill the wire response from a Response message; the caller releases its block after (InFlight.release)."""
    msg.model_name = reply.model
    msg.model_version = str(reply.version)
    msg.id = reply.id
    raw = msg.raw_output_contents
    add = msg.outputs.add
    read = outputs.read
    for o in reply.outputs:
        out = add()
        out.name = o.name
        out.datatype = o.datatype
        out.shape.extend(o.shape)
        # An output written to the client's shared memory still gets its (empty) raw entry,
        # as Triton does, so raw contents stay aligned with outputs by index.
        raw.append(read(o.offset, o.nbytes) if o.offset != NOT_IN_ARENA else b"")
    params = reply.parameters
    if params:
        for key, value in params.items():
            set_param(msg.parameters[key], value)

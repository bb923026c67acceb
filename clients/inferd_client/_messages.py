"""Plain data in and out of the client, and the one place that turns it into
protobuf (``build_request``) and back (``decode_response``, the metadata views)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Union

import grpc
import numpy as np

from inferd_client._proto import grpc_service_pb2 as pb
from inferd_client._tensors import datatype_of, deserialize, element_count, from_contents, serialize

ParameterValue = Union[bool, int, float, str]


class InferError(Exception):
    """A request the server refused or could not run. ``code`` is the gRPC status (over HTTP
    the one of the same meaning, the HTTP status itself in ``http_status``; None for an
    error inside a stream, which carries only a message)."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None, http_status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.http_status = http_status

    def __str__(self) -> str:
        return f"[{self.code.name}] {self.message}" if self.code is not None else self.message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> "InferError":
        return cls(error.details() or str(error), error.code())  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class ShmInput:
    """An input whose data lies in a registered system shared memory region."""

    region: str  # the name it was registered under
    datatype: str
    shape: Sequence[int]
    byte_size: int
    offset: int = 0


@dataclass(frozen=True, slots=True)
class Output:
    """A requested output; with ``region`` the server writes it into that shared memory
    region instead of the response. ``class_count`` asks for top-k classification."""

    name: str
    region: str | None = None
    byte_size: int = 0
    offset: int = 0
    class_count: int = 0


Inputs = Mapping[str, "np.ndarray | ShmInput"]
Outputs = Sequence["str | Output"]


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RegionStatus:
    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(slots=True)
class InferResult(Mapping[str, np.ndarray]):
    """A response: ``result["OUTPUT0"]`` is a numpy array (read-only; BYTES as an object
    array of ``bytes``). An output written to shared memory has no array here, only
    ``datatypes``/``shapes`` entries telling how to read it from the region."""

    model_name: str
    model_version: str
    id: str
    outputs: dict[str, np.ndarray]
    datatypes: dict[str, str]
    shapes: dict[str, tuple[int, ...]]
    parameters: dict[str, ParameterValue] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.outputs[name]
        except KeyError:
            where = " (it was written to shared memory)" if name in self.datatypes else ""
            raise KeyError(f"no output '{name}' in the response{where}; it has {sorted(self.outputs)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    @property
    def final(self) -> bool:
        """For a decoupled model's stream: whether this is the request's last response."""
        return bool(self.parameters.get("triton_final_response", True))


def _set_param(target: pb.InferParameter, value: ParameterValue) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int):
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    elif isinstance(value, str):
        target.string_param = value
    else:
        raise TypeError(f"a request parameter must be bool, int, float or str, got {type(value).__name__}")


def _param_value(p: pb.InferParameter) -> ParameterValue:
    kind = p.WhichOneof("parameter_choice")
    return getattr(p, kind) if kind else ""


def build_request(
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
) -> pb.ModelInferRequest:
    """A ModelInferRequest. ``priority`` (1 is the highest level, 0 the model's default) and
    ``timeout_us`` (how long the request may wait in the server's queue, where the model's
    queue policy allows an override) go as the protocol's request parameters, as do the
    sequence flags."""
    msg = pb.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    params = dict(parameters or {})
    if priority:
        params["priority"] = priority
    if timeout_us:
        params["timeout"] = timeout_us
    if sequence_id:
        params["sequence_id"] = sequence_id
        params["sequence_start"] = sequence_start
        params["sequence_end"] = sequence_end
    for key, param in params.items():
        _set_param(msg.parameters[key], param)
    for name, value in inputs.items():
        tensor = msg.inputs.add(name=name)
        if isinstance(value, ShmInput):
            tensor.datatype = value.datatype
            tensor.shape.extend(int(d) for d in value.shape)
            _set_param(tensor.parameters["shared_memory_region"], value.region)
            _set_param(tensor.parameters["shared_memory_byte_size"], value.byte_size)
            if value.offset:
                _set_param(tensor.parameters["shared_memory_offset"], value.offset)
            continue
        array = np.asarray(value)
        tensor.datatype = datatype_of(array)
        tensor.shape.extend(array.shape)
        msg.raw_input_contents.append(serialize(array))
    for item in outputs or ():
        out = item if isinstance(item, Output) else Output(item)
        requested = msg.outputs.add(name=out.name)
        if out.region is not None:
            _set_param(requested.parameters["shared_memory_region"], out.region)
            _set_param(requested.parameters["shared_memory_byte_size"], out.byte_size)
            if out.offset:
                _set_param(requested.parameters["shared_memory_offset"], out.offset)
        if out.class_count:
            _set_param(requested.parameters["classification"], out.class_count)
    return msg


def decode_response(msg: pb.ModelInferResponse) -> InferResult:
    arrays: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    raw = msg.raw_output_contents
    for i, out in enumerate(msg.outputs):
        shape = tuple(int(d) for d in out.shape)
        datatypes[out.name] = out.datatype
        shapes[out.name] = shape
        if i >= len(raw):
            arrays[out.name] = from_contents(out.contents, out.datatype, shape)
        elif raw[i] or element_count(shape) == 0:
            arrays[out.name] = deserialize(raw[i], out.datatype, shape)
        # else: the empty placeholder of an output the server wrote to shared memory
    return InferResult(
        model_name=msg.model_name, model_version=msg.model_version, id=msg.id, outputs=arrays,
        datatypes=datatypes, shapes=shapes, parameters={k: _param_value(v) for k, v in msg.parameters.items()},
    )


def decode_stream_response(msg: pb.ModelStreamInferResponse) -> "InferResult | InferError":
    if msg.error_message:
        return InferError(msg.error_message)
    return decode_response(msg.infer_response)


def model_metadata(msg: pb.ModelMetadataResponse) -> ModelMetadata:
    def tensors(items: Sequence[pb.ModelMetadataResponse.TensorMetadata]) -> tuple[TensorMetadata, ...]:
        return tuple(TensorMetadata(t.name, t.datatype, tuple(int(d) for d in t.shape)) for t in items)

    return ModelMetadata(msg.name, tuple(msg.versions), msg.platform, tensors(msg.inputs), tensors(msg.outputs))


def server_metadata(msg: pb.ServerMetadataResponse) -> ServerMetadata:
    return ServerMetadata(msg.name, msg.version, tuple(msg.extensions))


def region_statuses(msg: pb.SystemSharedMemoryStatusResponse) -> dict[str, RegionStatus]:
    return {name: RegionStatus(r.name, r.key, int(r.offset), int(r.byte_size)) for name, r in msg.regions.items()}


@dataclass(frozen=True, slots=True)
class StatDuration:
    """A statistic's count and its total time in nanoseconds."""

    count: int
    ns: int


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    batch_size: int
    compute_input: StatDuration
    compute_infer: StatDuration
    compute_output: StatDuration


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """One model version's statistics (Triton's ModelStatistics). ``inference`` maps success,
    fail, queue, compute_input, compute_infer, compute_output, cache_hit, cache_miss to their
    :class:`StatDuration`."""

    name: str
    version: str
    last_inference: int  # ms since the epoch
    inference_count: int
    execution_count: int
    inference: dict[str, StatDuration]
    batches: tuple[BatchStatistics, ...] = ()


@dataclass(frozen=True, slots=True)
class RepositoryModel:
    """An entry of the repository index: a model (version) and its state (READY, UNAVAILABLE, ...)."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True, slots=True)
class CudaRegionStatus:
    name: str
    device_id: int
    byte_size: int


INFERENCE_STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
                   "cache_hit", "cache_miss")

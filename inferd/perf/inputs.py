"""What to send: the model's inputs (ModelMetadata + ModelConfig), their shapes and data, and the
ModelInferRequest serialized once. Also the ModelStatistics snapshots taken around measurements.

Everything here runs in the controlling process over a synchronous channel; the workers only get
the request bytes.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np

from inferd import dtypes
from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc

from .options import PerfError, PerfOptions, TlsOptions

SERVICE = "inference.GRPCInferenceService"
INFER_PATH = f"/{SERVICE}/ModelInfer"
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", -1),
    ("grpc.max_receive_message_length", -1),
]


@dataclass(frozen=True)
class InputInfo:
    name: str
    datatype: str  # wire name, e.g. "FP32"
    dims: tuple[int, ...]  # from the config, without the batch dimension; -1 = variable


@dataclass
class ModelInfo:
    name: str
    version: str  # as requested ("" = server's choice)
    versions: list[str]
    platform: str
    max_batch_size: int
    inputs: list[InputInfo]
    outputs: list[str] = field(default_factory=list)
    sequence: bool = False  # the config has sequence_batching: requests need sequence ids

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0


# --------------------------------------------------------------------------- server access


class ServerClient:
    """A synchronous channel for the control RPCs (metadata, config, statistics)."""

    def __init__(self, url: str, timeout: float, tls: TlsOptions | None = None,
                 headers: list[tuple[str, str]] | None = None) -> None:
        from .transport import grpc_channel

        self.url = url
        self.timeout = timeout
        self.metadata = tuple(headers or ()) or None
        self.channel = grpc_channel(url, tls, CHANNEL_OPTIONS, aio=False)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)

    def _call(self, method: str, request, what: str):  # type: ignore[no-untyped-def]
        try:
            return getattr(self.stub, method)(request, timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise PerfError(f"{what} failed on {self.url}: {_rpc_text(exc)}") from None

    def register_system_region(self, name: str, key: str, byte_size: int) -> None:
        self._call("SystemSharedMemoryRegister",
                   pb.SystemSharedMemoryRegisterRequest(name=name, key=key, byte_size=byte_size),
                   f"registering system shared memory region '{name}'")

    def unregister_system_region(self, name: str) -> None:
        self._call("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name),
                   f"unregistering system shared memory region '{name}'")

    def register_cuda_region(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._call("CudaSharedMemoryRegister",
                   pb.CudaSharedMemoryRegisterRequest(name=name, raw_handle=raw_handle, device_id=device_id,
                                                      byte_size=byte_size),
                   f"registering CUDA shared memory region '{name}'")

    def unregister_cuda_region(self, name: str) -> None:
        self._call("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name=name),
                   f"unregistering CUDA shared memory region '{name}'")

    def close(self) -> None:
        self.channel.close()

    def check_live(self) -> None:
        try:
            response = self.stub.ServerLive(pb.ServerLiveRequest(), timeout=self.timeout, metadata=self.metadata)
        except grpc.RpcError as exc:
            raise PerfError(f"cannot reach a gRPC inference server at {self.url}: {_rpc_text(exc)}") from None
        if not response.live:
            raise PerfError(f"the server at {self.url} reports that it is not live")

    def model_info(self, name: str, version: str) -> ModelInfo:
        where = f"model '{name}'" + (f" version {version}" if version else "")
        try:
            md = self.stub.ModelMetadata(pb.ModelMetadataRequest(name=name, version=version), timeout=self.timeout,
                                         metadata=self.metadata)
            cfg = self.stub.ModelConfig(pb.ModelConfigRequest(name=name, version=version), timeout=self.timeout,
                                        metadata=self.metadata).config
        except grpc.RpcError as exc:
            raise PerfError(f"{where} is not available on {self.url}: {_rpc_text(exc)}") from None
        config_dims = {t.name: tuple(int(d) for d in t.dims) for t in cfg.input}
        inputs = []
        for t in md.inputs:
            dims = config_dims.get(t.name)
            if dims is None:  # no config entry: derive from the metadata shape
                shape = tuple(int(d) for d in t.shape)
                dims = shape[1:] if cfg.max_batch_size > 0 and shape else shape
            inputs.append(InputInfo(t.name, t.datatype, dims))
        if not inputs:
            raise PerfError(f"{where} on {self.url} has no inputs")
        return ModelInfo(
            name=name, version=version, versions=list(md.versions), platform=md.platform or cfg.backend,
            max_batch_size=int(cfg.max_batch_size), inputs=inputs, outputs=[t.name for t in md.outputs],
            sequence=cfg.HasField("sequence_batching"),
        )

    def statistics(self, name: str, version: str) -> dict[str, int]:
        """Counters of the model (summed over versions when ``version`` is empty)."""
        try:
            response = self.stub.ModelStatistics(
                pb.ModelStatisticsRequest(name=name, version=version), timeout=self.timeout, metadata=self.metadata
            )
        except grpc.RpcError as exc:
            raise PerfError(f"ModelStatistics for model '{name}' failed on {self.url}: {_rpc_text(exc)}") from None
        total = dict.fromkeys(STAT_FIELDS, 0)
        for ms in response.model_stats:
            if ms.name != name:
                continue
            total["inference_count"] += ms.inference_count
            total["execution_count"] += ms.execution_count
            st = ms.inference_stats
            for key in DURATIONS:
                d = getattr(st, key)
                total[f"{key}_count"] += d.count
                total[f"{key}_ns"] += d.ns
        return total


DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
STAT_FIELDS = ("inference_count", "execution_count") + tuple(
    f"{k}_{unit}" for k in DURATIONS for unit in ("count", "ns")
)


def _rpc_text(exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return f"{code.name if code else 'ERROR'}: {details}"


# --------------------------------------------------------------------------- shapes and data


def _numpy_dtype(inp: InputInfo) -> np.dtype:
    dt = dtypes.BY_NAME.get(inp.datatype)
    if dt is None or dt.numpy is None:
        raise PerfError(f"input '{inp.name}' has data type {inp.datatype}, which inferd perf cannot generate")
    return dt.numpy


def _check_row_shape(model: ModelInfo, inp: InputInfo, shape: tuple[int, ...], source: str) -> tuple[int, ...]:
    if len(shape) != len(inp.dims) or any(d != -1 and d != s for d, s in zip(inp.dims, shape)):
        raise PerfError(
            f"{source} gives input '{inp.name}' of model '{model.name}' the shape {list(shape)}, "
            f"but the model's dims are {list(inp.dims)} (without the batch dimension)"
        )
    return shape


def resolve_shapes(model: ModelInfo, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...] | None]:
    """Row shapes (without the batch dimension) per input; None where still variable."""
    names = [i.name for i in model.inputs]
    unknown = sorted(set(shapes) - set(names))
    if unknown:
        raise PerfError(f"--shape names {', '.join(repr(u) for u in unknown)}, not an input of model "
                        f"'{model.name}' (inputs: {', '.join(names)})")
    out: dict[str, tuple[int, ...] | None] = {}
    for inp in model.inputs:
        if inp.name in shapes:
            out[inp.name] = _check_row_shape(model, inp, shapes[inp.name], f"--shape {inp.name}")
        elif any(d < 0 for d in inp.dims):
            out[inp.name] = None
        else:
            out[inp.name] = inp.dims
    return out


def _variable_error(model: ModelInfo, inp: InputInfo) -> PerfError:
    return PerfError(
        f"input '{inp.name}' of model '{model.name}' has variable dims {list(inp.dims)}: give its shape "
        f"with --shape {inp.name}:" + ",".join("N" if d < 0 else str(d) for d in inp.dims)
    )


def _generate(inp: InputInfo, shape: tuple[int, ...], kind: str, rng: np.random.Generator,
              string_length: int) -> np.ndarray:
    dtype = _numpy_dtype(inp)
    if inp.datatype == "BYTES":
        count = int(np.prod(shape, dtype=np.int64))
        if kind == "zero":
            values = [b"0"] * count
        else:
            letters = rng.integers(97, 123, size=(count, string_length), dtype=np.uint8)
            values = [row.tobytes() for row in letters]
        array = np.empty(count, dtype=object)
        array[:] = values
        return array.reshape(shape)
    if kind == "zero":
        return np.zeros(shape, dtype=dtype)
    if inp.datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    if dtype.kind in "iu":
        return rng.integers(0, 64, size=shape).astype(dtype)
    return rng.random(size=shape, dtype=np.float32).astype(dtype)


def _from_values(inp: InputInfo, values: object, where: str) -> np.ndarray:
    dtype = _numpy_dtype(inp)
    if inp.datatype == "BYTES":
        flat = np.asarray(values, dtype=object).reshape(-1)
        out = np.empty(flat.size, dtype=object)
        for i, v in enumerate(flat):
            out[i] = v.encode() if isinstance(v, str) else bytes(v)
        return out.reshape(np.shape(values))
    try:
        return np.asarray(values, dtype=dtype)
    except (ValueError, TypeError) as exc:
        raise PerfError(f"{where}: values are not {inp.datatype}: {exc}") from None


def _load_file(path: Path, model: ModelInfo) -> list[dict[str, tuple[np.ndarray, tuple[int, ...] | None]]]:
    """Steps of data: per input (array, explicit row shape or None)."""
    by_name = {i.name: i for i in model.inputs}
    if not path.exists():
        raise PerfError(f"--input-data {path}: no such file (or use random / zero)")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except Exception as exc:
            raise PerfError(f"--input-data {path}: cannot read it as .npz: {exc}") from None
        step = {}
        for key, array in arrays.items():
            if key not in by_name:
                raise PerfError(f"--input-data {path} has array '{key}', not an input of model '{model.name}' "
                                f"(inputs: {', '.join(by_name)})")
            if by_name[key].datatype == "BYTES":
                array = _from_values(by_name[key], array.tolist(), f"--input-data {path} '{key}'")
            step[key] = (array, None)
        return [step]
    if path.suffix != ".json":
        raise PerfError(f"--input-data {path}: expected random, zero, a .json or a .npz file")
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PerfError(f"--input-data {path}: cannot read it as JSON: {exc}") from None
    entries = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise PerfError(f"--input-data {path}: expected {{\"data\": [{{\"INPUT\": [...]}}, ...]}} with at least one entry")
    if all(isinstance(e, list) for e in entries):
        # perf_analyzer's streams ({"data": [[step, ...], ...]}, for sequence models): the steps
        # of every stream in order, one after the other
        entries = [step for stream in entries for step in stream]
        if not entries:
            raise PerfError(f"--input-data {path}: its streams have no steps")
    steps = []
    for n, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise PerfError(f"--input-data {path}: data[{n}] is not an object of input name -> values "
                            "(give a list of such objects, or a list of lists of them for streams)")
        step = {}
        for key, value in entry.items():
            where = f"--input-data {path} data[{n}]['{key}']"
            inp = by_name.get(key)
            if inp is None:
                raise PerfError(f"--input-data {path} data[{n}] names '{key}', not an input of model "
                                f"'{model.name}' (inputs: {', '.join(by_name)})")
            shape = None
            if isinstance(value, dict):
                if "shape" in value:
                    shape = tuple(int(d) for d in value["shape"])
                if "b64" in value:
                    raw = base64.b64decode(value["b64"])
                    if inp.datatype == "BYTES":
                        raise PerfError(f"{where}: b64 data for BYTES inputs is not supported; give strings")
                    array = np.frombuffer(raw, dtype=_numpy_dtype(inp))
                elif "content" in value:
                    array = _from_values(inp, value["content"], where)
                else:
                    raise PerfError(f"{where}: expected a list, or an object with 'content' or 'b64'")
            else:
                array = _from_values(inp, value, where)
            step[key] = (array, shape)
        steps.append(step)
    return steps


def _fit(model: ModelInfo, inp: InputInfo, array: np.ndarray, row: tuple[int, ...] | None,
         explicit: tuple[int, ...] | None, batch: int, where: str) -> np.ndarray:
    """Reshape file data to the request shape; a single row is repeated over the batch."""
    if row is None:  # variable dims, no --shape: the data must say
        if explicit is not None:
            row = _check_row_shape(model, inp, explicit, where)
        elif array.ndim == len(inp.dims) + 1 and model.batching:
            if array.shape[0] != batch:
                raise PerfError(f"{where}: the array's first (batch) dimension is {array.shape[0]}, but -b is {batch}")
            row = _check_row_shape(model, inp, tuple(array.shape[1:]), where)
        elif array.ndim == len(inp.dims) and (array.ndim > 0 or not inp.dims):
            row = _check_row_shape(model, inp, tuple(array.shape), where)
        else:
            raise _variable_error(model, inp)
    full = (batch, *row) if model.batching else row
    row_size = int(np.prod(row, dtype=np.int64))
    if array.size == int(np.prod(full, dtype=np.int64)):
        return array.reshape(full)
    if model.batching and array.size == row_size:
        return np.broadcast_to(array.reshape(row), full).copy()
    raise PerfError(
        f"{where}: {array.size} values do not fill input '{inp.name}' of shape {list(full)}"
        + (f" (or {row_size} for one row)" if model.batching else "")
    )


def build_inputs(model: ModelInfo, options: PerfOptions) -> list[dict[str, np.ndarray]]:
    """One or more sets of input arrays (one per data step), full shapes including the batch."""
    if model.batching and options.batch_size > model.max_batch_size:
        raise PerfError(f"-b {options.batch_size} exceeds model '{model.name}' max_batch_size {model.max_batch_size}")
    if not model.batching and options.batch_size != 1:
        raise PerfError(f"model '{model.name}' does not batch (max_batch_size 0); -b must be 1")
    rows = resolve_shapes(model, options.shapes)
    kind = options.input_data
    if kind in ("random", "zero"):
        rng = np.random.default_rng(options.seed)
        step = {}
        for inp in model.inputs:
            row = rows[inp.name]
            if row is None:
                raise _variable_error(model, inp)
            full = (options.batch_size, *row) if model.batching else row
            step[inp.name] = _generate(inp, full, kind, rng, options.string_length)
        return [step]
    path = Path(kind)
    steps = []
    for n, raw_step in enumerate(_load_file(path, model)):
        missing = [i.name for i in model.inputs if i.name not in raw_step]
        if missing:
            raise PerfError(f"--input-data {path}" + (f" data[{n}]" if path.suffix == ".json" else "")
                            + f" has no data for input(s) {', '.join(missing)}")
        step = {}
        for inp in model.inputs:
            array, explicit = raw_step[inp.name]
            where = f"--input-data {path}" + (f" data[{n}]" if path.suffix == ".json" else "") + f" '{inp.name}'"
            step[inp.name] = _fit(model, inp, array, rows[inp.name], explicit, options.batch_size, where)
        steps.append(step)
    return steps


@dataclass
class Placement:
    """Where one request's tensors lie with --shared-memory: input name -> (region, offset,
    byte size), output name -> (region, byte size)."""

    inputs: dict[str, tuple[str, int, int]]
    outputs: dict[str, tuple[str, int]]


def raw_bytes(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode()
            parts.append(struct.pack("<I", len(data)))
            parts.append(data)
        return b"".join(parts)
    return np.ascontiguousarray(array).tobytes()


def serialize_requests(model: ModelInfo, steps: list[dict[str, np.ndarray]], options: PerfOptions,
                       placements: "list[Placement] | None" = None) -> list[bytes]:
    """ModelInferRequest bytes, built once; the workers send them as they are. With
    ``placements`` (--shared-memory) the tensors are named by region instead of carried."""
    datatype = {i.name: i.datatype for i in model.inputs}
    out = []
    for n, step in enumerate(steps):
        request = pb.ModelInferRequest(model_name=model.name, model_version=options.version)
        for name, array in step.items():
            tensor = request.inputs.add()
            tensor.name = name
            tensor.datatype = datatype[name]
            tensor.shape.extend(int(d) for d in array.shape)
            if placements is None:
                request.raw_input_contents.append(raw_bytes(array, datatype[name]))
                continue
            region, offset, size = placements[n].inputs[name]
            tensor.parameters["shared_memory_region"].string_param = region
            tensor.parameters["shared_memory_byte_size"].int64_param = size
            if offset:
                tensor.parameters["shared_memory_offset"].int64_param = offset
        if placements is not None:
            for name, (region, size) in placements[n].outputs.items():
                wanted = request.outputs.add(name=name)
                wanted.parameters["shared_memory_region"].string_param = region
                wanted.parameters["shared_memory_byte_size"].int64_param = size
        if options.priority is not None:
            request.parameters["priority"].int64_param = options.priority
        if options.timeout_us is not None:
            request.parameters["timeout"].int64_param = options.timeout_us
        out.append(request.SerializeToString())
    return out

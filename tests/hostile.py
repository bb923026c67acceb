"""Hostile inference requests, generated with hypothesis, for both protocols (issue 16, item 4).

Shared by tests/test_hostile_input.py (10,000 of each through the decoders and the data plane in
one process, and a sample over the wire) and bench/scenarios/hostile_input.py (10,000 of each over the
wire, recorded in bench/RESULTS.md). What they try: wrong byte sizes, shapes whose element count
overflows 64 bits, negative and huge dimensions, duplicate tensor names, BYTES framing that lies,
deep or malformed JSON, huge parameter maps, shared-memory offsets and sizes past a region, names
with path separators and NULs, unknown data types, typed contents out of range, lying
Inference-Header-Content-Length and binary_data_size values.

The repository they target (:func:`build_repository`) holds every kind of model the server runs on
this path: ONNX with and without batching, BYTES, fixed dims, and a Python model.
"""

from __future__ import annotations

import json
import random
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from inferd.dtypes import BY_NAME

REGION = "fuzz_region"  # a registered shared-memory region of REGION_BYTES bytes
REGION_BYTES = 64
MODELS = ["simple", "identity_fp32", "simple_string", "fixed23", "pyid"]
NAMES = MODELS + ["../simple", "simple/../../etc/passwd", "/etc/passwd", "", "nope", "simple\x00", "x" * 300,
                  "a/b", "..", "%2e%2e", "simple\n"]

PY_IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''


def build_repository(repo: Path) -> Path:
    from inferd.examples import onnx_models as om
    from repo_builder import add_model, config

    io16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
    out16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
    add_model(repo, "simple", om.add_sub(np.int32, 16, batch=True), config("simple", io16, out16, 8,
                                                                            extra="dynamic_batching { }\n"))
    add_model(repo, "identity_fp32", om.identity(np.float32, [-1], batch=True), config(
        "identity_fp32", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 64,
        extra="dynamic_batching { }\n"))
    add_model(repo, "simple_string", om.identity(object, [16], batch=True), config(
        "simple_string", [("INPUT0", "TYPE_STRING", [16])], [("OUTPUT0", "TYPE_STRING", [16])], 8))
    add_model(repo, "fixed23", om.identity(np.float32, [2, 3], batch=False), config(
        "fixed23", [("INPUT0", "TYPE_FP32", [2, 3])], [("OUTPUT0", "TYPE_FP32", [2, 3])], 0))
    add_model(repo, "pyid", PY_IDENTITY.encode(), config(
        "pyid", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 4, platform=None,
        extra='backend: "python"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n'), filename="model.py")
    return repo


# -- the valid requests the mutations start from ------------------------------------------------------------------
#
# Generation is kept cheap (hypothesis' cost grows with the number of draws and the bytes drawn): a
# request starts valid for one of the models (tensor bytes come from a seeded RNG, not from draws), then
# zero to three mutations apply, each a handful of draws. Most examples so reach the model's checks,
# shared memory, execution and the encoders, not only the first decoder check.

# model -> [(input, datatype, shape without the batch dim)], batching?
TEMPLATES: dict[str, tuple[list[tuple[str, str, list[int]]], bool]] = {
    "simple": ([("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])], True),
    "identity_fp32": ([("INPUT0", "FP32", [-1])], True),
    "simple_string": ([("INPUT0", "BYTES", [16])], True),
    "fixed23": ([("INPUT0", "FP32", [2, 3])], False),
    "pyid": ([("INPUT0", "FP32", [-1])], True),
}
OUTPUTS = {"simple": ["OUTPUT0", "OUTPUT1"]}


def element_count(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= max(d, 0)
    return n


def frames(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def tensor_bytes(dtype: str, shape: list[int], rng: random.Random) -> bytes:
    """Valid raw contents for ``shape`` of ``dtype`` (at most 64 KiB; more is cut)."""
    count = min(element_count(shape), 16384)
    if dtype == "BYTES":
        return frames([rng.randbytes(rng.randint(0, 6)) for _ in range(count)])
    item = BY_NAME[dtype].itemsize if dtype in BY_NAME else 4
    return rng.randbytes(count * item)


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: list[int]
    raw: bytes | None = None  # None: typed contents / JSON data
    params: dict[str, Any] = field(default_factory=dict)
    data: Any = None  # HTTP: the JSON data when there is no raw


@dataclass
class Request:
    model: str
    version: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    extra_raw: list[bytes] = field(default_factory=list)
    typed: bool = False  # gRPC: typed contents instead of raw


def valid(model: str, rng: random.Random) -> Request:
    specs, batching = TEMPLATES[model]
    rows = rng.randint(1, 4)
    request = Request(model)
    for name, dtype, dims in specs:
        shape = ([rows] if batching else []) + [rng.randint(1, 8) if d == -1 else d for d in dims]
        request.inputs.append(Tensor(name, dtype, shape, tensor_bytes(dtype, shape, rng)))
    return request


HUGE = [2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62, 2**63 - 1]
OFFSETS = [0, 4, 8, 60, 63, 64, 65, -1, -64, *HUGE]
BAD_VALUES: list[Any] = [True, False, -1, 0, 1, 7, 2**31, 2**63 - 1, -(2**63), 1.5, float("nan"), "", "1", "x" * 64,
                         "\x00"]


def _shm(rng: random.Random) -> dict[str, Any]:
    out: dict[str, Any] = {"shared_memory_region": rng.choice([REGION, REGION, REGION, "nope", "", "../" + REGION])}
    if rng.random() < 0.8:
        out["shared_memory_offset"] = rng.choice(OFFSETS)
    if rng.random() < 0.9:
        out["shared_memory_byte_size"] = rng.choice(OFFSETS + [16, 24, 32, 64, "16"])
    return out


def _mutate(request: Request, how: int, rng: random.Random) -> None:
    """One of the hostile changes (``how`` picks it)."""
    tensors = request.inputs
    t = rng.choice(tensors) if tensors else None
    if how == 0 and t is not None:  # wrong byte size
        if t.raw is not None:
            t.raw = t.raw[: max(0, len(t.raw) - rng.randint(1, 5))] if rng.random() < 0.5 else \
                t.raw + rng.randbytes(rng.randint(1, 5))
    elif how == 1 and t is not None:  # a shape whose count overflows, or negative / huge / empty dims
        t.shape = rng.choice([[2**62, 2**62], [2**63 - 1, 2], [-1, 16], [0, 16], [2**31, 2**31, 2**31], [],
                              [1, 0, 2**63 - 1], [rng.randint(-3, 40) for _ in range(rng.randint(1, 7))]])
    elif how == 2 and t is not None:  # the wrong or an unknown data type
        t.datatype = rng.choice(sorted(BY_NAME) + ["", "FP8", "int32", "TYPE_FP32", "STRING", "BYTES\n"])
    elif how == 3 and t is not None:  # the same name twice
        tensors.append(Tensor(t.name, t.datatype, list(t.shape), t.raw))
    elif how == 4 and tensors:  # one input missing
        tensors.pop(rng.randrange(len(tensors)))
    elif how == 5 and t is not None:  # a name that is not the model's (or leads somewhere else)
        t.name = rng.choice(["INPUT9", "", "../INPUT0", "INPUT0\x00", "OUTPUT0", "input0", "x" * 200, "a/b"])
    elif how == 6 and t is not None:  # BYTES framing that lies
        t.datatype = "BYTES"
        claimed = rng.choice([5, 100, 2**31, 2**32 - 1])
        t.raw = frames([b"ok"] * min(max(0, element_count(t.shape) - 1), 4096)) + struct.pack("<I", claimed) + b"ab"
    elif how == 7 and t is not None:  # the tensor in shared memory, with offsets and sizes in and past the region
        t.params.update(_shm(rng))
        if rng.random() < 0.7:
            t.raw = None
    elif how == 8:  # outputs asked for: unknown ones, classification, shared memory, binary flags
        names = OUTPUTS.get(request.model, ["OUTPUT0"]) + ["nope", "", "INPUT0", "../OUTPUT0"]
        params: dict[str, Any] = {}
        if rng.random() < 0.5:
            params["classification"] = rng.choice([0, 1, 3, 40, -2, 2**40, "3"])
        if rng.random() < 0.4:
            params.update(_shm(rng))
        if rng.random() < 0.3:
            params["binary_data"] = rng.choice(BAD_VALUES)
        request.outputs.append((rng.choice(names), params))
    elif how == 9:  # request parameters inferd reads, with hostile values
        key = rng.choice(["priority", "timeout", "sequence_id", "sequence_start", "sequence_end",
                          "binary_data_output", "triton_enable_empty_final_response"])
        request.params[key] = rng.choice(BAD_VALUES)
    elif how == 10:  # a huge parameter map
        target = t.params if t is not None and rng.random() < 0.3 else request.params
        target.update({f"junk_{i}": i for i in range(rng.choice([64, 256, 1024]))})
    elif how == 11:  # a version that is no number
        request.version = rng.choice(["-1", "abc", "0x10", "99999999999999999999", "1.5", "\x00", "7", " 1"])
    elif how == 12:  # more raw contents than inputs
        request.extra_raw.append(rng.randbytes(rng.randint(0, 16)))
    elif how == 13:  # typed contents instead of raw (counts and ranges may not fit)
        request.typed = True
    elif how == 14:  # a model name with path separators, NULs, or none at all
        request.model = rng.choice(["../simple", "simple/../../etc/passwd", "/etc/passwd", "", "nope", "simple\x00",
                                    "x" * 300, "a/b", "..", "%2e%2e", "simple\n"])
    elif how == 15 and t is not None:  # a huge tensor that is nothing but zeros on the wire
        t.shape = [1, 1 << 18] if request.model != "fixed23" else [2, 3]
        t.raw = bytes(4 * element_count(t.shape)) if t.datatype != "BYTES" else t.raw


MUTATIONS = 16


@st.composite
def requests(draw: Any) -> Request:
    """A request: valid for one model, then up to three hostile changes."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    request = valid(draw(st.sampled_from(sorted(TEMPLATES))), rng)
    for how in draw(st.lists(st.integers(0, MUTATIONS - 1), max_size=3)):
        _mutate(request, how, rng)
    return request


# -- gRPC -------------------------------------------------------------------------------------------------------


def _set_param(target: Any, value: Any) -> None:
    if isinstance(value, bool):
        target.bool_param = value
    elif isinstance(value, int) and -(2**63) <= value < 2**63:
        target.int64_param = value
    elif isinstance(value, float):
        target.double_param = value
    else:
        target.string_param = str(value)


def _typed(contents: Any, t: Tensor, rng: random.Random) -> None:
    n = min(element_count(t.shape), 256) + rng.choice([-1, 0, 0, 0, 1])
    n = max(n, 0)
    d = t.datatype
    if d in ("INT8", "INT16", "INT32"):
        contents.int_contents.extend(rng.randint(-(2**31), 2**31 - 1) if rng.random() < 0.1 else rng.randint(-9, 9)
                                     for _ in range(n))
    elif d in ("UINT8", "UINT16", "UINT32"):
        contents.uint_contents.extend(rng.randint(0, 2**32 - 1) if rng.random() < 0.1 else rng.randint(0, 9)
                                      for _ in range(n))
    elif d == "INT64":
        contents.int64_contents.extend(rng.randint(-(2**63), 2**63 - 1) for _ in range(n))
    elif d == "UINT64":
        contents.uint64_contents.extend(rng.randint(0, 2**64 - 1) for _ in range(n))
    elif d in ("FP32", "FP16", "BF16"):
        contents.fp32_contents.extend(rng.choice([0.5, -1e38, 3e38, float("inf"), float("nan")]) for _ in range(n))
    elif d == "FP64":
        contents.fp64_contents.extend(rng.random() for _ in range(n))
    elif d == "BOOL":
        contents.bool_contents.extend(rng.random() < 0.5 for _ in range(n))
    else:
        contents.bytes_contents.extend(rng.randbytes(3) for _ in range(n))


def to_grpc(request: Request, seed: int = 0) -> bytes:
    """The request as a serialized ModelInferRequest (inferd's message; the wire is the same)."""
    from inferd._proto import grpc_service_pb2 as pb

    rng = random.Random(seed)
    msg = pb.ModelInferRequest(model_name=request.model, model_version=request.version)
    for key, value in request.params.items():
        _set_param(msg.parameters[key], value)
    for t in request.inputs:
        out = msg.inputs.add(name=t.name, datatype=t.datatype)
        out.shape.extend(t.shape)
        for key, value in t.params.items():
            _set_param(out.parameters[key], value)
        if request.typed:
            _typed(out.contents, t, rng)
        elif t.raw is not None:
            msg.raw_input_contents.append(t.raw)
    if not request.typed:
        msg.raw_input_contents.extend(request.extra_raw)
    for name, params in request.outputs:
        o = msg.outputs.add(name=name)
        for key, value in params.items():
            _set_param(o.parameters[key], value)
    return msg.SerializeToString()


@st.composite
def grpc_requests(draw: Any) -> bytes:
    return to_grpc(draw(requests()), draw(st.integers(0, 2**16)))


# -- HTTP ----------------------------------------------------------------------------------------------------------


def _json_values(t: Tensor, rng: random.Random) -> Any:
    count = min(element_count(t.shape), 4096)
    kind = rng.random()
    if t.datatype == "BYTES":
        flat: list[Any] = ["s%d" % rng.randint(0, 99) for _ in range(count)]
    elif t.datatype == "BOOL":
        flat = [rng.random() < 0.5 for _ in range(count)]
    elif t.datatype.startswith(("INT", "UINT")):
        flat = [rng.randint(-5, 300) for _ in range(count)]
    else:
        flat = [rng.random() for _ in range(count)]
    if kind < 0.15 and flat:  # a value of the wrong kind, or out of range
        flat[rng.randrange(len(flat))] = rng.choice([None, "x", 2**70, -(2**70), 1e308, [1], {"a": 1}, True, 0.5])
    elif kind < 0.25:
        flat = flat[: max(0, len(flat) - rng.randint(1, 3))]
    if rng.random() < 0.5 and len(t.shape) >= 2 and t.shape[-1] > 0 and len(flat) % t.shape[-1] == 0:
        return [flat[i:i + t.shape[-1]] for i in range(0, len(flat), t.shape[-1])]  # nested, row-major
    return flat


def to_http(request: Request, seed: int = 0) -> tuple[str, bytes, dict[str, str]]:
    """(model, body, headers) for POST /v2/models/<model>/infer: JSON data, or binary tensor data."""
    rng = random.Random(seed)
    binary_mode = rng.random() < 0.4
    doc: dict[str, Any] = {}
    if request.params:
        doc["parameters"] = request.params
    binary = b""
    inputs = []
    for t in request.inputs:
        item: dict[str, Any] = {"name": t.name, "datatype": t.datatype, "shape": t.shape}
        params = dict(t.params)
        if "shared_memory_region" not in params:
            if binary_mode and t.raw is not None:
                params["binary_data_size"] = len(t.raw) + rng.choice([0, 0, 0, 0, -1, 3, -(2**40)])
                binary += t.raw
            else:
                item["data"] = _json_values(t, rng)
        if params:
            item["parameters"] = params
        inputs.append(item)
    doc["inputs"] = inputs
    if request.outputs:
        doc["outputs"] = [{"name": n, "parameters": p} if p else {"name": n} for n, p in request.outputs]
    head = json.dumps(doc).encode()
    headers = {"Content-Type": "application/json"}
    if binary_mode:
        length = len(head) if rng.random() < 0.85 else rng.choice([-1, 0, len(head) + 5, 2**40, "abc", "1e3"])
        headers["Inference-Header-Content-Length"] = str(length)
    return request.model, head + binary, headers


def nasty_body(kind: int, rng: random.Random) -> bytes:
    """Bodies no valid request looks like: garbage, deep nesting, not an object, broken JSON."""
    if kind == 0:
        return rng.randbytes(rng.randint(0, 300))
    if kind == 1:
        return ('{"inputs": ' + rng.choice(["[", '{"a":']) * rng.choice([100, 1000, 10_000, 200_000])).encode()
    if kind == 2:
        return json.dumps(rng.choice([None, 1, "x", [1, 2], True, 1e308])).encode()
    if kind == 3:
        return b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3,'
    return b'{"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [NaN]}], "x": ' \
        + b"1" * rng.choice([10, 5000])


@st.composite
def http_bodies(draw: Any) -> tuple[str, bytes, dict[str, str]]:
    """(model name, body, headers) for POST /v2/models/<name>/infer."""
    seed = draw(st.integers(0, 2**32 - 1))
    if draw(st.integers(0, 9)) == 0:
        rng = random.Random(seed)
        return rng.choice(NAMES), nasty_body(draw(st.integers(0, 4)), rng), {"Content-Type": "application/json"}
    return to_http(draw(requests()), seed)

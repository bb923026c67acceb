"""Deterministic builders for small ONNX example/test models.

Every builder returns an :class:`onnx.ModelProto` (opset :data:`OPSET`,
ir_version :data:`IR_VERSION`) built with :mod:`onnx.helper`; random weights
come from ``numpy.random.default_rng(seed)`` so the same arguments always give
byte-identical models.  Nothing is downloaded.

Shapes: ``dims`` is an int or a sequence of ints; ``-1`` means a dynamic
dimension.  With ``batch=True`` a leading symbolic ``"batch"`` dimension is
prepended (Triton's ``max_batch_size > 0`` convention: config dims exclude it).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
# ir_version 9 is understood by onnxruntime >= 1.16; set explicitly so a newer
# onnx package doesn't stamp a version the runtime rejects.
IR_VERSION = 9
PRODUCER = "inferd.examples"

Dims = int | Sequence[int]


# --------------------------------------------------------------------------- helpers


def elem_type(dtype: Any, bfloat16: bool = False) -> int:
    """ONNX ``TensorProto`` element type for a numpy dtype (``object``/``str``/``bytes`` -> STRING).

    ``bfloat16=True`` (or ``dtype="bfloat16"``) gives ``TensorProto.BFLOAT16``; numpy has no bf16.
    """
    if bfloat16 or (isinstance(dtype, str) and dtype.lower() in ("bfloat16", "bf16")):
        return TensorProto.BFLOAT16
    dt = np.dtype(dtype)
    if dt.kind in ("O", "U", "S"):
        return TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(dt)


def _shape(dims: Dims, batch: bool) -> list[int | str]:
    if isinstance(dims, (int, np.integer)):
        dims = [int(dims)]
    shape: list[int | str] = ["batch"] if batch else []
    for i, d in enumerate(dims):
        d = int(d)
        shape.append(f"dim{i}" if d < 0 else d)  # -1 -> named dynamic dim
    return shape


def _vi(name: str, etype: int, dims: Dims, batch: bool) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, etype, _shape(dims, batch))


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def serialize(model: onnx.ModelProto) -> bytes:
    """Deterministic serialization (stable field/map ordering)."""
    return model.SerializeToString(deterministic=True)


def save(model: onnx.ModelProto | bytes, path: str | os.PathLike[str]) -> bool:
    """Write ``model`` to ``path`` atomically, only if the bytes differ.

    Returns True when the file was (re)written, False when it was already identical
    (its mtime is then left untouched).
    """
    data = model if isinstance(model, bytes) else serialize(model)
    return write_bytes_if_changed(path, data)


def write_bytes_if_changed(path: str | os.PathLike[str], data: bytes) -> bool:
    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return False
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True


# --------------------------------------------------------------------------- simple graphs


def add_sub(dtype: Any = np.int32, dims: Dims = 16, batch: bool = True) -> onnx.ModelProto:
    """Triton's "simple": OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    et = elem_type(dtype)
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
        ],
        "add_sub",
        [_vi("INPUT0", et, dims, batch), _vi("INPUT1", et, dims, batch)],
        [_vi("OUTPUT0", et, dims, batch), _vi("OUTPUT1", et, dims, batch)],
    )
    return _model(graph)


def identity(
    dtype: Any = np.float32,
    shape: Dims = -1,
    batch: bool = True,
    name_in: str = "INPUT0",
    name_out: str = "OUTPUT0",
    *,
    bfloat16: bool = False,
) -> onnx.ModelProto:
    """OUTPUT = INPUT for any ONNX dtype (bool, (u)int8..64, fp16/32/64, string via ``object``,
    bfloat16 via ``bfloat16=True`` or ``dtype="bfloat16"``)."""
    et = elem_type(dtype, bfloat16)
    graph = helper.make_graph(
        [helper.make_node("Identity", [name_in], [name_out], name="identity")],
        "identity",
        [_vi(name_in, et, shape, batch)],
        [_vi(name_out, et, shape, batch)],
    )
    return _model(graph)


def scale(
    dims: Dims = 256,
    factor: float = 2.0,
    batch: bool = True,
    name_in: str = "INPUT0",
    name_out: str = "OUTPUT0",
) -> onnx.ModelProto:
    """FP32 OUTPUT = INPUT * factor."""
    f = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    graph = helper.make_graph(
        [helper.make_node("Mul", [name_in, "factor"], [name_out], name="scale")],
        "scale",
        [_vi(name_in, TensorProto.FLOAT, dims, batch)],
        [_vi(name_out, TensorProto.FLOAT, dims, batch)],
        initializer=[f],
    )
    return _model(graph)


def relu(
    dims: Dims = 256, batch: bool = True, name_in: str = "INPUT0", name_out: str = "OUTPUT0"
) -> onnx.ModelProto:
    """FP32 OUTPUT = max(INPUT, 0)."""
    graph = helper.make_graph(
        [helper.make_node("Relu", [name_in], [name_out], name="relu")],
        "relu",
        [_vi(name_in, TensorProto.FLOAT, dims, batch)],
        [_vi(name_out, TensorProto.FLOAT, dims, batch)],
    )
    return _model(graph)


# --------------------------------------------------------------------------- MLP


def mlp_weights(
    d_in: int = 256, hidden: int = 1024, d_out: int = 256, seed: int = 0
) -> dict[str, np.ndarray]:
    """The float32 weights used by :func:`mlp` / :func:`fused_scale_mlp_relu` for ``seed``.

    W1 [d_in, hidden], b1 [hidden], W2 [hidden, d_out], b2 [d_out]; weights scaled by
    1/sqrt(fan_in), biases small.
    """
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32)
    b1 = (rng.standard_normal(hidden) * 0.01).astype(np.float32)
    w2 = (rng.standard_normal((hidden, d_out)) / np.sqrt(hidden)).astype(np.float32)
    b2 = (rng.standard_normal(d_out) * 0.01).astype(np.float32)
    return {"W1": w1, "b1": b1, "W2": w2, "b2": b2}


def mlp_reference(x: np.ndarray, weights: dict[str, np.ndarray]) -> np.ndarray:
    """Numpy re-implementation of :func:`mlp` (for tests/clients)."""
    h = np.maximum(x.astype(np.float32) @ weights["W1"] + weights["b1"], 0.0)
    return (h @ weights["W2"] + weights["b2"]).astype(np.float32)


def _mlp_nodes(x: str, y: str, prefix: str = "") -> list[onnx.NodeProto]:
    p = prefix
    return [
        helper.make_node("MatMul", [x, "W1"], [p + "h_mm"], name=p + "fc1_matmul"),
        helper.make_node("Add", [p + "h_mm", "b1"], [p + "h_pre"], name=p + "fc1_bias"),
        helper.make_node("Relu", [p + "h_pre"], [p + "h"], name=p + "relu1"),
        helper.make_node("MatMul", [p + "h", "W2"], [p + "y_mm"], name=p + "fc2_matmul"),
        helper.make_node("Add", [p + "y_mm", "b2"], [y], name=p + "fc2_bias"),
    ]


def _initializers(weights: dict[str, np.ndarray]) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(weights[k], k) for k in ("W1", "b1", "W2", "b2")]


def mlp(
    d_in: int = 256,
    hidden: int = 1024,
    d_out: int = 256,
    seed: int = 0,
    batch: bool = True,
    name_in: str = "INPUT0",
    name_out: str = "OUTPUT0",
) -> onnx.ModelProto:
    """FP32 two-layer MLP: (MatMul+Add) -> Relu -> (MatMul+Add), weights from :func:`mlp_weights`."""
    w = mlp_weights(d_in, hidden, d_out, seed)
    graph = helper.make_graph(
        _mlp_nodes(name_in, name_out),
        "mlp",
        [_vi(name_in, TensorProto.FLOAT, d_in, batch)],
        [_vi(name_out, TensorProto.FLOAT, d_out, batch)],
        initializer=_initializers(w),
    )
    return _model(graph)


def fused_scale_mlp_relu(
    d_in: int = 256,
    hidden: int = 1024,
    d_out: int = 256,
    factor: float = 2.0,
    seed: int = 0,
    batch: bool = True,
    name_in: str = "INPUT0",
    name_out: str = "OUTPUT0",
) -> onnx.ModelProto:
    """``relu(mlp(scale(x, factor)))`` as one graph -- the single-model counterpart of a
    scale -> mlp -> relu ensemble; uses the same weights as ``mlp(..., seed=seed)``."""
    w = mlp_weights(d_in, hidden, d_out, seed)
    f = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    nodes = [helper.make_node("Mul", [name_in, "factor"], ["scaled"], name="scale")]
    nodes += _mlp_nodes("scaled", "mlp_out")
    nodes.append(helper.make_node("Relu", ["mlp_out"], [name_out], name="relu_out"))
    graph = helper.make_graph(
        nodes,
        "fused_scale_mlp_relu",
        [_vi(name_in, TensorProto.FLOAT, d_in, batch)],
        [_vi(name_out, TensorProto.FLOAT, d_out, batch)],
        initializer=[f, *_initializers(w)],
    )
    return _model(graph)


# --------------------------------------------------------------------------- stateful sequences


def accumulator(dtype: Any = np.int32, batch: bool = True, name_in: str = "INPUT", name_out: str = "OUTPUT",
                state_in: str = "ACC_IN", state_out: str = "ACC_OUT") -> onnx.ModelProto:
    """A running sum kept in implicit state (``sequence_batching.state``):
    ``OUTPUT = ACC_OUT = INPUT + ACC_IN``. The sequence batcher feeds ACC_OUT back
    as ACC_IN on the sequence's next request and zeros on its START."""
    et = elem_type(dtype)
    graph = helper.make_graph(
        [
            helper.make_node("Add", [name_in, state_in], ["sum"], name="add"),
            helper.make_node("Identity", ["sum"], [name_out], name="output"),
            helper.make_node("Identity", ["sum"], [state_out], name="state"),
        ],
        "accumulator",
        [_vi(name_in, et, 1, batch), _vi(state_in, et, 1, batch)],
        [_vi(name_out, et, 1, batch), _vi(state_out, et, 1, batch)],
    )
    return _model(graph)


def confident(dims: Dims = 16, factor: float = 2.0) -> onnx.ModelProto:
    """The cheap half of a cascade: FP32 OUTPUT0 = INPUT0 * factor and SCORE = max(sigmoid(INPUT0))
    over each row ([batch, 1]): how sure the cheap model is of that row."""
    f = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["INPUT0", "factor"], ["OUTPUT0"], name="scale"),
         helper.make_node("Sigmoid", ["INPUT0"], ["sig"], name="sigmoid"),
         helper.make_node("ReduceMax", ["sig"], ["SCORE"], axes=[1], keepdims=1, name="score")],
        "confident",
        [_vi("INPUT0", TensorProto.FLOAT, dims, True)],
        [_vi("OUTPUT0", TensorProto.FLOAT, dims, True), _vi("SCORE", TensorProto.FLOAT, 1, True)],
        initializer=[f],
    )
    return _model(graph)

"""Issue #2: every KServe v2 data type round-trips through an ONNX identity model,
as raw_input_contents and (where the protocol has a field for it) typed contents."""

from __future__ import annotations

import grpc
import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

# wire name -> (numpy dtype, config enum)
TYPES = {
    "BOOL": (np.bool_, "TYPE_BOOL"),
    "UINT8": (np.uint8, "TYPE_UINT8"),
    "UINT16": (np.uint16, "TYPE_UINT16"),
    "UINT32": (np.uint32, "TYPE_UINT32"),
    "UINT64": (np.uint64, "TYPE_UINT64"),
    "INT8": (np.int8, "TYPE_INT8"),
    "INT16": (np.int16, "TYPE_INT16"),
    "INT32": (np.int32, "TYPE_INT32"),
    "INT64": (np.int64, "TYPE_INT64"),
    "FP16": (np.float16, "TYPE_FP16"),
    "FP32": (np.float32, "TYPE_FP32"),
    "FP64": (np.float64, "TYPE_FP64"),
    "BYTES": (np.object_, "TYPE_STRING"),
    "BF16": (ml_dtypes.bfloat16, "TYPE_BF16"),
}
TYPED_FIELD = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def _model_name(wire: str) -> str:
    return f"identity_{wire.lower()}"


def _sample(wire: str) -> np.ndarray:
    """A [2, 5] batch with the type's extremes."""
    dtype = TYPES[wire][0]
    if wire == "BOOL":
        return np.array([[True, False, True, True, False], [False, False, True, False, True]])
    if wire == "BYTES":
        return np.array([[b"", b"a", b"\x00\x01", "\u00fcber".encode(), b"z" * 300],
                         [b"x", b"yy", b" ", b"tab\t", b"end"]], dtype=np.object_)
    if wire in ("FP16", "FP32", "FP64", "BF16"):
        info = ml_dtypes.finfo(dtype) if wire == "BF16" else np.finfo(dtype)
        return np.array([[0.0, -1.5, float(info.max), float(info.min), float(info.tiny)],
                         [np.inf, -np.inf, 0.25, -0.0, 3.0]]).astype(dtype)
    info = np.iinfo(dtype)
    return np.array([[int(info.min), int(info.max), 0, 1, int(info.max) - 1], [7, 8, 9, 10, 11]], dtype=dtype)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("datatypes")
    for wire, (dtype, enum) in TYPES.items():
        name = _model_name(wire)
        model = om.identity("bfloat16" if wire == "BF16" else dtype, [-1], batch=True)
        add_model(repo, name, model, config(name, [("INPUT0", enum, [-1])], [("OUTPUT0", enum, [-1])], 8))
    # Not batching, with a NaN-carrying float: exercised without a batch dimension.
    add_model(repo, "identity_fp32_nobatch", om.identity(np.float32, [3], batch=False),
              config("identity_fp32_nobatch", [("INPUT0", "TYPE_FP32", [3])], [("OUTPUT0", "TYPE_FP32", [3])], 0))
    with running(repo) as server:
        yield server


def test_every_model_ready(client):
    assert client.is_server_ready() is True
    for wire in TYPES:
        md = client.get_model_metadata(_model_name(wire))
        assert [(t.datatype, list(t.shape)) for t in md.inputs] == [(wire, [-1, -1])]
        assert [(t.datatype, list(t.shape)) for t in md.outputs] == [(wire, [-1, -1])]


def _assert_same(wire: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if wire == "BYTES":
        assert got.tolist() == want.tolist()
    elif wire == "BF16":
        assert got.dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit-exact


@pytest.mark.parametrize("wire", list(TYPES))
def test_raw_round_trip(client, wire):
    x = _sample(wire)
    i = grpcclient.InferInput("INPUT0", list(x.shape), wire)
    i.set_data_from_numpy(x)
    result = client.infer(_model_name(wire), [i])
    out = result.get_output("OUTPUT0")
    assert out.datatype == wire
    assert list(out.shape) == [2, 5]
    _assert_same(wire, result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("wire", [w for w in TYPES if w in TYPED_FIELD])
def test_typed_contents_round_trip(stub, wire):
    x = _sample(wire)
    request = service_pb2.ModelInferRequest(model_name=_model_name(wire))
    t = request.inputs.add(name="INPUT0", datatype=wire, shape=list(x.shape))
    getattr(t.contents, TYPED_FIELD[wire]).extend(x.ravel().tolist())
    response = stub.ModelInfer(request)
    assert response.outputs[0].datatype == wire
    assert list(response.outputs[0].shape) == [2, 5]
    result = grpcclient.InferResult(response)
    _assert_same(wire, result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("wire", ["FP16", "BF16"])
def test_typed_contents_refused_for_types_without_a_field(stub, wire):
    request = service_pb2.ModelInferRequest(model_name=_model_name(wire))
    t = request.inputs.add(name="INPUT0", datatype=wire, shape=[1, 2])
    t.contents.fp32_contents.extend([1.0, 2.0])
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(request)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert wire in exc.value.details() and "raw_input_contents" in exc.value.details()
    assert "INPUT0" in exc.value.details() and _model_name(wire) in exc.value.details()


@pytest.mark.parametrize("wire", ["INT8", "UINT8", "INT16", "UINT16"])
def test_typed_contents_out_of_range(stub, wire):
    """A typed value that does not fit the tensor's type is the client's error, not the server's."""
    request = service_pb2.ModelInferRequest(model_name=_model_name(wire))
    t = request.inputs.add(name="INPUT0", datatype=wire, shape=[1, 2])
    getattr(t.contents, TYPED_FIELD[wire]).extend([1, 70000])
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(request)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "70000" in exc.value.details() and wire in exc.value.details() and "INPUT0" in exc.value.details()


def test_bf16_as_float32_words_is_refused_clearly(client, stub):
    """BF16 data sent as 4-byte float32 words (the old tritonclient habit) has the wrong byte size."""
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    request = service_pb2.ModelInferRequest(model_name="identity_bf16")
    request.inputs.add(name="INPUT0", datatype="BF16", shape=[1, 2])
    request.raw_input_contents.append(x.tobytes())
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(request)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "byte size 8" in exc.value.details() and "BF16" in exc.value.details() and "expecting 4" in exc.value.details()


def test_nan_round_trip(client):
    x = np.array([np.nan, -np.nan, 1.0], dtype=np.float32)
    i = grpcclient.InferInput("INPUT0", [3], "FP32")
    i.set_data_from_numpy(x)
    out = client.infer("identity_fp32_nobatch", [i]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(out.view(np.uint32), x.view(np.uint32))


def test_empty_variable_dimension(client):
    x = np.zeros((2, 0), dtype=np.int32)
    i = grpcclient.InferInput("INPUT0", [2, 0], "INT32")
    i.set_data_from_numpy(x)
    result = client.infer("identity_int32", [i])
    assert list(result.get_output("OUTPUT0").shape) == [2, 0]
    assert result.as_numpy("OUTPUT0").shape == (2, 0)


def test_large_tensor_beyond_grpc_default_limit(client):
    """24 MiB each way: more than gRPC's 4 MiB default message size."""
    x = np.random.default_rng(0).standard_normal((2, 3 * 2**20)).astype(np.float32)
    i = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("identity_fp32", [i]).as_numpy("OUTPUT0"), x)


def test_non_utf8_bytes_refused_clearly(client):
    """onnxruntime string tensors hold UTF-8 text; other bytes get a clear client error."""
    x = np.array([[b"ok", b"\xff\xfe"]], dtype=np.object_)
    i = grpcclient.InferInput("INPUT0", [1, 2], "BYTES")
    i.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("identity_bytes", [i])
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    msg = exc.value.message()
    assert "identity_bytes" in msg and "INPUT0" in msg and "element 1" in msg and "UTF-8" in msg


async def test_aio_round_trip(server):
    client = aioclient.InferenceServerClient(server.url)
    try:
        for wire in ("BOOL", "INT64", "FP16", "BYTES", "BF16"):
            x = _sample(wire)
            i = grpcclient.InferInput("INPUT0", list(x.shape), wire)
            i.set_data_from_numpy(x)
            result = await client.infer(_model_name(wire), [i])
            assert result.get_output("OUTPUT0").datatype == wire
            _assert_same(wire, result.as_numpy("OUTPUT0"), x)
    finally:
        await client.close()

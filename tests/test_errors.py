"""Issue #2: every request error answers with its gRPC status code and a message that
names the model, tensor and value; the server keeps serving good requests afterwards."""

from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

INVALID = grpc.StatusCode.INVALID_ARGUMENT
INT16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def _bad_reshape_model():
    """Reshape [n] -> [3, -1]: fails at run time unless n is a multiple of 3."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["X", "shape"], ["Y"])], "bad_reshape",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [3, "m"])],
        initializer=[numpy_helper.from_array(np.array([3, -1], dtype=np.int64), "shape")],
    )
    return om._model(graph)


def _gather_model():
    """Y = DATA[INDICES] over a 4-element table: an index >= 4 fails at run time."""
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "INDICES"], ["Y"], axis=0)], "gather",
        [helper.make_tensor_value_info("INDICES", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n"])],
        initializer=[numpy_helper.from_array(np.array([10, 20, 30, 40], dtype=np.float32), "table")],
    )
    return om._model(graph)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("errors")
    add_model(repo, "simple", om.add_sub(np.int32, 16, batch=True), config("simple", INT16, OUT16, 8))
    add_model(repo, "strings", om.identity(object, [2], batch=True),
              config("strings", [("INPUT0", "TYPE_STRING", [2])], [("OUTPUT0", "TYPE_STRING", [2])], 4))
    add_model(repo, "bad_reshape", _bad_reshape_model(),
              config("bad_reshape", [("X", "TYPE_FP32", [-1])], [("Y", "TYPE_FP32", [3, -1])], 0))
    add_model(repo, "gather", _gather_model(),
              config("gather", [("INDICES", "TYPE_INT64", [-1])], [("Y", "TYPE_FP32", [-1])], 0))
    # Fails to load: its config names an output the model file does not have.
    add_model(repo, "not_ready", om.add_sub(np.int32, 16, batch=True),
              config("not_ready", INT16, [("OUTPUT9", "TYPE_INT32", [16])], 8))
    with running(repo) as server:
        yield server


def _request(model: str = "simple", rows: int = 1, cols: int = 16, **kw) -> service_pb2.ModelInferRequest:
    """A good raw request for "simple" (before the test breaks it)."""
    request = service_pb2.ModelInferRequest(model_name=model, **kw)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[rows, cols])
        request.raw_input_contents.append(np.ones((rows, cols), dtype=np.int32).tobytes())
    return request


def _fails(stub, request, code: grpc.StatusCode, *words: str) -> str:  # noqa: D103
    with pytest.raises(grpc.RpcError) as exc:
        stub.ModelInfer(request)
    details = exc.value.details()
    assert exc.value.code() == code, details
    for word in words:
        assert word in details, (word, details)
    return details


# -- which model ----------------------------------------------------------------------


def test_unknown_model(stub, client):
    details = _fails(stub, _request("no_such_model"), grpc.StatusCode.NOT_FOUND, "no_such_model")
    assert details.startswith("Request for unknown model")
    for call in (lambda: client.get_model_metadata("no_such_model"), lambda: client.get_model_config("no_such_model")):
        with pytest.raises(InferenceServerException) as exc:
            call()
        assert exc.value.status() == "StatusCode.NOT_FOUND"
        assert exc.value.message().startswith("Request for unknown model") and "no_such_model" in exc.value.message()


def test_unknown_version(stub, client):
    details = _fails(stub, _request(model_version="7"), grpc.StatusCode.NOT_FOUND, "simple", "7")
    assert details.startswith("Request for unknown model")
    with pytest.raises(InferenceServerException) as exc:
        client.get_model_metadata("simple", "7")
    assert exc.value.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("version", ["abc", "-1", "1.0"])
def test_malformed_version(stub, version):
    _fails(stub, _request(model_version=version), INVALID, "simple", f"'{version}'")


def test_model_not_ready(stub, client):
    # The reason the model failed to load travels with the error.
    _fails(stub, _request("not_ready"), grpc.StatusCode.UNAVAILABLE, "not_ready", "OUTPUT9")
    with pytest.raises(InferenceServerException) as exc:
        client.get_model_metadata("not_ready")
    assert exc.value.status() == "StatusCode.UNAVAILABLE" and "not_ready" in exc.value.message()


# -- which inputs ---------------------------------------------------------------------


def test_missing_input(stub):
    request = _request()
    del request.inputs[1]
    del request.raw_input_contents[1]
    _fails(stub, request, INVALID, "simple", "INPUT1", "expected 2 inputs but got 1")


def test_extra_input(stub):
    request = _request()
    request.inputs.add(name="INPUT7", datatype="INT32", shape=[1, 16])
    request.raw_input_contents.append(bytes(64))
    _fails(stub, request, INVALID, "simple", "unexpected inference input 'INPUT7'")


def test_input_given_twice(stub):
    request = _request()
    request.inputs[1].name = "INPUT0"
    _fails(stub, request, INVALID, "simple", "INPUT0", "twice")


def test_raw_contents_count_mismatch(stub):
    request = _request()
    del request.raw_input_contents[1]
    _fails(stub, request, INVALID, "simple", "1 raw_input_contents for 2 inputs")


def test_unknown_requested_output(stub):
    request = _request()
    request.outputs.add(name="OUTPUT5")
    _fails(stub, request, INVALID, "simple", "unexpected inference output 'OUTPUT5'")


# -- types, shapes, sizes -------------------------------------------------------------


def test_wrong_datatype(stub, client):
    request = _request()
    request.inputs[0].datatype = "FP32"
    _fails(stub, request, INVALID, "simple", "INPUT0", "'FP32'", "'INT32'")
    # the same through tritonclient
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [1, 16], "INT64")
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int64))
        inputs.append(i)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INT64" in exc.value.message() and "INT32" in exc.value.message()


def test_unknown_datatype(stub):
    request = _request()
    request.inputs[0].datatype = "FLOAT"
    _fails(stub, request, INVALID, "simple", "INPUT0", "unknown datatype 'FLOAT'")


def test_shape_not_matching_config(stub):
    _fails(stub, _request(cols=15), INVALID, "simple", "INPUT0", "[-1, 16]", "[1, 15]")
    request = _request()
    request.inputs[0].shape[:] = [16]  # no batch dimension
    request.inputs[1].shape[:] = [16]
    _fails(stub, request, INVALID, "simple", "INPUT0", "[16]")


def test_inputs_with_different_batch_sizes(stub):
    request = _request(rows=2)
    request.inputs[1].shape[:] = [1, 16]
    request.raw_input_contents[1] = bytes(64)
    _fails(stub, request, INVALID, "simple", "INPUT1", "batch size 1", "2")


def test_negative_shape(stub):
    request = _request()
    request.inputs[0].shape[:] = [-1, 16]
    _fails(stub, request, INVALID, "simple", "INPUT0", "[-1, 16]", "negative")


def test_byte_size_not_matching_shape(stub):
    request = _request()
    request.raw_input_contents[0] = bytes(60)
    _fails(stub, request, INVALID, "simple", "INPUT0", "60", "64", "[1, 16]")


def _bytes_request(raw: bytes, shape=(1, 2)) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="strings")
    request.inputs.add(name="INPUT0", datatype="BYTES", shape=list(shape))
    request.raw_input_contents.append(raw)
    return request


def _frame(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


@pytest.mark.parametrize("raw,words", [
    (_frame(b"ab") + struct.pack("<I", 10) + b"xyz", ["element 1 claims 10 bytes but only 3 remain"]),
    (_frame(b"ab") + b"\x01\x00", ["ends after 1 of 2 elements"]),
    (_frame(b"ab", b"cd") + b"!", ["1 bytes left over"]),
    (b"", ["ends after 0 of 2 elements"]),
], ids=["overlong", "truncated_prefix", "trailing", "empty"])
def test_malformed_bytes_framing(stub, raw, words):
    _fails(stub, _bytes_request(raw), INVALID, "strings", "INPUT0", "malformed", *words)


def test_raw_and_typed_contents_together(stub):
    request = _request()
    request.inputs[0].contents.int_contents.extend([1] * 16)
    _fails(stub, request, INVALID, "simple", "INPUT0", "contents", "raw_input_contents")


def test_typed_contents_count_mismatch(stub):
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.int_contents.extend([1] * 15)
    _fails(stub, request, INVALID, "simple", "INPUT0", "15 values", "expecting 16")


def test_typed_contents_in_the_wrong_field(stub):
    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        t = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        t.contents.fp32_contents.extend([1.0] * 16)
    _fails(stub, request, INVALID, "simple", "INPUT0", "0 values", "expecting 16")


def test_batch_larger_than_max_batch_size(stub, client):
    _fails(stub, _request(rows=9), INVALID, "simple", "batch-size must be <= 8", "9")
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [12, 16], "INT32")
        i.set_data_from_numpy(np.ones((12, 16), dtype=np.int32))
        inputs.append(i)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "12" in exc.value.message()


@pytest.mark.parametrize("key,value", [("priority", "high"), ("timeout", -5)])
def test_bad_request_parameter(stub, key, value):
    request = _request()
    if isinstance(value, str):
        request.parameters[key].string_param = value
    else:
        request.parameters[key].int64_param = value
    _fails(stub, request, INVALID, "simple", key, str(value))


def test_classification_of_bytes_output(stub):
    request = _bytes_request(_frame(b"a", b"b"))
    out = request.outputs.add(name="OUTPUT0")
    out.parameters["classification"].int64_param = 1
    _fails(stub, request, INVALID, "strings", "OUTPUT0", "BYTES")


def test_shared_memory_tensors_in_unregistered_regions_refused(client):
    """A tensor in a region nobody registered is refused, not read as empty (tests/test_shared_memory.py has the rest)."""
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        inputs.append(i)
    inputs[1].set_shared_memory("region0", 64)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs)
    assert exc.value.status() == "StatusCode.NOT_FOUND"
    assert "INPUT1" in exc.value.message() and "simple" in exc.value.message() and "region0" in exc.value.message()
    inputs[1].set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("region1", 64)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs, outputs=[out])
    assert exc.value.status() == "StatusCode.NOT_FOUND" and "OUTPUT0" in exc.value.message()


# -- the model fails at run time ------------------------------------------------------


def _reshape_request(n: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="bad_reshape")
    request.inputs.add(name="X", datatype="FP32", shape=[n])
    request.raw_input_contents.append(np.arange(n, dtype=np.float32).tobytes())
    return request


def test_model_fails_at_run_time(stub):
    # 6 elements reshape to [3, 2]; 4 cannot.
    response = stub.ModelInfer(_reshape_request(6))
    assert list(response.outputs[0].shape) == [3, 2]
    _fails(stub, _reshape_request(4), grpc.StatusCode.INTERNAL, "bad_reshape")

    request = service_pb2.ModelInferRequest(model_name="gather")
    request.inputs.add(name="INDICES", datatype="INT64", shape=[2])
    request.raw_input_contents.append(np.array([1, 3], dtype=np.int64).tobytes())
    response = stub.ModelInfer(request)
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], dtype=np.float32), [20, 40])
    request.raw_input_contents[0] = np.array([1, 9], dtype=np.int64).tobytes()
    _fails(stub, request, grpc.StatusCode.INTERNAL, "gather")


def test_run_time_failure_is_counted(client, stub):
    before = client.get_inference_statistics("bad_reshape").model_stats[0].inference_stats
    with pytest.raises(grpc.RpcError):
        stub.ModelInfer(_reshape_request(5))
    after = client.get_inference_statistics("bad_reshape").model_stats[0].inference_stats
    assert after.fail.count == before.fail.count + 1
    assert after.success.count == before.success.count


# -- the aio client sees the same -----------------------------------------------------


async def test_aio_errors(server):
    client = aioclient.InferenceServerClient(server.url)
    try:
        i = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        with pytest.raises(InferenceServerException) as exc:
            await client.infer("simple", [i])
        assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "INPUT1" in exc.value.message()
        with pytest.raises(InferenceServerException) as exc:
            await client.infer("nope", [i])
        assert exc.value.status() == "StatusCode.NOT_FOUND"
        assert exc.value.message().startswith("Request for unknown model")
        x = grpcclient.InferInput("X", [4], "FP32")
        x.set_data_from_numpy(np.zeros(4, dtype=np.float32))
        with pytest.raises(InferenceServerException) as exc:
            await client.infer("bad_reshape", [x])
        assert exc.value.status() == "StatusCode.INTERNAL" and "bad_reshape" in exc.value.message()
    finally:
        await client.close()


# -- still serving --------------------------------------------------------------------


def test_server_still_answers_good_requests(stub, client, server):
    """Runs last in this module: after every bad request above, good ones still work."""
    response = stub.ModelInfer(_request(rows=8))
    out = np.frombuffer(response.raw_output_contents[0], dtype=np.int32).reshape(8, 16)
    np.testing.assert_array_equal(out, 2)
    assert client.is_server_live()
    assert client.is_model_ready("simple") and client.is_model_ready("bad_reshape")
    assert server.proc.poll() is None
    assert "Traceback" not in server.log()

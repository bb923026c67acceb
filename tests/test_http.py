"""Issue #7: the KServe v2 HTTP/REST frontend, through tritonclient.http and raw HTTP,
against a real server: every data type as JSON and as binary data (both ways), the
other endpoints, errors with their HTTP status, and perf_analyzer -i http."""

from __future__ import annotations

import gzip
import http.client
import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import ROOT, running
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


def _name(wire: str) -> str:
    return f"identity_{wire.lower()}"


def _sample(wire: str) -> np.ndarray:
    """A [2, 5] batch with the type's extremes (BYTES: UTF-8 text, so JSON can carry it)."""
    dtype = TYPES[wire][0]
    if wire == "BOOL":
        return np.array([[True, False, True, True, False], [False, False, True, False, True]])
    if wire == "BYTES":
        return np.array([[b"", b"a", b"\x00\x01", "\u00fcber".encode(), b"z" * 300],
                         [b"x", b"yy", b" ", b"tab\t", "\u65e5\u672c".encode()]], dtype=np.object_)
    if wire in ("FP16", "FP32", "FP64", "BF16"):
        info = ml_dtypes.finfo(dtype) if wire == "BF16" else np.finfo(dtype)
        return np.array([[0.0, -1.5, float(info.max), float(info.min), float(info.tiny)],
                         [np.inf, -np.inf, 0.25, -0.0, 3.0]]).astype(dtype)
    info = np.iinfo(dtype)
    return np.array([[int(info.min), int(info.max), 0, 1, int(info.max) - 1], [7, 8, 9, 10, 11]], dtype=dtype)


def _same(wire: str, got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape
    if wire == "BYTES":
        # tritonclient gives bytes for binary outputs and str for JSON ones.
        assert [x if isinstance(x, bytes) else x.encode() for x in got.ravel()] == want.ravel().tolist()
    elif wire == "BF16":
        np.testing.assert_array_equal(got.astype(ml_dtypes.bfloat16).view(np.uint16), want.view(np.uint16))
    else:
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit-exact


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("http")
    for wire, (dtype, enum) in TYPES.items():
        name = _name(wire)
        model = om.identity("bfloat16" if wire == "BF16" else dtype, [-1], batch=True)
        add_model(repo, name, model, config(name, [("INPUT0", enum, [-1])], [("OUTPUT0", enum, [-1])], 8))
    add_model(repo, "add_sub", om.add_sub(np.int32, 4, batch=False), config(
        "add_sub", [("INPUT0", "TYPE_INT32", [4]), ("INPUT1", "TYPE_INT32", [4])],
        [("OUTPUT0", "TYPE_INT32", [4]), ("OUTPUT1", "TYPE_INT32", [4])], 0))
    add_model(repo, "broken", None, 'name: "broken"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n',)
    with running(repo) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.close()


def _raw(server, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None):
    """(status, headers, body) of one plain HTTP request."""
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def _error(exc: pytest.ExceptionInfo) -> tuple[str, str]:
    return exc.value.status(), exc.value.message()


# -- health and metadata ---------------------------------------------------------------


def test_health_and_metadata(client, server):
    assert client.is_server_live() is True
    # one model is broken: not ready, as over gRPC
    assert client.is_server_ready() is False
    assert _raw(server, "GET", "/v2/health/ready")[0] == 400
    assert _raw(server, "GET", "/v2/health/live")[0] == 200
    md = client.get_server_metadata()
    assert md["name"] == "triton" and "binary_tensor_data" in md["extensions"]
    assert client.is_model_ready("identity_fp32") is True
    assert client.is_model_ready("identity_fp32", "1") is True
    assert client.is_model_ready("identity_fp32", "2") is False
    assert client.is_model_ready("broken") is False
    for version in ("", "1"):
        meta = client.get_model_metadata("identity_fp32", version)
        assert meta == {"name": "identity_fp32", "versions": ["1"], "platform": "onnxruntime_onnx",
                        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}],
                        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, -1]}]}
    cfg = client.get_model_config("add_sub")
    assert cfg["name"] == "add_sub" and cfg["max_batch_size"] == 0
    assert cfg["input"][0]["dims"] == [4] and cfg["input"][0]["data_type"] == "TYPE_INT32"
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["identity_fp32"] == {"name": "identity_fp32", "version": "1", "state": "READY"}
    assert index["broken"]["state"] == "UNAVAILABLE" and index["broken"]["reason"]
    status, _, body = _raw(server, "POST", "/v2/repository/index", json.dumps({"ready": True}))
    assert status == 200 and "broken" not in {e["name"] for e in json.loads(body)}


def test_statistics_match_requests(client):
    before = client.get_inference_statistics("add_sub")["model_stats"][0]
    x = np.arange(4, dtype=np.int32)
    inputs = [httpclient.InferInput(n, [4], "INT32").set_data_from_numpy(x) for n in ("INPUT0", "INPUT1")]
    for _ in range(3):
        client.infer("add_sub", inputs)
    after = client.get_inference_statistics("add_sub", "1")["model_stats"][0]
    assert after["name"] == "add_sub" and after["version"] == "1"
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 3
    assert after["execution_count"] == before["execution_count"] + 3
    everything = client.get_inference_statistics()["model_stats"]
    assert {s["name"] for s in everything} >= {"add_sub", "identity_fp32"}


# -- inference: every data type, JSON and binary, both ways --------------------------


@pytest.mark.parametrize("binary_out", [True, False], ids=["out-binary", "out-json"])
@pytest.mark.parametrize("binary_in", [True, False], ids=["in-binary", "in-json"])
@pytest.mark.parametrize("wire", list(TYPES))
def test_round_trip(client, wire, binary_in, binary_out):
    if wire == "BF16" and not binary_in:
        pytest.skip("tritonclient refuses BF16 as JSON (test_bf16_json_input sends it by hand)")
    x = _sample(wire)
    i = httpclient.InferInput("INPUT0", list(x.shape), wire)
    i.set_data_from_numpy(x, binary_data=binary_in)
    o = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)
    result = client.infer(_name(wire), [i], outputs=[o])
    out = result.get_output("OUTPUT0")
    assert out["datatype"] == wire and out["shape"] == [2, 5]
    assert ("data" in out) != binary_out
    _same(wire, result.as_numpy("OUTPUT0"), x)
    assert result.get_response()["model_name"] == _name(wire)
    assert result.get_response()["model_version"] == "1"


def test_outputs_default_to_binary_with_tritonclient(client):
    """No outputs named: tritonclient asks for binary_data_output, every output comes back binary."""
    x = np.arange(4, dtype=np.int32)
    inputs = [httpclient.InferInput(n, [4], "INT32").set_data_from_numpy(x) for n in ("INPUT0", "INPUT1")]
    result = client.infer("add_sub", inputs)
    assert [o["parameters"]["binary_data_size"] for o in result.get_response()["outputs"]] == [16, 16]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), 0 * x)


def test_plain_json_request_nested_data(server):
    """A plain JSON body (no binary, no parameters): nested data is taken row-major; JSON comes back."""
    body = {"id": "req-7", "inputs": [
        {"name": "INPUT0", "shape": [2, 3], "datatype": "INT64", "data": [[1, 2, 3], [4, 5, 6]]}]}
    status, headers, content = _raw(server, "POST", "/v2/models/identity_int64/infer", json.dumps(body),
                                    {"Content-Type": "application/json"})
    assert status == 200, content
    assert headers["content-type"].startswith("application/json")
    assert "inference-header-content-length" not in headers
    doc = json.loads(content)
    assert doc["id"] == "req-7" and doc["model_name"] == "identity_int64" and doc["model_version"] == "1"
    assert doc["outputs"] == [{"name": "OUTPUT0", "datatype": "INT64", "shape": [2, 3], "data": [1, 2, 3, 4, 5, 6]}]


def test_versioned_infer_and_mixed_outputs(server):
    """/versions/1/infer; one output binary, one JSON, by request-level default and per-output flag."""
    body = {"parameters": {"binary_data_output": True}, "inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "INT32", "data": [1, 2, 3, 4]},
        {"name": "INPUT1", "shape": [4], "datatype": "INT32", "parameters": {"binary_data_size": 16}}],
        "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1", "parameters": {"binary_data": False}}]}
    head = json.dumps(body).encode()
    raw = np.array([1, 1, 1, 1], dtype=np.int32).tobytes()
    status, headers, content = _raw(server, "POST", "/v2/models/add_sub/versions/1/infer", head + raw,
                                    {"Inference-Header-Content-Length": str(len(head)),
                                     "Content-Type": "application/octet-stream"})
    assert status == 200, content
    assert headers["content-type"] == "application/octet-stream"
    n = int(headers["inference-header-content-length"])
    doc = json.loads(content[:n])
    out0, out1 = doc["outputs"]
    assert out0["parameters"] == {"binary_data_size": 16} and "data" not in out0
    np.testing.assert_array_equal(np.frombuffer(content[n:], dtype=np.int32), [2, 3, 4, 5])
    assert out1["data"] == [0, 1, 2, 3]


def test_bf16_json_input(server):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "BF16", "data": [1.5, -2.0, 0.25]}]}
    status, _, content = _raw(server, "POST", "/v2/models/identity_bf16/infer", json.dumps(body))
    assert status == 200, content
    assert json.loads(content)["outputs"][0]["data"] == [1.5, -2.0, 0.25]


def test_classification(client):
    x = np.array([[0.5, 3.0, -1.0, 2.0, 0.0]], dtype=np.float32)
    i = httpclient.InferInput("INPUT0", list(x.shape), "FP32").set_data_from_numpy(x)
    for binary in (True, False):
        o = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)
        result = client.infer("identity_fp32", [i], outputs=[o])
        assert result.get_output("OUTPUT0")["datatype"] == "BYTES"
        got = [v if isinstance(v, bytes) else v.encode() for v in result.as_numpy("OUTPUT0").ravel()]
        assert got == [b"3.000000:1", b"2.000000:3"]


def test_request_id_priority_and_timeout(client):
    x = np.ones((1, 2), dtype=np.float32)
    i = httpclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(x)
    result = client.infer("identity_fp32", [i], request_id="abc-1", priority=0, timeout=10_000_000)
    assert result.get_response()["id"] == "abc-1"
    with pytest.raises(InferenceServerException) as exc:
        client.infer("identity_fp32", [i], parameters={"x": 1}, priority=-1)  # negative priority
    assert _error(exc)[0] == "400"


def test_compressed_request_and_response(client):
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    for request_algo, response_algo in (("gzip", "deflate"), ("deflate", "gzip")):
        i = httpclient.InferInput("INPUT0", [2, 5], "FP32").set_data_from_numpy(x)
        result = client.infer("identity_fp32", [i], request_compression_algorithm=request_algo,
                              response_compression_algorithm=response_algo)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_response_compressed_only_when_asked(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    status, headers, content = _raw(server, "POST", "/v2/models/identity_fp32/infer", body,
                                    {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["content-encoding"] == "gzip"
    assert json.loads(gzip.decompress(content))["outputs"][0]["data"] == [1.0, 2.0]
    status, headers, _ = _raw(server, "POST", "/v2/models/identity_fp32/infer", body)
    assert status == 200 and "content-encoding" not in headers


def test_large_binary_tensor(client):
    x = np.random.default_rng(0).standard_normal((2, 3 * 2**20)).astype(np.float32)  # 24 MiB each way
    i = httpclient.InferInput("INPUT0", list(x.shape), "FP32").set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("identity_fp32", [i]).as_numpy("OUTPUT0"), x)


# -- errors --------------------------------------------------------------------------


def _infer_status(server, path: str, body: bytes | str, headers: dict | None = None) -> tuple[int, str]:
    status, h, content = _raw(server, "POST", path, body, headers)
    assert h["content-type"].startswith("application/json")
    return status, json.loads(content)["error"]


def test_errors_through_tritonclient(client, server):
    x = np.ones((1, 3), dtype=np.float32)
    fp32 = httpclient.InferInput("INPUT0", [1, 3], "FP32").set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("nope", [fp32])
    assert _error(exc) == ("404", "Request for unknown model: 'nope' is not found")
    with pytest.raises(InferenceServerException) as exc:
        client.infer("identity_fp32", [fp32], model_version="3")
    assert _error(exc)[0] == "404" and "version 3" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.infer("identity_int32", [fp32])
    assert _error(exc)[0] == "400" and "data-type is 'FP32'" in _error(exc)[1] and "INT32" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.infer("add_sub", [httpclient.InferInput("INPUT0", [3], "INT32").set_data_from_numpy(
            np.ones(3, dtype=np.int32))])
    assert _error(exc)[0] == "400" and "INPUT1" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.infer("identity_fp32", [fp32], outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert _error(exc)[0] == "400" and "NOPE" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.infer("broken", [fp32])
    assert _error(exc)[0] == "503" and "broken" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.get_model_metadata("nope")
    assert _error(exc)[0] == "404"
    # model control is off (the default mode): refused as over gRPC, with gRPC's words
    grpc_client = grpcclient.InferenceServerClient(server.url)
    for call in ("load_model", "unload_model"):
        with pytest.raises(InferenceServerException) as exc:
            getattr(client, call)("identity_fp32")
        with pytest.raises(InferenceServerException) as grpc_exc:
            getattr(grpc_client, call)("identity_fp32")
        assert _error(exc) == ("501", grpc_exc.value.message())
    grpc_client.close()
    assert client.get_system_shared_memory_status() == []  # served over HTTP too (test_http_extensions.py)


@pytest.mark.parametrize("body, headers, status, words", [
    ("{not json", None, 400, ["not valid JSON"]),
    ("[1, 2]", None, 400, ["must be an object"]),
    ('{"inputs": 3}', None, 400, ["'inputs' array"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1]}]}', None, 400,
     ["1 values", "expecting 2"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [[1], [2, 3]]}]}', None, 400,
     ["3 values"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, "x"]}]}', None, 400,
     ["must be numbers", "'x'"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FLOAT", "data": [1, 2]}]}', None, 400,
     ["unknown datatype", "FLOAT"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, -2], "datatype": "FP32", "data": []}]}', None, 400,
     ["negative"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32"}]}', None, 400,
     ["neither 'data' nor 'binary_data_size'"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}]}',
     None, 400, ["binary_data_size", "Inference-Header-Content-Length"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}',
     {"Inference-Header-Content-Length": "9999"}, 400, ["Inference-Header-Content-Length", "9999"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2], '
     '"parameters": {"shared_memory_region": "r"}}]}', None, 400, ["'r'", "shared_memory_byte_size", "is required"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "parameters": '
     '{"shared_memory_region": "r", "shared_memory_byte_size": 8}}]}', None, 404, ["'r'", "INPUT0"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], '
     '"parameters": {"timeout": "soon"}}', None, 400, ["timeout"]),
    ('{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}',
     {"Content-Encoding": "br"}, 501, ["br"]),
])
def test_malformed_requests(server, body, headers, status, words):
    got, message = _infer_status(server, "/v2/models/identity_fp32/infer", body, headers)
    assert got == status, message
    for word in words:
        assert word in message


def test_integer_range_and_kind_checked_in_json(server):
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT8", "data": [1, 300]}]}
    status, message = _infer_status(server, "/v2/models/identity_int8/infer", json.dumps(body))
    assert status == 400 and "300" in message and "INT8" in message
    body["inputs"][0]["data"] = [1, 2.5]
    status, message = _infer_status(server, "/v2/models/identity_int8/infer", json.dumps(body))
    assert status == 400 and "integers" in message and "2.5" in message


def test_binary_data_left_over(server):
    head = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                                   "parameters": {"binary_data_size": 8}}]}).encode()
    status, message = _infer_status(server, "/v2/models/identity_fp32/infer", head + bytes(12),
                                    {"Inference-Header-Content-Length": str(len(head))})
    assert status == 400 and "4 bytes of binary data left over" in message


def test_non_utf8_bytes_output_as_json_is_refused_clearly():
    """(In-process: the example ONNX string models refuse non-UTF-8 input, so no server output has it.)"""
    from inferd.errors import InvalidArgument
    from inferd.frontends.http_codec import json_values

    with pytest.raises(InvalidArgument, match="not valid UTF-8.*binary_data"):
        json_values(np.array([b"\xff"], dtype=np.object_), "BYTES", "OUT", "m")


def test_unknown_endpoint_and_method(server):
    status, headers, content = _raw(server, "GET", "/v2/nothing/here")
    assert status == 404 and "error" in json.loads(content)
    status, _, content = _raw(server, "GET", "/v2/models/identity_fp32/infer")
    assert status == 405 and "error" in json.loads(content)
    status, _, content = _raw(server, "GET", "/v2/models/identity_fp32/versions/x")
    assert status == 400 and "version" in json.loads(content)["error"]


def test_model_control_over_http(start_server, tmp_path):
    """Explicit model control through the HTTP routes (when this build has it)."""
    help_text = subprocess.run([sys.executable, "-m", "inferd.cli", "serve", "--help"], capture_output=True,
                               text=True, cwd=ROOT).stdout
    if "--model-control-mode" not in help_text:
        pytest.skip("this build has no explicit model control")
    repo = tmp_path / "repo"
    for name in ("first", "second"):
        add_model(repo, name, om.identity(np.float32, [-1], batch=False),
                  config(name, [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    server = start_server(repo, ["--model-control-mode", "explicit", "--load-model", "first"],
                          log_path=tmp_path / "server.log")
    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_model_ready("first") and not client.is_model_ready("second")
    client.load_model("second")
    assert client.is_model_ready("second")
    x = np.ones(2, dtype=np.float32)
    i = httpclient.InferInput("INPUT0", [2], "FP32").set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer("second", [i]).as_numpy("OUTPUT0"), x)
    client.unload_model("second")
    assert not client.is_model_ready("second")
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("missing")
    assert int(_error(exc)[0]) >= 400
    client.close()


# -- perf_analyzer -i http -----------------------------------------------------------


def test_perf_analyzer_http(example_server, perf_analyzer):
    tool = perf_analyzer
    run = subprocess.run(
        [tool, "-m", "mlp", "-u", example_server.http_url, "-i", "http", "-p", "1000", "--concurrency-range", "2",
         "--max-trials", "4", "--stability-percentage", "200"],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Throughput:" in run.stdout and "Concurrency: 2" in run.stdout, run.stdout
    assert "Traceback" not in example_server.log()

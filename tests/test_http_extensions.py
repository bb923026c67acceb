"""HTTP parity with gRPC for Triton's extensions, through tritonclient.http against a
real server: system shared memory (the same regions as gRPC), CUDA shared memory
(nothing to report, registration refused), trace and log settings, the W3C
traceparent header, stateful sequences (sequence_id / _start / _end) and the
refusal of decoupled models."""

from __future__ import annotations

import http.client
import json
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from conftest import ServerProcess

TRACE_ID = "5bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "10f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture(scope="module")
def traced(example_repository, tmp_path_factory):
    """The example repository, with a trace file (tracing stays off until a test turns it on)."""
    tmp = tmp_path_factory.mktemp("http_ext")
    trace_file = tmp / "trace.jsonl"
    server = ServerProcess(example_repository, ["--trace-config", f"triton,file={trace_file}",
                                                "--trace-config", "rate=1", "--allow-client-shm"], log_path=tmp / "server.log")
    yield server, trace_file
    assert server.stop() == 0, server.log()
    assert "Traceback" not in server.log(), server.log()


@pytest.fixture(scope="module")
def server(traced):
    return traced[0]


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.http_url)
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions():
    made = []

    def make(name: str, size: int):
        handle = shm.create_shared_memory_region(name, f"/inferd_http_{uuid.uuid4().hex[:12]}", size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _raw(server, method: str, path: str, body: str | None = None) -> tuple[int, dict, bytes]:
    host, port = server.http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def _key(handle) -> str:
    return handle._shm_key


def _error(exc: pytest.ExceptionInfo) -> tuple[str, str]:
    return exc.value.status(), exc.value.message()


def _simple_inputs(a: np.ndarray, b: np.ndarray) -> list:
    return [httpclient.InferInput("INPUT0", list(a.shape), "INT32"), httpclient.InferInput("INPUT1", list(b.shape), "INT32")]


# -- system shared memory ----------------------------------------------------------------------


def test_inputs_and_outputs_in_shared_memory(client, regions):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    n = a.nbytes
    ip, op = regions("in", 2 * n), regions("out", 2 * n)
    shm.set_shared_memory_region(ip, [a, b])
    client.register_system_shared_memory("in", _key(ip), 2 * n)
    client.register_system_shared_memory("out", _key(op), 2 * n)
    inputs = _simple_inputs(a, b)
    inputs[0].set_shared_memory("in", n)
    inputs[1].set_shared_memory("in", n, offset=n)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("out", n)
    outputs[1].set_shared_memory("out", n, offset=n)
    result = client.infer("simple", inputs, outputs=outputs)
    for out in result.get_response()["outputs"]:  # the data went to the region: none in the response
        assert out["shape"] == [1, 16] and out["datatype"] == "INT32"
        assert "data" not in out and "binary_data_size" not in out.get("parameters", {})
    # Read as Triton's simple_http_shm_client does: the output's datatype and shape, the region's bytes.
    out0 = result.get_output("OUTPUT0")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, out0["shape"]), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [1, 16]), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [1, 16], offset=n), a - b)

    # The client rewrites its input region: the server reads the new values (no copy was kept).
    shm.set_shared_memory_region(ip, [a * 10])
    client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [1, 16]), a * 10 + b)


def test_mixed_shared_memory_binary_and_json_tensors(client, regions):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    ip, op = regions("in_b", b.nbytes), regions("out_1", b.nbytes)
    shm.set_shared_memory_region(ip, [b])
    client.register_system_shared_memory("in_b", _key(ip), b.nbytes)
    client.register_system_shared_memory("out_1", _key(op), b.nbytes)
    for binary in (True, False):
        inputs = _simple_inputs(a, b)
        inputs[0].set_data_from_numpy(a, binary_data=binary)
        inputs[1].set_shared_memory("in_b", b.nbytes)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                   httpclient.InferRequestedOutput("OUTPUT1")]
        outputs[1].set_shared_memory("out_1", b.nbytes)
        result = client.infer("simple", inputs, outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [2, 16]), a - b)


def test_bytes_tensors_in_shared_memory(client, regions):
    values = np.array([[b"hello", b"", b"shared memory"] + [b"x%d" % i for i in range(13)]], dtype=np.object_)
    data = serialize_byte_tensor(values)
    size = len(data.item())
    ip, op = regions("str_in", size), regions("str_out", size)
    shm.set_shared_memory_region(ip, [data])
    client.register_system_shared_memory("str_in", _key(ip), size)
    client.register_system_shared_memory("str_out", _key(op), size)
    i = httpclient.InferInput("INPUT0", [1, 16], "BYTES")
    i.set_shared_memory("str_in", size)
    o = httpclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("str_out", size)
    client.infer("simple_string", [i], outputs=[o])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.object_, [1, 16]), values)


def test_register_status_unregister_shared_with_grpc(client, server, regions):
    h1, h2 = regions("r1", 64), regions("r2", 128)
    client.register_system_shared_memory("r1", _key(h1), 64)
    client.register_system_shared_memory("r2", _key(h2), 96, offset=32)
    status = sorted(client.get_system_shared_memory_status(), key=lambda r: r["name"])
    assert status == [{"name": "r1", "key": _key(h1), "offset": 0, "byte_size": 64},
                      {"name": "r2", "key": _key(h2), "offset": 32, "byte_size": 96}]
    assert client.get_system_shared_memory_status("r2") == [status[1]]
    # One set of regions for both protocols.
    grpc = grpcclient.InferenceServerClient(server.url)
    try:
        assert set(grpc.get_system_shared_memory_status().regions) == {"r1", "r2"}
        grpc.unregister_system_shared_memory("r2")
        assert [r["name"] for r in client.get_system_shared_memory_status()] == ["r1"]
    finally:
        grpc.close()

    with pytest.raises(InferenceServerException) as exc:
        client.register_system_shared_memory("r1", _key(h2), 64)
    assert _error(exc)[0] == "409" and "r1" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.get_system_shared_memory_status("nope")
    assert _error(exc) == ("404", "Unable to find system shared memory region: 'nope'")
    with pytest.raises(InferenceServerException) as exc:
        client.register_system_shared_memory("bad", "/../../etc/passwd", 16)
    assert _error(exc)[0] == "400" and "not a shared memory object name" in _error(exc)[1]

    client.unregister_system_shared_memory("r1")
    client.unregister_system_shared_memory("r1")  # unknown: nothing to do, as Triton
    assert client.get_system_shared_memory_status() == []
    client.register_system_shared_memory("r1", _key(h1), 64)
    client.unregister_system_shared_memory()  # all
    assert client.get_system_shared_memory_status() == []


@pytest.mark.parametrize("body, words", [
    ({"offset": 0, "byte_size": 16}, ["'key' must be a string"]),
    ({"key": "/x", "offset": -1, "byte_size": 16}, ["'offset' must be a non-negative integer"]),
    ({"key": "/x", "byte_size": "16"}, ["'byte_size' must be a non-negative integer"]),
    ({"key": "/x"}, ["'byte_size' must be a non-negative integer"]),
])
def test_register_body_is_checked(server, body, words):
    status, _, content = _raw(server, "POST", "/v2/systemsharedmemory/region/raw/register", json.dumps(body))
    assert status == 400
    message = json.loads(content)["error"]
    for word in words:
        assert word in message and "'raw'" in message


@pytest.mark.parametrize("size, offset, code, words", [
    (64, 32, "400", ["invalid offset + byte size", "'in64'", "INPUT0"]),
    (32, 0, "400", ["'in64'", "byte size 32", "64 bytes", "INPUT0"]),
])
def test_bad_offsets_and_sizes_as_over_grpc(client, server, regions, size, offset, code, words):
    handle = regions("in64", 64)
    client.register_system_shared_memory("in64", _key(handle), 64)
    a = np.ones((1, 16), dtype=np.int32)
    inputs = _simple_inputs(a, a)
    inputs[0].set_shared_memory("in64", size, offset=offset)
    inputs[1].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs)
    assert exc.value.status() == code
    for word in words:
        assert word in exc.value.message(), exc.value.message()
    grpc = grpcclient.InferenceServerClient(server.url)
    try:
        g_inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        g_inputs[0].set_shared_memory("in64", size, offset=offset)
        g_inputs[1].set_data_from_numpy(a)
        with pytest.raises(InferenceServerException) as g_exc:
            grpc.infer("simple", g_inputs)
        assert g_exc.value.message() == exc.value.message()  # the same checks, the same words
    finally:
        grpc.close()


def test_unknown_region_and_data_given_twice(client, server, regions):
    a = np.ones((1, 16), dtype=np.int32)
    inputs = _simple_inputs(a, a)
    inputs[0].set_shared_memory("never_registered", 64)
    inputs[1].set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs)
    assert _error(exc)[0] == "404" and "never_registered" in _error(exc)[1] and "INPUT0" in _error(exc)[1]

    handle = regions("twice", 64)
    client.register_system_shared_memory("twice", _key(handle), 64)
    body = {"inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16,
         "parameters": {"shared_memory_region": "twice", "shared_memory_byte_size": 64}},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}]}
    status, _, content = _raw(server, "POST", "/v2/models/simple/infer", json.dumps(body))
    assert status == 400 and "must not also give 'data'" in json.loads(content)["error"]

    out = httpclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("twice", 32)  # too small for the [1, 16] INT32 result
    inputs = _simple_inputs(a, a)
    for i in inputs:
        i.set_data_from_numpy(a)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs, outputs=[out])
    assert _error(exc)[0] == "400" and "'twice'" in _error(exc)[1] and "OUTPUT0" in _error(exc)[1]


def test_cuda_shared_memory_has_nothing_and_refuses_registration(client):
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_cuda_shared_memory()  # clients clear every region at start-up
    client.unregister_cuda_shared_memory("x")
    with pytest.raises(InferenceServerException) as exc:
        client.register_cuda_shared_memory("cu", "AAAA", 0, 64)
    assert _error(exc)[0] == "501"
    assert "CUDA" in _error(exc)[1] and "system shared memory" in _error(exc)[1]
    with pytest.raises(InferenceServerException) as exc:
        client.get_cuda_shared_memory_status("cu")
    assert _error(exc)[0] == "404"


def test_cuda_registration_bodies_are_checked_naming_the_region(server):
    path = "/v2/cudasharedmemory/region/cu/register"
    status, _, body = _raw(server, "POST", path, json.dumps({"raw_handle": {"b64": "!!"}, "device_id": 0,
                                                             "byte_size": 64}))
    assert status == 400 and b"'cu'" in body and b"valid base64" in body
    status, _, body = _raw(server, "POST", path, json.dumps({"raw_handle": "AAAA", "device_id": 0, "byte_size": 64}))
    assert status == 400 and b"'raw_handle' must be" in body
    status, _, body = _raw(server, "POST", path, json.dumps({"raw_handle": {"b64": "AAAA"}, "device_id": -1,
                                                             "byte_size": 64}))
    assert status == 400 and b"'device_id' must be a non-negative integer" in body


# -- trace and log settings, traceparent -------------------------------------------------------


def _triton_file(path, timeout: float = 30) -> list[dict]:
    """A trace file in Triton's format (a JSON array), once its writer has written it (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not (path.exists() and path.read_text().strip()):
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_trace_settings_and_traceparent(traced, client):
    server, trace_file = traced
    settings = client.get_trace_settings()
    assert settings == {"trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "0",
                        "trace_file": str(trace_file), "trace_mode": "triton"}
    grpc = grpcclient.InferenceServerClient(server.url)
    try:
        a = np.ones((1, 16), dtype=np.int32)
        inputs = _simple_inputs(a, a)
        for i in inputs:
            i.set_data_from_numpy(a)
        client.infer("simple", inputs, headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"})  # off: no trace

        updated = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "log_frequency": "1"})
        assert updated["trace_level"] == ["TIMESTAMPS"] and updated["log_frequency"] == "1"
        # The same settings as the TraceSetting RPC sees.
        assert list(grpc.get_trace_settings().settings["trace_level"].value) == ["TIMESTAMPS"]
        model = client.update_trace_settings("simple", settings={"trace_rate": "7"})
        assert model["trace_rate"] == "7" and client.get_trace_settings("simple")["trace_rate"] == "7"
        assert client.get_trace_settings()["trace_rate"] == "1"  # the global one unchanged
        cleared = client.update_trace_settings("simple", settings={"trace_rate": None})
        assert cleared["trace_rate"] == "1"

        for bad, word in [({"trace_rate": "-3"}, "trace_rate"), ({"trace_file": "/tmp/elsewhere"}, "cannot be changed"),
                          ({"trace_level": [1]}, "array of strings"), ({"bogus": "1"}, "unknown trace setting")]:
            with pytest.raises(InferenceServerException) as exc:
                client.update_trace_settings(settings=bad)
            assert _error(exc)[0] == "400" and word in _error(exc)[1]

        client.infer("simple", inputs, headers={"traceparent": TRACEPARENT}, request_id="http-traced-1")
        # Triton's trace file (log_frequency 1: the first trace alone in trace.jsonl.0, written by the
        # exporter's thread). Triton's format has no W3C ids: the parent is checked on spans in test_tracing.
        entries = _triton_file(trace_file.with_name(trace_file.name + ".0"))
        roots = [e for e in entries if "request_id" in e]
        assert [(e["model_name"], e["request_id"]) for e in roots] == [("simple", "http-traced-1")]  # the untraced one left nothing
        names = [ts["name"] for e in entries for ts in e.get("timestamps", [])]
        assert names[:2] == ["HTTP_RECV_START", "HTTP_RECV_END"] and names[-2:] == ["HTTP_SEND_START", "HTTP_SEND_END"]
        assert {"REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_END", "REQUEST_END"} <= set(names)
    finally:
        client.update_trace_settings(settings={"trace_level": ["OFF"]})
        grpc.close()


def test_log_settings(server, client):
    settings = client.get_log_settings()
    assert settings == {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                        "log_verbose_level": 0, "log_format": "default"}
    try:
        updated = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
        assert updated["log_verbose_level"] == 1 and updated["log_format"] == "ISO8601"
        grpc = grpcclient.InferenceServerClient(server.url)
        assert grpc.get_log_settings().settings["log_verbose_level"].uint32_param == 1  # one set of settings
        grpc.close()
        for bad, word in [({"log_info": "yes"}, "must be a bool"), ({"log_format": "xml"}, "log_format"),
                          ({"log_file": "/tmp/x.log"}, "cannot be changed"), ({"colour": True}, "unknown log setting"),
                          ({"log_verbose_level": -1}, "non-negative")]:
            with pytest.raises(InferenceServerException) as exc:
                client.update_log_settings(bad)
            assert _error(exc)[0] == "400" and word in _error(exc)[1]
        assert client.get_log_settings()["log_verbose_level"] == 1  # a refused change changes nothing
    finally:
        client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})


# -- sequences and decoupled models -------------------------------------------------------------


def _seq(client, sequence_id, value: int, start: bool = False, end: bool = False) -> int:
    i = httpclient.InferInput("INPUT", [1, 1], "INT32").set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = client.infer("simple_sequence", [i], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT")[0, 0])


def test_sequence_parameters_reach_the_sequence_batcher(client):
    """Two interleaved sequences (an integer id and a string id) keep their own running sums."""
    assert _seq(client, 1001, 1, start=True) == 1
    assert _seq(client, "seq-b", 100, start=True) == 100
    assert _seq(client, 1001, 2) == 3
    assert _seq(client, "seq-b", 200) == 300
    assert _seq(client, 1001, 3, end=True) == 6
    assert _seq(client, "seq-b", 300, end=True) == 600
    assert _seq(client, 1001, 5, start=True, end=True) == 5  # START resets the state
    with pytest.raises(InferenceServerException) as exc:
        _seq(client, 0, 1)  # no sequence id
    assert _error(exc)[0] == "400" and "correlation ID" in _error(exc)[1]


def test_decoupled_model_is_refused_with_tritons_words(client):
    inputs = [httpclient.InferInput("IN", [3], "INT32").set_data_from_numpy(np.arange(3, dtype=np.int32)),
              httpclient.InferInput("REPEAT", [1], "INT32").set_data_from_numpy(np.array([2], dtype=np.int32))]
    with pytest.raises(InferenceServerException) as exc:
        client.infer("repeat_decoupled", inputs)
    assert _error(exc)[1] == "HTTP end point doesn't support models with decoupled transaction policy"


# -- perf_analyzer -----------------------------------------------------------------------------------


def test_perf_analyzer_http_with_system_shared_memory(server, client, perf_analyzer):
    result = subprocess.run(
        [perf_analyzer, "-m", "mlp", "-u", server.http_url, "-i", "http", "--shared-memory", "system",
         "--concurrency-range", "2", "--measurement-mode", "count_windows", "--measurement-request-count", "100",
         # This checks that it works, not how fast: a busy machine must not fail it for instability.
         "--stability-percentage", "1000", "--max-trials", "3"],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput" in result.stdout
    assert client.get_system_shared_memory_status() == []  # it unregistered what it registered

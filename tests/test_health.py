"""Issue #7: health for orchestrators. grpc.health.v1 on the gRPC port follows readiness
(NOT_SERVING while models load, when one is unavailable, and from the start of a
drain, while an accepted request still runs); HTTP /v2/health/ready agrees; server
reflection lists and describes the services."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import ROOT, running
from gated_model import add_gated_model, release, wait_started
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _check(url: str, service: str = "") -> int:
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def _http_status(http_url: str, path: str, method: str = "GET", body: str | None = None) -> int:
    host, port = http_url.split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def _identity(repo, name="identity"):
    add_model(repo, name, om.identity(np.float32, [-1], batch=False),
              config(name, [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))


def _fp32(module, x):
    i = module.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("health")
    _identity(repo)
    with running(repo) as server:
        yield server


def test_serving_when_ready(server):
    assert _check(server.url) == SERVING
    assert _check(server.url, "inference.GRPCInferenceService") == SERVING
    with pytest.raises(grpc.RpcError) as exc:
        _check(server.url, "no.such.Service")
    assert exc.value.code() == grpc.StatusCode.NOT_FOUND
    assert _http_status(server.http_url, "/v2/health/ready") == 200


def test_reflection_lists_and_describes_services(server):
    with grpc.insecure_channel(server.url) as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        services = set(db.get_services())
        assert {"inference.GRPCInferenceService", "grpc.health.v1.Health",
                "grpc.reflection.v1alpha.ServerReflection"} <= services
        from google.protobuf.descriptor_pool import DescriptorPool

        pool = DescriptorPool(db)
        service = pool.FindServiceByName("inference.GRPCInferenceService")
        methods = {m.name for m in service.methods}
        assert {"ModelInfer", "ServerReady", "ModelMetadata", "RepositoryIndex"} <= methods
        assert service.methods_by_name["ModelInfer"].input_type.full_name == "inference.ModelInferRequest"
        assert pool.FindServiceByName("grpc.health.v1.Health").methods_by_name["Check"]


def test_not_serving_with_an_unavailable_model(start_server, tmp_path):
    repo = tmp_path / "repo"
    _identity(repo)
    add_model(repo, "broken", None, 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    server = start_server(repo, log_path=tmp_path / "server.log")
    assert _check(server.url) == NOT_SERVING
    assert _http_status(server.http_url, "/v2/health/ready") == 400
    assert _http_status(server.http_url, "/v2/health/live") == 200
    # the good model still serves
    client = grpcclient.InferenceServerClient(server.url)
    x = np.ones(3, dtype=np.float32)
    np.testing.assert_array_equal(client.infer("identity", _fp32(grpcclient, x)).as_numpy("OUTPUT0"), x)
    client.close()


class _Request(threading.Thread):
    def __init__(self, url: str, model: str, x: np.ndarray) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.x = url, model, x
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            self.result = client.infer(self.model, _fp32(grpcclient, self.x), client_timeout=120).as_numpy("OUTPUT0")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            client.close()


class _HttpRequest(_Request):
    def run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=120)
        try:
            self.result = client.infer(self.model, _fp32(httpclient, self.x)).as_numpy("OUTPUT0")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            client.close()


def _inflight(server, model: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "inferd_inference_inflight_request_count" and sample.labels["model"] == model:
                return sample.value
    return 0.0


def test_drain_turns_not_serving_while_requests_are_in_flight(start_server, tmp_path):
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    add_gated_model(repo, "gated", gate)
    server = start_server(repo, log_path=tmp_path / "server.log")
    assert _check(server.url) == SERVING

    # A Watch stream opened before the stop sees the change.
    watch_channel = grpc.insecure_channel(server.url)
    watch = health_pb2_grpc.HealthStub(watch_channel).Watch(health_pb2.HealthCheckRequest(service=""), timeout=60)
    assert next(watch).status == SERVING

    x = np.arange(4, dtype=np.float32)
    request = _Request(server.url, "gated", x)
    request.start()
    wait_started(gate)
    # A second one, over HTTP, waits in the queue behind it (one instance).
    http_request = _HttpRequest(server.http_url, "gated", x + 1)
    http_request.start()
    deadline = time.monotonic() + 30
    while _inflight(server, "gated") < 2:
        assert time.monotonic() < deadline, "the HTTP request never reached the model's queue"
        time.sleep(0.01)
    server.proc.send_signal(signal.SIGTERM)

    # From a second channel, while the request is still held by the model:
    deadline = time.monotonic() + 10
    while _check(server.url) != NOT_SERVING:
        assert time.monotonic() < deadline, "health stayed SERVING after SIGTERM"
        time.sleep(0.01)
    assert _check(server.url, "inference.GRPCInferenceService") == NOT_SERVING
    assert next(watch).status == NOT_SERVING
    assert _http_status(server.http_url, "/v2/health/ready") == 400
    assert _http_status(server.http_url, "/v2/health/live") == 200
    client = grpcclient.InferenceServerClient(server.url)
    assert client.is_server_ready() is False
    with pytest.raises(InferenceServerException) as exc:  # new work is refused...
        client.infer("gated", _fp32(grpcclient, x), client_timeout=10)
    assert exc.value.status() == "StatusCode.UNAVAILABLE"
    client.close()
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]})
    assert _http_status(server.http_url, "/v2/models/gated/infer", "POST", body) == 503
    assert request.is_alive() and http_request.is_alive() and server.proc.poll() is None, \
        "the drain did not wait for the requests"

    release(gate)  # ...while the accepted ones finish, with their answers
    for r, want in ((request, x), (http_request, x + 1)):
        r.join(60)
        assert r.error is None, f"{r.error}\n{server.log()}"
        np.testing.assert_array_equal(r.result, want)
    assert server.proc.wait(60) == 0, server.log()
    with pytest.raises(StopIteration):  # the server ended the Watch stream rather than wait on it
        next(watch)
    watch_channel.close()
    assert "Traceback" not in server.log()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_not_ready_while_models_load(tmp_path):
    """The ports open first: live, but not ready (HTTP 400, NOT_SERVING) until loading ends."""
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    add_gated_model(repo, "slow_load", gate, hold_load=True)
    _identity(repo)
    grpc_port, http_port, metrics_port = _free_port(), _free_port(), _free_port()
    log = open(tmp_path / "server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo), "--grpc-address", "127.0.0.1",
         "--grpc-port", str(grpc_port), "--http-port", str(http_port), "--metrics-port", str(metrics_port)],
        stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ),
    )
    try:
        url, http_url = f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                if _http_status(http_url, "/v2/health/live") == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "HTTP never answered"
            time.sleep(0.05)
        assert _http_status(http_url, "/v2/health/ready") == 400
        assert _check(url) == NOT_SERVING
        assert httpclient.InferenceServerClient(http_url).is_server_ready() is False

        release(gate, "loaded")
        deadline = time.monotonic() + 60
        while _check(url) != SERVING:
            assert time.monotonic() < deadline, "never became SERVING after loading"
            time.sleep(0.05)
        assert _http_status(http_url, "/v2/health/ready") == 200
    finally:
        release(gate, "loaded")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, (tmp_path / "server.log").read_text()
        log.close()

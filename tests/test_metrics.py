"""Issue #7: Prometheus metrics on /metrics of the metrics port, scraped from a real
server: counters move by exactly the requests sent (successes, failures by reason),
histograms agree with them, queue-depth gauges show waiting work, load states and
process metrics are there."""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import running
from gated_model import add_gated_model, release, wait_started
from inferd.examples import onnx_models as om
from repo_builder import add_model, config


_FAILING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(error=pb_utils.TritonError("this model always fails"))
                for _ in requests]
"""


@pytest.fixture(scope="module")
def gate(tmp_path_factory):
    return tmp_path_factory.mktemp("gate")


@pytest.fixture(scope="module")
def server(tmp_path_factory, gate):
    repo = tmp_path_factory.mktemp("metrics")
    add_model(repo, "add_sub", om.add_sub(np.int32, 4, batch=False), config(
        "add_sub", [("INPUT0", "TYPE_INT32", [4]), ("INPUT1", "TYPE_INT32", [4])],
        [("OUTPUT0", "TYPE_INT32", [4]), ("OUTPUT1", "TYPE_INT32", [4])], 0))
    add_model(repo, "batched", om.identity(np.float32, [-1], batch=True), config(
        "batched", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 8,
        extra="dynamic_batching { max_queue_delay_microseconds: 200000 }\n"
              "instance_group [ { kind: KIND_CPU count: 1 } ]\n"))
    add_gated_model(repo, "gated", gate)
    add_model(repo, "broken", None, 'name: "broken"\nplatform: "onnxruntime_onnx"\n')
    add_model(repo, "failing", _FAILING.encode(), config(
        "failing", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0, platform=None,
        extra='backend: "python"\n'), filename="model.py")
    with running(repo) as server:
        yield server


def scrape_text(server, accept: str | None = None) -> str:
    request = urllib.request.Request(server.metrics_url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return response.read().decode()


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label pairs): value} of one scrape, with the sample names as
    written (as Prometheus stores them; prometheus_client's parser would add _total to
    Triton's counters). Every family still parses with prometheus_client."""
    text = scrape_text(server)
    assert list(text_string_to_metric_families(text))
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            name, labels, value = match.groups()
            out[(name, tuple(sorted(_LABEL.findall(labels or ""))))] = float(value)
    return out


def _mv(model: str, **extra: str) -> tuple:
    return tuple(sorted({"model": model, "version": "1", **extra}.items()))


def get(metrics, name: str, model: str, **extra: str) -> float:
    return metrics[(name, _mv(model, **extra))]


def _add_sub_inputs(module, n: int = 4):
    x = np.arange(n, dtype=np.int32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = module.InferInput(name, [n], "INT32")
        i.set_data_from_numpy(x)
        inputs.append(i)
    return inputs


def test_scrape_has_every_family(server):
    m = scrape(server)
    names = {name for name, _ in m}
    for family in ("nv_inference_request_success", "nv_inference_request_failure",
                   "inferd_inference_request_failure_total",
                   "nv_inference_count", "nv_inference_exec_count",
                   "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
                   "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
                   "nv_inference_compute_output_duration_us", "nv_inference_pending_request_count",
                   "inferd_inference_inflight_request_count", "inferd_inference_request_duration_seconds_bucket",
                   "inferd_inference_queue_duration_seconds_count", "inferd_inference_compute_duration_seconds_sum",
                   "inferd_inference_batch_size_bucket", "inferd_model_load_state", "inferd_server_ready",
                   "process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert family in names, family
    assert m[("process_resident_memory_bytes", ())] > 0
    # Load state: one 1 per model version, on its state; the broken model has no version.
    assert get(m, "inferd_model_load_state", "add_sub", state="READY") == 1
    assert get(m, "inferd_model_load_state", "add_sub", state="LOADING") == 0
    assert m[("inferd_model_load_state", tuple(sorted({"model": "broken", "version": "",
                                                      "state": "UNAVAILABLE"}.items())))] == 1
    assert m[("inferd_server_ready", ())] == 0  # a model is unavailable
    # Failure counters exist (at 0) before any failure, so rate() works from the first scrape.
    assert get(m, "inferd_inference_request_failure_total", "batched", reason="INVALID_ARGUMENT") == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
        assert get(m, "nv_inference_request_failure", "batched", reason=reason) == 0


TRITON_FAMILIES = {
    "nv_inference_request_success": "counter", "nv_inference_request_failure": "counter",
    "nv_inference_count": "counter", "nv_inference_exec_count": "counter",
    "nv_inference_request_duration_us": "counter", "nv_inference_queue_duration_us": "counter",
    "nv_inference_compute_input_duration_us": "counter", "nv_inference_compute_infer_duration_us": "counter",
    "nv_inference_compute_output_duration_us": "counter", "nv_inference_pending_request_count": "gauge",
}


def test_triton_names_types_and_labels_exactly(server):
    """A Triton dashboard's series, byte for byte: Triton's names (no _total), types and labels,
    in the text format whatever the scraper asks for (OpenMetrics would rename the counters)."""
    grpc_client = grpcclient.InferenceServerClient(server.url)
    grpc_client.infer("add_sub", _add_sub_inputs(grpcclient))
    for accept in (None, "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3"):
        text = scrape_text(server, accept)
        lines = text.splitlines()
        for name, kind in TRITON_FAMILIES.items():
            assert f"# TYPE {name} {kind}" in lines
            assert f"{name}_total" not in text
        assert any(line.startswith('nv_inference_request_success{model="add_sub",version="1"} ') and
                   int(line.rsplit(" ", 1)[1]) >= 1 for line in lines)
        assert 'nv_inference_request_failure{model="add_sub",version="1",reason="OTHER"} ' in text
        assert not any(line.startswith("nv_") and "_total" in line for line in lines)
        assert "# EOF" not in text
    grpc_client.close()


def test_failures_counted_under_triton_reasons(server):
    """OTHER for a request the model refuses, REJECTED for one whose timeout passed in the queue,
    BACKEND for one the model failed to execute; inferd's own family keeps the status."""
    grpc_client = grpcclient.InferenceServerClient(server.url)
    before = scrape(server)
    with pytest.raises(InferenceServerException):
        grpc_client.infer("add_sub", _add_sub_inputs(grpcclient, 5))
    batched = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    batched.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
    with pytest.raises(InferenceServerException):  # 1 us: expires while waiting out the 200 ms queue delay
        grpc_client.infer("batched", [batched], timeout=1)
    failing = grpcclient.InferInput("INPUT0", [2], "FP32")
    failing.set_data_from_numpy(np.ones(2, dtype=np.float32))
    with pytest.raises(InferenceServerException) as exc:
        grpc_client.infer("failing", [failing])
    assert exc.value.status() == "StatusCode.INTERNAL"
    after = scrape(server)
    grpc_client.close()

    def delta(name: str, model: str, reason: str) -> float:
        return get(after, name, model, reason=reason) - get(before, name, model, reason=reason)

    assert [delta("nv_inference_request_failure", "add_sub", r) for r in ("OTHER", "REJECTED", "BACKEND")] == [1, 0, 0]
    assert [delta("nv_inference_request_failure", "batched", r) for r in ("OTHER", "REJECTED", "BACKEND")] == [0, 1, 0]
    assert [delta("nv_inference_request_failure", "failing", r) for r in ("OTHER", "REJECTED", "BACKEND")] == [0, 0, 1]
    assert delta("inferd_inference_request_failure_total", "add_sub", "INVALID_ARGUMENT") == 1
    assert delta("inferd_inference_request_failure_total", "failing", "INTERNAL") == 1


def test_triton_reason_of_each_inferd_reason():
    from inferd.dataplane.metrics import triton_reason

    cases = {"UNAVAILABLE": "REJECTED", "TIMEOUT": "REJECTED", "CANCELED": "CANCELED", "CANCELLED": "CANCELED",
             "INTERNAL": "BACKEND", "INVALID_ARGUMENT": "OTHER", "UNIMPLEMENTED": "OTHER"}
    assert {r: triton_reason(r, ensemble=False) for r in cases} == cases
    assert {triton_reason(r, ensemble=True) for r in cases} == {"OTHER"}  # as Triton counts an ensemble's


def test_counters_move_by_exactly_the_requests_sent(server):
    before = scrape(server)
    grpc_client = grpcclient.InferenceServerClient(server.url)
    http_client = httpclient.InferenceServerClient(server.http_url)
    for _ in range(5):
        grpc_client.infer("add_sub", _add_sub_inputs(grpcclient))
    for _ in range(4):
        http_client.infer("add_sub", _add_sub_inputs(httpclient))
    for client, module in ((grpc_client, grpcclient), (http_client, httpclient), (http_client, httpclient)):
        with pytest.raises(InferenceServerException):  # wrong shape: refused by the model's checks
            client.infer("add_sub", _add_sub_inputs(module, 5))
    for client, module in ((grpc_client, grpcclient), (http_client, httpclient)):
        with pytest.raises(InferenceServerException):  # no such model: no model's counter moves
            client.infer("nope", _add_sub_inputs(module))
    after = scrape(server)

    def delta(name: str, **extra: str) -> float:
        return get(after, name, "add_sub", **extra) - get(before, name, "add_sub", **extra)

    assert delta("nv_inference_request_success") == 9
    assert delta("inferd_inference_request_failure_total", reason="INVALID_ARGUMENT") == 3
    for reason in ("UNAVAILABLE", "TIMEOUT", "CANCELED", "INTERNAL"):
        assert delta("inferd_inference_request_failure_total", reason=reason) == 0
    assert delta("nv_inference_request_failure", reason="OTHER") == 3
    assert delta("nv_inference_count") == 9
    assert delta("nv_inference_exec_count") == 9
    assert delta("inferd_inference_request_duration_seconds_count") == 9
    assert delta("inferd_inference_request_duration_seconds_bucket", le="+Inf") == 9
    assert delta("inferd_inference_queue_duration_seconds_count") == 9
    assert delta("inferd_inference_compute_duration_seconds_count") == 9
    assert delta("inferd_inference_batch_size_count") == 9
    assert delta("inferd_inference_batch_size_sum") == 9
    assert delta("inferd_inference_batch_size_bucket", le="1.0") == 9
    assert delta("nv_inference_request_duration_us") > 0
    assert delta("nv_inference_compute_infer_duration_us") > 0
    assert get(after, "nv_inference_pending_request_count", "add_sub") == 0
    # the metrics and the statistics extension are one set of counters
    stats = grpc_client.get_inference_statistics("add_sub").model_stats[0]
    assert stats.inference_stats.success.count == get(after, "nv_inference_request_success", "add_sub")
    assert stats.execution_count == get(after, "nv_inference_exec_count", "add_sub")
    assert stats.inference_stats.success.ns // 1000 == get(after, "nv_inference_request_duration_us",
                                                           "add_sub")
    grpc_client.close()
    http_client.close()


def test_batches_counted_by_rows_and_executions(server):
    before = scrape(server)
    errors: list[BaseException] = []

    def one() -> None:
        client = grpcclient.InferenceServerClient(server.url)
        try:
            i = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
            i.set_data_from_numpy(np.ones((2, 3), dtype=np.float32))
            client.infer("batched", [i])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    after = scrape(server)

    def delta(name: str, **extra: str) -> float:
        return get(after, name, "batched", **extra) - get(before, name, "batched", **extra)

    executions = delta("nv_inference_exec_count")
    assert delta("nv_inference_request_success") == 4
    assert delta("nv_inference_count") == 8  # rows
    assert 1 <= executions <= 4
    assert delta("inferd_inference_batch_size_count") == executions
    assert delta("inferd_inference_batch_size_sum") == 8
    assert delta("inferd_inference_compute_duration_seconds_count") == 4  # per request


def test_queue_depth_and_inflight_gauges(server, gate):
    """Two requests for a one-instance model held by the test: one executes, one waits."""
    def one(out: list) -> None:
        client = grpcclient.InferenceServerClient(server.url)
        try:
            i = grpcclient.InferInput("INPUT0", [2], "FP32")
            i.set_data_from_numpy(np.ones(2, dtype=np.float32))
            out.append(client.infer("gated", [i], client_timeout=120).as_numpy("OUTPUT0"))
        finally:
            client.close()

    results: list = []
    threads = [threading.Thread(target=one, args=(results,), daemon=True) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        wait_started(gate)
        deadline = time.monotonic() + 30
        while True:
            m = scrape(server)
            if get(m, "inferd_inference_inflight_request_count", "gated") == 2:
                break
            assert time.monotonic() < deadline, "the second request never arrived"
            time.sleep(0.02)
        assert get(m, "nv_inference_pending_request_count", "gated") == 1
    finally:
        release(gate)
        for t in threads:
            t.join(60)
    assert len(results) == 2
    m = scrape(server)
    assert get(m, "inferd_inference_inflight_request_count", "gated") == 0
    assert get(m, "nv_inference_pending_request_count", "gated") == 0
    assert get(m, "nv_inference_request_success", "gated") == 2
    assert get(m, "inferd_inference_queue_duration_seconds_count", "gated") == 2


def test_other_paths_are_not_found(server):
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(server.metrics_url.replace("/metrics", "/other"), timeout=10)
    assert exc.value.code == 404


def test_metrics_can_be_turned_off(start_server, tmp_path):
    repo = tmp_path / "repo"
    add_model(repo, "identity", om.identity(np.float32, [-1], batch=False),
              config("identity", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    server = start_server(repo, ["--allow-metrics", "false", "--allow-http=false"], log_path=tmp_path / "server.log")
    assert server.metrics_url is None and server.http_url is None and server.url
    assert "metrics on" not in server.log() and "HTTP on" not in server.log()
    assert grpcclient.InferenceServerClient(server.url).is_server_ready()

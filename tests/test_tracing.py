"""Issue #7: OpenTelemetry tracing (in-process with an in-memory exporter, and
over gRPC: TraceSetting, W3C traceparent, the file destination) and LogSettings."""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.utils import InferenceServerException

from conftest import ROOT, ServerProcess, running
from inferd.errors import InvalidArgument, Unavailable
from inferd.examples import onnx_models as om
from inferd.observability.tracing import ROOT_SPAN, TraceConfig, Tracing, ensemble_step
from inferd.repository import ModelManager
from inferd.dataplane import DataPlane
from inferd.types import InferenceRequest
from repo_builder import add_model, config

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
INT16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def _repo(tmp_path):
    repo = tmp_path / "repo"
    # A queue delay long enough that requests sent together share one execution.
    add_model(repo, "simple", om.add_sub(), config(
        "simple", INT16, OUT16, 8, extra="dynamic_batching { max_queue_delay_microseconds: 50000 }\n"))
    return repo


def _request(rows: int = 1, model: str = "simple") -> InferenceRequest:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    return InferenceRequest(model_name=model, inputs={"INPUT0": a, "INPUT1": a}, id="req-1")


@pytest.fixture
async def plane(tmp_path):
    manager = ModelManager([_repo(tmp_path)])
    await manager.load_all()
    exporter = InMemorySpanExporter()
    dp = DataPlane(manager)
    dp.tracing = Tracing(TraceConfig(level=("TIMESTAMPS",), rate=1), processor=SimpleSpanProcessor(exporter))
    yield dp, exporter
    await manager.stop()
    dp.tracing.shutdown()


def _by_name(spans):
    out: dict[str, list] = {}
    for s in spans:
        out.setdefault(s.name, []).append(s)
    return out


# -- in-process ------------------------------------------------------------------------------


async def test_request_span_with_queue_and_compute_children(plane):
    dp, exporter = plane
    req = _request()
    req.trace = dp.tracing.start("simple", req.id, lambda: {"traceparent": TRACEPARENT})
    await dp.infer(req)
    spans = _by_name(exporter.get_finished_spans())
    root, = spans[ROOT_SPAN]
    queue, = spans["queue"]
    compute, = spans["compute"]
    # The caller's W3C context is the request span's parent.
    assert format(root.context.trace_id, "032x") == TRACE_ID
    assert format(root.parent.span_id, "016x") == PARENT_ID
    assert root.attributes["triton.model_name"] == "simple" and root.attributes["triton.model_version"] == 1
    for child in (queue, compute):
        assert child.parent.span_id == root.context.span_id and child.context.trace_id == root.context.trace_id
    assert compute.attributes["batch_size"] == 1 and compute.attributes["instance"]
    # In order, inside the request: queued, then executed.
    assert root.start_time <= queue.start_time <= queue.end_time <= compute.start_time <= compute.end_time <= root.end_time
    assert queue.end_time - queue.start_time >= 40_000_000  # the 50 ms queue delay


async def test_one_compute_span_per_request_of_a_shared_batch(plane):
    dp, exporter = plane
    reqs = [_request(rows=r) for r in (1, 2, 3)]
    for r in reqs:
        r.trace = dp.tracing.start("simple", r.id)
    await asyncio.gather(*(dp.infer(r) for r in reqs))
    spans = _by_name(exporter.get_finished_spans())
    assert len(spans[ROOT_SPAN]) == 3 and len(spans["queue"]) == 3
    assert sorted(s.attributes["batch_size"] for s in spans["compute"]) == [6, 6, 6]
    assert {s.attributes["batch_requests"] for s in spans["compute"]} == {3}
    roots = {s.context.span_id for s in spans[ROOT_SPAN]}
    assert {s.parent.span_id for s in spans["compute"]} == roots  # each under its own request


async def test_failed_request_span_has_an_error_status(plane):
    dp, exporter = plane
    req = _request()
    req.inputs["INPUT1"] = req.inputs["INPUT1"][:, :8]
    req.trace = dp.tracing.start("simple", req.id)
    with pytest.raises(InvalidArgument):
        await dp.infer(req)
    root, = exporter.get_finished_spans()
    assert root.name == ROOT_SPAN and not root.status.is_ok and "INPUT1" in root.status.description


async def test_ensemble_step_hook_nests_the_composing_models_spans(plane):
    dp, exporter = plane
    req = _request()
    req.trace = dp.tracing.start("simple", req.id)
    sub = _request()
    sub.trace = ensemble_step(req.trace, "add", "simple", 1)
    await dp.infer(sub)  # ends the step's span, as for any request it runs
    req.trace.end()
    spans = _by_name(exporter.get_finished_spans())
    root, = spans[ROOT_SPAN]
    step, = spans["ensemble step add"]
    assert step.parent.span_id == root.context.span_id and step.attributes["triton.model_name"] == "simple"
    assert spans["queue"][0].parent.span_id == step.context.span_id
    assert spans["compute"][0].parent.span_id == step.context.span_id
    assert ensemble_step(None, "add", "simple") is None


ENSEMBLE = """name: "twice"
platform: "ensemble"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "Y" data_type: TYPE_INT32 dims: [ 16 ] } ]
ensemble_scheduling { step [
  { model_name: "simple" model_version: -1
    input_map { key: "INPUT0" value: "X" } input_map { key: "INPUT1" value: "X" }
    output_map { key: "OUTPUT0" value: "sum" } },
  { model_name: "simple" model_version: 1
    input_map { key: "INPUT0" value: "sum" } input_map { key: "INPUT1" value: "X" }
    output_map { key: "OUTPUT0" value: "Y" } }
] }
"""


async def test_traced_ensemble_has_a_span_per_step_with_the_models_spans_under_it(tmp_path):
    repo = _repo(tmp_path)
    (repo / "twice" / "1").mkdir(parents=True)
    (repo / "twice" / "config.pbtxt").write_text(ENSEMBLE)
    manager = ModelManager([repo])
    await manager.load_all()
    exporter = InMemorySpanExporter()
    dp = DataPlane(manager)
    dp.tracing = Tracing(TraceConfig(level=("TIMESTAMPS", "TENSORS"), rate=1), processor=SimpleSpanProcessor(exporter))
    try:
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        req = InferenceRequest(model_name="twice", inputs={"X": x}, id="ens-1")
        req.trace = dp.tracing.start("twice", req.id, lambda: {"traceparent": TRACEPARENT})
        out = await dp.infer(req)
        np.testing.assert_array_equal(out.outputs["Y"], 3 * x)
        spans = _by_name(exporter.get_finished_spans())
        root, = spans[ROOT_SPAN]
        assert root.attributes["triton.model_name"] == "twice" and format(root.parent.span_id, "016x") == PARENT_ID
        first, = spans["ensemble step 0 simple"]
        second, = spans["ensemble step 1 simple"]
        for step in (first, second):
            assert step.parent.span_id == root.context.span_id
            assert step.attributes["triton.model_name"] == "simple" and step.attributes["triton.model_version"] == 1
            assert step.attributes["triton.input.INPUT0"] == "int32 [1, 16]"  # level TENSORS: the step's tensors
            assert step.attributes["triton.output.OUTPUT0"] == "int32 [1, 16]"
            assert step.status.is_ok
        # Each step's queue wait and execution nest under that step, not under the request.
        assert sorted(s.parent.span_id for s in spans["queue"]) == sorted([first.context.span_id, second.context.span_id])
        assert sorted(s.parent.span_id for s in spans["compute"]) == sorted([first.context.span_id, second.context.span_id])
        assert root.start_time <= first.start_time <= first.end_time <= second.start_time <= second.end_time <= root.end_time

        # Refused before any step runs (a composing model is gone): no step span, the request's span has the error.
        exporter.clear()
        bad = InferenceRequest(model_name="twice", inputs={"X": x}, id="ens-2")
        bad.trace = dp.tracing.start("twice", bad.id)
        await manager.unload_model("simple")
        with pytest.raises(Unavailable):
            await dp.infer(bad)
        spans = _by_name(exporter.get_finished_spans())
        root, = spans[ROOT_SPAN]
        assert set(spans) == {ROOT_SPAN} and not root.status.is_ok and "simple" in root.status.description
    finally:
        await manager.stop()
        dp.tracing.shutdown()


async def test_rate_count_and_tensors_level(plane):
    dp, exporter = plane
    tracing = dp.tracing
    tracing.update("", {"trace_rate": ["3"], "trace_count": ["2"], "trace_level": ["TIMESTAMPS", "TENSORS"]})
    started = [tracing.start("simple") for _ in range(9)]
    assert [t is not None for t in started] == [False, False, True, False, False, True, False, False, False]
    assert tracing.settings()["trace_count"] == ["0"] and not tracing.enabled
    for t in started:
        if t is not None:
            t.end()
    tracing.update("", {"trace_count": ["-1"], "trace_rate": ["1"]})
    assert tracing.enabled
    exporter.clear()
    req = _request()
    req.trace = tracing.start("simple")
    await dp.infer(req)
    root = _by_name(exporter.get_finished_spans())[ROOT_SPAN][0]
    assert root.attributes["triton.input.INPUT0"] == "int32 [1, 16]"
    assert root.attributes["triton.output.OUTPUT1"] == "int32 [1, 16]"


def test_off_costs_nothing_and_starts_nothing():
    tracing = Tracing()
    assert not tracing.enabled and tracing.start("simple") is None
    req = _request()
    assert req.trace is None


def test_per_model_settings_and_clearing():
    exporter = InMemorySpanExporter()
    tracing = Tracing(TraceConfig(rate=10), processor=SimpleSpanProcessor(exporter))
    assert tracing.settings()["trace_level"] == ["OFF"] and not tracing.enabled
    s = tracing.update("simple", {"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"]})
    assert s["trace_level"] == ["TIMESTAMPS"] and s["trace_rate"] == ["1"]
    assert tracing.enabled and tracing.start("other") is None and tracing.start("simple") is not None
    s = tracing.update("simple", {"trace_rate": []})  # cleared: the global value again
    assert s["trace_rate"] == ["10"] and s["trace_level"] == ["TIMESTAMPS"]
    s = tracing.update("", {"trace_rate": ["5"]})
    assert s["trace_rate"] == ["5"] and tracing.settings()["trace_level"] == ["OFF"]
    tracing.update("", {"trace_rate": []})
    assert tracing.settings()["trace_rate"] == ["10"]
    for changes, word in [
        ({"trace_level": ["LOUD"]}, "LOUD"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "OFF cannot be combined"),
        ({"trace_rate": ["0"]}, ">= 1"),
        ({"trace_rate": ["x"]}, "not an integer"),
        ({"trace_count": ["-2"]}, ">= -1"),
        ({"trace_file": ["/etc/evil"]}, "cannot be changed at run time"),
        ({"bogus": ["1"]}, "unknown trace setting 'bogus'"),
    ]:
        with pytest.raises(InvalidArgument, match=re.escape(word)):
            tracing.update("", changes)
    tracing.shutdown()


def test_no_destination_refuses_to_turn_on():
    tracing = Tracing()
    with pytest.raises(InvalidArgument, match="no destination"):
        tracing.update("", {"trace_level": ["TIMESTAMPS"]})
    assert tracing.settings()["trace_level"] == ["OFF"]
    with pytest.raises(ValueError, match="no destination"):
        Tracing(TraceConfig(level=("TIMESTAMPS",)))


def test_trace_config_parsing():
    c = TraceConfig.parse(["rate=5", "level=TIMESTAMPS", "level=TENSORS", "count=3", "triton,file=/tmp/t.json",
                           "triton,log-frequency=2", "opentelemetry,url=collector:4318/v1/traces",
                           "opentelemetry,resource=deployment=test"])
    assert (c.rate, c.level, c.count, c.file, c.log_frequency) == (5, ("TIMESTAMPS", "TENSORS"), 3, "/tmp/t.json", 2)
    assert c.url == "http://collector:4318/v1/traces" and c.resource == {"deployment": "test"}
    for spec, word in [
        ("rate=0", ">= 1"), ("level=LOUD", "LOUD"), ("mode=jaeger", "mode must be"), ("file=/x", "triton,file"),
        ("zipkin,url=x", "unknown trace mode"), ("triton,url=x", "unknown triton-mode setting"),
        ("nonsense", "key=value"), ("opentelemetry,resource=x", "key=value"),
    ]:
        with pytest.raises(ValueError, match=re.escape(word)):
            TraceConfig.parse([spec])


_WITHOUT_OTLP = ("import sys; sys.modules['opentelemetry.exporter.otlp.proto.http.trace_exporter'] = None; "
                 "from inferd.cli import main; sys.exit(main(sys.argv[1:]))")


def test_opentelemetry_mode_without_the_otlp_package_is_refused(tmp_path):
    """Without inferd[otlp] (its import made to fail, as in a base install) the mode names the extra."""
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTLP, "serve", "--model-repository", str(tmp_path),
         "--trace-config", "mode=opentelemetry"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "opentelemetry-exporter-otlp-proto-http" in result.stderr
    assert "pip install 'inferd[otlp]'" in result.stderr


class _Collector(http.server.BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: keeps every POSTed ExportTraceServiceRequest body."""

    bodies: list[tuple[str, str, bytes]] = []

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.bodies.append((self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.server
def test_opentelemetry_mode_exports_spans_over_otlp_http(tmp_path):
    """inferd[otlp] installed (the test extra has it): a traced request reaches an OTLP/HTTP collector
    as protobuf spans naming the model, under the traceparent the client sent."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=collector.serve_forever, daemon=True)
    thread.start()
    url = f"127.0.0.1:{collector.server_address[1]}/v1/traces"
    server = ServerProcess(_repo(tmp_path), ["--trace-config", "mode=opentelemetry", "--trace-config",
                                             f"opentelemetry,url={url}", "--trace-config", "rate=1",
                                             "--trace-config", "level=TIMESTAMPS"])
    try:
        client = grpcclient.InferenceServerClient(server.url)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        client.infer("simple", inputs, headers={"traceparent": TRACEPARENT})
        client.close()
        spans = []
        deadline = time.monotonic() + 30  # the batch span processor exports within its 5 s schedule
        while time.monotonic() < deadline and not any(s.trace_id.hex() == TRACE_ID for s in spans):
            time.sleep(0.1)
            spans = []
            for path, content_type, body in list(_Collector.bodies):
                assert path == "/v1/traces" and content_type == "application/x-protobuf"
                export = ExportTraceServiceRequest.FromString(body)
                spans += [s for rs in export.resource_spans for ss in rs.scope_spans for s in ss.spans]
    finally:
        server.stop()
        collector.shutdown()
    ours = [s for s in spans if s.trace_id.hex() == TRACE_ID]
    assert ours, f"no span of trace {TRACE_ID} among {len(spans)} exported"
    attributes = {kv.key: kv.value.string_value for s in ours for kv in s.attributes}
    assert "simple" in attributes.values(), attributes
    assert any(s.parent_span_id.hex() == PARENT_ID for s in ours)


def _triton_traces(entries: list[dict]) -> dict[int, dict]:
    """Read a trace file back as Triton's trace_summary.py does: entries grouped by id."""
    traces: dict[int, dict] = {}
    for entry in entries:
        t = traces.setdefault(entry["id"], {"timestamps": {}, "tensors": []})
        for key in ("model_name", "model_version", "request_id", "parent_id"):
            if key in entry:
                t[key] = entry[key]
        for ts in entry.get("timestamps", []):
            t["timestamps"][ts["name"]] = ts["ns"]
        if "activity" in entry:
            t["tensors"].append((entry["activity"], entry["tensor"]))
    return traces


def test_file_destination_writes_tritons_trace_format(tmp_path):
    path = tmp_path / "trace.json"
    tracing = Tracing(TraceConfig(level=("TIMESTAMPS", "TENSORS"), rate=1, file=str(path), log_frequency=0))
    trace = tracing.start("ens", "r1", version=2)
    trace.tensors_attributes("input", {"IN": np.array([[0.5, 1.5]], np.float32)})
    t0 = time.time_ns()
    step = ensemble_step(trace, "0 simple", "simple", 1)
    step.record("queue", t0, t0 + 10)
    step.record("compute", t0 + 10, t0 + 30, {"batch_size": 1, "input_ns": 4, "infer_ns": 10, "output_ns": 3})
    step.tensors_attributes("output", {"OUT": np.array([[7]], np.int32)})
    step.end()
    trace.end()
    assert path.read_text() == ""  # log_frequency 0: written when the server stops
    tracing.shutdown()
    entries = json.loads(path.read_text())  # one JSON array, as Triton writes it
    traces = _triton_traces(entries)
    assert len(traces) == 2
    (root_id, root), (step_id, child) = sorted(traces.items())
    assert (root["model_name"], root["model_version"], root["request_id"]) == ("ens", 2, "r1")
    assert "parent_id" not in root
    assert (child["model_name"], child["model_version"], child["parent_id"]) == ("simple", 1, root_id)
    assert list(child["timestamps"]) == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                                         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    ts = child["timestamps"]
    assert ts["QUEUE_START"] == t0 and ts["COMPUTE_START"] == t0 + 10 and ts["COMPUTE_END"] == t0 + 30
    # The backend's split counted back from COMPUTE_END: output 3 ns, infer 10 ns before it.
    assert ts["COMPUTE_OUTPUT_START"] == t0 + 27 and ts["COMPUTE_INPUT_END"] == t0 + 17
    assert root["timestamps"]["REQUEST_START"] <= ts["REQUEST_START"] <= ts["REQUEST_END"] <= root["timestamps"]["REQUEST_END"]
    assert root["tensors"] == [("TENSOR_QUEUE_INPUT", {"name": "IN", "data": "0.5,1.5", "shape": "1,2", "dtype": "FP32"})]
    assert child["tensors"] == [("TENSOR_BACKEND_OUTPUT", {"name": "OUT", "data": "7", "shape": "1,1", "dtype": "INT32"})]


def test_file_destination_with_log_frequency_writes_numbered_files(tmp_path):
    path = tmp_path / "trace.json"
    tracing = Tracing(TraceConfig(level=("TIMESTAMPS",), rate=1, file=str(path), log_frequency=2))
    for i in range(3):
        tracing.start("simple", f"r{i}").end()
    tracing.shutdown()
    first = _triton_traces(json.loads((tmp_path / "trace.json.0").read_text()))
    second = _triton_traces(json.loads((tmp_path / "trace.json.1").read_text()))
    assert sorted(t["request_id"] for t in first.values()) == ["r0", "r1"]
    assert [t["request_id"] for t in second.values()] == ["r2"]


# -- over gRPC ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traced_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("traced")
    trace_file = tmp / "trace.jsonl"
    server = ServerProcess(_repo(tmp), ["--trace-config", f"triton,file={trace_file}", "--trace-config", "rate=1"])
    yield server, trace_file
    server.stop()


def test_trace_setting_rpc_and_traceparent(traced_server):
    server, trace_file = traced_server
    client = grpcclient.InferenceServerClient(server.url)
    settings = client.get_trace_settings().settings
    assert list(settings["trace_level"].value) == ["OFF"] and list(settings["trace_rate"].value) == ["1"]
    assert list(settings["trace_file"].value) == [str(trace_file)] and list(settings["trace_mode"].value) == ["triton"]

    a = np.ones((1, 16), dtype=np.int32)
    inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(a)
    client.infer("simple", inputs, headers={"traceparent": f"00-{'1' * 32}-{'2' * 16}-01"})  # off: no trace

    updated = client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "log_frequency": ["1"]}).settings
    assert list(updated["trace_level"].value) == ["TIMESTAMPS"] and list(updated["log_frequency"].value) == ["1"]
    client.infer("simple", inputs, headers={"traceparent": TRACEPARENT}, request_id="traced-1")
    model = client.update_trace_settings("simple", settings={"trace_rate": ["7"]}).settings
    assert list(model["trace_rate"].value) == ["7"]
    assert list(client.get_trace_settings().settings["trace_rate"].value) == ["1"]  # global unchanged

    with pytest.raises(InferenceServerException) as exc:
        client.update_trace_settings(settings={"trace_rate": ["-3"]})
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "trace_rate" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        client.update_trace_settings(settings={"trace_file": ["/tmp/elsewhere"]})
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"

    # log_frequency 1: each trace in a file of its own, trace.json.0 first (the exporter batches in
    # the background). The W3C parent is tested on the spans themselves (test_traceparent_...).
    first = trace_file.with_name(trace_file.name + ".0")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (first.exists() and first.read_text().strip()):
        time.sleep(0.2)
    traces = _triton_traces(json.loads(first.read_text()))
    assert [(t["model_name"], t["request_id"]) for t in traces.values()] == [("simple", "traced-1")]  # the untraced one left nothing
    (trace,) = traces.values()
    assert list(trace["timestamps"]) == GRPC_ORDER
    client.close()


def test_trace_setting_without_destination(example_server):
    client = grpcclient.InferenceServerClient(example_server.url)
    assert list(client.get_trace_settings().settings["trace_level"].value) == ["OFF"]
    with pytest.raises(InferenceServerException) as exc:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "no destination" in exc.value.message()
    client.close()


def test_log_settings_change_level_and_format(start_server, tmp_path):
    repo = _repo(tmp_path)
    server = start_server(repo, ["--model-control-mode", "explicit"])
    client = grpcclient.InferenceServerClient(server.url)
    settings = client.get_log_settings().settings
    assert settings["log_info"].bool_param is True and settings["log_format"].string_param == "default"
    assert settings["log_verbose_level"].uint32_param == 0 and settings["log_file"].string_param == ""

    updated = client.update_log_settings({"log_info": False}).settings
    assert updated["log_info"].bool_param is False and updated["log_warning"].bool_param is True
    client.load_model("simple")
    client.update_log_settings({"log_info": True, "log_format": "ISO8601"})
    client.unload_model("simple")
    client.update_log_settings({"log_verbose_level": 1})
    assert client.get_log_settings().settings["log_verbose_level"].uint32_param == 1

    for bad, word in [({"log_info": None}, "must be a bool"), ({"log_format": "xml"}, "log_format"),
                      ({"log_file": "/tmp/x.log"}, "cannot be changed"), ({"colour": True}, "unknown log setting")]:
        with pytest.raises(InferenceServerException) as exc:
            client.update_log_settings(bad)
        assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and word in exc.value.message()
    client.close()
    server.stop()
    log = server.log()
    assert "manager: loaded model 'simple'" not in log  # info was off while it loaded
    unloaded = next(line for line in log.splitlines() if "unloaded model 'simple'" in line)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", unloaded), unloaded  # ISO 8601 from then on


# -- the frontends' timestamps (Triton's GRPC_* and HTTP_*), in either process mode ------------------

CORE_ORDER = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START",
              "COMPUTE_END", "REQUEST_END"]
GRPC_ORDER = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *CORE_ORDER, "GRPC_SEND_START", "GRPC_SEND_END"]
HTTP_ORDER = ["HTTP_RECV_START", "HTTP_RECV_END", *CORE_ORDER, "HTTP_SEND_START", "HTTP_SEND_END"]
# A checkout or bare mirror of triton-inference-server/server: its qa/common/trace_summary.py reads the file.
TRITON_SERVER_REPO = os.environ.get("TRITON_SERVER_REPO", "")


def _trace_summary(trace_file) -> str | None:
    """Triton's own trace_summary.py run over ``trace_file``, or None without the repository."""
    if not TRITON_SERVER_REPO:
        return None
    source = pathlib.Path(TRITON_SERVER_REPO)
    script = source / "qa" / "common" / "trace_summary.py"
    if script.is_file():
        code = script.read_text()
    else:
        proc = subprocess.run(["git", "--git-dir", str(source), "show", "HEAD:qa/common/trace_summary.py"],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            return None
        code = proc.stdout
    copy = pathlib.Path(str(trace_file) + ".summary.py")
    copy.write_text(code)
    proc = subprocess.run([sys.executable, str(copy), str(trace_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# A Python model whose BLS call to simple is traced with its request (trace=request.trace()); it
# answers simple's OUTPUT0 and its trace's context (get_context(), "" when not traced).
BLS_TRACED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            call = pb_utils.InferenceRequest(
                model_name="simple", requested_output_names=["OUTPUT0"], trace=request.trace(),
                inputs=[pb_utils.Tensor("INPUT0", x), pb_utils.Tensor("INPUT1", x)])
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            context = request.trace().get_context() or ""
            out.append(pb_utils.InferenceResponse([
                pb_utils.get_output_tensor_by_name(response, "OUTPUT0"),
                pb_utils.Tensor("CONTEXT", np.array([context.encode()], np.object_))]))
        return out
'''


def _bls_repo(tmp_path):
    repo = _repo(tmp_path)
    (repo / "bls" / "1").mkdir(parents=True)
    (repo / "bls" / "1" / "model.py").write_text(BLS_TRACED)
    (repo / "bls" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, '
        '{ name: "CONTEXT" data_type: TYPE_STRING dims: [ 1 ] } ]\n')
    return repo


def test_an_untraced_requests_trace_has_no_context():
    import triton_python_backend_utils as pb_utils

    assert pb_utils.InferenceTrace().get_context() is None
    with pytest.raises(pb_utils.TritonModelException, match="trace must be a pb_utils.InferenceTrace"):
        pb_utils.InferenceRequest(model_name="m", trace="00-abc")


@pytest.mark.server
def test_frontend_timestamps_reach_the_trace_file(tmp_path):
    import tritonclient.http as httpclient

    trace_file = tmp_path / "trace.json"
    args = ["--trace-config", f"triton,file={trace_file}", "--trace-config", "rate=1",
            "--trace-config", "level=TIMESTAMPS"]  # log-frequency 0: the whole file when the server stops
    a = np.ones((1, 16), dtype=np.int32)
    with running(_bls_repo(tmp_path), extra_args=args) as server:
        g = grpcclient.InferenceServerClient(server.url)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for i in inputs:
            i.set_data_from_numpy(a)
        g.infer("simple", inputs, request_id="via-grpc")
        g.close()
        with httpclient.InferenceServerClient(server.http_url) as h:
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for i in inputs:
                i.set_data_from_numpy(a)
            h.infer("simple", inputs, request_id="via-http")
            # A refused request's trace ends too (its error is what the frontend sends).
            bad = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "NOT_AN_INPUT")]
            for i in bad:
                i.set_data_from_numpy(a)
            with pytest.raises(InferenceServerException):
                h.infer("simple", bad, request_id="bad-http")
            bls_in = httpclient.InferInput("IN", [1, 16], "INT32")
            bls_in.set_data_from_numpy(a)
            answer = h.infer("bls", [bls_in], request_id="via-bls", headers={"traceparent": TRACEPARENT})
    assert answer.as_numpy("OUTPUT0").tolist() == (a + a).tolist()
    context = json.loads(answer.as_numpy("CONTEXT")[0])
    # The request's span is a child of the HTTP header's W3C parent: same trace id, its own span id.
    assert re.fullmatch(rf"00-{TRACE_ID}-[0-9a-f]{{16}}-[0-9a-f]{{2}}", context["traceparent"]), context
    assert PARENT_ID not in context["traceparent"], context
    all_traces = _triton_traces(json.loads(trace_file.read_text()))
    traces = {t.get("request_id"): t for t in all_traces.values() if "parent_id" not in t}
    assert set(traces) == {"via-grpc", "via-http", "bad-http", "via-bls"}, traces
    # The BLS call: a child trace of the bls request's, with simple's own queue and compute.
    (bls_id,) = [i for i, t in all_traces.items() if t.get("request_id") == "via-bls"]
    children = [t for t in all_traces.values() if t.get("parent_id") == bls_id]
    assert [c["model_name"] for c in children] == ["simple"], children
    assert list(children[0]["timestamps"]) == CORE_ORDER
    for request_id, order in (("via-grpc", GRPC_ORDER), ("via-http", HTTP_ORDER)):
        stamps = traces[request_id]["timestamps"]
        assert list(stamps) == order, (request_id, stamps)
        values = [stamps[name] for name in order]
        assert values == sorted(values), (request_id, stamps)  # as they happened, on one clock
    failed = traces["bad-http"]["timestamps"]
    assert list(failed) == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "REQUEST_END",
                            "HTTP_SEND_START", "HTTP_SEND_END"], failed
    summary = _trace_summary(trace_file)
    if summary is not None:  # Triton's per-protocol summary finds each frontend's requests
        assert "HTTP infer request (avg)" in summary and "GRPC infer request (avg)" in summary, summary
        assert "Infer (avg)" in summary, summary  # the compute split: input, infer, output


def test_a_frontends_request_is_written_once_its_answer_is_sent(tmp_path):
    from inferd.types import FrontendStamps

    path = tmp_path / "trace.json"
    tracing = Tracing(TraceConfig(level=("TIMESTAMPS",), rate=1, file=str(path), log_frequency=1))
    sent = tracing.start("simple", "sent")
    t0 = time.monotonic_ns()
    stamps = FrontendStamps("http", t0, t0 + 1000)
    sent.frontend(stamps)
    sent.end()
    never = tracing.start("simple", "never")
    gone = FrontendStamps("grpc", t0, t0 + 1000)
    never.frontend(gone)
    never.end()
    tracing._provider.force_flush()
    assert not (tmp_path / "trace.json.0").exists()  # both wait for their frontend
    t1 = time.monotonic_ns()
    stamps.sent(t1, t1 + 500)
    stamps.sent(1, 2)  # once only
    gone.sent(None, None)  # the client went away before an answer: no send stamps
    tracing.shutdown()
    traces = {}
    for name in ("trace.json.0", "trace.json.1"):
        traces.update({t["request_id"]: t for t in _triton_traces(json.loads((tmp_path / name).read_text())).values()})
    http = traces["sent"]["timestamps"]
    assert list(http) == ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "REQUEST_END",
                          "HTTP_SEND_START", "HTTP_SEND_END"]
    assert http["HTTP_RECV_END"] - http["HTTP_RECV_START"] == 1000
    assert http["HTTP_SEND_END"] - http["HTTP_SEND_START"] == 500
    assert http["REQUEST_END"] <= http["HTTP_SEND_START"]
    assert list(traces["never"]["timestamps"]) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START",
                                                   "REQUEST_END"]


class _Context:
    """What the one-process ModelInfer asks of a grpc.aio context on its success path."""

    def time_remaining(self) -> None:
        return None

    def cancelled(self) -> bool:
        return False

    def invocation_metadata(self) -> tuple:
        return ()


async def test_the_grpc_frontend_stamps_a_request_only_while_tracing_is_on(plane):
    # Untraced, a request carries no FrontendStamps (the façade's tracing_on, asked per request);
    # traced, its stamps reach the trace, whose root span waits for the send.
    from inferd._proto import grpc_service_pb2 as pb
    from inferd.frontends.grpc_service import InferenceServicer

    dp, exporter = plane
    seen = []
    infer = dp.infer

    async def recording(request, **kw):  # type: ignore[no-untyped-def]
        seen.append(request.frontend)
        return await infer(request, **kw)

    dp.infer = recording
    message = pb.ModelInferRequest(model_name="simple", id="via-grpc")
    for name in ("INPUT0", "INPUT1"):
        message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        message.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    servicer = InferenceServicer(dp)
    traced = await servicer.ModelInfer(message, _Context())
    assert len(traced.raw_output_contents) == 2
    assert seen[0] is not None and seen[0].protocol == "grpc"
    assert [s.name for s in exporter.get_finished_spans() if s.name == ROOT_SPAN] == [ROOT_SPAN]  # ended on the send
    tracing, dp.tracing = dp.tracing, Tracing()  # off
    try:
        untraced = await servicer.ModelInfer(message, _Context())
    finally:
        dp.tracing = tracing
    assert untraced.raw_output_contents == traced.raw_output_contents
    assert seen[1] is None

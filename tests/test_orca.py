"""Issue 47 item 5: the ORCA load report on HTTP generate / generate_stream (Triton's orca_http): the
``endpoint-load-metrics-format`` request header makes the answer carry ``endpoint-load-metrics``, computed
as Triton computes it from the KV-cache block metrics a Python model registers under Triton's name
(``nv_trt_llm_kv_cache_block_metrics``: ``nv_`` names are the models' to use, as in Triton). The
formatting first, then a real server (both process modes: the metrics live in the core)."""

from __future__ import annotations

import json
import urllib.request

import pytest

from inferd.frontends.orca import header_value, load_metrics

KV_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.family = pb_utils.MetricFamily("nv_trt_llm_kv_cache_block_metrics", "KV cache blocks",
                                            pb_utils.MetricFamily.GAUGE)
        self.metrics = []
        for kind, value in (("tokens_per", 64), ("used", 3), ("max", 12)):
            metric = self.family.Metric(labels={**labels, "kv_cache_block_type": kind})
            metric.set(value)
            self.metrics.append(metric)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "text_output", pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy())]) for r in requests]
'''
KV_CONFIG = '''name: "kv"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
'''
JSON_REPORT = 'JSON {"named_metrics":{"kv_cache_utilization":0.25,"max_token_capacity":768}}'
TEXT_REPORT = "TEXT named_metrics.kv_cache_utilization=0.250000, named_metrics.max_token_capacity=768"


def test_the_report_is_computed_and_written_as_tritons() -> None:
    blocks = {"tokens_per": 64.0, "used": 3.0, "max": 12.0}
    assert load_metrics(blocks) == (0.25, 768)
    assert header_value("json", blocks) == JSON_REPORT
    assert header_value("text", blocks) == TEXT_REPORT
    assert header_value("json", {"tokens_per": 16.0, "used": 0.0, "max": 0.0}) == (
        'JSON {"named_metrics":{"kv_cache_utilization":0.0,"max_token_capacity":0}}')
    assert header_value("json", {"tokens_per": 1.0, "used": 1.0, "max": 100000.0}) == (
        'JSON {"named_metrics":{"kv_cache_utilization":1e-5,"max_token_capacity":100000}}')
    assert header_value("json", {"tokens_per": 64.0, "used": 3.0}) is None  # a block metric missing
    assert header_value("xml", blocks) is None


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    from conftest import running

    repo = tmp_path_factory.mktemp("orca_repo")
    (repo / "kv" / "1").mkdir(parents=True)
    (repo / "kv" / "1" / "model.py").write_text(KV_MODEL)
    (repo / "kv" / "config.pbtxt").write_text(KV_CONFIG)
    with running(repo) as s:
        yield s


def _generate(server, route: str, fmt: str | None) -> tuple[str | None, bytes]:  # type: ignore[no-untyped-def]
    headers = {"Content-Type": "application/json"}
    if fmt is not None:
        headers["endpoint-load-metrics-format"] = fmt
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/kv/{route}",
                                     json.dumps({"text_input": "hi"}).encode(), headers)
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.headers.get("endpoint-load-metrics"), answer.read()


@pytest.mark.parametrize("route", ["generate", "generate_stream"])
def test_generate_answers_carry_the_load_report_when_asked(server, route) -> None:  # type: ignore[no-untyped-def]
    report, body = _generate(server, route, "json")
    assert report == JSON_REPORT and b'"text_output":"hi"' in body
    assert _generate(server, route, "text")[0] == TEXT_REPORT
    assert _generate(server, route, None)[0] is None
    assert _generate(server, route, "yaml")[0] is None


def test_the_models_nv_metric_is_on_metrics(server) -> None:  # type: ignore[no-untyped-def]
    assert server.metric("nv_trt_llm_kv_cache_block_metrics",
                         '{kv_cache_block_type="max",model="kv",version="1"}') == 12

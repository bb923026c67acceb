"""deploy/grafana/inferd.json: every query names metrics and labels that a running
server exports on /metrics, and the panels cover what operators watch."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "inferd.json"
_METRIC = re.compile(r"\b((?:inferd|nv|process)_[a-z0-9_]+)\b")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"\{([^}]*)\}")
_LEGEND = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _queries(dash: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, expression, legend) for every target, and the template variables' queries."""
    out = [(p["title"], t["expr"], t.get("legendFormat", "")) for p in dash["panels"] for t in p["targets"]]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"], ""))
    return out


def _exported(metrics_url: str) -> tuple[set[str], set[str]]:
    text = urllib.request.urlopen(metrics_url, timeout=30).read().decode()
    names, labels = set(), set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)  # Triton's counters are exported without _total, the parser's samples add it
        for sample in family.samples:
            names.add(sample.name)
            labels.update(sample.labels)
    return names, labels


def test_every_query_names_a_metric_and_labels_the_server_exports(example_server) -> None:
    names, labels = _exported(example_server.metrics_url)
    labels |= {"instance", "job"}  # added by Prometheus at scrape time
    queries = _queries(_dashboard())
    for title, expr, legend in queries:
        metrics = _METRIC.findall(expr)
        assert metrics, f"{title}: {expr} names no inferd metric"
        for metric in metrics:
            assert metric in names, f"{title}: {metric} is not exported (exported: {sorted(names)})"
        used = {label.strip() for group in _GROUPING.findall(expr) for label in group.split(",") if label.strip()}
        used |= {m.split("=")[0].rstrip("!~").strip() for block in _MATCHER.findall(expr) for m in block.split(",")}
        used |= set(_LEGEND.findall(legend))
        assert used <= labels, f"{title}: labels {sorted(used - labels)} are not exported"


def test_the_panels_cover_throughput_latency_queue_batch_and_failures_per_model() -> None:
    dash = _dashboard()
    exprs = " ".join(e for _, e, _ in _queries(dash))
    for metric in ("nv_inference_request_success", "inferd_inference_request_duration_seconds_bucket",
                   "inferd_inference_queue_duration_seconds_bucket", "inferd_inference_batch_size_bucket",
                   "inferd_inference_request_failure_total"):
        assert metric in exprs
    assert "by (model, reason)" in exprs
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "model"}
    for panel in dash["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert 'model=~"$model"' in target["expr"] or "by (model" not in target["expr"], panel["title"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))

"""Prometheus metrics: per model version counters, gauges and histograms.

Served on ``/metrics`` of the metrics port (docs/METRICS.md lists every
metric and the Triton ``nv_inference_*`` name it stands for).

Cost on the request path: the counters are not kept twice. :class:`ModelStats`
already counts successes, failures by reason, inferences, executions and the
cumulative durations for the statistics extension; the collector reads them
when Prometheus scrapes, so the metrics and ModelStatistics can never
disagree. Only the histograms need per-request work: a :class:`ModelHistograms`
observer is attached to each model version's stats when it is built (before
it takes a request), holds its own bucket arrays (no label lookup, no lock:
stats are updated on the event loop, and the scrape runs there too) and
costs a bisect and two additions per observation.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector, make_asgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from inferd.observability import stats as stats_module
from inferd.observability.stats import ModelStats

if TYPE_CHECKING:
    from inferd.dataplane import DataPlane

# Seconds: 100 us .. 60 s, as a request to a small CPU model and to a large one lands.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Failure reasons always exported (as 0 until one happens), so rate() works from the first scrape.
FAILURE_REASONS = ("INVALID_ARGUMENT", "UNAVAILABLE", "SLO_REFUSED", "TIMEOUT", "CANCELED", "INTERNAL")
# A client that went away is "CANCELED" whichever way the data plane learnt of it.
_REASON_ALIASES = {"CANCELLED": "CANCELED"}
LOAD_STATES = ("READY", "LOADING", "UNLOADING", "UNAVAILABLE")


class Histogram:
    """Cumulative-on-export bucket counts; not thread-safe (event loop only)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += n
        self.total += value * n

    def buckets(self) -> list[tuple[str, float]]:
        out = []
        running = 0
        for bound, count in zip(self.bounds, self.counts):
            running += count
            out.append((floatToGoString(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


class ModelHistograms:
    """The ModelStats observer of one model version."""

    __slots__ = ("request", "queue", "compute", "batch")

    def __init__(self) -> None:
        self.request = Histogram(LATENCY_BUCKETS)
        self.queue = Histogram(LATENCY_BUCKETS)
        self.compute = Histogram(LATENCY_BUCKETS)
        self.batch = Histogram(BATCH_BUCKETS)

    def __call__(self, event: str, stats: ModelStats, data: dict) -> None:
        if event == "success":
            self.request.observe(data["ns"] * 1e-9)
        elif event == "queue":
            self.queue.observe(data["ns"] * 1e-9)
        elif event == "execution":
            # Each request of the batch is charged the batch's compute time, as in ModelStatistics.
            self.compute.observe((data["input_ns"] + data["infer_ns"] + data["output_ns"]) * 1e-9, data["requests"])
            self.batch.observe(data["rows"])


def histograms_of(stats: ModelStats) -> ModelHistograms | None:
    for observer in stats.observers:
        if isinstance(observer, ModelHistograms):
            return observer
    return None


class InferdCollector:
    """Reads every loaded model version's stats at scrape time."""

    def __init__(self, dataplane: "DataPlane") -> None:
        self.dp = dataplane

    def collect(self) -> Iterator[Metric]:
        L = ["model", "version"]
        c = CounterMetricFamily
        success = c("inferd_inference_request_success", "Successful inference requests", labels=L)
        failure = c("inferd_inference_request_failure", "Failed inference requests, by reason", labels=[*L, "reason"])
        count = c("inferd_inference_count", "Inferences performed (a batch of N rows counts N)", labels=L)
        exec_count = c("inferd_inference_exec_count", "Model executions (a dynamic batch counts 1)", labels=L)
        request_us = c("inferd_inference_request_duration_us",
                       "Cumulative end-to-end duration of successful requests, microseconds", labels=L)
        queue_us = c("inferd_inference_queue_duration_us", "Cumulative time requests waited in the queue, microseconds",
                     labels=L)
        input_us = c("inferd_inference_compute_input_duration_us",
                     "Cumulative compute input duration, microseconds (per request)", labels=L)
        infer_us = c("inferd_inference_compute_infer_duration_us",
                     "Cumulative compute infer (model) duration, microseconds (per request)", labels=L)
        output_us = c("inferd_inference_compute_output_duration_us",
                      "Cumulative compute output duration, microseconds (per request)", labels=L)
        hits = c("inferd_cache_hit_count", "Requests answered from the response cache", labels=L)
        misses = c("inferd_cache_miss_count", "Requests the response cache did not hold (then executed)", labels=L)
        hit_us = c("inferd_cache_hit_duration_us",
                   "Cumulative time finding and extracting response cache hits, microseconds", labels=L)
        miss_us = c("inferd_cache_miss_duration_us",
                    "Cumulative time looking up and inserting response cache misses, microseconds", labels=L)
        pending = GaugeMetricFamily("inferd_inference_pending_request_count",
                                    "Requests waiting in the queue for a model instance", labels=L)
        inflight = GaugeMetricFamily("inferd_inference_inflight_request_count",
                                     "Requests accepted and not yet answered (queued or executing)", labels=L)
        h = HistogramMetricFamily
        request_h = h("inferd_inference_request_duration_seconds",
                      "End-to-end duration of successful requests in the server", labels=L)
        queue_h = h("inferd_inference_queue_duration_seconds", "Time a request waited in the queue", labels=L)
        compute_h = h("inferd_inference_compute_duration_seconds",
                      "Compute time (input + infer + output) of the execution that ran a request", labels=L)
        batch_h = h("inferd_inference_batch_size", "Rows per model execution", labels=L)

        for model in self.dp.manager.models():
            s = model.stats
            lv = [model.name, str(model.version)]
            success.add_metric(lv, s.success.count)
            reasons = dict.fromkeys(FAILURE_REASONS, 0)
            for reason, n in s.fail_reasons.items():
                reason = _REASON_ALIASES.get(reason, reason)
                reasons[reason] = reasons.get(reason, 0) + n
            for reason, n in reasons.items():
                failure.add_metric([*lv, reason], n)
            count.add_metric(lv, s.inference_count)
            exec_count.add_metric(lv, s.execution_count)
            request_us.add_metric(lv, s.success.ns // 1000)
            queue_us.add_metric(lv, s.queue.ns // 1000)
            input_us.add_metric(lv, s.compute_input.ns // 1000)
            infer_us.add_metric(lv, s.compute_infer.ns // 1000)
            output_us.add_metric(lv, s.compute_output.ns // 1000)
            hits.add_metric(lv, s.cache_hit.count)
            misses.add_metric(lv, s.cache_miss.count)
            hit_us.add_metric(lv, s.cache_hit.ns // 1000)
            miss_us.add_metric(lv, s.cache_miss.ns // 1000)
            depth = getattr(model.scheduler, "queue_depth", None)
            pending.add_metric(lv, depth() if depth is not None else s.pending)
            inflight.add_metric(lv, s.pending)
            hist = histograms_of(s)
            if hist is not None:
                for family, one in ((request_h, hist.request), (queue_h, hist.queue), (compute_h, hist.compute),
                                    (batch_h, hist.batch)):
                    family.add_metric(lv, one.buckets(), one.total)

        state = GaugeMetricFamily("inferd_model_load_state",
                                  "1 for the state each model version is in, 0 for the others",
                                  labels=[*L, "state"])
        for entry in self.dp.manager.index():
            for name in LOAD_STATES:
                state.add_metric([entry.name, entry.version, name], 1 if entry.state == name else 0)
        ready = GaugeMetricFamily("inferd_server_ready", "1 when the server is ready for inference")
        ready.add_metric([], 1 if self.dp.ready_now() else 0)

        yield from (success, failure, count, exec_count, request_us, queue_us, input_us, infer_us, output_us,
                    hits, misses, hit_us, miss_us, pending, inflight, request_h, queue_h, compute_h, batch_h, state, ready)


class ServerMetrics:
    """The registry behind ``/metrics``; attaches histograms to each model version as it is built."""

    def __init__(self, dataplane: "DataPlane") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(InferdCollector(dataplane))  # type: ignore[arg-type]
        stats_module.on_create.append(self._attach)
        for model in dataplane.manager.models():  # any already loaded
            self._attach(model.stats)

    @staticmethod
    def _attach(stats: ModelStats) -> None:
        if histograms_of(stats) is None:
            stats.observers.append(ModelHistograms())

    def close(self) -> None:
        if self._attach in stats_module.on_create:
            stats_module.on_create.remove(self._attach)

    def asgi_app(self) -> Any:
        """``/metrics`` (Prometheus text, or OpenMetrics when asked); 404 elsewhere."""
        metrics = make_asgi_app(self.registry)

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            if scope["path"] in ("/metrics", "/metrics/"):
                await metrics(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 404,
                        "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
            await send({"type": "http.response.body", "body": b"not found; metrics are on /metrics\n"})

        return app

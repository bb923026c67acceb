"""Prometheus metrics: per model version counters, gauges and histograms.

Served on ``/metrics`` of the metrics port (docs/METRICS.md lists every
metric). Where Triton has a metric, it is served under Triton's name, type,
labels (``model``, ``version``) and failure reasons, and nowhere else, so a
dashboard or alert built for Triton reads inferd unchanged and no quantity is
exported twice; ``inferd_*`` names are only for what Triton lacks (latency
histograms, batch sizes, in-flight requests, load states, failures by status).

Triton's counters carry no ``_total`` suffix. prometheus_client always adds
one to a counter (and OpenMetrics requires it), so those families are written
here in the Prometheus text format 0.0.4 that Triton serves, and ``/metrics``
answers in that format whatever the scraper's Accept header asks for: an
OpenMetrics answer would rename every Triton series.

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

import gzip
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from inferd.observability import custom_metrics, gpu_metrics
from inferd.observability.text_format import escape, family
from inferd.observability import stats as stats_module
from inferd.observability.stats import ModelStats

if TYPE_CHECKING:
    from inferd.dataplane import DataPlane

# Seconds: 100 us .. 60 s, as a request to a small CPU model and to a large one lands.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
# Triton's time to first response (--metrics-config histogram_latencies=true): whole milliseconds from a
# request reaching the model to its first response, one observation per request, Triton's default buckets.
FIRST_RESPONSE = "nv_inference_first_response_histogram_ms"
FIRST_RESPONSE_BUCKETS = (100.0, 500.0, 2000.0, 5000.0)
METRICS_SETTINGS = ("histogram_latencies", "counter_latencies", "summary_latencies", "summary_quantiles")
# Failure reasons always exported (as 0 until one happens), so rate() works from the first scrape.
FAILURE_REASONS = ("INVALID_ARGUMENT", "UNAVAILABLE", "SLO_REFUSED", "TIMEOUT", "CANCELED", "INTERNAL")
# A client that went away is "CANCELED" whichever way the data plane learnt of it.
_REASON_ALIASES = {"CANCELLED": "CANCELED"}
LOAD_STATES = ("READY", "LOADING", "UNLOADING", "UNAVAILABLE")

# Triton's failure reasons (core's FailureReason): a request the scheduler refused or timed out,
# one the client cancelled, one the model failed to execute, anything else.
TRITON_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
_TRITON_REASON = {"UNAVAILABLE": "REJECTED", "SLO_REFUSED": "REJECTED", "TIMEOUT": "REJECTED",
                  "CANCELED": "CANCELED", "CANCELLED": "CANCELED", "INTERNAL": "BACKEND"}


def triton_reason(reason: str, ensemble: bool) -> str:
    """Triton's reason for one of inferd's (a gRPC status name, TIMEOUT or CANCELED).
    An ensemble's own failures are OTHER, as Triton counts them."""
    return "OTHER" if ensemble else _TRITON_REASON.get(reason, "OTHER")


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
    """The ModelStats observer of one model version. Attached when the stats are created,
    before the builder sets the config's bucket overrides (``model_metrics``), which are
    taken at the first event or scrape (:meth:`settle`), before anything was observed."""

    __slots__ = ("request", "queue", "compute", "batch", "first", "inter", "first_ms", "settled")

    def __init__(self, first_response: bool = False) -> None:
        self.request = Histogram(LATENCY_BUCKETS)
        self.queue = Histogram(LATENCY_BUCKETS)
        self.compute = Histogram(LATENCY_BUCKETS)
        self.batch = Histogram(BATCH_BUCKETS)
        # A stream's responses (decoupled models): its first, and each later one from the one before. For a
        # model served under /v1 (one response per token) these are time to first token and per output token.
        self.first = Histogram(LATENCY_BUCKETS)
        self.inter = Histogram(LATENCY_BUCKETS)
        # Triton's nv_inference_first_response_histogram_ms, when histogram_latencies is on.
        self.first_ms = Histogram(FIRST_RESPONSE_BUCKETS) if first_response else None
        self.settled = False

    def settle(self, stats: ModelStats) -> None:
        self.settled = True
        custom = stats.histogram_buckets
        for family, attr in (("inferd_inference_request_duration_seconds", "request"),
                             ("inferd_inference_queue_duration_seconds", "queue"),
                             ("inferd_inference_compute_duration_seconds", "compute"),
                             ("inferd_inference_batch_size", "batch")):
            if family in custom:
                setattr(self, attr, Histogram(custom[family]))
        if self.first_ms is not None and FIRST_RESPONSE in custom:
            self.first_ms = Histogram(custom[FIRST_RESPONSE])

    def __call__(self, event: str, stats: ModelStats, data: dict) -> None:
        if not self.settled:
            self.settle(stats)
        if event == "success":
            self.request.observe(data["ns"] * 1e-9)
        elif event == "queue":
            self.queue.observe(data["ns"] * 1e-9)
        elif event == "execution":
            # Each request of the batch is charged the batch's compute time, as in ModelStatistics.
            self.compute.observe((data["input_ns"] + data["infer_ns"] + data["output_ns"]) * 1e-9, data["requests"])
            self.batch.observe(data["rows"])
        elif event == "response":
            (self.inter if data["index"] else self.first).observe(data["ns"] * 1e-9)
        elif event == "first_response" and self.first_ms is not None:
            self.first_ms.observe(data["ns"] // 1_000_000)  # whole ms, as Triton divides its nanoseconds


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
        failure = CounterMetricFamily(
            "inferd_inference_request_failure",
            "Failed inference requests by the status the client received (the failures of "
            "nv_inference_request_failure, split finer than Triton's four reasons)", labels=[*L, "reason"])
        real = CounterMetricFamily("inferd_inference_real_elements",
                                   "Elements of request data in padded inputs (inferd.padding)", labels=L)
        padded = CounterMetricFamily("inferd_inference_pad_elements",
                                     "Elements of padding added to padded inputs (inferd.padding)", labels=L)
        waste = GaugeMetricFamily("inferd_inference_padding_waste",
                                  "Padding elements per element of request data since the model loaded", labels=L)
        memory = GaugeMetricFamily("inferd_model_memory_growth_bytes",
                                   "Resident memory the process gained while this version's own code executed, "
                                   "summed over executions (Python models only)", labels=L)
        inflight = GaugeMetricFamily("inferd_inference_inflight_request_count",
                                     "Requests accepted and not yet answered (queued or executing)", labels=L)
        h = HistogramMetricFamily
        request_h = h("inferd_inference_request_duration_seconds",
                      "End-to-end duration of successful requests in the server", labels=L)
        queue_h = h("inferd_inference_queue_duration_seconds", "Time a request waited in the queue", labels=L)
        compute_h = h("inferd_inference_compute_duration_seconds",
                      "Compute time (input + infer + output) of the execution that ran a request", labels=L)
        batch_h = h("inferd_inference_batch_size", "Rows per model execution", labels=L)
        first_h = h("inferd_stream_first_response_duration_seconds",
                    "Decoupled models: from a request reaching the model to its first response (time to first "
                    "token for a /v1 model)", labels=L)
        inter_h = h("inferd_stream_inter_response_duration_seconds",
                    "Decoupled models: from one response of a stream to the next (time per output token for a /v1 "
                    "model; the count is the responses after the first)", labels=L)
        prompt_tokens = CounterMetricFamily("inferd_openai_prompt_tokens",
                                            "/v1 models: prompt tokens of their requests (usage's prompt_tokens)",
                                            labels=L)
        completion_tokens = CounterMetricFamily("inferd_openai_completion_tokens",
                                                "/v1 models: tokens their responses carried (usage's "
                                                "completion_tokens)", labels=L)
        steps = CounterMetricFamily(
            "inferd_ensemble_step_requests",
            "An ensemble's requests per step, by the model the step ran and what it did: ran, skipped "
            "(a predicate did not hold: fallback tensors), split (it ran for some rows)",
            labels=[*L, "step", "step_model", "outcome"])

        paused = GaugeMetricFamily(
            "inferd_stream_paused_sequences",
            "Continuous-batching models: sequences holding a slot but taking no step, because their client has "
            "not read what their stream's bound holds (--stream-max-responses, --stream-max-bytes)", labels=L)
        pauses = CounterMetricFamily("inferd_stream_pauses",
                                     "Continuous-batching models: times a sequence was paused for its client "
                                     "since the model loaded", labels=L)

        for model in self.dp.manager.models():
            s = model.stats
            lv = [model.name, str(model.version)]
            scheduler = model.scheduler
            if hasattr(scheduler, "stream_pauses"):  # an IterativeScheduler
                paused.add_metric(lv, scheduler.paused_sequences())
                pauses.add_metric(lv, scheduler.stream_pauses)
            reasons = dict.fromkeys(FAILURE_REASONS, 0)
            for reason, n in s.fail_reasons.items():
                reason = _REASON_ALIASES.get(reason, reason)
                reasons[reason] = reasons.get(reason, 0) + n
            for reason, n in reasons.items():
                failure.add_metric([*lv, reason], n)
            real.add_metric(lv, s.real_elements)
            padded.add_metric(lv, s.pad_elements)
            waste.add_metric(lv, s.pad_elements / s.real_elements if s.real_elements else 0.0)
            if s.memory_growth is not None:
                memory.add_metric(lv, s.memory_growth)
            inflight.add_metric(lv, s.pending)
            if model.spec.openai is not None:
                prompt_tokens.add_metric(lv, s.prompt_tokens)
                completion_tokens.add_metric(lv, s.completion_tokens)
            for (index, step_model, outcome), n in sorted(s.steps.items()):
                steps.add_metric([*lv, str(index), step_model, outcome], n)
            hist = histograms_of(s)
            if hist is not None:
                if not hist.settled:
                    hist.settle(s)
                for family, one in ((request_h, hist.request), (queue_h, hist.queue), (compute_h, hist.compute),
                                    (batch_h, hist.batch), (first_h, hist.first), (inter_h, hist.inter)):
                    family.add_metric(lv, one.buckets(), one.total)

        state = GaugeMetricFamily("inferd_model_load_state",
                                  "1 for the state each model version is in, 0 for the others",
                                  labels=[*L, "state"])
        for entry in self.dp.manager.index():
            for name in LOAD_STATES:
                state.add_metric([entry.name, entry.version, name], 1 if entry.state == name else 0)
        ready = GaugeMetricFamily("inferd_server_ready", "1 when the server is ready for inference")
        ready.add_metric([], 1 if self.dp.ready_now() else 0)
        admission = self.dp.admission
        queued = GaugeMetricFamily("inferd_server_queued_requests",
                                   "Client requests the server holds (queued or executing), over all models")
        queued.add_metric([], admission.requests)
        queued_bytes = GaugeMetricFamily("inferd_server_queued_bytes", "Input tensor bytes of the requests held")
        queued_bytes.add_metric([], admission.bytes)
        rejected = CounterMetricFamily("inferd_server_overload_rejected",
                                       "Requests refused because the server held --max-queued-requests or "
                                       "--max-queued-bytes already (by the core, or by a frontend worker at its "
                                       "share of the requests cap or with its hand-off arena full), or gRPC calls "
                                       "past --grpc-max-held-calls")
        rejected.add_metric([], admission.refused_total())

        yield from (failure, real, padded, waste, inflight, request_h, queue_h, compute_h, batch_h, first_h, inter_h,
                    state, ready,
                    queued, queued_bytes, rejected, memory, steps, prompt_tokens, completion_tokens, paused, pauses)
        yield from self._residency()
        yield from self._hosts()

    def _hosts(self) -> Iterator[Metric]:
        """Model hosts (inferd/hosts/): each model's host restarts, and the hosts' resident memory."""
        hosts = self.dp.manager.hosts
        if hosts is None:
            return
        restarts = CounterMetricFamily("inferd_model_host_restarts",
                                       "Times a model's host process died (crashed, was killed for a stuck or "
                                       "runaway model) and was started again", labels=["model"])
        for name, n in sorted(hosts.restarts.items()):
            restarts.add_metric([name], n)
        processes = GaugeMetricFamily("inferd_model_host_processes", "Model host processes running, by model",
                                      labels=["model"])
        resident = GaugeMetricFamily("inferd_model_host_resident_bytes",
                                     "Resident memory of a model's host processes, as loaded", labels=["model"])
        by_model: dict[str, list[int]] = {}
        for instance in hosts.instances:
            if instance.host is not None:
                by_model.setdefault(instance.model.name, []).append(instance.rss)
        for name, sizes in sorted(by_model.items()):
            processes.add_metric([name], len(sizes))
            resident.add_metric([name], sum(sizes))
        yield from (restarts, processes, resident)

    def _residency(self) -> Iterator[Metric]:
        """--model-control-mode on_demand: loads, evictions, hits, misses, cold starts, footprints, by model
        name (cumulative across evictions: inferd/repository/demand.py keeps them)."""
        demand = self.dp.manager.demand
        if demand is None:
            return
        M = ["model"]
        counters = [
            (CounterMetricFamily("inferd_model_loads", "Loads of the model (on demand or pinned)", labels=M),
             lambda c: c.loads),
            (CounterMetricFamily("inferd_model_load_failures", "Demand loads of the model that failed", labels=M),
             lambda c: c.load_failures),
            (CounterMetricFamily("inferd_model_load_backoffs",
                                 "Requests answered at once with the model's last load failure (not loaded again "
                                 "before its backoff passes)", labels=M),
             lambda c: c.backoffs),
            (CounterMetricFamily("inferd_model_evictions",
                                 "Times the model was unloaded to make room under --model-memory-budget", labels=M),
             lambda c: c.evictions),
            (CounterMetricFamily("inferd_model_load_refusals",
                                 "Loads refused (RESOURCE_EXHAUSTED): the budget could not make room", labels=M),
             lambda c: c.refusals),
            (CounterMetricFamily("inferd_model_residency_hits", "Requests that found the model loaded", labels=M),
             lambda c: c.hits),
            (CounterMetricFamily("inferd_model_residency_misses", "Requests that waited for the model to load",
                                 labels=M), lambda c: c.misses),
            (CounterMetricFamily("inferd_model_cold_start_seconds",
                                 "Time requests waited for the model to load (cold start), summed", labels=M),
             lambda c: c.cold_start_ns / 1e9),
            (CounterMetricFamily("inferd_model_load_seconds", "Time the model's loads took, summed", labels=M),
             lambda c: c.load_ns / 1e9),
        ]
        for name, c in sorted(demand.counters.items()):
            for family_, read in counters:
                family_.add_metric([name], read(c))
        footprint = GaugeMetricFamily("inferd_model_footprint_bytes",
                                      "Host memory the model holds when loaded, as its last load measured it "
                                      "(at least its files)", labels=M)
        for name, n in sorted(demand.footprints.items()):
            footprint.add_metric([name], n)
        used = GaugeMetricFamily("inferd_model_memory_used_bytes", "Footprints of the loaded models, summed")
        used.add_metric([], demand.used())
        yield from (f for f, _ in counters)
        yield from (footprint, used)
        if demand.budget is not None:
            budget = GaugeMetricFamily("inferd_model_memory_budget_bytes", "--model-memory-budget")
            budget.add_metric([], demand.budget)
            yield budget
        gpu_used = demand.gpu_used()
        if gpu_used:
            used_gpu = GaugeMetricFamily("inferd_model_gpu_memory_used_bytes",
                                         "Footprints of the loaded models on the GPU, summed", labels=["gpu"])
            for device, n in sorted(gpu_used.items()):
                used_gpu.add_metric([str(device)], n)
            yield used_gpu
        if demand.gpu_budgets:
            budget_gpu = GaugeMetricFamily("inferd_model_gpu_memory_budget_bytes", "--model-gpu-memory-budget",
                                           labels=["gpu"])
            for device, n in sorted(demand.gpu_budgets.items()):
                budget_gpu.add_metric([str(device)], n)
            yield budget_gpu



# Triton's per-model families: (name, type, help, value of a model version's stats).
_Read = Callable[[Any], float]
TRITON_FAMILIES: tuple[tuple[str, str, str, _Read], ...] = (
    ("nv_inference_request_success", "counter", "Successful inference requests (a request counts 1 whatever its "
     "batch size)", lambda m: m.stats.success.count),
    ("nv_inference_count", "counter", "Inferences performed (a request of N batch rows counts N)",
     lambda m: m.stats.inference_count),
    ("nv_inference_exec_count", "counter", "Model executions (a dynamic batch counts 1)",
     lambda m: m.stats.execution_count),
    ("nv_inference_request_duration_us", "counter", "Cumulative end-to-end duration of successful requests in "
     "the server, microseconds", lambda m: m.stats.success.ns // 1000),
    ("nv_inference_queue_duration_us", "counter", "Cumulative time successful requests waited in the queue, "
     "microseconds", lambda m: m.stats.queue.ns // 1000),
    ("nv_inference_compute_input_duration_us", "counter", "Cumulative time spent preparing inputs for execution, "
     "microseconds (each request charged its batch's time)", lambda m: m.stats.compute_input.ns // 1000),
    ("nv_inference_compute_infer_duration_us", "counter", "Cumulative time the model executed, microseconds (each "
     "request charged its batch's time)", lambda m: m.stats.compute_infer.ns // 1000),
    ("nv_inference_compute_output_duration_us", "counter", "Cumulative time spent on outputs after execution, "
     "microseconds (each request charged its batch's time)", lambda m: m.stats.compute_output.ns // 1000),
    ("nv_inference_pending_request_count", "gauge", "Requests waiting in the queue for a model instance",
     lambda m: _queue_depth(m)),
)
_FAILURE_HELP = "Failed inference requests by Triton's reason (REJECTED, CANCELED, BACKEND, OTHER)"
# Triton's response cache families, for the model versions that use the cache (as Triton serves them).
CACHE_FAMILIES: tuple[tuple[str, str, str, _Read], ...] = (
    ("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model", lambda m: m.stats.cache_hit.count),
    ("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model",
     lambda m: m.stats.cache_miss.count),
    ("nv_cache_hit_duration_per_model", "counter", "Total cache hit duration per model, in microseconds",
     lambda m: m.stats.cache_hit.ns // 1000),
    ("nv_cache_miss_duration_per_model", "counter", "Total cache miss (insert+lookup) duration per model, in "
     "microseconds", lambda m: m.stats.cache_miss.ns // 1000),
)


def _tags(model: Any) -> str:
    """A model's metric_tags as extra labels on its Triton series (checked as label names at load)."""
    tags = getattr(model.stats, "metric_tags", ())
    return "".join(f',{k}="{escape(v)}"' for k, v in tags)


def _queue_depth(model: Any) -> float:
    depth = getattr(model.scheduler, "queue_depth", None)
    return depth() if depth is not None else model.stats.pending


def parse_metrics_config(settings: list[str]) -> dict[str, str]:
    """``--metrics-config <setting>=<value>`` (repeatable, Triton's flag) as a dict; ValueError in Triton's
    words for a malformed one, and naming the settings for one Triton does not know."""
    out: dict[str, str] = {}
    for arg in settings:
        name, eq, value = arg.partition("=")
        if not eq or "," in name or not name or not value:
            raise ValueError(f"--metrics-config option format is <setting>=<value>. Got {arg}")
        if name not in METRICS_SETTINGS:
            raise ValueError(f"--metrics-config: unknown setting '{name}' (Triton's: {', '.join(METRICS_SETTINGS)})")
        out[name] = value
    return out


def _first_response_lines(models: list[tuple[Any, str]]) -> list[str]:
    """Triton's time-to-first-response histogram, as prometheus-cpp writes one: count, sum, buckets."""
    lines = [f"# HELP {FIRST_RESPONSE} Duration from request to first response in milliseconds\n"
             f"# TYPE {FIRST_RESPONSE} histogram\n"]
    for m, lv in models:
        hist = histograms_of(m.stats)
        if hist is None or hist.first_ms is None:
            continue
        if not hist.settled:
            hist.settle(m.stats)
        h = hist.first_ms
        lines.append(f"{FIRST_RESPONSE}_count{{{lv}}} {sum(h.counts)}\n"
                     f"{FIRST_RESPONSE}_sum{{{lv}}} {custom_metrics.number(h.total)}\n")
        running = 0
        for bound, count in zip(h.bounds, h.counts):
            running += count
            lines.append(f'{FIRST_RESPONSE}_bucket{{{lv},le="{custom_metrics.number(bound)}"}} {running}\n')
        lines.append(f'{FIRST_RESPONSE}_bucket{{{lv},le="+Inf"}} {running + h.counts[-1]}\n')
    return lines if len(lines) > 1 else []


def triton_exposition(models: Iterable[Any]) -> str:
    """Triton's families in the Prometheus text format, exactly as Triton writes them
    (counter names without ``_total``)."""
    models = list(models)
    labels = [(m, f'model="{escape(m.name)}",version="{m.version}"' + _tags(m)) for m in models]
    lines: list[str] = []
    for name, kind, help_text, read in TRITON_FAMILIES[:1]:
        family(lines, name, kind, help_text, ((lv, read(m)) for m, lv in labels))
    failures = []
    for m, lv in labels:
        counts = dict.fromkeys(TRITON_REASONS, 0)
        ensemble = m.spec.platform == "ensemble"
        for reason, n in m.stats.fail_reasons.items():
            counts[triton_reason(reason, ensemble)] += n
        failures.extend((f'{lv},reason="{reason}"', n) for reason, n in counts.items())
    family(lines, "nv_inference_request_failure", "counter", _FAILURE_HELP, failures)
    for name, kind, help_text, read in TRITON_FAMILIES[1:]:
        family(lines, name, kind, help_text, ((lv, read(m)) for m, lv in labels))
    cached = [(m, lv) for m, lv in labels if getattr(m, "cache", None) is not None]
    if cached:
        for name, kind, help_text, read in CACHE_FAMILIES:
            family(lines, name, kind, help_text, ((lv, read(m)) for m, lv in cached))
    lines.extend(_first_response_lines(labels))
    return "".join(lines)


class ServerMetrics:
    """The registry behind ``/metrics``; attaches histograms to each model version as it is built."""

    def __init__(self, dataplane: "DataPlane", nvml: Any = None, histogram_latencies: bool = False) -> None:
        """``histogram_latencies`` (--metrics-config histogram_latencies=true): Triton's
        nv_inference_first_response_histogram_ms for every model."""
        self._dataplane = dataplane
        self.histogram_latencies = histogram_latencies
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(InferdCollector(dataplane))  # type: ignore[arg-type]
        # nv_gpu_* where NVML answers (``nvml``: a fake pynvml for tests); none on a CPU host.
        self.gpu = gpu_metrics.gpu_collector(nvml, gpu_metrics.visible_uuids)
        if self.gpu is not None:
            self.registry.register(self.gpu)  # type: ignore[arg-type]
        stats_module.on_create.append(self._attach)
        for model in dataplane.manager.models():  # any already loaded
            self._attach(model.stats)

    def _attach(self, stats: ModelStats) -> None:
        if histograms_of(stats) is None:
            stats.observers.append(ModelHistograms(self.histogram_latencies))
            stats.first_response = self.histogram_latencies

    def close(self) -> None:
        if self._attach in stats_module.on_create:
            stats_module.on_create.remove(self._attach)
        if self.gpu is not None:
            self.gpu.close()

    def exposition(self, hosted: Sequence[list[Any]] = ()) -> bytes:
        """One scrape: Triton's families, the models' custom metrics (pb_utils.MetricFamily; ``hosted``:
        the model hosts' own, :meth:`Hosts.custom_metrics`), then inferd's and the process collector's."""
        text = triton_exposition(self._dataplane.manager.models())
        if self.gpu is not None:
            text += self.gpu.triton_text()
        text += custom_metrics.REGISTRY.exposition(hosted)
        return text.encode() + generate_latest(self.registry)

    def asgi_app(self) -> Any:
        """``/metrics`` (Prometheus text format 0.0.4, gzip when asked); 404 elsewhere."""

        async def app(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                return
            if scope["path"] not in ("/metrics", "/metrics/"):
                await send({"type": "http.response.start", "status": 404,
                            "headers": [(b"content-type", b"text/plain; charset=utf-8")]})
                await send({"type": "http.response.body", "body": b"not found; metrics are on /metrics\n"})
                return
            hosts = self._dataplane.manager.hosts
            hosted = await hosts.custom_metrics() if hosts is not None else []
            # Read on the event loop, where the stats are updated: a consistent snapshot, no lock.
            body = self.exposition(hosted)
            headers = [(b"content-type", CONTENT_TYPE_PLAIN_0_0_4.encode())]  # as Triton serves it
            accept = dict(scope.get("headers") or ()).get(b"accept-encoding", b"")
            if b"gzip" in accept:
                body = gzip.compress(body, compresslevel=1)
                headers.append((b"content-encoding", b"gzip"))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        return app

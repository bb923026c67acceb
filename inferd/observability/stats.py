"""Per model-version statistics, the data behind ModelStatistics.

Counters only grow; durations are nanoseconds. Updated on the event loop
(the scheduler resolves batches there), so no locking is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass(slots=True)
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


@dataclass(slots=True)
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


@dataclass(frozen=True, slots=True)
class BatchStatistics:
    """One batch size's compute durations, as ModelStatistics reports them."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(slots=True)
class ResponseStat:
    """One response index's durations (Triton's InferResponseStatistics)."""

    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)
    success: Duration = field(default_factory=Duration)
    fail: Duration = field(default_factory=Duration)
    empty_response: Duration = field(default_factory=Duration)
    cancel: Duration = field(default_factory=Duration)

    def copy(self) -> "ResponseStat":
        return ResponseStat(*(Duration(d.count, d.ns) for d in (getattr(self, f) for f in RESPONSE_FIELDS)))


RESPONSE_FIELDS = ("compute_infer", "compute_output", "success", "fail", "empty_response", "cancel")  # ResponseStat's


@dataclass(frozen=True, slots=True)
class ModelStatistics:
    """A copy of one model version's counters at one moment: plain data, safe to
    hand to a frontend (or another process) while the counters move on."""

    name: str
    version: int
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success: Duration
    fail: Duration
    queue: Duration
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration
    batch_stats: tuple[BatchStatistics, ...]  # by batch size, ascending
    # The response cache: hits (lookup and extraction) and misses (lookup and insertion).
    cache_hit: Duration = field(default_factory=Duration)
    cache_miss: Duration = field(default_factory=Duration)
    # By response index ("0", "1", ...): each response's compute, success, failure, empty
    # final and cancellation, as Triton 2.4x reports them (response_stats).
    response_stats: dict[str, ResponseStat] = field(default_factory=dict)
    # What the version holds in memory, measured at its load: (type, id, byte_size) entries.
    memory_usage: tuple[tuple[str, int, int], ...] = ()


# Wall-clock milliseconds for last_inference, derived from the monotonic clock
# so that no timing code reads the wall clock.
_WALL_ORIGIN_NS = time.time_ns() - time.monotonic_ns()


def wall_ms(monotonic_s: float) -> int:
    return (_WALL_ORIGIN_NS + int(monotonic_s * 1e9)) // 1_000_000


Observer = Callable[[str, "ModelStats", dict], None]

# Called with each new ModelStats (a model version being built, before it
# takes requests): the metrics exporter attaches its observer here.
on_create: list[Callable[["ModelStats"], None]] = []


class ModelStats:
    """Counters of one model version, as ModelStatistics reports them."""

    __slots__ = (
        "name", "version", "success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
        "inference_count", "execution_count", "last_inference_s", "batch_stats", "fail_reasons",
        "observers", "pending", "cache_hit", "cache_miss", "memory_growth", "real_elements", "pad_elements",
        "responses", "single_response", "memory_usage", "histogram_buckets", "metric_tags", "steps",
        "prompt_tokens", "completion_tokens", "first_response",
    )

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_s = 0.0  # monotonic; 0: none yet (the wall-clock ms are worked out when read)
        self.batch_stats: dict[int, BatchStat] = {}
        self.fail_reasons: dict[str, int] = {}
        # An ensemble's steps: requests per (step index, model run, outcome: ran, skipped, split),
        # so conditional and routed steps show what they did. ModelStatistics has no field for
        # them; /metrics exports them.
        self.steps: dict[tuple[int, str, str], int] = {}
        self.observers: list[Observer] = []
        self.pending = 0  # requests admitted and not yet answered
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        # Bytes the process's resident memory grew across this version's executions, summed; None
        # for backends that do not measure it (only the Python backend does: see BatchResult).
        self.memory_growth: int | None = None
        # Padded models: elements of the requests' own data in padded inputs, and the
        # padding added around them (padding waste = pad / real). ModelStatistics has no
        # field for them; /metrics exports them.
        self.real_elements = 0
        self.pad_elements = 0
        # response_stats, by index. A model that answers each request once with each execution
        # (``single_response``: neither decoupled nor iterative) has its one response, index 0,
        # counted from its executions and its request's end; a decoupled model's stream counts
        # each response itself (record_response).
        self.responses: dict[int, ResponseStat] = {}
        self.single_response = False
        # /v1 models: the prompts' tokens of their requests, and the tokens of their responses (each
        # response carrying the text output is one), as the /v1 layer's usage counts them.
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # What this version holds, measured at its load: (type "CPU"/"GPU", device id, bytes), as
        # ModelStatistics' memory_usage; empty when it was not measured.
        self.memory_usage: tuple[tuple[str, int, int], ...] = ()
        # /metrics: the config's model_metrics buckets by histogram family, and its metric_tags
        # (extra labels), set by the builder right after it creates the stats.
        self.histogram_buckets: dict[str, tuple[float, ...]] = {}
        self.metric_tags: tuple[tuple[str, str], ...] = ()
        # Time to first response is observed (--metrics-config histogram_latencies=true; set by the
        # exporter's hook): the request path asks this before it reads the clock for it.
        self.first_response = False
        for hook in on_create:
            hook(self)

    def snapshot(self) -> ModelStatistics:
        """The counters now, copied (the statistics extension's answer for this version)."""
        def copy(d: Duration) -> Duration:
            return Duration(d.count, d.ns)

        batches = tuple(
            BatchStatistics(size, copy(b.compute_input), copy(b.compute_infer), copy(b.compute_output))
            for size, b in sorted(self.batch_stats.items())
        )
        return ModelStatistics(
            self.name, self.version, self.last_inference_ms, self.inference_count, self.execution_count,
            copy(self.success), copy(self.fail), copy(self.queue), copy(self.compute_input),
            copy(self.compute_infer), copy(self.compute_output), batches, copy(self.cache_hit), copy(self.cache_miss),
            {str(i): r.copy() for i, r in sorted(self.responses.items())}, self.memory_usage,
        )

    @property
    def last_inference_ms(self) -> int:
        """When the last request ended, in wall-clock ms since the epoch (0: none yet); converted
        here, when read, rather than on every request."""
        return wall_ms(self.last_inference_s) if self.last_inference_s else 0

    def _response(self, index: int) -> ResponseStat:
        stat = self.responses.get(index)
        if stat is None:
            stat = self.responses[index] = ResponseStat()
        return stat

    def record_response(self, index: int, kind: str, infer_ns: int, output_ns: int) -> None:
        """Response ``index`` of a stream: ``kind`` is success, fail, empty (a final flag
        with no response) or cancel (the stream was cancelled before it); ``infer_ns`` the
        model's time on it, ``output_ns`` the server's after the model sent it."""
        stat = self._response(index)
        total = infer_ns + output_ns
        if self.observers and kind == "success":
            self._notify("response", {"index": index, "ns": total})
        if kind == "empty":
            stat.empty_response.add(total)
        elif kind == "cancel":
            stat.cancel.add(total)
        else:
            stat.compute_infer.add(infer_ns)
            stat.compute_output.add(output_ns)
            (stat.success if kind == "success" else stat.fail).add(total)

    def record_first_response(self, ns: int, count: int = 1) -> None:
        """A request's first response (its only one, or a stream's first, an error's too) went out ``ns``
        after the request reached the model's path: Triton's time to first response, one per request
        (nv_inference_first_response_histogram_ms). Only observers take it; nothing is counted here."""
        if self.first_response and self.observers:
            self._notify("first_response", {"ns": ns}, count)

    def _notify(self, event: str, data: dict, count: int = 1) -> None:
        """Each observer hears ``event`` ``count`` times (once per request a grouped ensemble step stands for)."""
        for _ in range(count):
            for observer in self.observers:
                observer(event, self, data)

    def record_success(self, duration_ns: int, now: float, count: int = 1) -> None:
        """``count`` requests (an ensemble's grouped step stands for several) succeeded in ``duration_ns`` each."""
        d = self.success  # once per request: the additions written out (see record_execution)
        d.count += count
        d.ns += duration_ns * count
        if self.single_response:
            d = (self.responses.get(0) or self._response(0)).success
            d.count += count
            d.ns += duration_ns * count
        self.last_inference_s = now
        if self.observers:
            self._notify("success", {"ns": duration_ns}, count)

    def record_failure(self, duration_ns: int, reason: str, now: float, count: int = 1) -> None:
        self.fail.add(duration_ns * count, count)
        self.fail_reasons[reason] = self.fail_reasons.get(reason, 0) + count
        if self.single_response:
            stat = self._response(0)
            (stat.cancel if reason == "CANCELED" else stat.fail).add(duration_ns * count, count)
        self.last_inference_s = now
        if self.observers:
            self._notify("failure", {"ns": duration_ns, "reason": reason}, count)

    def record_cache_hit(self, duration_ns: int, lookup_ns: int, now: float) -> None:
        """A request answered from the response cache: a success (``duration_ns`` in the
        server) that never reached the model, so no inference or execution is counted
        (as Triton); ``lookup_ns``: finding and extracting the entry."""
        self.cache_hit.add(lookup_ns)
        self.record_success(duration_ns, now)

    def record_cache_miss(self, ns: int) -> None:
        """A request the cache did not hold: ``ns`` looking it up and inserting the result."""
        self.cache_miss.add(ns)

    def record_queue(self, ns: int, count: int = 1) -> None:
        d = self.queue
        d.count += count
        d.ns += ns * count
        if self.observers:
            self._notify("queue", {"ns": ns}, count)

    def record_memory(self, delta: int | None) -> None:
        """One execution's resident memory change, when its backend measured it."""
        if delta is not None:
            self.memory_growth = (self.memory_growth or 0) + delta

    def record_execution(self, batch_rows: int, requests: int, input_ns: int, infer_ns: int, output_ns: int,
                         filler_rows: int = 0) -> None:
        """One execution of ``requests`` requests carrying ``batch_rows`` rows, ``filler_rows`` of
        them carrying no request (a direct sequence batch's idle slots): those count in the batch
        size, as Triton's backends report it, but are no inferences."""
        # Once per execution (per request on the idle fast path): the additions are written out
        # rather than through Duration.add, nine Python calls fewer each time.
        self.execution_count += 1
        self.inference_count += batch_rows - filler_rows
        # Per-request compute durations: each request of the batch is charged
        # the batch's time, as Triton reports them.
        d = self.compute_input
        d.count += requests
        d.ns += input_ns * requests
        d = self.compute_infer
        d.count += requests
        d.ns += infer_ns * requests
        d = self.compute_output
        d.count += requests
        d.ns += output_ns * requests
        bs = self.batch_stats.get(batch_rows)
        if bs is None:
            bs = self.batch_stats[batch_rows] = BatchStat()
        d = bs.compute_input
        d.count += 1
        d.ns += input_ns
        d = bs.compute_infer
        d.count += 1
        d.ns += infer_ns
        d = bs.compute_output
        d.count += 1
        d.ns += output_ns
        if self.single_response:
            stat = self.responses.get(0) or self._response(0)
            d = stat.compute_infer
            d.count += requests
            d.ns += infer_ns * requests
            d = stat.compute_output
            d.count += requests
            d.ns += output_ns * requests
        if self.observers:
            self._notify("execution", {"rows": batch_rows, "requests": requests,
                                       "input_ns": input_ns, "infer_ns": infer_ns, "output_ns": output_ns})

    def record_padding(self, real: int, pad: int) -> None:
        """One padded execution: ``real`` elements of request data, ``pad`` of padding."""
        self.real_elements += real
        self.pad_elements += pad

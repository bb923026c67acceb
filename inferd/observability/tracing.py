"""OpenTelemetry tracing of inference requests, with Triton's trace settings.

A sampled request gets a span (``InferRequest``) from the moment the frontend
decoded it until its answer is ready, with child spans for each wait in a
model's queue (``queue``) and each batch execution it took part in
(``compute``, with the batch size), and, for ensembles, one span per step
(:func:`ensemble_step`) under which the composing model's own queue and
compute spans nest. A W3C ``traceparent`` (and ``tracestate``) in the gRPC
metadata makes the request span a child of the caller's.

Settings are Triton's (``--trace-config``, the TraceSetting RPC):
``trace_level`` (OFF, TIMESTAMPS, TENSORS: TENSORS adds the tensors' names,
types and shapes as attributes), ``trace_rate`` (trace one request in N),
``trace_count`` (stop after N more traces; -1: no limit), ``log_frequency``
(file destination: write after every N traces; 0: at shutdown), and, fixed
at start-up, ``trace_mode`` with its destination: ``triton`` writes spans as
JSON lines to ``file``; ``opentelemetry`` exports them with OTLP/HTTP to
``url`` (needs the ``opentelemetry-exporter-otlp-proto-http`` package).

Off (the default) costs the request path one attribute test in the
frontend, and ``request.trace is None`` tests where spans would be recorded.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from inferd.errors import InvalidArgument

log = logging.getLogger(__name__)

LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MODES = ("triton", "opentelemetry")
ROOT_SPAN = "InferRequest"
DEFAULT_OTLP_URL = "http://localhost:4318/v1/traces"
OTLP_PACKAGE = "opentelemetry-exporter-otlp-proto-http"


# -- configuration (--trace-config) ------------------------------------------------------


@dataclass
class TraceConfig:
    """Start-up settings, as Triton's ``--trace-config`` names them."""

    level: tuple[str, ...] = ("OFF",)
    rate: int = 1000
    count: int = -1
    log_frequency: int = 0
    mode: str = "triton"
    file: str = ""
    url: str = DEFAULT_OTLP_URL
    resource: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, specs: Sequence[str]) -> "TraceConfig":
        """``--trace-config`` values: ``key=value`` (global: rate, level, count, mode) or
        ``triton,key=value`` (file, log-frequency) or ``opentelemetry,key=value``
        (url, resource). Raises ValueError naming what is wrong."""
        config = cls()
        levels: list[str] = []
        for spec in specs:
            section = ""
            body = spec
            head, sep, rest = spec.partition(",")
            if sep and "=" not in head:
                section, body = head, rest
                if section not in MODES:
                    raise ValueError(f"--trace-config {spec}: unknown trace mode '{section}' (use {' or '.join(MODES)})")
            key, eq, value = body.partition("=")
            key = key.strip().replace("_", "-")
            if not eq or not key:
                raise ValueError(f"--trace-config {spec}: expected key=value")
            where = f"--trace-config {spec}"
            if section == "":
                if key == "level":
                    levels.append(_level(value, where))
                elif key == "rate":
                    config.rate = _int(value, where, minimum=1)
                elif key == "count":
                    config.count = _int(value, where, minimum=-1)
                elif key == "mode":
                    if value not in MODES:
                        raise ValueError(f"{where}: mode must be {' or '.join(MODES)}")
                    config.mode = value
                elif key in ("file", "log-frequency"):
                    raise ValueError(f"{where}: '{key}' is a setting of the triton mode: --trace-config triton,{key}=...")
                else:
                    raise ValueError(f"{where}: unknown setting '{key}' (global settings: level, rate, count, mode)")
            elif section == "triton":
                if key == "file":
                    config.file = value
                elif key == "log-frequency":
                    config.log_frequency = _int(value, where, minimum=0)
                else:
                    raise ValueError(f"{where}: unknown triton-mode setting '{key}' (file, log-frequency)")
            else:
                if key == "url":
                    config.url = value if "://" in value else f"http://{value}"
                elif key == "resource":
                    k, eq2, v = value.partition("=")
                    if not eq2 or not k:
                        raise ValueError(f"{where}: resource must be key=value")
                    config.resource[k] = v
                else:
                    raise ValueError(f"{where}: unknown opentelemetry setting '{key}' (url, resource)")
        if levels:
            config.level = _levels(levels, "--trace-config level")
        return config


def _int(value: str, where: str, minimum: int) -> int:
    try:
        n = int(value)
    except ValueError:
        raise ValueError(f"{where}: '{value}' is not an integer") from None
    if n < minimum:
        raise ValueError(f"{where}: must be >= {minimum}, got {n}")
    return n


def _level(value: str, where: str) -> str:
    level = value.strip().upper()
    if level not in LEVELS:
        raise ValueError(f"{where}: trace level '{value}' is not one of {', '.join(LEVELS)}")
    return level


def _levels(values: Sequence[str], where: str) -> tuple[str, ...]:
    levels = tuple(dict.fromkeys(_level(v, where) for v in values))
    if "OFF" in levels and len(levels) > 1:
        raise ValueError(f"{where}: OFF cannot be combined with other levels, got {list(levels)}")
    return levels


def add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE", dest="trace_config",
        help="tracing, as Triton: level=OFF|TIMESTAMPS|TENSORS, rate=N (one request in N), count=N (-1: no "
             "limit), mode=triton|opentelemetry; triton,file=PATH (JSON lines), triton,log-frequency=N; "
             "opentelemetry,url=HOST:PORT/v1/traces, opentelemetry,resource=KEY=VALUE (repeatable; off by default)")


# -- run-time settings ------------------------------------------------------------------


@dataclass
class _Settings:
    level: tuple[str, ...]
    rate: int
    count: int
    log_frequency: int
    seen: int = 0  # requests seen since the rate last changed

    @property
    def on(self) -> bool:
        return self.level != ("OFF",) and self.count != 0


SETTING_KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode")


class Tracing:
    """The server's tracer: sampling, per-model settings, the exporter."""

    def __init__(self, config: TraceConfig | None = None, *, processor: Any = None) -> None:
        """``processor``: an OpenTelemetry span processor to use instead of the
        configured destination (tests pass a SimpleSpanProcessor over an
        InMemorySpanExporter)."""
        self.config = config = config or TraceConfig()
        self._global = _Settings(config.level, config.rate, config.count, config.log_frequency)
        self._models: dict[str, _Settings] = {}
        self._lock = threading.Lock()  # a Python model's BLS may start traces from its thread
        self._provider: Any = None
        self._tracer: Any = None
        self._file_exporter: TritonTraceFile | None = None
        if processor is None:
            processor = self._destination(config)
        if processor is not None:
            self._start_provider(processor, config.resource)
        elif self._global.on:
            raise ValueError(
                "tracing is on (--trace-config level=...) but has no destination: add "
                "--trace-config triton,file=PATH or --trace-config mode=opentelemetry"
            )
        self.enabled = False
        self._refresh()

    # -- set-up ------------------------------------------------------------------

    def _destination(self, config: TraceConfig) -> Any:
        if config.mode == "opentelemetry":
            try:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            except ImportError:
                raise ValueError(
                    f"--trace-config mode=opentelemetry exports with OTLP/HTTP, which needs the "
                    f"'{OTLP_PACKAGE}' package: pip install 'inferd[otlp]' (or use "
                    "--trace-config triton,file=PATH)"
                ) from None
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            return BatchSpanProcessor(OTLPSpanExporter(endpoint=config.url))
        if config.file:
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            self._file_exporter = TritonTraceFile(config.file, lambda: self._global.log_frequency)
            return BatchSpanProcessor(self._file_exporter)
        return None

    def _start_provider(self, processor: Any, resource: Mapping[str, str]) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        attributes = {"service.name": "inferd", **resource}
        self._provider = TracerProvider(resource=Resource.create(attributes))
        self._provider.add_span_processor(processor)
        self._tracer = self._provider.get_tracer("inferd")
        self._propagator = TraceContextTextMapPropagator()

    def shutdown(self) -> None:
        """Export what is pending and close the destination."""
        if self._provider is not None:
            self._provider.shutdown()

    def _refresh(self) -> None:
        self.enabled = self._tracer is not None and (
            self._global.on or any(s.on for s in self._models.values())
        )

    # -- the request path ----------------------------------------------------------

    def start(self, model: str, request_id: str = "",
              carrier: Callable[[], Mapping[str, str]] | None = None, version: int = 0) -> "RequestTrace | None":
        """A trace for one request to ``model`` when it is sampled, else None.
        ``carrier()`` gives the request's headers/metadata (read only when sampled)."""
        s = self._models.get(model, self._global) if self._models else self._global
        if not s.on:
            return None
        with self._lock:
            s.seen += 1
            if s.seen % s.rate:
                return None
            if s.count > 0:
                s.count -= 1
                if s.count == 0:
                    self._refresh()
        context = None
        if carrier is not None:
            headers = carrier()
            if headers:
                context = self._propagator.extract(headers)
        span = self._tracer.start_span(ROOT_SPAN, context=context, attributes={
            "triton.model_name": model, "triton.request_id": request_id,
            "triton.model_version": version if version > 0 else -1})
        return RequestTrace(self._tracer, span, "TENSORS" in s.level)

    # -- TraceSetting ------------------------------------------------------------------

    def settings(self, model: str = "") -> dict[str, list[str]]:
        s = self._models.get(model, self._global) if model else self._global
        c = self.config
        return {
            "trace_level": list(s.level),
            "trace_rate": [str(s.rate)],
            "trace_count": [str(s.count)],
            "log_frequency": [str(s.log_frequency)],
            "trace_file": [c.file] if c.mode == "triton" else [],
            "trace_mode": [c.mode],
        }

    def update(self, model: str, changes: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """Apply TraceSetting changes (an empty list clears a setting: a model's
        falls back to the global one, the global one to its start-up value);
        all or nothing. Returns the settings now in force for ``model``."""
        base = self._global if model else _Settings(
            self.config.level, self.config.rate, self.config.count, self.config.log_frequency)
        with self._lock:
            current = self._models.get(model, self._global) if model else self._global
            new = replace(current)
            for key, values in changes.items():
                values = list(values)
                where = f"trace setting '{key}'"
                if key == "trace_level":
                    if not values:
                        new.level = base.level
                    else:
                        try:
                            new.level = _levels(values, where)
                        except ValueError as exc:
                            raise InvalidArgument(str(exc)) from None
                elif key in ("trace_rate", "trace_count", "log_frequency"):
                    attr = {"trace_rate": "rate", "trace_count": "count", "log_frequency": "log_frequency"}[key]
                    if not values:
                        setattr(new, attr, getattr(base, attr))
                        continue
                    if len(values) != 1:
                        raise InvalidArgument(f"{where} takes one value, got {values}")
                    minimum = {"rate": 1, "count": -1, "log_frequency": 0}[attr]
                    try:
                        setattr(new, attr, _int(values[0], where, minimum))
                    except ValueError as exc:
                        raise InvalidArgument(str(exc)) from None
                elif key in ("trace_file", "trace_mode"):
                    if values and values != self.settings(model)[key]:
                        raise InvalidArgument(
                            f"{where} cannot be changed at run time; start the server with --trace-config "
                            + ("triton,file=PATH" if key == "trace_file" else "mode=...")
                        )
                else:
                    raise InvalidArgument(f"unknown trace setting '{key}'; known: {', '.join(SETTING_KEYS)}")
            if new.on and self._tracer is None:
                raise InvalidArgument(
                    "tracing has no destination on this server: start it with --trace-config triton,file=PATH "
                    "or --trace-config mode=opentelemetry to turn tracing on at run time"
                )
            if new.rate != current.rate:
                new.seen = 0
            if model:
                self._models[model] = new
            else:
                self._global = new
            self._refresh()
        return self.settings(model)


# -- one request's trace ------------------------------------------------------------------


# Triton's frontend timestamp names: (receive start, receive end, send start, send end).
FRONTEND_TIMESTAMPS = {
    "grpc": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "GRPC_SEND_START", "GRPC_SEND_END"),
    "http": ("HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"),
}
TIMESTAMP_PREFIX = "triton.timestamp."  # a root span attribute: one more of Triton's timestamps (wall ns)


def _wall_offset() -> int:
    """What to add to a CLOCK_MONOTONIC moment to put it on the spans' clock (OpenTelemetry stamps
    spans with time.time_ns()); taken once per trace, so its frontend's intervals stay exact."""
    return time.time_ns() - time.monotonic_ns()


class RequestTrace:
    """The spans of one sampled request. The scheduler records its queue waits
    and executions with :meth:`record`; whoever started it calls :meth:`end`.

    A request from a gRPC / HTTP frontend (:meth:`frontend`) keeps its span open past
    :meth:`end` (REQUEST_END, as an attribute) until the frontend reports the send
    (:meth:`sent`), so one trace holds Triton's frontend timestamps too."""

    __slots__ = ("_tracer", "span", "context", "tensors", "_send", "_ended", "_error", "_offset")

    def __init__(self, tracer: Any, span: Any, tensors: bool) -> None:
        from opentelemetry.trace import set_span_in_context

        self._tracer = tracer
        self.span = span
        self.context = set_span_in_context(span)
        self.tensors = tensors  # trace_level TENSORS: record tensor names, types and shapes
        self._send: tuple[str, str] | None = None  # the frontend's send names, until it reports
        self._ended = False  # end() was called (the model path is done)
        self._error: BaseException | None = None
        self._offset = 0  # monotonic -> span clock, for the frontend's stamps

    def record(self, name: str, start_ns: int, end_ns: int, attributes: Mapping[str, Any] | None = None) -> None:
        """A finished child span (a queue wait, an execution)."""
        span = self._tracer.start_span(name, context=self.context, start_time=start_ns, attributes=attributes)
        span.end(end_time=end_ns)

    def set(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def tensors_attributes(self, kind: str, arrays: Mapping[str, Any]) -> None:
        """At TENSORS level: each tensor's dtype and shape, and (``triton.tensor.*``, what the
        triton file writes as Triton's TENSOR_QUEUE_INPUT / TENSOR_BACKEND_OUTPUT) its data."""
        if self.tensors:
            for name, array in arrays.items():
                self.span.set_attribute(f"triton.{kind}.{name}", f"{array.dtype} {list(array.shape)}")
                self.span.set_attribute(f"triton.tensor.{kind}.{name}", _tensor_json(array))

    def child(self, name: str, attributes: Mapping[str, Any] | None = None) -> "RequestTrace":
        """A live child span (an ensemble step); its own queue/compute spans nest under it."""
        span = self._tracer.start_span(name, context=self.context, attributes=attributes)
        return RequestTrace(self._tracer, span, self.tensors)

    def frontend(self, stamps: Any) -> None:
        """The request came through a frontend (an :class:`inferd.types.FrontendStamps`): record
        its receive moments and wait for its send (``stamps.on_sent``) before the span ends."""
        names = FRONTEND_TIMESTAMPS.get(stamps.protocol)
        if names is None:
            return
        self._offset = offset = _wall_offset()
        self.span.set_attribute(TIMESTAMP_PREFIX + names[0], stamps.recv_start_ns + offset)
        self.span.set_attribute(TIMESTAMP_PREFIX + names[1], stamps.recv_end_ns + offset)
        self._send = (names[2], names[3])
        stamps.on_sent = self.sent

    def sent(self, start_ns: int | None, end_ns: int | None) -> None:
        """The frontend sent the answer (CLOCK_MONOTONIC ns; None: it never did). Ends the
        span if :meth:`end` was called; else :meth:`end` will."""
        names, self._send = self._send, None
        if names is not None and start_ns is not None and end_ns is not None:
            self.span.set_attribute(TIMESTAMP_PREFIX + names[0], start_ns + self._offset)
            self.span.set_attribute(TIMESTAMP_PREFIX + names[1], end_ns + self._offset)
        if self._ended:
            self._finish()

    def end(self, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        if self._send is not None:  # the frontend still sends: REQUEST_END is now, the span ends at sent()
            self.span.set_attribute(TIMESTAMP_PREFIX + "REQUEST_END", time.time_ns())  # the spans' own clock
            return
        self._finish()

    def _finish(self) -> None:
        if self._error is not None:
            from opentelemetry.trace import Status, StatusCode

            error = self._error
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()


def ensemble_step(trace: RequestTrace | None, step: str, model: str, version: int = 0) -> RequestTrace | None:
    """The hook for ensembles: a span for one step of ``trace``'s request.

    Give the result to the step's sub-request (``InferenceRequest.trace``) so
    the composing model's queue and compute spans nest under the step; end it
    with ``.end(error)`` when the step finishes (the data plane does this for a
    sub-request that goes through :meth:`DataPlane.infer`). None in, None out:
    untraced requests pay nothing."""
    if trace is None:
        return None
    return trace.child(f"ensemble step {step}", {"triton.model_name": model, "triton.model_version": version})


def bls_call(trace: RequestTrace | None, model: str, version: int = 0) -> RequestTrace | None:
    """The hook for a Python model's BLS call made with ``trace=request.trace()``: a span under
    the calling request's (the callee's queue and compute spans nest under it; the triton file
    writes it as a child trace, ``parent_id`` the caller's). None in, None out."""
    if trace is None:
        return None
    return trace.child(f"{BLS_PREFIX}{model}", {"triton.model_name": model,
                                               "triton.model_version": version if version > 0 else -1})


def trace_context(trace: RequestTrace) -> str:
    """The W3C trace context of ``trace``'s span as a JSON string (pb_utils' ``get_context()``; in a
    model host, the trace's stand-in carries the context the core wrote for it)."""
    known = getattr(trace, "context_json", None)
    if known is not None:
        return known  # type: ignore[no-any-return]
    import json

    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.context)
    return json.dumps(carrier)


# -- the triton-mode file destination: Triton's JSON trace format ------------------------------

# Span names -> Triton's timestamp names (start, end).
_TIMESTAMPS = {"queue": ("QUEUE_START", None), "compute": ("COMPUTE_START", "COMPUTE_END")}
_ACTIVITY = {"input": "TENSOR_QUEUE_INPUT", "output": "TENSOR_BACKEND_OUTPUT"}
STEP_PREFIX = "ensemble step "
BLS_PREFIX = "BLS "  # a Python model's traced BLS call: a child trace, as an ensemble step


def _tensor_json(array: Any) -> str:
    """A tensor as Triton's trace writes it: data comma-joined, shape "1,16", dtype "FP32"."""
    import json

    import numpy as np

    from inferd.dtypes import from_numpy

    a = np.asarray(array)
    try:
        dtype: str = from_numpy(a.dtype).name
    except Exception:  # an array no wire type names (never from a request): numpy's name
        dtype = str(a.dtype)
    values = [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in a.reshape(-1).tolist()]
    return json.dumps({"data": ",".join(values), "shape": ",".join(str(d) for d in a.shape),
                       "dtype": dtype})


def _compute_split(span: Any) -> list[dict]:
    """COMPUTE_INPUT_END and COMPUTE_OUTPUT_START of one execution, from the durations the backend
    measured (``input_ns``, ``infer_ns``, ``output_ns``: Triton's split), counted back from
    COMPUTE_END: what is left before them is the hand-over to the instance's thread, which Triton's
    COMPUTE_START does not see. None when the execution reported no times (it failed)."""
    attrs = span.attributes or {}
    if "output_ns" not in attrs:
        return []
    output_start = max(span.start_time, span.end_time - int(attrs["output_ns"]))
    input_end = max(span.start_time, output_start - int(attrs["infer_ns"]))
    return [{"name": "COMPUTE_INPUT_END", "ns": input_end}, {"name": "COMPUTE_OUTPUT_START", "ns": output_start}]


class TritonTraceFile:
    """The ``triton`` mode's file, in Triton's trace format (docs/user_guide/trace.md): a JSON
    array of entries, per traced request (and per ensemble step, with ``parent_id``) one
    ``{"id", "model_name", "model_version", "request_id"}``, one ``{"id", "timestamps":
    [{"name", "ns"}]}`` per activity (REQUEST_START, QUEUE_START, COMPUTE_START, COMPUTE_END,
    REQUEST_END; for a request from the gRPC frontend GRPC_WAITREAD_START/END and
    GRPC_SEND_START/END, from HTTP HTTP_RECV_START/END and HTTP_SEND_START/END), and at TENSORS
    level one ``{"id", "activity", "tensor"}`` per tensor.

    The spans of a request are held until its root span ends, then turned into entries.
    ``log_frequency`` 0: the whole array is written to ``path`` when the server stops; N: every
    N traces into ``path.0``, ``path.1``, ... (Triton's naming), each a JSON array."""

    def __init__(self, path: str, log_frequency: Callable[[], int]) -> None:
        import itertools

        self.path = path
        self._log_frequency = log_frequency
        self._held: dict[int, list[Any]] = {}  # trace id -> its finished spans, until the root
        self._entries: list[dict] = []
        self._traces = 0
        self._files = 0
        self._ids = itertools.count(1)
        open(path, "a").close()  # fail at start-up, not at the first trace

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        for span in spans:
            held = self._held.setdefault(span.context.trace_id, [])
            held.append(span)
            if span.name == ROOT_SPAN:
                del self._held[span.context.trace_id]
                self._entries.extend(self._convert(span, held))
                self._traces += 1
                every = self._log_frequency()
                if every and self._traces >= every:
                    self._write(f"{self.path}.{self._files}")
                    self._files += 1
        return SpanExportResult.SUCCESS

    def _convert(self, root: Any, spans: list[Any]) -> list[dict]:
        """One request's spans as Triton's entries (its ensemble steps as child traces)."""
        ids: dict[int, int] = {}  # span id -> trace entry id, for the root and each step
        sends: dict[int, list[tuple[str, int]]] = {}  # trace entry id -> its frontend's send stamps
        entries: list[dict] = []
        ordered = [root] + sorted((s for s in spans if s.name.startswith((STEP_PREFIX, BLS_PREFIX))),
                                  key=lambda s: s.start_time)
        for span in ordered:
            tid = ids[span.context.span_id] = next(self._ids)
            attrs = span.attributes or {}
            head: dict[str, Any] = {"id": tid, "model_name": attrs.get("triton.model_name", ""),
                                    "model_version": int(attrs.get("triton.model_version", -1) or -1)}
            if span is root:
                head["request_id"] = attrs.get("triton.request_id", "")
            else:
                head["parent_id"] = ids[root.context.span_id]
            entries.append(head)
            # The frontend's receive stamps (GRPC_WAITREAD_*, HTTP_RECV_*) before REQUEST_START, its send
            # stamps after REQUEST_END (below), as they happened.
            frontend = [(key[len(TIMESTAMP_PREFIX):], int(value)) for key, value in attrs.items()
                        if key.startswith(TIMESTAMP_PREFIX) and key != TIMESTAMP_PREFIX + "REQUEST_END"]
            for name, ns in frontend:
                if "_SEND_" not in name:
                    entries.append({"id": tid, "timestamps": [{"name": name, "ns": ns}]})
            sends[tid] = [(name, ns) for name, ns in frontend if "_SEND_" in name]
            entries.append({"id": tid, "timestamps": [{"name": "REQUEST_START", "ns": span.start_time}]})
            for kind in ("input", "output"):
                for key, value in attrs.items():
                    prefix = f"triton.tensor.{kind}."
                    if key.startswith(prefix):
                        import json

                        entries.append({"id": tid, "activity": _ACTIVITY[kind], "tensor": {
                            "name": key[len(prefix):], **json.loads(value)}})
        for span in sorted(spans, key=lambda s: s.start_time):
            names = _TIMESTAMPS.get(span.name)
            owner = ids.get(span.parent.span_id) if span.parent is not None else None
            if names is None or owner is None:
                continue
            start, end = names
            entries.append({"id": owner, "timestamps": [{"name": start, "ns": span.start_time}]})
            if span.name == "compute":
                entries.extend({"id": owner, "timestamps": [stamp]} for stamp in _compute_split(span))
            if end is not None:
                entries.append({"id": owner, "timestamps": [{"name": end, "ns": span.end_time}]})
        for span in ordered:  # REQUEST_END: when the model path ended (a frontend's send may come after)
            end = (span.attributes or {}).get(TIMESTAMP_PREFIX + "REQUEST_END", span.end_time)
            tid = ids[span.context.span_id]
            entries.append({"id": tid, "timestamps": [{"name": "REQUEST_END", "ns": int(end)}]})
            for name, ns in sends[tid]:
                entries.append({"id": tid, "timestamps": [{"name": name, "ns": ns}]})
        return entries

    def _write(self, path: str) -> None:
        import json

        with open(path, "w") as f:
            json.dump(self._entries, f, indent=2)
            f.write("\n")
        self._entries = []
        self._traces = 0

    def shutdown(self) -> None:
        if self._log_frequency() == 0:
            self._write(self.path)
        elif self._entries:
            self._write(f"{self.path}.{self._files}")
            self._files += 1

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

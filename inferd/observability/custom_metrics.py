"""Custom metrics that models register (Triton's custom metrics API; the Python backend's
``pb_utils.MetricFamily`` / ``Metric`` are built on this), served on ``/metrics`` after the
server's own families, in the text format Triton writes them.

One registry per process (:data:`REGISTRY`): a model's code registers from its instance
thread, the exporter reads on the event loop, so every access holds the registry's lock.
A family is named once per server: a second family of the same name and kind is the same
family (the first description stays), of another kind an error, as in Triton. A metric
lives as long as the model holds it (its owner calls :meth:`Family.remove`), so a model
that is unloaded takes its series with it.
"""

from __future__ import annotations

import math
import re
import threading
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any, Sequence

from inferd.observability.text_format import escape, number as _number

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
# The server's own families: a model may not register under these prefixes. Other nv_ names are free, as in
# Triton (the TensorRT-LLM backend registers nv_trt_llm_* through this API, which the ORCA load report reads).
SERVER_PREFIXES = ("inferd_", "nv_inference_", "nv_cache_", "nv_gpu_", "nv_energy_", "nv_cpu_")
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class MetricError(ValueError):
    """A custom metric used against its kind, or named or labelled as Prometheus does not allow."""


@dataclass
class Series:
    """One metric: a family's labelled value (counter, gauge) or histogram."""

    labels: tuple[tuple[str, str], ...]
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    counts: list[int] = field(default_factory=list)  # per bucket, the last one +Inf
    total: float = 0.0


class Family:
    def __init__(self, registry: "CustomMetrics", name: str, description: str, kind: str) -> None:
        self._registry = registry
        self.name = name
        self.description = description
        self.kind = kind
        self.series: dict[tuple[tuple[str, str], ...], Series] = {}
        self.holders = 0  # MetricFamily objects that refer to this family

    def metric(self, labels: dict[str, str] | None, buckets: list[float] | None) -> Series:
        """The series of ``labels`` (created, or the existing one: Triton shares it too)."""
        key = _labels(self.name, labels)
        if self.kind == HISTOGRAM:
            if buckets is None:
                raise MetricError("Failed to create metric. Missing required buckets.")
            bounds = tuple(float(b) for b in buckets)
            if any(b2 <= b1 for b1, b2 in zip(bounds, bounds[1:])) or any(math.isnan(b) for b in bounds):
                raise MetricError(f"Failed to create metric. Buckets must be increasing, got {list(buckets)}")
        elif buckets is not None:
            raise MetricError("Failed to create metric. Unexpected buckets found.")
        else:
            bounds = ()
        with self._registry.lock:
            found = self.series.get(key)
            if found is None:
                found = self.series[key] = Series(key, bounds, counts=[0] * (len(bounds) + 1))
            return found

    def remove(self, series: Series) -> None:
        with self._registry.lock:
            if self.series.get(series.labels) is series:
                del self.series[series.labels]

    def increment(self, series: Series, value: float) -> None:
        if self.kind == HISTOGRAM:
            raise MetricError("Failed to increment metric value: a histogram is observed, not incremented "
                              "(use observe)")
        if self.kind == COUNTER and value < 0:
            raise MetricError(f"Failed to increment metric value: a counter only goes up, got {value}")
        with self._registry.lock:
            series.value += value

    def set(self, series: Series, value: float) -> None:
        if self.kind != GAUGE:
            raise MetricError(f"Failed to set metric value: only a gauge is set, this is a {self.kind}")
        with self._registry.lock:
            series.value = float(value)

    def observe(self, series: Series, value: float) -> None:
        if self.kind != HISTOGRAM:
            raise MetricError(f"Failed to observe metric value: only a histogram observes, this is a {self.kind}")
        with self._registry.lock:
            series.counts[bisect_left(series.buckets, value)] += 1
            series.total += value

    def value(self, series: Series) -> float:
        if self.kind == HISTOGRAM:
            raise MetricError("Failed to get metric value: a histogram has no single value")
        with self._registry.lock:
            return series.value

    def text(self) -> str:
        """This family in the text format (its lock held by the caller)."""
        lines = [f"# HELP {self.name} {self.description}\n# TYPE {self.name} {self.kind}\n"]
        for s in self.series.values():
            labels = ",".join(f'{k}="{escape(v)}"' for k, v in s.labels)
            if self.kind != HISTOGRAM:
                lines.append(f"{self.name}{{{labels}}} {number(s.value)}\n")
                continue
            sep = "," if labels else ""
            running = 0
            for bound, count in zip((*s.buckets, math.inf), s.counts):
                running += count
                le = "+Inf" if bound == math.inf else number(bound)
                lines.append(f'{self.name}_bucket{{{labels}{sep}le="{le}"}} {running}\n')
            lines.append(f"{self.name}_sum{{{labels}}} {number(s.total)}\n")
            lines.append(f"{self.name}_count{{{labels}}} {running}\n")
        return "".join(lines)


class CustomMetrics:
    """The process's custom metric families, by name."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._families: dict[str, Family] = {}

    def family(self, name: str, description: str, kind: str) -> Family:
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise MetricError(f"Error when creating MetricFamily: unknown kind {kind!r} "
                              "(use MetricFamily.COUNTER, GAUGE or HISTOGRAM)")
        if not _NAME.match(name or ""):
            raise MetricError(f"Error when creating MetricFamily: name {name!r} is not a Prometheus metric name "
                              "(letters, digits, '_' and ':', not starting with a digit)")
        if name.startswith(SERVER_PREFIXES):
            raise MetricError(f"Error when creating MetricFamily: name {name!r} is reserved for the server's own "
                              f"metrics ({', '.join(p + '*' for p in SERVER_PREFIXES)})")
        with self.lock:
            found = self._families.get(name)
            if found is None:
                found = self._families[name] = Family(self, name, description, kind)
            elif found.kind != kind:
                raise MetricError(f"Error when creating MetricFamily: a family named '{name}' already exists as a "
                                  f"{found.kind}; it cannot also be a {kind}")
            found.holders += 1
            return found

    def release(self, family: Family) -> None:
        """A MetricFamily object is gone; the family goes with its last holder."""
        with self.lock:
            family.holders -= 1
            if family.holders <= 0 and self._families.get(family.name) is family:
                del self._families[family.name]

    def exposition(self, others: Sequence[list[Any]] = ()) -> str:
        """Every family in the text format, with ``others``' (other processes' :meth:`snapshot`: model
        hosts) merged in: a family of one name is one family, a series of the same labels one
        series, as when every model registers in one process (counters and histograms add up,
        a gauge shows the last value read)."""
        registry = self.merged(others) if others else self
        with registry.lock:
            return "".join(f.text() for f in registry._families.values() if f.series)

    def merged(self, others: Sequence[list[Any]]) -> "CustomMetrics":
        """A registry of this one's families and ``others``' (snapshots) merged, as :meth:`exposition` shows them."""
        merged = CustomMetrics()
        with self.lock:
            mine = self.snapshot_locked()
        for snapshot in (mine, *others):
            merged._merge(snapshot)
        return merged

    def snapshot(self) -> list[list[Any]]:
        """The families as plain data (msgpack-able), for another process's :meth:`exposition`."""
        with self.lock:
            return self.snapshot_locked()

    def snapshot_locked(self) -> list[list[Any]]:
        return [[f.name, f.description, f.kind,
                 [[[list(kv) for kv in s.labels], list(s.buckets), s.value, list(s.counts), s.total]
                  for s in f.series.values()]]
                for f in self._families.values() if f.series]

    def _merge(self, snapshot: list[list[Any]]) -> None:
        for name, description, kind, series in snapshot:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = Family(self, name, description, kind)
            elif family.kind != kind:
                continue  # registered as another kind elsewhere: the first one seen is shown
            for labels, buckets, value, counts, total in series:
                key = tuple((k, v) for k, v in labels)
                found = family.series.get(key)
                if found is None or found.buckets != tuple(buckets):
                    family.series[key] = Series(key, tuple(buckets), value, list(counts), total)
                elif kind == GAUGE:
                    found.value = value
                else:
                    found.value += value
                    found.counts = [a + b for a, b in zip(found.counts, counts)]
                    found.total += total

    def samples(self, name: str) -> list[tuple[dict[str, str], float]]:
        """The series of the counter or gauge family ``name`` (labels, value), in the order /metrics writes
        them; none for a histogram or a family nobody registered."""
        with self.lock:
            found = self._families.get(name)
            if found is None or found.kind == HISTOGRAM:
                return []
            return [(dict(s.labels), s.value) for s in found.series.values()]


def number(value: float) -> str:
    """As Triton (prometheus-cpp) writes a double: 2, not 2.0."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return _number(value)


def _labels(family: str, labels: dict[str, str] | None) -> tuple[tuple[str, str], ...]:
    if labels is None:
        return ()
    if not isinstance(labels, dict):
        raise MetricError("Failed to create metric. Labels must be a dictionary.")
    for key in labels:
        if not isinstance(key, str) or not _LABEL.match(key) or key.startswith("__"):
            raise MetricError(f"Failed to create metric of family '{family}': label name {key!r} is not a "
                              "Prometheus label name (letters, digits and '_', not starting with a digit or '__')")
    return tuple(sorted((k, str(v)) for k, v in labels.items()))  # sorted, as Triton writes them


REGISTRY = CustomMetrics()

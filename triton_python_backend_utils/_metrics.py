"""``pb_utils.MetricFamily`` and ``Metric``: Triton's custom metrics API for Python models,
over :mod:`inferd.observability.custom_metrics` (served on ``/metrics``)."""

from __future__ import annotations

import weakref
from typing import Any

from inferd.observability import custom_metrics as _cm


def _exception(exc: Exception) -> Exception:
    from triton_python_backend_utils import TritonModelException

    return TritonModelException(str(exc))


class MetricFamily:
    """A named family of metrics of one kind: ``MetricFamily(name, description, kind)``."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2
    _KINDS = {COUNTER: _cm.COUNTER, GAUGE: _cm.GAUGE, HISTOGRAM: _cm.HISTOGRAM}

    def __init__(self, name: str, description: str, kind: int) -> None:
        if kind not in self._KINDS:
            raise _exception(_cm.MetricError(
                f"Error when creating MetricFamily: kind must be MetricFamily.COUNTER (0), GAUGE (1) or "
                f"HISTOGRAM (2), got {kind!r}"))
        try:
            self._family = _cm.REGISTRY.family(name, description, self._KINDS[kind])
        except _cm.MetricError as exc:
            raise _exception(exc) from None
        weakref.finalize(self, _cm.REGISTRY.release, self._family)

    def Metric(self, labels: dict[str, str] | None = None, buckets: list[float] | None = None) -> "Metric":
        """The metric of ``labels`` in this family (``buckets``: a histogram's upper bounds)."""
        if buckets is not None and not isinstance(buckets, list):
            raise _exception(_cm.MetricError("Failed to create metric. Buckets must be a list."))
        try:
            series = self._family.metric(labels, buckets)
        except _cm.MetricError as exc:
            raise _exception(exc) from None
        return Metric(self, series)


class Metric:
    """One labelled metric: ``increment`` (counter, gauge), ``set`` (gauge), ``observe``
    (histogram), ``value`` (counter, gauge). It leaves ``/metrics`` when the model drops it."""

    def __init__(self, family: MetricFamily, series: Any) -> None:
        self._owner = family  # keeps the family alive while this metric is
        self._family = family._family
        self._series = series
        weakref.finalize(self, self._family.remove, series)

    def increment(self, value: float) -> None:
        self._call(self._family.increment, value)

    def set(self, value: float) -> None:
        self._call(self._family.set, value)

    def observe(self, value: float) -> None:
        self._call(self._family.observe, value)

    def value(self) -> float:
        try:
            return self._family.value(self._series)
        except _cm.MetricError as exc:
            raise _exception(exc) from None

    def _call(self, op: Any, value: float) -> None:
        try:
            op(self._series, float(value))
        except (TypeError, ValueError) as exc:
            if isinstance(exc, _cm.MetricError):
                raise _exception(exc) from None
            raise _exception(_cm.MetricError(f"a metric's value must be a number, got {value!r}")) from None

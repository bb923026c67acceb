"""Triton's GPU metrics (``nv_gpu_*``, ``nv_energy_consumption``), read from NVML.

Triton reads them through DCGM every ``--metrics-interval-ms``; inferd reads NVML
(``nvidia-ml-py``, the ``pynvml`` module) when Prometheus scrapes, as the rest of
its metrics are read, so a scrape costs a few NVML calls per GPU (microseconds
each) and nothing runs between scrapes. Names, units and the ``gpu_uuid`` label
are Triton's: utilization as a ratio in [0, 1], memory in bytes, power in watts,
energy in joules since the server started.

Where NVML is absent (no package, no driver: every CPU host) :func:`gpu_collector`
returns None and there is no GPU metric at all, never an error. A reading that
fails for one GPU (a query the device does not support, say) leaves that sample
out of the scrape and is logged once.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from inferd.observability.text_format import escape, family

log = logging.getLogger(__name__)

LABELS = ["gpu_uuid"]


class GpuCollector:
    """A Prometheus collector over the GPUs NVML reports (those ``visible`` names, when given)."""

    def __init__(self, nvml: Any, visible_uuids: Callable[[], set[str]] | None = None) -> None:
        self.nvml = nvml
        self._visible = visible_uuids
        self._devices: list[tuple[str, Any]] | None = None
        self._energy_start: dict[str, int] = {}
        self._warned: set[tuple[str, str]] = set()

    def devices(self) -> list[tuple[str, Any]]:
        """(uuid, NVML handle) of each GPU reported, found on the first scrape."""
        if self._devices is None:
            nvml = self.nvml
            found = []
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                uuid = nvml.nvmlDeviceGetUUID(handle)
                found.append((uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
            visible = self._visible() if self._visible is not None else set()
            # CUDA_VISIBLE_DEVICES hides GPUs from CUDA, not from NVML: report the ones this
            # server can use, unless none of their UUIDs matches (then every GPU NVML sees).
            if visible and any(u in visible for u, _ in found):
                found = [(u, h) for u, h in found if u in visible]
            self._devices = found
        return self._devices

    def _read(self, uuid: str, what: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except self.nvml.NVMLError as exc:
            if (uuid, what) not in self._warned:
                self._warned.add((uuid, what))
                log.warning("GPU %s: NVML cannot read %s (%s); the metric is left out", uuid, what, exc)
            return None

    def collect(self) -> Iterator[Metric]:
        nvml = self.nvml
        util = GaugeMetricFamily("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", labels=LABELS)
        total = GaugeMetricFamily("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", labels=LABELS)
        used = GaugeMetricFamily("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", labels=LABELS)
        power = GaugeMetricFamily("nv_gpu_power_usage", "GPU power usage in watts", labels=LABELS)
        limit = GaugeMetricFamily("nv_gpu_power_limit", "GPU power management limit in watts", labels=LABELS)
        for uuid, h in self.devices():
            label = [uuid]
            rates = self._read(uuid, "utilization", lambda: nvml.nvmlDeviceGetUtilizationRates(h))
            if rates is not None:
                util.add_metric(label, rates.gpu / 100.0)
            memory = self._read(uuid, "memory", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
            if memory is not None:
                total.add_metric(label, float(memory.total))
                used.add_metric(label, float(memory.used))
            mw = self._read(uuid, "power usage", lambda: nvml.nvmlDeviceGetPowerUsage(h))
            if mw is not None:
                power.add_metric(label, mw / 1000.0)
            mw = self._read(uuid, "power limit", lambda: nvml.nvmlDeviceGetPowerManagementLimit(h))
            if mw is not None:
                limit.add_metric(label, mw / 1000.0)
        yield from (util, total, used, power, limit)

    def triton_text(self) -> str:
        """``nv_energy_consumption``, a counter Triton names without ``_total`` (which prometheus_client
        would add), in the text format; read at the same scrape as :meth:`collect`."""
        samples = []
        for uuid, h in self.devices():
            mj = self._read(uuid, "energy", lambda: self.nvml.nvmlDeviceGetTotalEnergyConsumption(h))
            if mj is not None:
                start = self._energy_start.setdefault(uuid, mj)
                samples.append((f'gpu_uuid="{escape(uuid)}"', (mj - start) / 1000.0))
        if not samples:
            return ""
        lines: list[str] = []
        family(lines, "nv_energy_consumption", "counter", "GPU energy consumption in joules since the server started",
               samples)
        return "".join(lines)

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


def gpu_collector(nvml: Any = None, visible_uuids: Callable[[], set[str]] | None = None) -> GpuCollector | None:
    """A collector when NVML can be initialised here (``nvml``: the pynvml module, or a fake); else None."""
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:  # no driver or no GPU: no GPU metrics, as on any CPU host
        log.debug("no GPU metrics: NVML did not initialise (%s)", exc)
        return None
    collector = GpuCollector(nvml, visible_uuids)
    try:
        count = len(collector.devices())
    except nvml.NVMLError as exc:
        log.warning("no GPU metrics: NVML cannot list the GPUs (%s)", exc)
        collector.close()
        return None
    if not count:
        collector.close()
        return None
    log.info("GPU metrics for %d GPU(s) from NVML", count)
    return collector


def visible_uuids() -> set[str]:
    """The UUIDs of the GPUs the server places instances on (the default inventory)."""
    from inferd.gpu.inventory import default_inventory

    return {g.uuid for g in default_inventory().gpus() if g.uuid}

"""What loaded: one row per model (name, versions, backend, instances, state, reason),
printed as a table when loading ends (``inferd serve``, ``inferd check``), and the
sentence that says whether the server is ready and, if not, why."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from inferd.config import ModelSpec
from inferd.repository.demand import EVICTED, NOT_LOADED
from inferd.repository.manager import READY, ModelManager
from inferd.repository.residency import format_size

_HEADER = ("MODEL", "VERSIONS", "BACKEND", "INSTANCES", "STATE", "REASON")


@dataclass(frozen=True, slots=True)
class ModelRow:
    name: str
    versions: str  # "1, 2"; "-" when none loaded
    backend: str  # the platform (onnxruntime_onnx, ensemble, ...) or the backend; "-" when unknown
    instances: str  # "2 CPU"; "-" for none (an ensemble, a model that failed)
    state: str  # READY, UNAVAILABLE, LOADING, UNLOADING, or "NOT LOADED" (explicit, on_demand)
    reason: str
    memory: str = "-"  # the footprint measured at load ("12.3 MiB"; on_demand, inferd check); "-": none

    @property
    def ready(self) -> bool:
        return self.state == READY


def _instances(spec: ModelSpec) -> str:
    counts: dict[str, int] = {}
    for group in spec.instance_groups:
        kind = group.kind.removeprefix("KIND_")
        counts[kind] = counts.get(kind, 0) + max(group.count, 1) * max(len(group.gpus), 1)
    return " + ".join(f"{n} {kind}" for kind, n in counts.items()) or "-"


def model_rows(manager: ModelManager) -> list[ModelRow]:
    """The manager's models, sorted by name, a row each (its versions joined)."""
    grouped: dict[str, list] = {}
    for entry in manager.index():
        grouped.setdefault(entry.name, []).append(entry)
    rows = []
    for name in sorted(grouped):
        entries = grouped[name]
        state, reason = entries[0].state, entries[0].reason
        versions = ", ".join(e.version for e in entries if e.version) or "-"
        backend = instances = memory = "-"
        if any(e.version for e in entries):
            spec = manager.get(name).spec
            backend = spec.platform or spec.backend or "-"
            instances = "-" if spec.platform == "ensemble" else _instances(spec)
            held = [n for m in manager.models() if m.name == name for kind, _, n in m.stats.memory_usage
                    if kind == "CPU"]
            memory = format_size(sum(held)) if held else "-"
        elif manager.demand is not None and reason in (NOT_LOADED, EVICTED):
            state = ""  # on_demand: listed, loads on its first request; not a failure
        rows.append(ModelRow(name, versions, backend, instances, state or "NOT LOADED", reason, memory))
    return rows


def format_table(rows: Sequence[ModelRow]) -> str:
    """Aligned columns under a header; the reason, last, is never cut."""
    if not rows:
        return ""
    if any(r.memory != "-" for r in rows):  # footprints measured: a MEMORY column before STATE
        header: tuple[str, ...] = (*_HEADER[:4], "MEMORY", *_HEADER[4:])
        cells = [header] + [(r.name, r.versions, r.backend, r.instances, r.memory, r.state, r.reason) for r in rows]
    else:
        header = _HEADER
        cells = [header] + [(r.name, r.versions, r.backend, r.instances, r.state, r.reason) for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(header) - 1)]
    lines = ["  ".join([*(c.ljust(w) for c, w in zip(line, widths)), line[-1]]).rstrip() for line in cells]
    return "\n".join(lines)


def readiness(rows: Sequence[ModelRow], server_ready: bool) -> str:
    """``17 of 18 models ready``, then why the server is not ready when it is not."""
    wanted = [r for r in rows if r.state != "NOT LOADED"]
    text = f"{sum(r.ready for r in wanted)} of {len(wanted)} models ready"
    if server_ready:
        return text
    not_ready = [f"{r.name} is {r.state}" for r in wanted if not r.ready]
    return f"{text}; the server is not ready until every model is: {', '.join(not_ready) or 'loading'}"

"""Which models stay loaded under a memory budget: the pure decision.

``--model-control-mode on_demand`` loads a model when a request first asks for
it and, when that load would pass ``--model-memory-budget``, unloads the least
recently used models that can go. This module decides which, and nothing else:
:func:`plan_load` is a function of plain data (the resident models with their
footprints, last use, whether anything is queued or in flight for them, pins
and keep-warm times; the budget; ``now``) and returns a :class:`Plan`, so it is
tested as a state machine on made-up times (tests/test_residency.py), like the
batch decision. The driver that measures, loads and unloads is
:mod:`inferd.repository.demand`.

The rules:

- a model may be evicted only when it is *idle*: nothing queued, in flight or
  waiting for its load, and no ensemble that is in use needs it (the driver
  folds those into :attr:`Resident.busy`); an in-flight model finishes first;
- never a pinned one (``inferd.pinned: true`` in its config, or loaded by
  RepositoryModelLoad);
- never one used within its ``inferd.keep_warm_seconds``;
- among the rest, the least recently used go first (ties: by name, so the
  decision is the same on every run), only as many as the load needs;
- if even evicting all of them leaves too little room, nothing is evicted and
  the load is refused (:attr:`Plan.refusal` says why, naming the budget, the
  footprint and what holds the memory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True, slots=True)
class Resident:
    """One loaded model, as the decision sees it."""

    name: str
    footprint: int  # bytes it holds (measured at its load)
    last_use: float  # clock seconds of the last request that asked for it
    busy: bool = False  # queued, in flight, waiting for its load, or needed by an ensemble in use
    pinned: bool = False
    keep_warm_until: float = 0.0  # not evicted before this time (last use + inferd.keep_warm_seconds)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do before loading a model: the models to unload first (least recently used
    first), or why the load cannot fit (then ``evict`` is empty)."""

    evict: tuple[str, ...] = ()
    refusal: str | None = None


def plan_load(name: str, footprint: int, budget: int, residents: Sequence[Resident], now: float) -> Plan:
    """Make room for ``name`` (``footprint`` bytes) under ``budget`` bytes among ``residents``
    (``name`` itself must not be among them). Pure: reads only its arguments."""
    used = sum(r.footprint for r in residents)
    if used + footprint <= budget:
        return Plan()
    if footprint > budget:
        return Plan(refusal=f"model '{name}' needs {format_size(footprint)} (its footprint), more than the whole "
                            f"model memory budget of {format_size(budget)}; raise --model-memory-budget")
    candidates = sorted((r for r in residents if evictable(r, now)), key=lambda r: (r.last_use, r.name))
    evict: list[str] = []
    for r in candidates:
        if used + footprint <= budget:
            break
        evict.append(r.name)
        used -= r.footprint
    if used + footprint > budget:
        return Plan(refusal=_refusal(name, footprint, budget, residents, now))
    return Plan(tuple(evict))


def over_budget(budget: int, residents: Sequence[Resident], now: float) -> tuple[str, ...]:
    """After a load measured more than it was expected to: the idle models to unload (least
    recently used first) to bring the residents back within ``budget``, as far as they can."""
    used = sum(r.footprint for r in residents)
    out: list[str] = []
    for r in sorted((r for r in residents if evictable(r, now)), key=lambda r: (r.last_use, r.name)):
        if used <= budget:
            break
        out.append(r.name)
        used -= r.footprint
    return tuple(out)


def evictable(r: Resident, now: float) -> bool:
    return not (r.busy or r.pinned or now < r.keep_warm_until)


def _refusal(name: str, footprint: int, budget: int, residents: Sequence[Resident], now: float) -> str:
    used = sum(r.footprint for r in residents)
    groups: dict[str, list[Resident]] = {"pinned": [], "in use": [], "kept warm": [], "idle": []}
    for r in residents:
        key = "pinned" if r.pinned else "in use" if r.busy else "kept warm" if now < r.keep_warm_until else "idle"
        groups[key].append(r)
    held = "; ".join(
        f"{key}: " + ", ".join(f"'{r.name}' {format_size(r.footprint)}" for r in sorted(rs, key=lambda r: r.name))
        for key, rs in groups.items() if rs)
    return (f"model '{name}' needs {format_size(footprint)} (its footprint) and the model memory budget of "
            f"{format_size(budget)} has {format_size(max(0, budget - used))} free; the models holding it cannot be "
            f"unloaded now ({held}); try again once they are idle, or raise --model-memory-budget")


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30,
          "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_size(text: str, what: str = "--model-memory-budget") -> int:
    """``"512MiB"``, ``"2G"``, ``"1.5GB"``, ``"1073741824"`` -> bytes (K/M/G/T are powers of
    1000, Ki/Mi/Gi/Ti of 1024, as in Kubernetes quantities). Raises ValueError naming ``what``.
    Written here: the standard library has no size parser, and these dozen lines are not worth a
    dependency."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _UNITS:
        raise ValueError(f"{what} must be a size such as 512MiB, 2G or 1073741824 (bytes), got '{text}'")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise ValueError(f"{what} must be > 0, got '{text}'")
    return size


def format_size(n: int) -> str:
    """Bytes as people read them: ``12.3 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"

"""Which models stay loaded under a memory budget: the pure decision.

``--model-control-mode on_demand`` loads a model when a request first asks for
it and, when that load would pass ``--model-memory-budget``, unloads the least
recently used models that can go. This module decides which, and nothing else:
:func:`plan_load` is a function of plain data (the resident models with their
footprints, last use, whether anything is queued or in flight for them, pins
and keep-warm times; the budget; ``now``) and returns a :class:`Plan`, so it is
tested as a state machine on made-up times (tests/repository/test_residency.py), like the
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
  footprint and what holds the memory), unless the room could be made once
  the loads in progress have ended (were their models idle): then it waits
  (:attr:`Plan.wait`) and is decided again when one of them ends (a load's
  room is held from its decision to its end, so loads in parallel never
  promise the same bytes twice);
- loads run in parallel, at most ``slots`` at a time (the cores: a load is CPU
  work, and each holds a transient peak of memory besides its footprint); a
  load past them waits for one to end. A load that a loading model waits for
  (a BLS call from its ``initialize``) neither waits for a slot nor for memory:
  the model it would wait for waits for it.

Per GPU (``--model-gpu-memory-budget 0:8GiB,1:4GiB``) the same rules hold for
each device on its own: a load that needs bytes on GPU k (its footprint there,
as its last load measured it) evicts the least recently used idle models that
hold memory on GPU k, and is refused naming the device, its budget, the
footprint and what holds it. Host and GPU budgets are one decision: a single
pass in least-recently-used order evicts a model when it frees memory
somewhere the load is still short of room, so a model is never evicted for a
device it does not use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Mapping, Sequence


@dataclass(frozen=True, slots=True)
class Resident:
    """One loaded model, as the decision sees it."""

    name: str
    footprint: int  # host bytes it holds (measured at its load)
    last_use: float  # clock seconds of the last request that asked for it
    busy: bool = False  # queued, in flight, waiting for its load, or needed by an ensemble in use
    pinned: bool = False
    keep_warm_until: float = 0.0  # not evicted before this time (last use + inferd.keep_warm_seconds)
    gpus: tuple[tuple[int, int], ...] = ()  # (GPU index, bytes it holds there), as measured at its load
    loading: bool = False  # a load in progress: ``footprint`` and ``gpus`` are the room held for it

    def holds(self, device: int | None) -> int:
        """Bytes held on ``device``: None is host memory, an int a GPU index."""
        if device is None:
            return self.footprint
        return sum(n for i, n in self.gpus if i == device)


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do about a load: start it after unloading ``evict`` (least recently used first; empty:
    it fits), or not now: ``wait`` says for what (a slot, or memory that loads in progress hold; decide
    again when one of them ends), ``refusal`` why it cannot fit (then ``evict`` is empty)."""

    evict: tuple[str, ...] = ()
    refusal: str | None = None
    wait: str | None = None


def plan_load(name: str, footprint: int, budget: int | None, residents: Sequence[Resident], now: float,
              gpu_footprint: Mapping[int, int] | None = None, gpu_budgets: Mapping[int, int] | None = None, *,
              slots: int | None = None, may_wait: bool = True) -> Plan:
    """Make room for ``name`` (``footprint`` host bytes, ``gpu_footprint`` bytes per GPU index) under
    ``budget`` host bytes (None: no limit) and ``gpu_budgets`` (GPU index -> bytes; a GPU without one
    has no limit) among ``residents`` (``name`` itself must not be among them; loads in progress are
    among them, ``loading``, never evicted). ``slots``: how many loads may run at once (None: no
    limit); ``may_wait``: False for a load another load waits for, which is refused rather than made
    to wait. One pass in least recently used order evicts an idle model only when it holds memory
    somewhere the load is still short of room (a model on GPU 0 alone is not evicted for GPU 1).
    Pure: reads only its arguments."""
    needs = _needs(footprint, budget, gpu_footprint or {}, gpu_budgets or {})
    for device, need, limit in needs:
        if need > limit:
            return Plan(refusal=_too_large(name, device, need, limit))
    plan = _make_room(name, needs, residents, now, may_wait)
    loads = sum(1 for r in residents if r.loading)
    if plan.refusal is None and plan.wait is None and may_wait and slots is not None and loads >= slots:
        return Plan(wait=f"a load slot ({loads} loads in progress, {slots} at a time)")
    return plan


def _make_room(name: str, needs: list[tuple[int | None, int, int]], residents: Sequence[Resident], now: float,
               may_wait: bool) -> Plan:
    used = {device: sum(r.holds(device) for r in residents) for device, _, _ in needs}
    short = [d for d, need, limit in needs if used[d] + need > limit]
    if not short:
        return Plan()
    limits = {d: (need, limit) for d, need, limit in needs}
    evict: list[str] = []
    for r in sorted((r for r in residents if evictable(r, now)), key=lambda r: (r.last_use, r.name)):
        if not short:
            break
        if not any(r.holds(d) for d in short):
            continue
        evict.append(r.name)
        for d in used:
            used[d] -= r.holds(d)
        short = [d for d in short if used[d] + limits[d][0] > limits[d][1]]
    if short:
        if may_wait and any(r.loading for r in residents) and _room_once_loaded(name, needs, residents, now):
            return Plan(wait="memory that loads in progress hold")
        device = short[0]
        need, limit = limits[device]
        return Plan(refusal=_refusal(name, device, need, limit, residents, now))
    return Plan(tuple(evict))


def _room_once_loaded(name: str, needs: list[tuple[int | None, int, int]], residents: Sequence[Resident],
                      now: float) -> bool:
    """Whether room could be made if the loads in progress had ended and their models were idle: then
    waiting for them may help; otherwise the load is refused at once."""
    ended = [replace(r, loading=False, busy=False) if r.loading else r for r in residents]
    return _make_room(name, needs, ended, now, may_wait=False).refusal is None


def over_budget(budget: int | None, residents: Sequence[Resident], now: float,
                gpu_budgets: Mapping[int, int] | None = None) -> tuple[str, ...]:
    """After a load measured more than it was expected to: the idle models to unload (least
    recently used first, only those holding memory where a budget is passed) to bring the residents
    back within ``budget`` and ``gpu_budgets``, as far as they can."""
    limits = _needs(0, budget, {}, gpu_budgets or {}, every_gpu=True)
    used = {d: sum(r.holds(d) for r in residents) for d, _, _ in limits}
    over = [d for d, _, limit in limits if used[d] > limit]
    bound = {d: limit for d, _, limit in limits}
    out: list[str] = []
    for r in sorted((r for r in residents if evictable(r, now)), key=lambda r: (r.last_use, r.name)):
        if not over:
            break
        if not any(r.holds(d) for d in over):
            continue
        out.append(r.name)
        for d in used:
            used[d] -= r.holds(d)
        over = [d for d in over if used[d] > bound[d]]
    return tuple(out)


def evictable(r: Resident, now: float) -> bool:
    return not (r.busy or r.loading or r.pinned or now < r.keep_warm_until)


def _needs(footprint: int, budget: int | None, gpu_footprint: Mapping[int, int], gpu_budgets: Mapping[int, int],
           every_gpu: bool = False) -> list[tuple[int | None, int, int]]:
    """(device, bytes the load needs there, budget there) for every budget the load touches: the host
    (None) when there is a host budget, each GPU with a budget the load needs bytes on (``every_gpu``:
    every GPU with a budget)."""
    out: list[tuple[int | None, int, int]] = []
    if budget is not None:
        out.append((None, footprint, budget))
    for device in sorted(gpu_budgets):
        need = gpu_footprint.get(device, 0)
        if need > 0 or every_gpu:
            out.append((device, need, gpu_budgets[device]))
    return out


def _where(device: int | None) -> tuple[str, str]:
    """How a refusal names the memory and the flag that sizes it."""
    if device is None:
        return "the model memory budget", "--model-memory-budget"
    return f"GPU {device}'s model memory budget", f"--model-gpu-memory-budget {device}:SIZE"


def _too_large(name: str, device: int | None, need: int, limit: int) -> str:
    return too_large(name, device, need, limit, "its footprint")


def too_large(name: str, device: int | None, need: int, limit: int, what: str) -> str:
    """The refusal of a model that cannot fit even alone: ``need`` bytes on ``device`` (None: the host)
    past a budget of ``limit``; ``what`` says where ``need`` comes from (its files, its last load)."""
    budget, flag = _where(device)
    there = "" if device is None else f" on GPU {device}"
    whole = "the whole model memory budget" if device is None else f"the whole of {budget}"
    return (f"model '{name}' needs {format_size(need)}{there} ({what}), more than {whole} of "
            f"{format_size(limit)}; raise {flag}")


def _refusal(name: str, device: int | None, need: int, limit: int, residents: Sequence[Resident],
             now: float) -> str:
    budget, flag = _where(device)
    holders = [r for r in residents if r.holds(device)]
    used = sum(r.holds(device) for r in holders)
    groups: dict[str, list[Resident]] = {"pinned": [], "loading": [], "in use": [], "kept warm": [], "idle": []}
    for r in holders:
        key = ("pinned" if r.pinned else "loading" if r.loading else "in use" if r.busy
               else "kept warm" if now < r.keep_warm_until else "idle")
        groups[key].append(r)
    held = "; ".join(
        f"{key}: " + ", ".join(f"'{r.name}' {format_size(r.holds(device))}" for r in sorted(rs, key=lambda r: r.name))
        for key, rs in groups.items() if rs)
    there = "" if device is None else f" on GPU {device}"
    return (f"model '{name}' needs {format_size(need)}{there} (its footprint) and {budget} of "
            f"{format_size(limit)} has {format_size(max(0, limit - used))} free; the models holding it cannot be "
            f"unloaded now ({held or 'none'}); try again once they are idle, or raise {flag}")


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


def parse_gpu_budgets(texts: Sequence[str], what: str = "--model-gpu-memory-budget") -> dict[int, int]:
    """``["0:8GiB,1:4GiB"]`` (the flag, repeatable, each a comma-separated list of ``GPU:SIZE``, as
    Triton's ``--cuda-memory-pool-byte-size <GPU>:<bytes>`` names a device) -> {GPU index: bytes}.
    Raises ValueError naming ``what``, the offending item and what would be valid."""
    out: dict[int, int] = {}
    for text in texts:
        for item in (p.strip() for p in text.split(",")):
            device, sep, size = item.partition(":")
            if not sep or not device.strip().isdigit():
                raise ValueError(f"{what} takes GPU:SIZE items such as 0:8GiB,1:4GiB (a GPU index, a colon, a "
                                 f"size), got '{item}'")
            index = int(device)
            if index in out:
                raise ValueError(f"{what} gives GPU {index} twice ('{text}'): one budget per GPU")
            out[index] = parse_size(size, f"{what} {index}:SIZE")
    return out


def usage_line(used: int, budget: int | None, gpu_used: Mapping[int, int], gpu_budgets: Mapping[int, int]) -> str:
    """What the loaded models hold against the budgets, as a log line says it."""
    line = (f"{format_size(used)} of the {format_size(budget)} budget in use" if budget is not None
            else f"{format_size(used)} in use (no budget)")
    for device, n in sorted(gpu_used.items()):
        limit = gpu_budgets.get(device)
        line += f"; GPU {device}: {format_size(n)}" + (f" of {format_size(limit)}" if limit is not None else "")
    return line


def format_size(n: int) -> str:
    """Bytes as people read them: ``12.3 MiB``."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"

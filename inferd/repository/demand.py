"""``--model-control-mode on_demand``: load a model on its first request, evict the coldest.

Every model of the repository is listed from start-up; only the pinned ones
(``inferd.pinned: true``, and the ``--load-model`` ones) are loaded then. A
request for a model that is not loaded waits here (:meth:`OnDemand.wait`)
while the model loads, then takes its path as any other request: concurrent
requests for one cold model share one load; a load that fails answers every
one of them with its reason; a request's deadline and queue timeout count
through the wait (it is refused when either passes before the load ends). An
ensemble loads the composing models its steps need (nested ones too).

Before a load that would pass ``--model-memory-budget``, the pure decision
(:func:`inferd.repository.residency.plan_load`) names the idle models to
unload, least recently used first; when no room can be made the request is
refused at once (RESOURCE_EXHAUSTED, naming the budget, the footprint and what
holds the memory). Loads happen one at a time, so the footprint each measures
(:mod:`inferd.repository.footprint`) is its own; a model's footprint is what
its last load measured, and never less than its files (the estimate before
its first load).
RepositoryModelLoad pins a model (and makes room for it the same way);
RepositoryModelUnload unpins and unloads it.

Counters (per model name, kept across evictions): loads, evictions, requests
that found the model loaded (hits) or had to wait (misses), and the time those
waited (cold start); the exporter (:mod:`inferd.observability.metrics`) reads them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

from inferd.clock import Clock, MonotonicClock
from inferd.config import parse_config_file
from inferd.errors import ConfigError, DeadlineExceeded, InferdError, ResourceExhausted, Unavailable
from inferd.repository.footprint import file_bytes
from inferd.repository.residency import Resident, format_size, over_budget, plan_load
from inferd.types import InferenceRequest

if TYPE_CHECKING:
    from inferd.repository.manager import ModelManager, _Entry

log = logging.getLogger(__name__)

NOT_LOADED = "not loaded: loads on its first request (model control mode on_demand)"
EVICTED = "evicted to make room under the model memory budget: loads again on its next request"


@dataclass(slots=True)
class DemandCounters:
    """One model's on-demand counters (cumulative; they survive its evictions)."""

    loads: int = 0
    load_failures: int = 0
    evictions: int = 0
    refusals: int = 0  # loads refused: the budget could not hold the model
    hits: int = 0  # requests that found it loaded
    misses: int = 0  # requests that waited for its load
    cold_start_ns: int = 0  # the time those waited, summed
    load_ns: int = 0  # the loads themselves, summed


class OnDemand:
    """The on-demand driver of one :class:`ModelManager`; on its event loop only.

    ``budget``: host bytes the models may hold (None: no limit, nothing is evicted);
    ``warmup``: run a model's ``model_warmup`` on a demand load before the waiting requests."""

    def __init__(self, manager: "ModelManager", budget: int | None = None, clock: Clock | None = None,
                 warmup: bool = True) -> None:
        self.manager = manager
        self.budget = budget
        self.clock = clock or MonotonicClock()
        self.warmup = warmup
        self.counters: dict[str, DemandCounters] = {}
        self.footprints: dict[str, int] = {}  # name -> the largest footprint measured (bytes)
        self.last_use: dict[str, float] = {}
        self.pinned: set[str] = set()  # by RepositoryModelLoad / --load-model
        self._loads: dict[str, asyncio.Task] = {}
        self._waiting: dict[str, int] = {}  # requests waiting for a model's load (busy: never evicted)
        self._protected: set[str] = set()  # the models an ensemble being loaded needs
        self._lock = asyncio.Lock()  # one load or eviction at a time: footprints are measured alone

    # -- the request path --------------------------------------------------------

    def cold(self, name: str) -> bool:
        """Whether a request for ``name`` must wait for a load; counts a hit and the use otherwise.
        An unknown name is not cold (the lookup that follows refuses it)."""
        entry = self.manager._entries.get(name)
        if entry is None:
            return False
        if not self._resident(entry, self.clock.now()):
            return True
        self._counters(name).hits += 1
        return False

    def _resident(self, entry: "_Entry", now: float, depth: int = 0) -> bool:
        """Loaded, and for an ensemble every composing model too (each use recorded)."""
        if entry.latest is None:
            return False
        self.last_use[entry.name] = now
        prepared = entry.ensemble
        if prepared is not None and depth < 16:  # deeper is a cycle, refused at load
            for used in prepared.graph.composing_models():
                inner = self.manager._entries.get(used)
                if inner is None or not self._resident(inner, now, depth + 1):
                    return False
        return True

    async def wait(self, name: str, request: InferenceRequest | None = None) -> None:
        """Wait for model ``name`` to be loaded (loading it if no one is); raises the load's error,
        RESOURCE_EXHAUSTED when the budget cannot hold it, or ``request``'s own deadline or queue
        timeout passing first. Cancelling the caller leaves the load going for the others."""
        counters = self._counters(name)
        counters.misses += 1
        task = self._loads.get(name)
        if task is None:
            task = self._loads[name] = asyncio.get_running_loop().create_task(self._load(name),
                                                                           name=f"inferd-load-{name}")
            task.add_done_callback(lambda t: self._loaded(name, t))
        self._waiting[name] = self._waiting.get(name, 0) + 1
        start = time.perf_counter_ns()
        try:
            bound = _wait_bound(request, self.clock.now()) if request is not None else None
            if bound is None:
                await asyncio.shield(task)
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(task), max(0.0, bound[0]))
                except asyncio.TimeoutError:
                    raise bound[1](name) from None
        finally:
            # Decremented as the waiter resumes, so the model counts as busy until the request is
            # in its queue (nothing awaits between here and there): no eviction in between.
            self._waiting[name] -= 1
            if not self._waiting[name]:
                del self._waiting[name]
            self.last_use[name] = self.clock.now()  # its use: the freshest, not the coldest
            counters.cold_start_ns += time.perf_counter_ns() - start

    def _loaded(self, name: str, task: asyncio.Task) -> None:
        if self._loads.get(name) is task:
            del self._loads[name]
        if not task.cancelled():
            task.exception()  # retrieved: the waiters got it (or all went away)

    async def _load(self, name: str) -> None:
        async with self._lock:
            entry = self.manager._entries.get(name)
            if entry is None or self._resident(entry, self.clock.now()):
                return
            needed = list(self._needed(name))
            self._protected = set(self._closure(name))
            try:
                for one in needed:
                    await self._load_one(one)
            finally:
                self._protected = set()

    def _needed(self, name: str, depth: int = 0) -> Iterator[str]:
        """What must load for ``name`` to serve, composing models first: for an ensemble, those of its
        steps that are not loaded (nested ensembles' too), then the ensemble itself if it is not."""
        graph = self.manager._ensemble_graph(name)
        if graph is not None and depth < 16:
            for used in sorted(graph.composing_models()):
                yield from self._needed(used, depth + 1)
        entry = self.manager._entries.get(name)
        if entry is not None and entry.latest is None:
            yield name

    def _closure(self, name: str, depth: int = 0) -> Iterator[str]:
        yield name
        graph = self.manager._ensemble_graph(name)
        if graph is not None and depth < 16:
            for used in graph.composing_models():
                yield from self._closure(used, depth + 1)

    async def _load_one(self, name: str) -> None:
        manager = self.manager
        entry = manager._entries.get(name)
        if entry is None:
            raise Unavailable(f"model '{name}' is not in the model repository")
        if entry.latest is not None:
            return
        if manager._ensemble_graph(name) is None:  # an ensemble holds no memory of its own
            await self._make_room(name)
        start = time.perf_counter_ns()
        error = await manager._load_locked(name)
        counters = self._counters(name)
        counters.load_ns += time.perf_counter_ns() - start
        if error is None and entry.latest is None:  # an ensemble whose check failed
            error = Unavailable(entry.reason or "not ready")
        if error is not None:
            counters.load_failures += 1
            entry.state, entry.reason = "UNAVAILABLE", f"failed to load on demand: {error.message}"
            raise type(error)(f"model '{name}' failed to load on demand: {error.message}")
        counters.loads += 1
        self.last_use[name] = self.clock.now()
        self._record_footprint(name)
        log.info("loaded model '%s' on demand in %.0f ms: footprint %s; %s", name,
                 (time.perf_counter_ns() - start) / 1e6, format_size(self.footprints[name]), self._usage_line())
        if self.budget is not None:  # it measured more than expected: back within the budget
            for victim in over_budget(self.budget, self.residents(), self.clock.now()):
                await self._evict(victim)

    async def _make_room(self, name: str) -> None:
        if self.budget is None:
            return
        estimate = max(self.footprints.get(name, 0), self._files(name))
        plan = plan_load(name, estimate, self.budget, [r for r in self.residents() if r.name != name],
                         self.clock.now())
        if plan.refusal is not None:
            self._counters(name).refusals += 1
            raise ResourceExhausted(plan.refusal)
        for victim in plan.evict:
            await self._evict(victim)

    async def _evict(self, name: str) -> None:
        log.info("evicting model '%s' (%s, idle since %.1f s) to make room under the model memory budget", name,
                 format_size(self.footprints.get(name, 0)), self.clock.now() - self.last_use.get(name, 0.0))
        await self.manager._unload(name, collect=False)
        entry = self.manager._entries.get(name)
        if entry is not None and entry.latest is None:
            entry.reason = EVICTED
        self._counters(name).evictions += 1

    # -- what the decision reads ------------------------------------------------------

    def residents(self) -> list[Resident]:
        """The loaded models (ensembles hold nothing of their own: left out) as the decision sees them."""
        now = self.clock.now()
        entries = self.manager._entries
        busy = set(self._waiting) | self._protected
        for entry in entries.values():  # an ensemble in use needs every model under it
            if entry.ensemble is not None and any(m.scheduler.inflight() for m in entry.versions.values()):
                busy.update(self._closure(entry.name))
        out = []
        for entry in entries.values():
            if entry.latest is None or entry.ensemble is not None:
                continue
            params = entry.latest.spec.params
            last = self.last_use.get(entry.name, 0.0)
            out.append(Resident(
                entry.name, self.footprints.get(entry.name, 0), last,
                busy=entry.name in busy or any(m.scheduler.inflight() for m in entry.versions.values()),
                pinned=entry.name in self.pinned or params.pinned,
                keep_warm_until=last + params.keep_warm_seconds if params.keep_warm_seconds else 0.0))
        return out

    def used(self) -> int:
        """Bytes the loaded models hold, by their footprints."""
        return sum(r.footprint for r in self.residents())

    def _record_footprint(self, name: str) -> None:
        """The footprint of ``name`` as its last load measured it (the sum over its versions), never
        less than its files: a load that reused memory an evicted model left mapped measures less
        than it holds."""
        entry = self.manager._entries[name]
        measured = sum(n for m in entry.versions.values() for kind, _, n in m.stats.memory_usage if kind == "CPU")
        self.footprints[name] = max(measured, self._files(name))

    def _files(self, name: str) -> int:
        entry = self.manager._entries.get(name)
        return file_bytes(entry.path) if entry is not None else 0

    def _counters(self, name: str) -> DemandCounters:
        counters = self.counters.get(name)
        if counters is None:
            counters = self.counters[name] = DemandCounters()
        return counters

    def _usage_line(self) -> str:
        used = self.used()
        return (f"{format_size(used)} of the {format_size(self.budget)} budget in use" if self.budget is not None
                else f"{format_size(used)} in use (no budget)")

    # -- lifecycle and model control -----------------------------------------------------

    async def start(self, startup: list[str]) -> None:
        """Start-up: list every model as not loaded, then load the pinned ones (``inferd.pinned: true``
        and ``startup``, the ``--load-model`` names; ``*``: all), which are never evicted."""
        manager = self.manager
        for entry in manager._entries.values():
            if entry.latest is None and not entry.lock.locked():
                entry.state, entry.reason, entry.wanted = "UNAVAILABLE", NOT_LOADED, False
        names = list(manager._entries) if "*" in startup else list(dict.fromkeys(startup))
        unknown = [n for n in names if n not in manager._entries]
        if unknown:  # as explicit mode: a name that is no model stops the start-up
            raise ConfigError(f"--load-model {', '.join(unknown)}: no such model in the model repositories "
                              f"(found: {', '.join(sorted(manager._entries)) or 'none'})")
        for name, entry in sorted(manager._entries.items()):
            if name not in names and _pinned_in_config(name, entry.path):
                names.append(name)
        for name in names:
            try:
                await self.load_pinned(name)
            except InferdError as exc:
                log.error("model '%s' (pinned) failed to load at start-up: %s", name, exc.message)

    async def load_pinned(self, name: str, config: object = None, files: dict[str, object] | None = None) -> None:
        """RepositoryModelLoad (and a pinned model at start-up): make room, (re)load, pin."""
        async with self._lock:
            self._protected = set(self._closure(name))
            try:
                if self.manager._ensemble_graph(name) is not None:
                    for used in self._needed(name):
                        if used != name:
                            await self._load_one(used)
                elif self.manager._entries.get(name) is not None:
                    await self._make_room(name)
                await self.manager.load_model(name, config, files)  # type: ignore[arg-type]
            finally:
                self._protected = set()
            self._record_footprint(name)
            self._counters(name).loads += 1
            self.pinned.add(name)
            self.last_use[name] = self.clock.now()

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """RepositoryModelUnload: unpin and unload (it loads again on demand)."""
        async with self._lock:
            self.pinned.discard(name)
            await self.manager.unload_model(name, unload_dependents)


def _pinned_in_config(name: str, model_dir: object) -> bool:
    """Whether a model's config.pbtxt says ``inferd.pinned: true`` (read before it loads;
    a config that does not parse is not pinned: its load reports it)."""
    try:
        config = parse_config_file(model_dir / "config.pbtxt", model=name)  # type: ignore[operator]
    except (InferdError, OSError):
        return False
    param = config.parameters.get("inferd.pinned")
    return param is not None and param.string_value.strip().lower() in ("true", "1")


def _wait_bound(request: InferenceRequest, now: float) -> tuple[float, Callable[[str], InferdError]] | None:
    """How long the request may wait for its model's load (seconds) and the error to give it then:
    its deadline, or its queue timeout counted from when its frontend received it; None: unbounded."""
    bounds = []
    if request.deadline is not None:
        bounds.append((request.deadline - now, _deadline_passed))
    if request.timeout_us:
        received = request.received_ns * 1e-9 if request.received_ns else now
        bounds.append((received + request.timeout_us * 1e-6 - now, _timed_out))
    return min(bounds, key=lambda b: b[0]) if bounds else None


def _deadline_passed(name: str) -> InferdError:
    return DeadlineExceeded(f"model '{name}': the request's deadline passed while the model loaded on demand")


def _timed_out(name: str) -> InferdError:
    return Unavailable(f"model '{name}': request timed out while the model loaded on demand (its timeout "
                       "counts from its arrival, load time included); a longer timeout would wait for it")

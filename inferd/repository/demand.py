"""``--model-control-mode on_demand``: load a model on its first request, evict the coldest.

Every model is listed from start-up; only the pinned ones (``inferd.pinned:
true``, ``--load-model``) load then. A request for a model that is not loaded
waits here (:meth:`OnDemand.wait`) while it loads, then takes its path as any
other: concurrent requests for one cold model share one load, a failed load
answers each with its reason, its deadline and queue timeout count through
the wait, a failure is remembered for a backoff
(:mod:`inferd.repository.cold_waits`). An ensemble loads the composing models
its steps need, in parallel.

Loads of different models run in parallel: a cold request waits for its own
model's load, not for others', unless memory must be freed for its own (loads
in progress hold the room it needs) or every load slot is busy (``slots``: the
cores this process may use, at least 2: a load is CPU work, and holds a
transient peak of memory besides its footprint). The pure decision
(:func:`inferd.repository.residency.plan_load`) says whether a load may start
and the idle models to unload first (least recently used first), or that it
waits (decided again when a load ends) or is refused (RESOURCE_EXHAUSTED,
naming the budget, the footprint and what holds the memory). A load holds its
room (its footprint as last measured, or its files before its first load) from
that decision to its end, so parallel loads never promise the same bytes
twice. Models in hosts build in their hosts, side by side; in-process builds
are measured one at a time (:class:`~inferd.repository.footprint.MeasureGate`),
and a reload from unchanged files reuses its measured figure and builds beside
other loads.

A footprint is what the model's last load measured
(:mod:`inferd.repository.footprint`). A model measured past a whole budget is
refused (RESOURCE_EXHAUSTED naming the model, its footprint, the budget and the
flag): unloaded as soon as its load has measured it, its waiting requests
refused, and every later request refused at once, without a load, until its
files change or RepositoryModelLoad asks for it. RepositoryModelLoad pins a
model (making room the same way); RepositoryModelUnload unpins and unloads it.

Per GPU, ``--model-gpu-memory-budget`` is enforced by the same decision, by
what torch's allocator gained on each GPU during a model's last load; a model
not yet loaded has no known GPU footprint, so its first load is planned by its
host side and the idle models past a GPU's budget are unloaded after it
(:func:`~inferd.repository.residency.over_budget`).

A Python model's BLS call into a model that is not loaded waits for its load as
a request does (:meth:`OnDemand.call_from`). One made while the caller itself
loads (its ``initialize``) waits for no slot or memory that loads in progress
hold (its caller's load waits for it), and is refused at once when the caller's
build is an in-process one being measured (the callee would wait for it).

Counters per model (kept across evictions): loads, evictions, refusals, hits,
misses, cold-start time; the exporter (:mod:`inferd.dataplane.metrics`) reads them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

from inferd.backends.base import file_bytes
from inferd.clock import Clock, MonotonicClock
from inferd.errors import ConfigError, InferdError, ResourceExhausted, Unavailable
from inferd.host import cpu_budget
from inferd.repository.cold_waits import Failure, wait_bound
from inferd.repository.layout import change_stamp, pinned_in_config
from inferd.repository.residency import Resident, format_size, over_budget, plan_load, too_large, usage_line
from inferd.types import InferenceRequest

if TYPE_CHECKING:
    from inferd.repository.manager import ModelEntry, ModelManager

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
    backoffs: int = 0  # requests answered with a remembered load failure (not loaded again)


class OnDemand:
    """The on-demand driver of one :class:`ModelManager`; on its event loop only.

    ``budget``: host bytes the models may hold (None: no limit); ``gpu_budgets``: GPU index -> bytes
    the models may hold there (a GPU not named: no limit); ``warmup``: run a model's ``model_warmup`` on
    a demand load before the waiting requests; ``slots``: loads at once (None: the cores, at least 2)."""

    def __init__(self, manager: "ModelManager", budget: int | None = None, clock: Clock | None = None,
                 warmup: bool = True, gpu_budgets: dict[int, int] | None = None, slots: int | None = None) -> None:
        self.manager = manager
        self.budget = budget
        self.gpu_budgets = dict(gpu_budgets or {})
        self.clock = clock or MonotonicClock()
        self.warmup = warmup
        # At least 2: one slow load (a model whose initialize waits on something) never holds up every other.
        self.slots = slots if slots is not None else max(2, cpu_budget())
        self.counters: dict[str, DemandCounters] = {}
        self.footprints: dict[str, int] = {}  # name -> host bytes, as its last load measured
        self.gpu_footprints: dict[str, dict[int, int]] = {}  # name -> GPU index -> bytes, as its last load measured
        self.failures: dict[str, Failure] = {}  # models whose last demand load failed
        self.refused: dict[str, tuple[tuple, str]] = {}  # measured past a whole budget: files' stamp, refusal
        self.last_use: dict[str, float] = {}
        self.pinned: set[str] = set()  # by RepositoryModelLoad / --load-model
        self._measured: dict[str, tuple] = {}  # name -> its files' change stamp when its footprint was measured
        self._loads: dict[str, asyncio.Task] = {}  # one per model being loaded, shared by its waiters
        self._waiting: dict[str, int] = {}  # requests waiting for a model's load (busy: never evicted)
        self._protected: Counter[str] = Counter()  # the models ensembles being loaded need
        self._held: dict[str, list[tuple[int, dict[int, int]]]] = {}  # the room each load in progress holds
        self._evicting: set[str] = set()  # being unloaded for a load: their room is that load's
        self._building: set[str] = set()  # models whose build runs now (their initialize may call others)
        self._urgent: set[str] = set()  # loads a loading model waits for: no wait for a slot or memory
        self._change: asyncio.Future[None] | None = None  # resolved when a load ends (waiting loads decide again)

    # -- the request path --------------------------------------------------------

    def cold(self, name: str) -> bool:
        """Whether a request for ``name`` must wait for a load (or be refused); counts a hit and the use
        otherwise. An unknown name is not cold (the lookup that follows refuses it)."""
        entry = self.manager.known.get(name)
        if entry is None:
            return False
        if not self._resident(entry, self.clock.now()) or name in self.refused:
            return True
        self._counters(name).hits += 1
        return False

    def _resident(self, entry: "ModelEntry", now: float, depth: int = 0) -> bool:
        """Loaded, and for an ensemble every composing model too (each use recorded)."""
        if entry.latest is None:
            return False
        self.last_use[entry.name] = now
        prepared = entry.ensemble
        if prepared is not None and depth < 16:  # deeper is a cycle, refused at load
            for used in prepared.graph.composing_models():
                inner = self.manager.known.get(used)
                if inner is None or not self._resident(inner, now, depth + 1):
                    return False
        return True

    async def wait(self, name: str, request: InferenceRequest | None = None) -> None:
        """Wait for model ``name`` to be loaded (loading it if no one is); raises the load's error,
        RESOURCE_EXHAUSTED when the budget cannot hold it, or ``request``'s own deadline or queue
        timeout passing first; a model whose last load failed, the remembered failure at once (until its
        backoff passes), and one measured past a whole budget, its refusal at once. Cancelling the
        caller leaves the load going for the others."""
        counters = self._counters(name)
        refusal = self._refusal(name)
        if refusal is not None:
            counters.refusals += 1
            raise ResourceExhausted(refusal)
        remembered = self._remembered(name)
        if remembered is not None:
            counters.backoffs += 1
            raise remembered
        counters.misses += 1
        task = self._task(name)
        self._waiting[name] = self._waiting.get(name, 0) + 1
        start = time.perf_counter_ns()
        try:
            bound = wait_bound(request, self.clock.now()) if request is not None else None
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

    def _task(self, name: str, chain: tuple[str, ...] = ()) -> asyncio.Task:
        """The load of ``name`` in progress, or a new one (``chain``: the ensembles whose load asks)."""
        task = self._loads.get(name)
        if task is None:
            task = self._loads[name] = asyncio.get_running_loop().create_task(self._load(name, chain),
                                                                           name=f"inferd-load-{name}")
            task.add_done_callback(lambda t: self._loaded(name, t))
        return task

    def _loaded(self, name: str, task: asyncio.Task) -> None:
        if self._loads.get(name) is task:
            del self._loads[name]
        self._urgent.discard(name)
        if not task.cancelled():
            task.exception()  # retrieved: the waiters got it (or all went away)

    async def call_from(self, name: str, request: InferenceRequest, caller: str) -> None:
        """A BLS call by model ``caller`` to model ``name`` (the dispatcher's cold hook): returns at once
        when ``name`` is loaded, else waits for its load as :meth:`wait` does; made while ``caller``
        itself loads, that load neither waits for a slot nor for memory other loads hold (``caller``'s
        load would wait for it), and is refused when ``caller``'s build is an in-process one being
        measured (:meth:`check_nested`)."""
        if not self.cold(name):
            return
        self.check_nested(name, caller, "made a BLS call to")
        if caller in self._building:
            self._hurry(name)
        await self.wait(name, request)

    def check_nested(self, name: str, caller: str, what: str) -> None:
        """Refuse (UNAVAILABLE) a load of ``name`` that model ``caller`` asks for (``what``: how) while its
        own in-process build is measured: builds in this process are measured one at a time, so the load
        of ``name`` would wait for ``caller``'s to end, which waits for this call."""
        if caller and caller == self.manager.gate.owner:
            raise Unavailable(
                f"model '{caller}' {what} model '{name}' while '{caller}' itself was loading (from its "
                f"initialize or warm-up): builds in the server's process are measured one at a time, so the "
                f"load of '{name}' could start only after '{caller}''s ends, which waits for this call; load "
                f"'{name}' first (pin it: --load-model {name} or inferd.pinned), run '{caller}' in a model host "
                "(inferd.host: process), or make the call from execute")

    def _hurry(self, name: str, depth: int = 0) -> None:
        """A loading model waits for ``name``'s load: it (and what it needs) waits for no slot or memory."""
        self._urgent.add(name)
        graph = self.manager.ensemble_graph(name)
        if graph is not None and depth < 16:
            for used in graph.composing_models():
                self._hurry(used, depth + 1)
        self._notify()

    def _refusal(self, name: str) -> str | None:
        """Why ``name`` is refused at once: its last load measured it past a whole budget (and its files
        have not changed since); else None."""
        refused = self.refused.get(name)
        if refused is None:
            return None
        entry = self.manager.known.get(name)
        if entry is None or change_stamp(entry.path) != refused[0]:
            del self.refused[name]  # changed files: a new model, measured again
            return None
        return refused[1]

    def _remembered(self, name: str) -> InferdError | None:
        """The error a request for ``name`` gets at once while its last failed load is remembered, or None
        (never failed, its backoff has passed, or its files changed since: it may load now)."""
        failure = self.failures.get(name)
        if failure is None or self.clock.now() >= failure.retry_at:
            return None
        entry = self.manager.known.get(name)
        if entry is None or change_stamp(entry.path) != failure.stamp:
            del self.failures[name]  # changed files: a new model, as far as its backoff goes
            return None
        return failure.answer(name, self.clock.now())

    def _remember(self, name: str, error: InferdError, stamp: tuple) -> float:
        """Record a failed demand load of ``name``; the seconds until it is tried again."""
        failure = self.failures[name] = Failure.after(self.failures.get(name), error, stamp, self.clock.now())
        return failure.retry_at - failure.at

    # -- loading --------------------------------------------------------------------

    async def _load(self, name: str, chain: tuple[str, ...]) -> None:
        """Load ``name``: an ensemble's composing models first (each its own load, in parallel)."""
        entry = self.manager.known.get(name)
        if entry is None or self._resident(entry, self.clock.now()):
            return
        closure = list(self._closure(name))
        self._protected.update(closure)
        try:
            await self._load_parts(name, chain)
            await self._load_one(name)
        finally:
            self._unprotect(closure)

    async def _load_parts(self, name: str, chain: tuple[str, ...]) -> None:
        """An ensemble's composing models that are not loaded, loaded (their loads shared with whoever
        else waits for them); one already in ``chain`` is a cycle, which the ensemble's own load reports."""
        graph = self.manager.ensemble_graph(name)
        if graph is None or len(chain) >= 16:
            return
        now = self.clock.now()
        parts = []
        for used in sorted(graph.composing_models()):
            inner = self.manager.known.get(used)
            if inner is not None and used not in chain and used != name and not self._resident(inner, now):
                parts.append(self._task(used, chain + (name,)))
        if parts:
            await asyncio.gather(*(asyncio.shield(t) for t in parts))

    def _closure(self, name: str, depth: int = 0) -> Iterator[str]:
        yield name
        graph = self.manager.ensemble_graph(name)
        if graph is not None and depth < 16:
            for used in graph.composing_models():
                yield from self._closure(used, depth + 1)

    def _unprotect(self, names: list[str]) -> None:
        self._protected.subtract(names)
        for name in names:
            if self._protected[name] <= 0:
                del self._protected[name]

    async def _load_one(self, name: str) -> None:
        manager = self.manager
        entry = manager.known.get(name)
        if entry is None:
            raise Unavailable(f"model '{name}' is not in the model repository")
        if entry.latest is not None:
            return
        remembered = self._remembered(name)  # a composing model of an ensemble, failed a moment ago
        if remembered is not None:
            raise remembered
        plain = manager.ensemble_graph(name) is None  # an ensemble holds no memory of its own
        stamp = change_stamp(entry.path)  # before: files changed during the load make the next request retry
        if plain:
            await self._admit(name, stamp)
        start = time.perf_counter_ns()
        self._building.add(name)
        try:
            error = await manager.load_locked(name)
            if error is None and plain and entry.latest is not None:
                self._record_footprint(name, stamp)  # before its room is let go: no moment unaccounted
        finally:
            self._building.discard(name)
            if plain:
                self._release(name)
        counters = self._counters(name)
        counters.load_ns += time.perf_counter_ns() - start
        if error is None and entry.latest is None:  # an ensemble whose check failed
            error = Unavailable(entry.reason or "not ready")
        if error is not None:
            counters.load_failures += 1
            delay = self._remember(name, error, stamp)
            retry = (f"tried again on a request after {delay:g} s, or at once when its files change or "
                     "RepositoryModelLoad asks for it")
            self.manager.set_unavailable(name, f"failed to load on demand: {error.message}; {retry}")
            raise type(error)(f"model '{name}' failed to load on demand: {error.message} ({retry})")
        self.failures.pop(name, None)
        counters.loads += 1
        self.last_use[name] = self.clock.now()
        if plain:
            log.info("loaded model '%s' on demand in %.0f ms: footprint %s; %s", name,
                     (time.perf_counter_ns() - start) / 1e6, format_size(self.footprints[name]),
                     usage_line(self.used(), self.budget, self.gpu_used(), self.gpu_budgets))
            await self._refuse_if_past_budget(name, stamp)
            await self._back_within_budgets()

    async def _admit(self, name: str, stamp: tuple, replacing: bool = False) -> None:
        """Wait until ``name``'s load may start (a slot, and room: the idle models the decision names
        unloaded first), then hold its room until :meth:`_release`; RESOURCE_EXHAUSTED when the budget
        cannot hold it. ``replacing``: ``name`` is loaded and this load replaces it (RepositoryModelLoad)."""
        while True:
            host, gpus = self._estimate(name, stamp)
            urgent = name in self._urgent
            residents = [r for r in self.residents() if r.name != name]
            plan = plan_load(name, host, self.budget, residents, self.clock.now(), gpus, self.gpu_budgets,
                             slots=None if urgent else self.slots, may_wait=not urgent)
            if plan.refusal is not None:
                self._counters(name).refusals += 1
                raise ResourceExhausted(plan.refusal)
            if plan.wait is None:
                break
            log.debug("the load of model '%s' waits for %s", name, plan.wait)
            await self._next_change()
        self._held.setdefault(name, []).append((host, gpus))
        if not plan.evict:
            return
        self._evicting.update(plan.evict)
        try:
            await asyncio.gather(*(self._evict(victim) for victim in plan.evict))
        except BaseException:
            self._release(name)
            raise
        finally:
            self._evicting.difference_update(plan.evict)

    def _estimate(self, name: str, stamp: tuple) -> tuple[int, dict[int, int]]:
        """The room a load of ``name`` holds: what its last load of these files measured (host, per GPU);
        before that (or once its files changed), its files on the host and nothing on GPUs."""
        if name in self.footprints and self._measured.get(name) == stamp:
            return self.footprints[name], dict(self.gpu_footprints.get(name, {}))
        return self._files(name), {}

    def _release(self, name: str) -> None:
        """A load has ended: the room it held is let go, and the loads waiting decide again."""
        held = self._held.get(name)
        if held:
            held.pop()
            if not held:
                del self._held[name]
        self._notify()

    async def _next_change(self) -> None:
        if self._change is None or self._change.done():
            self._change = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._change)

    def _notify(self) -> None:
        change, self._change = self._change, None
        if change is not None and not change.done():
            change.set_result(None)

    async def _refuse_if_past_budget(self, name: str, stamp: tuple) -> None:
        """Its load measured ``name`` past a whole budget: unload it and refuse (now and until its files
        change or RepositoryModelLoad asks again)."""
        refusal = self._past_budget(name)
        if refusal is None:
            return
        self.refused[name] = (stamp, refusal)
        self._counters(name).refusals += 1
        log.error("%s: unloaded and refused", refusal)
        self.pinned.discard(name)
        await self.manager.evict(name, f"refused: {refusal}")
        raise ResourceExhausted(refusal)

    def _past_budget(self, name: str) -> str | None:
        host = self.footprints.get(name, 0)
        if self.budget is not None and host > self.budget:
            return too_large(name, None, host, self.budget, "its footprint, measured at its load")
        for device, n in sorted(self.gpu_footprints.get(name, {}).items()):
            limit = self.gpu_budgets.get(device)
            if limit is not None and n > limit:
                return too_large(name, device, n, limit, "its footprint, measured at its load")
        return None

    async def _back_within_budgets(self) -> None:
        """A load measured more than it was expected to: unload the idle models past the budgets."""
        if self.budget is None and not self.gpu_budgets:
            return
        victims = over_budget(self.budget, self.residents(), self.clock.now(), self.gpu_budgets)
        if not victims:
            return
        self._evicting.update(victims)
        try:
            await asyncio.gather(*(self._evict(victim) for victim in victims))
        finally:
            self._evicting.difference_update(victims)

    async def _evict(self, name: str) -> None:
        log.info("evicting model '%s' (%s, idle since %.1f s) to make room under the model memory budget", name,
                 format_size(self.footprints.get(name, 0)), self.clock.now() - self.last_use.get(name, 0.0))
        try:
            await self.manager.evict(name, EVICTED)
        finally:
            self._notify()
        self._counters(name).evictions += 1

    # -- what the decision reads ------------------------------------------------------

    def residents(self) -> list[Resident]:
        """The loaded models (ensembles hold nothing of their own: left out; those being evicted: their
        room is another load's) and the loads in progress, with the room each holds, as the decision
        sees them."""
        now = self.clock.now()
        entries = self.manager.known
        busy = set(self._waiting) | set(self._protected)
        for entry in entries.values():  # an ensemble in use needs every model under it
            if entry.ensemble is not None and any(m.scheduler.inflight() for m in entry.versions.values()):
                busy.update(self._closure(entry.name))
        out = []
        for entry in entries.values():
            if entry.latest is None or entry.ensemble is not None or entry.name in self._evicting:
                continue
            params = entry.latest.spec.params
            last = self.last_use.get(entry.name, 0.0)
            out.append(Resident(
                entry.name, self.footprints.get(entry.name, 0), last,
                busy=entry.name in busy or any(m.scheduler.inflight() for m in entry.versions.values()),
                pinned=entry.name in self.pinned or params.pinned,
                keep_warm_until=last + params.keep_warm_seconds if params.keep_warm_seconds else 0.0,
                gpus=tuple(sorted(self.gpu_footprints.get(entry.name, {}).items()))))
        for name, held in self._held.items():
            for host, gpus in held:
                out.append(Resident(name, host, now, busy=True, loading=True, gpus=tuple(sorted(gpus.items()))))
        return out

    def used(self) -> int:
        """Bytes the loaded models hold, by their footprints (loads in progress not counted)."""
        return sum(r.footprint for r in self.residents() if not r.loading)

    def gpu_used(self) -> dict[int, int]:
        """GPU index -> bytes the loaded models hold there, by their footprints (every GPU with a budget
        or a footprint)."""
        out = dict.fromkeys(self.gpu_budgets, 0)
        for r in self.residents():
            if r.loading:
                continue
            for device, n in r.gpus:
                out[device] = out.get(device, 0) + n
        return out

    def _record_footprint(self, name: str, stamp: tuple) -> None:
        """The footprint of ``name`` as its load measured it (the sum over its versions), for files
        whose change stamp is ``stamp``."""
        entry = self.manager.known[name]
        self.footprints[name] = sum(n for m in entry.versions.values()
                                    for kind, _, n in m.stats.memory_usage if kind == "CPU")
        gpus: dict[int, int] = {}
        for model in entry.versions.values():
            for kind, device, n in model.stats.memory_usage:
                if kind == "GPU" and n > 0:
                    gpus[device] = gpus.get(device, 0) + n
        self.gpu_footprints[name] = gpus
        self._measured[name] = stamp

    def _files(self, name: str) -> int:
        entry = self.manager.known.get(name)
        return file_bytes(entry.path) if entry is not None else 0

    def _counters(self, name: str) -> DemandCounters:
        counters = self.counters.get(name)
        if counters is None:
            counters = self.counters[name] = DemandCounters()
        return counters

    # -- lifecycle and model control -----------------------------------------------------

    async def start(self, startup: list[str]) -> None:
        """Start-up: list every model as not loaded, then load the pinned ones (``inferd.pinned: true``
        and ``startup``, the ``--load-model`` names; ``*``: all), in parallel; they are never evicted."""
        manager = self.manager
        absent = sorted(set(self.gpu_budgets) - {g.index for g in manager.gpus.gpus()})
        if absent:  # not refused: a budget for a device no model can be placed on holds nothing back
            log.warning("--model-gpu-memory-budget names GPU %s, which this host does not have (GPUs: %s)",
                        ", ".join(map(str, absent)), ", ".join(str(g.index) for g in manager.gpus.gpus()) or "none")
        for entry in manager.known.values():
            if entry.latest is None and not entry.lock.locked():
                manager.set_unavailable(entry.name, NOT_LOADED, wanted=False)
        names = list(manager.known) if "*" in startup else list(dict.fromkeys(startup))
        unknown = [n for n in names if n not in manager.known]
        if unknown:  # as explicit mode: a name that is no model stops the start-up
            raise ConfigError(f"--load-model {', '.join(unknown)}: no such model in the model repositories "
                              f"(found: {', '.join(sorted(manager.known)) or 'none'})")
        for name, entry in sorted(manager.known.items()):
            if name not in names and pinned_in_config(name, entry.path):
                names.append(name)
        await asyncio.gather(*(self._start_pinned(name) for name in names))

    async def _start_pinned(self, name: str) -> None:
        try:
            await self.load_pinned(name)
        except InferdError as exc:
            log.error("model '%s' (pinned) failed to load at start-up: %s", name, exc.message)

    async def load_pinned(self, name: str, config: object = None, files: dict[str, object] | None = None,
                          caller: str = "") -> None:
        """RepositoryModelLoad (and a pinned model at start-up; ``caller``: the model whose
        ``pb_utils.load_model`` asks): make room, (re)load, pin; refused when it measures past a budget."""
        task = self._loads.get(name)
        if task is not None:  # its demand load first: this one (re)loads it after
            await asyncio.wait([task])
        manager = self.manager
        closure = list(self._closure(name))
        self._protected.update(closure)
        self.failures.pop(name, None)  # asked for: tried now, whatever its backoff
        self.refused.pop(name, None)  # ... and measured again
        if caller and caller in self._building:
            self._hurry(name)
        entry = manager.known.get(name)
        plain = entry is not None and manager.ensemble_graph(name) is None
        stamp = change_stamp(entry.path) if entry is not None else ()
        try:
            if plain:
                await self._admit(name, stamp)
            else:
                await self._load_parts(name, ())
            self._building.add(name)
            try:
                await manager.load_model(name, config, files)  # type: ignore[arg-type]
                if manager.ensemble_graph(name) is None:
                    self._record_footprint(name, change_stamp(manager.known[name].path))
            finally:
                self._building.discard(name)
                if plain:
                    self._release(name)
        finally:
            self._unprotect(closure)
            self._urgent.discard(name)
        self._counters(name).loads += 1
        self.pinned.add(name)
        self.last_use[name] = self.clock.now()
        if manager.ensemble_graph(name) is None:
            await self._refuse_if_past_budget(name, self._measured.get(name, ()))
            await self._back_within_budgets()

    async def unload(self, name: str, unload_dependents: bool = False) -> None:
        """RepositoryModelUnload: unpin and unload (it loads again on demand)."""
        task = self._loads.get(name)
        if task is not None:  # a load in progress ends first: it is unloaded after
            await asyncio.wait([task])
        self.pinned.discard(name)
        try:
            await self.manager.unload_model(name, unload_dependents)
        finally:
            self._notify()

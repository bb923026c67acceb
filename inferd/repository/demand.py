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

Per GPU, ``--model-gpu-memory-budget`` (GPU index -> bytes) is enforced by the
same decision: a model's footprint on each GPU is what torch's allocator gained
there during its last load (ModelStatistics' ``GPU`` memory_usage entries); a
model not yet loaded has no known GPU footprint, so its first load is planned
by its host side only and the idle models past a GPU's budget are unloaded
after it (:func:`~inferd.repository.residency.over_budget`), as a host
footprint larger than its estimate is.

A failed demand load is remembered: until its backoff passes (1 s after the
first failure, doubling with each failure in a row up to 60 s), or the
model's files change (:func:`~inferd.repository.layout.change_stamp`), or a
RepositoryModelLoad asks for it, a request for it is answered at once with the
failure (the same status, its reason, when it is tried again) instead of
loading it again: a client retrying a broken model in a loop costs a stat call
per request, not a load. Why those numbers: a failure that passes by itself (a
file being copied in, memory freed by another process) is retried within a
second or two; one that lasts costs one load a minute at most, and an operator
who fixes the files, or asks for a load, does not wait at all.

A Python model's BLS call (:class:`~inferd.model.ModelDispatcher`) into a model
that is not loaded waits for its load as a request does
(:meth:`OnDemand.call_from`), except one made by a model while that model
itself loads (its ``initialize`` or warm-up): loads run one at a time, so the
callee's load could start only once the caller's ended, which waits for the
call; such a call fails at once, naming both models.

Counters (per model name, kept across evictions): loads, evictions, requests
that found the model loaded (hits) or had to wait (misses), and the time those
waited (cold start); the exporter (:mod:`inferd.dataplane.metrics`) reads them.
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
from inferd.repository.layout import change_stamp
from inferd.repository.residency import Resident, format_size, over_budget, plan_load
from inferd.types import InferenceRequest

if TYPE_CHECKING:
    from inferd.repository.manager import ModelEntry, ModelManager

log = logging.getLogger(__name__)

NOT_LOADED = "not loaded: loads on its first request (model control mode on_demand)"
EVICTED = "evicted to make room under the model memory budget: loads again on its next request"
BACKOFF_FIRST = 1.0  # seconds a model whose demand load failed is not tried again after its first failure
BACKOFF_MAX = 60.0  # ... doubling with each failure in a row up to this


def backoff(failures: int) -> float:
    """Seconds before a model that failed to load ``failures`` times in a row is tried again."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** max(0, failures - 1))


@dataclass(slots=True)
class Failure:
    """A model's last failed demand load, remembered until it may be tried again."""

    kind: type[InferdError]  # the type of what the load raised: the status every request then gets
    reason: str  # the load's own words (the error itself is not kept: its traceback holds the failed build)
    failures: int  # in a row
    at: float  # clock seconds of the failure
    retry_at: float
    stamp: tuple  # the model folder's change stamp when that load started


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
    a demand load before the waiting requests."""

    def __init__(self, manager: "ModelManager", budget: int | None = None, clock: Clock | None = None,
                 warmup: bool = True, gpu_budgets: dict[int, int] | None = None) -> None:
        self.manager = manager
        self.budget = budget
        self.gpu_budgets = dict(gpu_budgets or {})
        self.clock = clock or MonotonicClock()
        self.warmup = warmup
        self.counters: dict[str, DemandCounters] = {}
        self.footprints: dict[str, int] = {}  # name -> host bytes, as its last load measured (at least its files)
        self.gpu_footprints: dict[str, dict[int, int]] = {}  # name -> GPU index -> bytes, as its last load measured
        self.failures: dict[str, Failure] = {}  # models whose last demand load failed
        self.last_use: dict[str, float] = {}
        self.pinned: set[str] = set()  # by RepositoryModelLoad / --load-model
        self._loads: dict[str, asyncio.Task] = {}
        self._waiting: dict[str, int] = {}  # requests waiting for a model's load (busy: never evicted)
        self._protected: set[str] = set()  # the models an ensemble being loaded needs
        self._lock = asyncio.Lock()  # one load or eviction at a time: footprints are measured alone
        self._loading: str | None = None  # the model whose build holds the lock now

    # -- the request path --------------------------------------------------------

    def cold(self, name: str) -> bool:
        """Whether a request for ``name`` must wait for a load; counts a hit and the use otherwise.
        An unknown name is not cold (the lookup that follows refuses it)."""
        entry = self.manager.known.get(name)
        if entry is None:
            return False
        if not self._resident(entry, self.clock.now()):
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
        backoff passes). Cancelling the caller leaves the load going for the others."""
        counters = self._counters(name)
        remembered = self._remembered(name)
        if remembered is not None:
            counters.backoffs += 1
            raise remembered
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

    async def call_from(self, name: str, request: InferenceRequest, caller: str) -> None:
        """A BLS call by model ``caller`` to model ``name`` (the dispatcher's cold hook): returns at once
        when ``name`` is loaded, else waits for its load as :meth:`wait` does; refused when ``caller`` is
        the model whose load runs now (its ``initialize`` or warm-up made the call): ``name``'s load would
        wait for that load to end, and that load waits for this call."""
        if not self.cold(name):
            return
        self.check_nested(name, caller, "made a BLS call to")
        await self.wait(name, request)

    def check_nested(self, name: str, caller: str, what: str) -> None:
        """Refuse (UNAVAILABLE) a load of ``name`` that model ``caller`` asks for (``what``: how) while its
        own load holds the driver's turn: the one would wait for the other for ever."""
        if caller and caller == self._loading:
            raise Unavailable(
                f"model '{caller}' {what} model '{name}' while '{caller}' itself was loading (from its "
                f"initialize or warm-up): on-demand loads run one at a time, so the load of '{name}' could start "
                f"only after '{caller}''s ends, which waits for this call; load '{name}' first (pin it: "
                f"--load-model {name} or inferd.pinned), or make the call from execute")

    def _remembered(self, name: str) -> InferdError | None:
        """The error a request for ``name`` gets at once while its last failed load is remembered, or None
        (never failed, its backoff has passed, or its files changed since: it may load now)."""
        failure = self.failures.get(name)
        if failure is None:
            return None
        now = self.clock.now()
        if now >= failure.retry_at:
            return None
        entry = self.manager.known.get(name)
        if entry is None or change_stamp(entry.path) != failure.stamp:
            del self.failures[name]  # changed files: a new model, as far as its backoff goes
            return None
        return failure.kind(
            f"model '{name}' failed to load on demand {now - failure.at:.1f} s ago: {failure.reason}; it is not "
            f"loaded again for {failure.retry_at - now:.1f} s (failure {failure.failures} in a row: the wait "
            f"doubles from {BACKOFF_FIRST:g} s up to {BACKOFF_MAX:g} s), or as soon as its files change or "
            "RepositoryModelLoad asks for it")

    def _remember(self, name: str, error: InferdError, stamp: tuple) -> float:
        """Record a failed demand load of ``name``; the seconds until it is tried again."""
        previous = self.failures.get(name)
        failures = previous.failures + 1 if previous is not None and previous.stamp == stamp else 1
        now = self.clock.now()
        delay = backoff(failures)
        self.failures[name] = Failure(type(error), error.message, failures, now, now + delay, stamp)
        return delay

    async def _load(self, name: str) -> None:
        async with self._lock:
            entry = self.manager.known.get(name)
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
        graph = self.manager.ensemble_graph(name)
        if graph is not None and depth < 16:
            for used in sorted(graph.composing_models()):
                yield from self._needed(used, depth + 1)
        entry = self.manager.known.get(name)
        if entry is not None and entry.latest is None:
            yield name

    def _closure(self, name: str, depth: int = 0) -> Iterator[str]:
        yield name
        graph = self.manager.ensemble_graph(name)
        if graph is not None and depth < 16:
            for used in graph.composing_models():
                yield from self._closure(used, depth + 1)

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
        if manager.ensemble_graph(name) is None:  # an ensemble holds no memory of its own
            await self._make_room(name)
        stamp = change_stamp(entry.path)  # before: files changed during the load make the next request retry
        start = time.perf_counter_ns()
        self._loading = name
        try:
            error = await manager.load_locked(name)
        finally:
            self._loading = None
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
        self._record_footprint(name)
        log.info("loaded model '%s' on demand in %.0f ms: footprint %s; %s", name,
                 (time.perf_counter_ns() - start) / 1e6, format_size(self.footprints[name]), self._usage_line())
        if self.budget is not None or self.gpu_budgets:  # it measured more than expected: back within the budgets
            for victim in over_budget(self.budget, self.residents(), self.clock.now(), self.gpu_budgets):
                await self._evict(victim)

    async def _make_room(self, name: str) -> None:
        if self.budget is None and not self.gpu_budgets:
            return
        estimate = max(self.footprints.get(name, 0), self._files(name))
        plan = plan_load(name, estimate, self.budget, [r for r in self.residents() if r.name != name],
                         self.clock.now(), self.gpu_footprints.get(name), self.gpu_budgets)
        if plan.refusal is not None:
            self._counters(name).refusals += 1
            raise ResourceExhausted(plan.refusal)
        for victim in plan.evict:
            await self._evict(victim)

    async def _evict(self, name: str) -> None:
        log.info("evicting model '%s' (%s, idle since %.1f s) to make room under the model memory budget", name,
                 format_size(self.footprints.get(name, 0)), self.clock.now() - self.last_use.get(name, 0.0))
        await self.manager.evict(name, EVICTED)
        self._counters(name).evictions += 1

    # -- what the decision reads ------------------------------------------------------

    def residents(self) -> list[Resident]:
        """The loaded models (ensembles hold nothing of their own: left out) as the decision sees them."""
        now = self.clock.now()
        entries = self.manager.known
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
                keep_warm_until=last + params.keep_warm_seconds if params.keep_warm_seconds else 0.0,
                gpus=tuple(sorted(self.gpu_footprints.get(entry.name, {}).items()))))
        return out

    def used(self) -> int:
        """Bytes the loaded models hold, by their footprints."""
        return sum(r.footprint for r in self.residents())

    def gpu_used(self) -> dict[int, int]:
        """GPU index -> bytes the loaded models hold there, by their footprints (every GPU with a budget
        or a footprint)."""
        out = dict.fromkeys(self.gpu_budgets, 0)
        for r in self.residents():
            for device, n in r.gpus:
                out[device] = out.get(device, 0) + n
        return out

    def _record_footprint(self, name: str) -> None:
        """The footprint of ``name`` as its last load measured it (the sum over its versions), never
        less than its files: a load that reused memory an evicted model left mapped measures less
        than it holds."""
        entry = self.manager.known[name]
        measured = sum(n for m in entry.versions.values() for kind, _, n in m.stats.memory_usage if kind == "CPU")
        self.footprints[name] = max(measured, self._files(name))
        gpus: dict[int, int] = {}
        for model in entry.versions.values():
            for kind, device, n in model.stats.memory_usage:
                if kind == "GPU" and n > 0:
                    gpus[device] = gpus.get(device, 0) + n
        self.gpu_footprints[name] = gpus

    def _files(self, name: str) -> int:
        entry = self.manager.known.get(name)
        return file_bytes(entry.path) if entry is not None else 0

    def _counters(self, name: str) -> DemandCounters:
        counters = self.counters.get(name)
        if counters is None:
            counters = self.counters[name] = DemandCounters()
        return counters

    def _usage_line(self) -> str:
        used = self.used()
        line = (f"{format_size(used)} of the {format_size(self.budget)} budget in use" if self.budget is not None
                else f"{format_size(used)} in use (no budget)")
        for device, n in sorted(self.gpu_used().items()):
            limit = self.gpu_budgets.get(device)
            line += f"; GPU {device}: {format_size(n)}" + (f" of {format_size(limit)}" if limit is not None else "")
        return line

    # -- lifecycle and model control -----------------------------------------------------

    async def start(self, startup: list[str]) -> None:
        """Start-up: list every model as not loaded, then load the pinned ones (``inferd.pinned: true``
        and ``startup``, the ``--load-model`` names; ``*``: all), which are never evicted."""
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
            self.failures.pop(name, None)  # asked for: tried now, whatever its backoff
            try:
                if self.manager.ensemble_graph(name) is not None:
                    for used in self._needed(name):
                        if used != name:
                            await self._load_one(used)
                elif self.manager.known.get(name) is not None:
                    await self._make_room(name)
                self._loading = name
                await self.manager.load_model(name, config, files)  # type: ignore[arg-type]
            finally:
                self._loading = None
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

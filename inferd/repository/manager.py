"""Loading, serving and unloading the models of a repository.

:class:`ModelManager` keeps every model's state (READY, UNAVAILABLE with a
reason, LOADING, UNLOADING) so that one broken model never stops the others:
it is reported, with its reason, by RepositoryIndex and by requests for it.
Loading blocks (runtimes read files and compile graphs), so it runs on a
worker thread; the event loop only swaps finished models in.

Model control (Triton's ``--model-control-mode``): ``none`` loads everything
at start-up; ``explicit`` loads the ``--load-model`` ones and then what
RepositoryModelLoad asks; ``poll`` also rescans the repositories
(:mod:`inferd.repository.control`). A (re)load builds and warms up the new
versions before swapping them in, in one step on the event loop, so a request
always finds a ready version; the old ones then finish what they accepted
and close. Versions whose files and config did not change are kept, not
rebuilt. A failed reload leaves the old versions serving (READY, the reason
says what failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from inferd import backends
from inferd.backends.session_cache import SessionCache
from inferd.clock import Clock
from inferd.config import ModelConfig, ModelSpec, ensemble_config, is_ensemble, prepare_config
from inferd.ensemble.graph import EnsembleGraph, build_graph, dependents, find_cycle, load_order
from inferd.errors import ConfigError, InferdError, NotFound, Unavailable, unknown_model
from inferd.facade import IndexEntry
from inferd.gpu.inventory import GpuInventory, default_inventory
from inferd.hosts.registry import Hosts
from inferd.model import ModelDispatcher
from inferd.model.cache import ResponseCache
from inferd.repository import ensembles as ensemble_loader
from inferd.repository.control import ModelLoading
from inferd.repository.demand import OnDemand
from inferd.observability.heap import trim_now
from inferd.repository.footprint import Footprint, Measure, MeasureGate
from inferd.repository.overrides import OverrideFolders
from inferd.repository.layout import available_versions, fingerprint, scan
from inferd.repository.build import Model, build_model
from inferd.scheduling.rate_limiter import RateLimiter

log = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"
NOT_LOADED = ""  # explicit mode: in the repository, never asked for
MODES = ("none", "poll", "explicit", "on_demand")


@dataclass
class ModelEntry:
    """The manager's record of one model of the repositories: its folder, state and loaded versions.
    Read by the on-demand driver (:mod:`inferd.repository.demand`); changed only through the manager."""

    name: str
    path: Path
    state: str = LOADING
    reason: str = ""
    versions: dict[int, Model] = field(default_factory=dict)
    latest: Model | None = None
    wanted: bool = True  # loaded or asked for (not unloaded): counts for server readiness
    sources: dict[int, tuple] = field(default_factory=dict)  # version -> what it was built from
    fingerprint: tuple = ()  # the model folder as last (re)loaded: poll mode's change test
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one load/unload at a time
    ensemble: Any = None  # an ensemble's PreparedEnsemble, once loaded
    origin: Path | None = None  # its folder in the repository (None: known only from an override)
    override: Path | None = None  # the override folder ``path`` points to, while loaded from one
    plain_config: tuple | None = None  # config.pbtxt's (inode, size, mtime) when last read as no ensemble
    hosted: bool = False  # its instances run in model hosts (its memory is theirs, not this process's)

    def __post_init__(self) -> None:
        if self.origin is None and self.override is None:
            self.origin = self.path

    def set_versions(self, versions: dict[int, Model]) -> None:
        self.versions = versions
        self.latest = versions[max(versions)] if versions else None


@dataclass(frozen=True)
class Prepared:
    """A model folder read and validated, before any instance is created."""

    spec: ModelSpec
    backend: backends.Backend
    files: dict[int, Path]  # version -> model file


def prepare(name: str, model_dir: Path, override: ModelConfig | None = None, auto_complete: bool = True,
            gpus: Sequence[int] = ()) -> Prepared:
    """Read, auto-complete and validate one model folder (:func:`inferd.config.prepare_config`). Blocking.

    ``override``: a config to use instead of ``config.pbtxt`` (RepositoryModelLoad's ``config``);
    ``gpus``: the GPU indexes instances may be placed on."""
    done = prepare_config(name, model_dir, available_versions(model_dir), backends.resolve, override, auto_complete,
                          gpus)
    return Prepared(done.spec, done.backend, done.files)


def load_versions(prepared: Prepared, model_dir: Path, clock: Clock | None = None) -> dict[int, Model]:
    """Create instances and schedulers for every selected version. Blocking."""
    loaded: dict[int, Model] = {}
    for version, path in prepared.files.items():
        loaded[version] = build_model(prepared.spec, prepared.backend, model_dir, version, path, clock)
    return loaded


class ModelManager:
    def __init__(self, repositories: list[Path], clock: Clock | None = None, *, mode: str = "none",
                 startup_models: list[str] | None = None, auto_complete: bool = True,
                 gpus: GpuInventory | None = None, cache: ResponseCache | None = None,
                 limiter: RateLimiter | None = None, memory_budget: int | None = None,
                 demand_warmup: bool = True, measure_footprints: bool = False,
                 gpu_memory_budget: dict[int, int] | None = None,
                 session_cache: SessionCache | None | bool = True, hosts: Hosts | None = None) -> None:
        if mode not in MODES:
            raise ValueError(f"model control mode must be one of {MODES}, got '{mode}'")
        self.repositories = repositories
        self.clock = clock
        self.mode = mode
        self.startup_models = list(startup_models or [])  # explicit mode: --load-model ("*": all)
        self.auto_complete = auto_complete  # False: --strict-model-config, every model brings its config
        self.cache = cache  # --cache-config: the response cache the models that enable it share
        self.limiter = limiter  # --rate-limit execution_count: the rate limiter every instance asks
        # --model-host: which models' instances run in host processes (None: all in this process)
        self.hosts = hosts
        self._entries: dict[str, ModelEntry] = {}
        # Every model the repositories (and override folders) hold, by name: read-only, for the on-demand driver.
        self.known: Mapping[str, ModelEntry] = MappingProxyType(self._entries)
        self.overrides = OverrideFolders()  # RepositoryModelLoad's file: parameters
        # Handed to every instance it builds: a Python model's BLS calls reach the other models through it.
        self.dispatcher = ModelDispatcher(self.get, clock, control=ModelLoading(self))
        # The GPUs instance groups are placed on (torch's view; a fake one in tests).
        self.gpus = gpus or default_inventory()
        # on_demand (inferd/repository/demand.py): loads on first request, evicts under the memory budgets;
        # a BLS call into a model that is not loaded loads it too.
        self.demand = (OnDemand(self, memory_budget, clock, demand_warmup, gpu_memory_budget)
                       if mode == "on_demand" else None)
        if self.demand is not None:
            self.dispatcher.cold = self.demand.call_from
        # Each version's footprint (ModelStatistics' memory_usage) is measured in every mode: a hosted one's
        # by its hosts, an in-process one around its build, one such build at a time (footprint.py).
        # (``measure_footprints`` is accepted for the callers that asked for it before: always on now.)
        self.gate = MeasureGate()
        # (name, version) -> (the files and config it was built from, the footprint its build measured):
        # a rebuild of the same (an on_demand reload) reuses the figure and builds beside other loads.
        self._measured: dict[tuple[str, int], tuple[tuple, tuple[tuple[str, int, int], ...]]] = {}
        self._skip_warmup = self.demand is not None and not demand_warmup
        # What a load of a file leaves for the next load of the same file (the ONNX backend's optimised
        # models): on_demand loads the same files again and again, so it gets a temporary folder of its
        # own unless handed one (``--model-cache-dir``); False, or another mode without one: none.
        if session_cache is True:
            session_cache = SessionCache() if mode == "on_demand" else None
        self.session_cache: SessionCache | None = session_cache or None

    # -- lookup (hot path) ---------------------------------------------------

    def get(self, name: str, version: int = 0) -> Model:
        entry = self._entries.get(name)
        if entry is None:
            raise unknown_model(name, known_models=self._entries)
        if version:
            model = entry.versions.get(version)
            if model is None:
                if entry.state == READY:
                    raise unknown_model(name, version, loaded_versions=entry.versions)
                raise Unavailable(f"model '{name}' version {version} is not ready: {entry.reason or entry.state}")
            return model
        model = entry.latest
        if model is None:
            raise Unavailable(f"model '{name}' is not ready: {entry.reason or entry.state.lower() or 'not loaded'}")
        return model

    def is_ready(self, name: str, version: int = 0) -> bool:
        try:
            model = self.get(name, version)
        except InferdError:
            return False
        return model.scheduler.problem() is None and self.ensemble_problem(name) is None

    def all_ready(self) -> bool:
        return all(e.state == READY and self._problem(e) is None for e in self._entries.values() if e.wanted)

    def _problem(self, entry: ModelEntry) -> str | None:
        """Why a loaded model cannot serve now: an ensemble's missing parts, or every instance of its
        latest version failed (stuck past the execution timeout), or None."""
        if entry.latest is not None:
            stuck = entry.latest.scheduler.problem()
            if stuck is not None:
                return stuck
        return self.ensemble_problem(entry.name)

    def ensemble_problem(self, name: str) -> str | None:
        """Why a loaded ensemble cannot serve now (a composing model, maybe nested, is
        missing, unloaded or failed), or None; None for any other model. Cheap: call it
        after loading or unloading a model to see which ensembles it affects."""
        entry = self._entries.get(name)
        if entry is None or entry.ensemble is None or entry.state != READY:
            return None
        prepared = entry.ensemble
        return (ensemble_loader.dependency_problem(prepared.graph, self._entries.get)
                or ensemble_loader.wiring_problem(prepared, self._entries.get))

    def models(self) -> list[Model]:
        return [m for e in self._entries.values() for m in e.versions.values()]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        out = []
        for entry in sorted(self._entries.values(), key=lambda e: e.name):
            if entry.versions:
                problem = self._problem(entry)
                state, reason = (UNAVAILABLE, problem) if problem else (entry.state, entry.reason)
                for version in sorted(entry.versions):
                    out.append(IndexEntry(entry.name, str(version), state, reason))
            elif not ready_only:
                out.append(IndexEntry(entry.name, "", entry.state, entry.reason))
        return [e for e in out if not ready_only or e.state == READY]

    # -- lifecycle -------------------------------------------------------------

    async def load_all(self) -> None:
        """Load every model in the repositories, concurrently; never raises for one model."""
        found = scan(self.repositories)
        for name, path in found.items():
            self._entries.setdefault(name, ModelEntry(name, path))
        if self.demand is not None:
            await self.demand.start(self.startup_models)
            return
        if self.mode == "explicit":
            found = self._startup_selection(found)
        # Ensembles after the models they compose (nested ones in dependency order).
        graphs = {name: g for name in found if (g := self.ensemble_graph(name)) is not None}
        plain = [name for name in found if name not in graphs]
        # Concurrently: models in hosts build in parallel; in-process builds are measured one at a time
        # (the gate), as their runtimes' builds, holding the GIL, would run anyway.
        await asyncio.gather(*(self.load_locked(name) for name in plain))
        for name in load_order(graphs):
            await self.load_locked(name)

    async def load_locked(self, name: str, within: str | None = None) -> InferdError | None:
        """A start-up (or on-demand) load, under the model's lock as RepositoryModelLoad's: one that
        arrives meanwhile waits, then finds the versions built and keeps them. ``within``: as :meth:`load`."""
        entry = self._entries[name]
        async with entry.lock:
            return await self.load(name, within=within)

    async def load(self, name: str, config: ModelConfig | None = None, within: str | None = None) -> InferdError | None:
        """(Re)load ``name``; never raises: returns the error when it failed.
        ``config``: use it instead of config.pbtxt (RepositoryModelLoad); ``within``: the model whose
        own load asked for this one (``pb_utils.load_model`` from its ``initialize``), which waits for it."""
        self.dispatcher.bind(asyncio.get_running_loop())  # before any instance can call it
        entry = self._entries[name]
        entry.state = LOADING if not entry.versions else entry.state
        if config is not None:  # RepositoryModelLoad's config replaces config.pbtxt, ensemble or not
            ensemble_config = config if is_ensemble(config) else None
        else:
            try:
                ensemble_config = self._read_ensemble_config(entry)
            except InferdError:
                ensemble_config = None  # prepare() reports the broken config
        if ensemble_config is not None:
            return await self._load_ensemble(entry, ensemble_config)
        try:
            models, sources = await self._build(entry, config, within)
        except InferdError as exc:
            log.error("failed to load model '%s': %s", name, exc.message)
            return self._failed(entry, exc)
        except Exception as exc:  # a backend bug must not take the server down
            log.exception("failed to load model '%s'", name)
            return self._failed(entry, InferdError(f"{type(exc).__name__}: {exc}"))
        old = entry.versions
        entry.ensemble = None
        entry.set_versions(models)
        entry.sources = sources
        entry.state, entry.reason = READY, ""
        log.info("loaded model '%s' versions %s", name, sorted(models))
        kept = set(map(id, models.values()))
        dropped = [m for m in old.values() if id(m) not in kept]
        if dropped:
            async with self.gate.holding(False, name, within) if not entry.hosted else _nothing():
                await asyncio.gather(*(m.scheduler.stop() for m in dropped))
        return None

    def _failed(self, entry: ModelEntry, exc: InferdError) -> InferdError:
        if entry.versions:  # a failed reload: the versions loaded before keep serving
            entry.state = READY
            entry.reason = f"reload failed, serving the previous version: {exc.message}"
        else:
            entry.state, entry.reason = UNAVAILABLE, exc.message
        return exc

    async def _build(self, entry: ModelEntry, config: ModelConfig | None,
                     within: str | None) -> tuple[dict[int, Model], dict[int, tuple]]:
        """Build the selected versions (on loader threads); a version whose files and config are those
        it was built from is kept as it is. Each version's footprint is measured (ModelStatistics'
        memory_usage): a hosted one's by its hosts, an in-process one around its build, alone."""
        loop = asyncio.get_running_loop()
        async with self.gate.holding(False, entry.name, within):  # reading may build a session: not beside a measure
            prepared, folder = await loop.run_in_executor(None, self._prepare_blocking, entry, config)
        entry.hosted = self.hosts is not None and self.hosts.hosted(prepared.spec, prepared.backend,
                                                                    sum(size for _, size, _ in folder))
        config_bytes = prepared.spec.config_bytes()
        shared = tuple(f for f in folder if not f[0].split("/", 1)[0].isdigit())
        old, old_sources = entry.versions, entry.sources
        models: dict[int, Model] = {}
        sources: dict[int, tuple] = {}
        try:
            for version, file in prepared.files.items():
                prefix = f"{version}/"
                sources[version] = source = (config_bytes, shared, tuple(f for f in folder if f[0].startswith(prefix)))
                if version in old and old_sources.get(version) == source:
                    models[version] = old[version]
                elif entry.hosted:
                    models[version] = await loop.run_in_executor(None, self._build_version, entry.name, prepared,
                                                                 version, file, None)
                elif (known := self._known_footprint(entry.name, version, source)) is not None:
                    # Built from these files before and measured then: the same figure again, so this build
                    # needs the process only shared (beside other such builds and reads, not beside a measure).
                    async with self.gate.holding(False, entry.name, within):
                        models[version] = await loop.run_in_executor(None, self._build_version, entry.name,
                                                                     prepared, version, file, None)
                        await loop.run_in_executor(None, trim_now)  # what the build parsed and freed goes back
                    models[version].stats.memory_usage = known
                    if within is not None and within == self.gate.owner:  # inside that model's measured build
                        cpu = sum(n for kind, _, n in known if kind == "CPU")
                        self.gate.nested[within] = self.gate.nested.get(within, 0) + cpu
                else:
                    nested = within is not None and within == self.gate.owner
                    async with self.gate.holding(True, entry.name, within):
                        models[version] = await loop.run_in_executor(None, self._build_version, entry.name,
                                                                     prepared, version, file, within if nested else "")
                    if prepared.backend.name != "python":  # its initialize may load models: measured every time
                        self._measured[(entry.name, version)] = (source, models[version].stats.memory_usage)
        except BaseException:
            for version, model in models.items():
                if model is not old.get(version):
                    for worker in getattr(model.scheduler, "workers", []):
                        worker.close()
            raise
        return models, sources

    def _known_footprint(self, name: str, version: int, source: tuple) -> tuple[tuple[str, int, int], ...] | None:
        """The footprint (memory_usage) an earlier in-process build of this version from the same files
        and config (``source``) measured (malloc's figure is the same for every build of the same model),
        or None: never measured, or changed since. Python models are never recorded: their ``initialize``
        may load other models, whose figures come out of their own measured build's."""
        known = self._measured.get((name, version))
        return known[1] if known is not None and known[0] == source else None

    def _prepare_blocking(self, entry: ModelEntry, config: ModelConfig | None) -> tuple[Prepared, tuple]:
        """Read and validate the model's folder (:func:`prepare`); blocking (a loader thread)."""
        entry.fingerprint = folder = fingerprint(entry.path)  # first: a change during the load is seen next poll
        prepared = prepare(entry.name, entry.path, config, self.auto_complete, [g.index for g in self.gpus.gpus()])
        if self._skip_warmup and prepared.spec.warmup:  # --model-warmup-on-demand false
            prepared = Prepared(dataclasses.replace(prepared.spec, warmup=()), prepared.backend, prepared.files)
        return prepared, folder

    def _build_version(self, name: str, prepared: Prepared, version: int, file: Path,
                       measure_within: str | None) -> Model:
        """Build one version; blocking (a loader thread). ``measure_within``: None for a hosted model (its
        hosts' memory is its footprint) or one whose footprint is known (:meth:`_known_footprint`), else
        this process's growth during the build is (the gate held, or ``measure_within`` names the model
        whose measured build this one is nested in)."""
        path = self._entries[name].path
        build = functools.partial(build_model, prepared.spec, prepared.backend, path, version, file, self.clock,
                                  self.dispatcher.for_model(name), cache=self.cache, limiter=self.limiter,
                                  session_cache=self.session_cache,
                                  hosts=self.hosts if self._entries[name].hosted else None)
        if measure_within is None:
            return build()
        with Measure() as measured:
            model = build()
        if model.stats.memory_usage:  # set by its build (hosted after all): not this process's growth
            return model
        footprint = measured.footprint
        inner = self.gate.nested.pop(name, 0)  # loads made within this build, measured there
        footprint = Footprint(max(0, footprint.cpu - inner), footprint.gpus)
        if measure_within:  # nested in that model's build: what it measured includes this
            self.gate.nested[measure_within] = self.gate.nested.get(measure_within, 0) + footprint.cpu
        model.stats.memory_usage = footprint.usage()
        return model

    # -- model control ---------------------------------------------------------------

    def _startup_selection(self, found: dict[str, Path]) -> dict[str, Path]:
        """Explicit mode: the ``--load-model`` models (and what ensembles among them
        use); the others are listed by RepositoryIndex, not loaded."""
        names = list(found) if "*" in self.startup_models else list(dict.fromkeys(self.startup_models))
        unknown = [n for n in names if n not in found]
        if unknown:
            raise ConfigError(f"--load-model {', '.join(unknown)}: no such model in the model repositories "
                              f"(found: {', '.join(sorted(found)) or 'none'})")
        selected = set(names)
        pending = list(names)
        while pending:
            graph = self.ensemble_graph(pending.pop())
            for used in graph.composing_models() if graph is not None else ():
                if used in found and used not in selected:
                    selected.add(used)
                    pending.append(used)
        for name, entry in self._entries.items():
            # Not one that a RepositoryModelLoad, arrived during start-up, is loading or has loaded.
            if name not in selected and not entry.versions and not entry.lock.locked():
                entry.state, entry.wanted = NOT_LOADED, False
        return {n: p for n, p in found.items() if n in selected}

    def dependents(self, name: str) -> list[str]:
        """Loaded models that use ``name``: ensembles, directly or through other
        ensembles, outermost last (unload_dependents unloads them first)."""
        graphs = [e.ensemble.graph for e in self._entries.values()
                  if getattr(e, "ensemble", None) is not None and e.versions]
        return dependents(name, graphs) if graphs else []

    async def load_model(self, name: str, config: ModelConfig | None = None,
                         files: dict[str, object] | None = None, within: str | None = None) -> None:
        """Load or reload ``name`` (RepositoryModelLoad, poll mode); raises when it fails.
        ``files`` (``file:<path>`` -> bytes): load from an override folder made of them and
        ``config`` instead of the repository's folder (:mod:`inferd.repository.overrides`);
        ``within``: as :meth:`load`."""
        loop = asyncio.get_running_loop()
        entry = self._entries.get(name)
        folder = None
        if files:
            folder = await loop.run_in_executor(None, self.overrides.write, name, config, files)
            if entry is None:
                entry = self._entries.setdefault(name, ModelEntry(name, folder, override=folder))
        elif entry is None or entry.origin is None:
            found = await loop.run_in_executor(None, scan, self.repositories)
            if name not in found:
                raise NotFound(f"failed to load '{name}': no such model in the model repositories")
            entry = self._entries.setdefault(name, ModelEntry(name, found[name]))
            entry.origin = found[name]
        async with entry.lock:
            entry.wanted = True
            before = (entry.path, entry.override)
            entry.path, entry.override = (folder, folder) if folder is not None else (entry.origin, None)
            error = await self.load(name, config, within)
            if error is None:
                dropped = before[1]
            else:  # what still serves, if anything, was loaded from where the entry pointed before
                entry.path, entry.override = before
                dropped = folder
            if dropped is not None and dropped != entry.override:
                self.overrides.release(dropped)
            if not entry.versions and entry.override is not None:  # nothing serves from it
                self.overrides.release(entry.override)
                entry.override = None
        if error is not None:
            raise type(error)(f"failed to load '{name}': {error.message}")
        if entry.state != READY or entry.reason:  # an ensemble reports through its entry
            raise Unavailable(f"failed to load '{name}': {entry.reason or entry.state}")

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload every version of ``name`` (RepositoryModelUnload): new requests are
        refused at once, accepted ones finish, then the instances close."""
        if name not in self._entries:
            raise NotFound(f"failed to unload '{name}': no such model")
        if unload_dependents:
            for dependent in reversed(self.dependents(name)):
                await self._unload(dependent)
        await self._unload(name)

    async def _unload(self, name: str, collect: bool = True) -> None:
        """``collect``: run a full collection after (on the loop: a few ms, the start-up's objects being
        frozen, observability/collector.py); an eviction (on_demand) leaves it out: the model goes by
        reference count and the collector's own runs, glibc's trim runs off the loop."""
        entry = self._entries[name]
        # An in-process model's memory goes back while no in-process build is measured (the gate, taken
        # before the model's lock: a build that loads this model from its initialize is not held up).
        async with self.gate.holding(False, name) if entry.versions and not entry.hosted else _nothing():
            async with entry.lock:
                entry.wanted = False
                old = entry.versions
                entry.state, entry.reason = UNLOADING, ""
                entry.set_versions({})
                entry.sources = {}
                if getattr(entry, "ensemble", None) is not None:
                    entry.ensemble = None
                await asyncio.gather(*(m.scheduler.stop() for m in old.values()))
                entry.state, entry.reason = UNAVAILABLE, "unloaded"
            if old:
                log.info("unloaded model '%s' versions %s", name, sorted(old))
                del old
                if collect:
                    _release_memory()
                else:
                    await asyncio.get_running_loop().run_in_executor(None, trim_now)

    async def evict(self, name: str, reason: str) -> None:
        """Unload ``name`` to make room (the on-demand driver), saying ``reason`` while nothing of it
        serves; no full collection after (it would cost the loop 25 ms: the model goes by reference
        count, glibc's trim runs off the loop)."""
        await self._unload(name, collect=False)
        entry = self._entries.get(name)
        if entry is not None and entry.latest is None:
            entry.reason = reason

    def set_unavailable(self, name: str, reason: str, wanted: bool | None = None) -> None:
        """Model ``name`` serves nothing, saying ``reason`` (the on-demand driver: not loaded yet, or its
        load failed); ``wanted``: whether it counts for server readiness (None: as it was)."""
        entry = self._entries[name]
        entry.state, entry.reason = UNAVAILABLE, reason
        if wanted is not None:
            entry.wanted = wanted

    async def forget(self, name: str) -> None:
        """Poll mode: the model's folder is gone; unload it and drop it from the index."""
        if name in self._entries:
            await self._unload(name)
            self._entries.pop(name, None)

    def entries(self) -> dict[str, tuple[Path, tuple, bool]]:
        """name -> (folder, fingerprint when last loaded, wanted): what poll mode compares."""
        return {n: (e.path, e.fingerprint, e.wanted) for n, e in self._entries.items()}

    async def _load_ensemble(self, entry: ModelEntry, config: Any) -> InferdError | None:
        """Check an ensemble against its (already loaded) composing models; nothing blocks.
        As for any model, a failed reload leaves the versions loaded before serving."""
        name = entry.name
        folder = fingerprint(entry.path)
        try:
            prepared = ensemble_loader.prepare(name, entry.path, config)
            # Triton's order: the ensemble's own faults (missing models, wiring against the composing
            # models' configs), then its version folders, then whether its composing models loaded.
            problem = find_cycle(name, self.ensemble_graph) or ensemble_loader.missing_models(
                prepared.graph, self._entries.get)
            if problem:
                raise Unavailable(problem)
            ensemble_loader.check_declared(prepared.graph, self._entries.get)
            prepared = ensemble_loader.select(prepared, entry.path, config)
            problem = ensemble_loader.dependency_problem(prepared.graph, self._entries.get)
            if problem:
                raise Unavailable(problem)
            ensemble_loader.check_models(prepared, self._entries.get)
            models = self._kept_ensemble_versions(entry, prepared)
            if models is None:
                models = ensemble_loader.build_versions(prepared, entry.path, self.get, self.clock,
                                                        lambda: self.ensemble_problem(name), self.cache)
        except InferdError as exc:
            log.error("failed to load ensemble '%s': %s", name, exc.message)
            return self._failed(entry, exc)
        except Exception as exc:
            log.exception("failed to load ensemble '%s'", name)
            return self._failed(entry, InferdError(f"{type(exc).__name__}: {exc}"))
        # Poll mode reloads it when its folder changes; a failed one (its composing models may come
        # up later) is tried again at every poll.
        entry.fingerprint = folder
        old = entry.versions
        entry.ensemble = prepared
        entry.set_versions(models)
        entry.state, entry.reason = READY, ""
        log.info("loaded ensemble '%s' versions %s", name, sorted(models))
        kept = set(map(id, models.values()))
        await asyncio.gather(*(m.scheduler.stop() for m in old.values() if id(m) not in kept))
        return None

    @staticmethod
    def _kept_ensemble_versions(entry: ModelEntry, prepared: Any) -> dict[int, Model] | None:
        """The loaded versions, when the reload changes neither the config nor the versions
        (as unchanged versions of other models are kept: their statistics go on)."""
        old = entry.ensemble
        if old is None or not entry.versions or sorted(entry.versions) != sorted(prepared.versions):
            return None
        same = old.spec.config_bytes() == prepared.spec.config_bytes()
        return dict(entry.versions) if same else None

    def ensemble_graph(self, name: str) -> EnsembleGraph | None:
        """An ensemble's wiring (None for other models, unknown names and broken configs)."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry.ensemble is not None:
            return entry.ensemble.graph
        try:
            config = self._read_ensemble_config(entry)
            return build_graph(ensemble_config(config)) if config is not None else None
        except InferdError:
            return None

    @staticmethod
    def _read_ensemble_config(entry: ModelEntry) -> ModelConfig | None:
        """The entry's config when it is an ensemble (``ensembles.read_config``), remembering that a
        model is none while its config.pbtxt is unchanged: on_demand asks on the event loop three or
        four times per load, and parsing the text costs 0.3-0.6 ms each time (measured here)."""
        path = entry.path / "config.pbtxt"
        try:
            st = path.stat()
            key: tuple | None = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            key = None
        if key is not None and entry.plain_config == key:
            return None
        config = ensemble_loader.read_config(entry.name, entry.path)
        entry.plain_config = key if config is None else None
        return config

    async def stop(self) -> None:
        """Finish what is in flight and release every model."""
        for entry in self._entries.values():
            entry.state = UNLOADING
        # Ensembles first: their in-flight requests still need their composing models.
        ensembles = [m for e in self._entries.values() if e.ensemble is not None for m in e.versions.values()]
        await asyncio.gather(*(m.scheduler.stop() for m in ensembles))
        await asyncio.gather(*(m.scheduler.stop() for m in self.models() if m not in ensembles))
        for entry in self._entries.values():
            entry.set_versions({})
            entry.state, entry.reason = UNAVAILABLE, "unloaded"
        self.overrides.close()
        if self.session_cache is not None:
            self.session_cache.close()  # a temporary folder goes; an operator's stays


def _release_memory() -> None:
    """Give the memory of unloaded models back to the system: collect what
    reference cycles hold, then ask glibc to return freed heap pages (a
    runtime's arenas otherwise stay mapped, and RSS only grows)."""
    gc.collect()
    trim_now()


@contextlib.asynccontextmanager
async def _nothing():  # type: ignore[no-untyped-def]
    """No gate to hold (a hosted model's memory is its hosts')."""
    yield

"""Loading, serving and unloading the models of a repository.

:class:`ModelManager` keeps every model's state (READY, UNAVAILABLE with a
reason, LOADING, UNLOADING) so that one broken model never stops the others:
it is reported, with its reason, by RepositoryIndex and by requests for it.
Loading blocks (runtimes read files and compile graphs), so it runs on a
worker thread; the event loop only swaps finished models in.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd import backends
from inferd._proto import model_config_pb2 as mc
from inferd.clock import Clock
from inferd.config import ModelSpec, autocomplete, parse_config_file, validate
from inferd.ensemble import loader as ensemble_loader
from inferd.ensemble.graph import EnsembleGraph, build_graph, find_cycle, load_order
from inferd.errors import ConfigError, InferdError, Unavailable, unknown_model
from inferd.repository.layout import available_versions, scan, select_versions
from inferd.repository.model import Model, build_model
from inferd.scheduling.policy import batching_policy

log = logging.getLogger(__name__)

READY, UNAVAILABLE, LOADING, UNLOADING = "READY", "UNAVAILABLE", "LOADING", "UNLOADING"


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


@dataclass
class _Entry:
    name: str
    path: Path
    state: str = LOADING
    reason: str = ""
    versions: dict[int, Model] = field(default_factory=dict)
    latest: Model | None = None
    ensemble: Any = None  # an ensemble's PreparedEnsemble, once loaded

    def set_versions(self, versions: dict[int, Model]) -> None:
        self.versions = versions
        self.latest = versions[max(versions)] if versions else None


@dataclass(frozen=True)
class Prepared:
    """A model folder read and validated, before any instance is created."""

    spec: ModelSpec
    backend: backends.Backend
    files: dict[int, Path]  # version -> model file


def prepare(name: str, model_dir: Path) -> Prepared:
    """Read, auto-complete and validate one model folder. Blocking."""
    config_path = model_dir / "config.pbtxt"
    if config_path.exists():
        config = parse_config_file(config_path, model=name)
    else:
        config = mc.ModelConfig()
    if not config.name:
        config.name = name
    elif config.name != name:
        raise ConfigError(f"model '{name}': config.pbtxt names the model '{config.name}'; it must match its folder")
    versions = select_versions(config, available_versions(model_dir))
    backend = backends.resolve(config, model_dir)
    if backend is None:
        raise ConfigError(f"model '{name}': an ensemble is checked against its composing models: "
                          "the ModelManager loads it (inferd.ensemble.loader), not prepare()")
    filename = config.default_model_filename or backend.default_filename
    files: dict[int, Path] = {}
    for version in versions:
        path = model_dir / str(version) / filename
        if not path.exists():
            raise ConfigError(f"model '{name}': version {version} has no model file '{filename}' ({path})")
        files[version] = path
    backend.complete_config(config, files[versions[-1]])
    signature = backend.signature(files[versions[-1]], name)
    if signature is not None:
        autocomplete(config, signature)
    if not config.instance_group:
        group = config.instance_group.add()
        group.kind = mc.ModelInstanceGroup.KIND_AUTO
        group.count = 1
    for group in config.instance_group:
        if group.count == 0:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            # As Triton does, the config a client reads shows the kind chosen.
            group.kind = mc.ModelInstanceGroup.KIND_GPU if backend.gpu_available() else mc.ModelInstanceGroup.KIND_CPU
    spec = validate(config, model_dir=model_dir, signature=signature)
    for version in versions[:-1]:
        other = backend.signature(files[version], name)
        if other is not None:
            validate(config, model_dir=model_dir, signature=other)
    batching_policy(config)  # refuse a bad dynamic_batching before any instance loads
    return Prepared(spec, backend, files)


def load_versions(prepared: Prepared, model_dir: Path, clock: Clock | None = None) -> dict[int, Model]:
    """Create instances and schedulers for every selected version. Blocking."""
    loaded: dict[int, Model] = {}
    for version, path in prepared.files.items():
        loaded[version] = build_model(prepared.spec, prepared.backend, model_dir, version, path, clock)
    return loaded


class ModelManager:
    def __init__(self, repositories: list[Path], clock: Clock | None = None) -> None:
        self.repositories = repositories
        self.clock = clock
        self._entries: dict[str, _Entry] = {}

    # -- lookup (hot path) ---------------------------------------------------

    def get(self, name: str, version: int = 0) -> Model:
        entry = self._entries.get(name)
        if entry is None:
            raise unknown_model(name)
        if version:
            model = entry.versions.get(version)
            if model is None:
                if entry.state == READY:
                    raise unknown_model(name, version)
                raise Unavailable(f"model '{name}' version {version} is not ready: {entry.reason or entry.state}")
            return model
        model = entry.latest
        if model is None:
            raise Unavailable(f"model '{name}' is not ready: {entry.reason or entry.state.lower()}")
        return model

    def is_ready(self, name: str, version: int = 0) -> bool:
        try:
            self.get(name, version)
        except InferdError:
            return False
        return self.ensemble_problem(name) is None

    def all_ready(self) -> bool:
        return all(e.state == READY and self.ensemble_problem(e.name) is None for e in self._entries.values())

    def ensemble_problem(self, name: str) -> str | None:
        """Why a loaded ensemble cannot serve now (a composing model, maybe nested, is
        missing, unloaded or failed), or None; None for any other model. Cheap: call it
        after loading or unloading a model to see which ensembles it affects."""
        entry = self._entries.get(name)
        if entry is None or entry.ensemble is None or entry.state != READY:
            return None
        return ensemble_loader.dependency_problem(entry.ensemble.graph, self._entries.get)

    def models(self) -> list[Model]:
        return [m for e in self._entries.values() for m in e.versions.values()]

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        out = []
        for entry in sorted(self._entries.values(), key=lambda e: e.name):
            if entry.versions:
                problem = self.ensemble_problem(entry.name)
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
            self._entries.setdefault(name, _Entry(name, path))
        # Ensembles after the models they compose (nested ones in dependency order).
        graphs = {name: g for name in found if (g := self._ensemble_graph(name)) is not None}
        await asyncio.gather(*(self.load(name) for name in found if name not in graphs))
        for name in load_order(graphs):
            await self.load(name)

    async def load(self, name: str) -> None:
        entry = self._entries[name]
        entry.state = LOADING if not entry.versions else entry.state
        try:
            ensemble_config = ensemble_loader.read_config(name, entry.path)
        except InferdError:
            ensemble_config = None  # prepare() reports the broken config
        if ensemble_config is not None:
            await self._load_ensemble(entry, ensemble_config)
            return
        loop = asyncio.get_running_loop()
        try:
            models = await loop.run_in_executor(None, self._load_blocking, name, entry.path)
        except InferdError as exc:
            entry.state, entry.reason = UNAVAILABLE, exc.message
            log.error("failed to load model '%s': %s", name, exc.message)
            return
        except Exception as exc:  # a backend bug must not take the server down
            entry.state, entry.reason = UNAVAILABLE, f"{type(exc).__name__}: {exc}"
            log.exception("failed to load model '%s'", name)
            return
        old = entry.versions
        entry.ensemble = None
        entry.set_versions(models)
        entry.state, entry.reason = READY, ""
        log.info("loaded model '%s' versions %s", name, sorted(models))
        for model in old.values():
            await model.scheduler.stop()

    def _load_blocking(self, name: str, path: Path) -> dict[int, Model]:
        prepared = prepare(name, path)
        return load_versions(prepared, path, self.clock)

    async def _load_ensemble(self, entry: _Entry, config: Any) -> None:
        """Check an ensemble against its (already loaded) composing models; nothing blocks."""
        name = entry.name
        try:
            prepared = ensemble_loader.prepare(name, entry.path, config)
            problem = find_cycle(name, self._ensemble_graph) or ensemble_loader.dependency_problem(
                prepared.graph, self._entries.get)
            if problem:
                raise Unavailable(problem)
            ensemble_loader.check_models(prepared, self._entries.get)
            models = ensemble_loader.build_versions(prepared, entry.path, self.get, self.clock)
        except InferdError as exc:
            entry.state, entry.reason = UNAVAILABLE, exc.message
            log.error("failed to load ensemble '%s': %s", name, exc.message)
            return
        except Exception as exc:
            entry.state, entry.reason = UNAVAILABLE, f"{type(exc).__name__}: {exc}"
            log.exception("failed to load ensemble '%s'", name)
            return
        old = entry.versions
        entry.ensemble = prepared
        entry.set_versions(models)
        entry.state, entry.reason = READY, ""
        log.info("loaded ensemble '%s' versions %s", name, sorted(models))
        for model in old.values():
            await model.scheduler.stop()

    def _ensemble_graph(self, name: str) -> EnsembleGraph | None:
        """An ensemble's wiring (None for other models, unknown names and broken configs)."""
        entry = self._entries.get(name)
        if entry is None:
            return None
        if entry.ensemble is not None:
            return entry.ensemble.graph
        try:
            config = ensemble_loader.read_config(name, entry.path)
            return build_graph(config) if config is not None else None
        except InferdError:
            return None

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

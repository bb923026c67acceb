"""Loading an ensemble: what the ModelManager calls (the repository's side of
:mod:`inferd.ensemble`, which never imports the repository).

An ensemble is loaded after its composing models (:func:`load_order`), on
the event loop (it has no instances, nothing blocks), its faults told in
Triton's order (qa/L0_model_config names them): :func:`prepare` checks its own
config and wiring; :func:`missing_models` names composing models the repository
lacks; :func:`check_declared` checks the wiring against the config.pbtxt of
each composing model that did not load; then :func:`select` picks its version
folders; :func:`dependency_problem` says whether its composing models are ready
(also nested, also later, when one is unloaded); :func:`check_models` checks
the wiring against their specs; :func:`build_versions` makes one
:class:`Model` per version folder.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from inferd.clock import Clock
from inferd.config import (
    ModelConfig, ModelSpec, declared_tensors, prepare_ensemble_config, read_ensemble_config, select_versions,
)
from inferd.ensemble.graph import Composing, EnsembleGraph, build_graph, check_against_models, check_step_tensors
from inferd.ensemble.scheduler import EnsembleScheduler
from inferd.errors import ConfigError
from inferd.model import Model, ModelLookup
from inferd.model.cache import ResponseCache
from inferd.observability.stats import ModelStats
from inferd.repository.layout import available_versions

READY = "READY"


@dataclass(frozen=True)
class PreparedEnsemble:
    spec: ModelSpec
    graph: EnsembleGraph
    versions: list[int]


def read_config(name: str, model_dir: Path) -> ModelConfig | None:
    """The model's config when it is an ensemble; None for any other model."""
    return read_ensemble_config(name, model_dir)


def prepare(name: str, model_dir: Path, config: ModelConfig) -> PreparedEnsemble:
    """Check the ensemble's own config and wiring; no other model is needed. Its versions are
    selected later (:func:`select`): a missing version folder is told after the wiring's faults."""
    spec, wiring = prepare_ensemble_config(config, model_dir)
    return PreparedEnsemble(spec, build_graph(wiring), [])


def select(prepared: PreparedEnsemble, model_dir: Path, config: ModelConfig) -> PreparedEnsemble:
    """The ensemble with the versions its version_policy selects among its version folders."""
    return replace(prepared, versions=select_versions(config, available_versions(model_dir)))


def missing_models(graph: EnsembleGraph, entry_of: Callable[[str], Any]) -> str | None:
    """Triton's words when a step names a model the repository does not have (None when all are there)."""
    missing = list(dict.fromkeys(s.model_name for s in graph.steps if entry_of(s.model_name) is None))
    if not missing:
        return None
    step = next(s for s in graph.steps if s.model_name == missing[0])
    return (f"ensemble {graph.name} contains models that are not available or ambiguous: {', '.join(missing)} "
            f"(ensemble '{graph.name}' {step.label}: model '{step.model_name}' is not in the model repository)")


def check_declared(graph: EnsembleGraph, entry_of: Callable[[str], Any]) -> None:
    """The wiring against the tensors each composing model's config.pbtxt declares, for those that are not
    loaded (a loaded one is checked against its spec: :func:`check_models`). As Triton checks an ensemble
    against its composing models' configs, an ensemble that maps a model's inputs wrongly is refused for
    that (ConfigError), not for the model's own failure to load."""
    for step in graph.steps:
        for name in step.candidates:
            entry = entry_of(name)
            if entry is None or (entry.state == READY and entry.versions):
                continue
            declared = declared_tensors(name, entry.path)
            if declared is not None:
                check_step_tensors(graph.name, step if name == step.model_name else replace(step, model_name=name),
                                   name, *declared)


def dependency_problem(graph: EnsembleGraph, entry_of: Callable[[str], Any], _seen: frozenset[str] = frozenset()) -> str | None:
    """Why the ensemble cannot serve now, or None when every composing model is ready.

    ``entry_of(name)`` is the manager's entry for a model (``state``,
    ``reason``, ``versions``, ``ensemble``: a PreparedEnsemble or None), or None
    when the repository has no such model. Nested ensembles are checked too.
    """
    seen = _seen | {graph.name}
    # Every step's model must exist before any is asked whether it loaded (Triton's order and words).
    missing = missing_models(graph, entry_of)
    if missing:
        return missing
    for step in graph.steps:
        for name in step.candidates:  # a routed step needs every model it may run
            problem = _composing_problem(graph, step, name, entry_of, seen)
            if problem:
                return problem
    return None


def _composing_problem(graph: EnsembleGraph, step: Any, name: str, entry_of: Callable[[str], Any],
                       seen: frozenset[str]) -> str | None:
    at = f"ensemble '{graph.name}' {step.label}"
    if name != step.model_name:
        at += f" (route to '{name}')"
    entry = entry_of(name)
    if entry is None:
        return f"{at}: model '{name}' is not in the model repository"
    if name in seen:
        return f"{at}: ensembles form a cycle through '{name}'"
    if entry.state != READY or not entry.versions:
        what = "failed to load" if entry.state == "UNAVAILABLE" and entry.reason != "unloaded" else "is not ready"
        return f"{at}: composing model '{name}' {what}: {entry.reason or entry.state.lower()}"
    if step.model_version and step.model_version not in entry.versions:
        return (f"{at}: version {step.model_version} of model '{name}' is not loaded "
                f"(loaded versions: {sorted(entry.versions)})")
    nested = getattr(entry, "ensemble", None)
    if nested is not None:
        problem = dependency_problem(nested.graph, entry_of, seen) or wiring_problem(nested, entry_of)
        if problem:
            return f"{at}: composing ensemble '{name}' is not ready: {problem}"
    return None


def wiring_problem(prepared: PreparedEnsemble, entry_of: Callable[[str], Any]) -> str | None:
    """Why the wiring no longer fits the composing models loaded now (one was
    reloaded with other tensors since the ensemble was checked), or None."""
    try:
        check_models(prepared, entry_of)
    except ConfigError as exc:
        return f"a composing model changed since the ensemble was loaded: {exc.message}"
    return None


def check_models(prepared: PreparedEnsemble, entry_of: Callable[[str], Any]) -> None:
    """The wiring against the composing models' specs (their latest loaded version's)."""

    def lookup(name: str) -> Composing | None:
        entry = entry_of(name)
        if entry is None or not entry.versions:
            return None
        latest = entry.versions[max(entry.versions)]
        return Composing(latest.spec, frozenset(entry.versions))

    check_against_models(prepared.spec, prepared.graph, lookup)
    if prepared.spec.response_cache:
        for step in prepared.graph.steps:
            used = lookup(step.model_name)
            if used is not None and (used.spec.decoupled or used.spec.sequence is not None):
                why = "'decoupled' transaction policy" if used.spec.decoupled else "sequence batching scheduler"
                raise ConfigError(f"ensemble '{prepared.spec.name}': Response Cache does not currently support "
                                  f"{step.label} (model '{step.model_name}' has {why}); an ensemble can cache "
                                  "only when every composing model could. Please disable the response cache.")


def build_versions(prepared: PreparedEnsemble, model_dir: Path, resolve: ModelLookup, clock: Clock | None = None,
                   problem: Callable[[], str | None] | None = None, cache: ResponseCache | None = None) -> dict:
    """One Model (an EnsembleScheduler and its own statistics) per selected version.
    ``problem``: why the ensemble cannot serve now (ModelManager.ensemble_problem);
    ``cache``: the server's response cache, for an ensemble whose config enables it."""
    models = {}
    for version in prepared.versions:
        stats = ModelStats(prepared.spec.name, version)
        scheduler = EnsembleScheduler(prepared.spec, prepared.graph, resolve, stats, clock, problem)
        models[version] = Model(spec=prepared.spec, version=version, scheduler=scheduler, stats=stats,
                                model_dir=model_dir, cache=cache if prepared.spec.response_cache else None)
    return models

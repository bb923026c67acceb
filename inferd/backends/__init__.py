"""Backends: the runtimes that execute models, found through one registry.

A backend is a :class:`Backend` subclass whose class attributes say what it can
do (:class:`inferd.config.BackendCapabilities`). The registry holds one instance
of each, by name: the built-in ones (registered here, in code) and those other
distributions declare in the ``inferd.backends`` entry point group (the name is
the backend's, the object its class), read once with :mod:`importlib.metadata`;
:func:`register` adds one from code. :func:`resolve` picks a model's backend
from its config (``platform`` or ``backend``) or, failing both, from the files
in its version folders (each backend's ``file_suffixes``).

Built-ins are registered in code, not in ``pyproject.toml``'s entry points, so a
source checkout (or a worktree on ``PYTHONPATH`` beside another install) finds
them without installed metadata, and a missing optional runtime (torch) only
drops its backend.
"""

from __future__ import annotations

import importlib
import logging
import threading
from importlib.metadata import entry_points
from pathlib import Path

from inferd.config import ModelConfig
from inferd.backends.base import (
    Backend, BatchResult, Device, ExecutionTimes, InferenceDispatcher, InstanceSpec, ModelInstance,
)
from inferd.errors import ConfigError

__all__ = [
    "ENTRY_POINTS", "Backend", "BatchResult", "Device", "ExecutionTimes", "InferenceDispatcher", "InstanceSpec",
    "ModelInstance", "available", "get", "register", "resolve", "unregister",
]

log = logging.getLogger(__name__)

ENTRY_POINTS = "inferd.backends"
# module:class of the built-in backends, in the order a model file is matched against them.
_BUILT_IN = (
    "inferd.backends.onnxruntime:OnnxRuntimeBackend",
    "inferd.backends.torchscript:TorchScriptBackend",  # needs inferd[torch]'s module imports to succeed
    "inferd.backends.python:PythonBackend",
)

_BACKENDS: dict[str, Backend] = {}
_REGISTRY_LOCK = threading.Lock()
_LOADED = False


def register(backend_class: type[Backend], *, replace: bool = False) -> Backend:
    """Add a backend: one instance of ``backend_class``, under its ``name``. Refuses a class that is
    not a Backend, one without a name, or a name already taken (unless ``replace``). Returns it."""
    _registry()  # the built-ins and entry points first, so a name they hold is seen as taken
    with _REGISTRY_LOCK:
        return _add(_BACKENDS, backend_class, f"backend class {backend_class!r}", replace)


def unregister(name: str) -> None:
    """Remove the backend called ``name`` (a test that registered one cleans up); no error if absent."""
    with _REGISTRY_LOCK:
        _BACKENDS.pop(name, None)


def _add(found: dict[str, Backend], backend_class: object, where: str, replace: bool = False) -> Backend:
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise TypeError(f"{where} is not a subclass of inferd.backends.Backend")
    name = backend_class.name
    if not name:
        raise TypeError(f"{where} has no name (set the class attribute 'name', the config's backend field)")
    if name in found and not replace:
        raise ValueError(f"{where}: a backend called '{name}' is registered already "
                         f"({type(found[name]).__module__}.{type(found[name]).__qualname__})")
    backend = backend_class()
    found[name] = backend
    return backend


def _registry() -> dict[str, Backend]:
    # Models load on several threads at once: the first fills the registry
    # under the lock, and nobody sees it half filled.
    global _LOADED
    if _LOADED:
        return _BACKENDS
    with _REGISTRY_LOCK:
        if _LOADED:
            return _BACKENDS
        found: dict[str, Backend] = {}
        for target in _BUILT_IN:
            module, _, attr = target.partition(":")
            try:
                backend_class = getattr(importlib.import_module(module), attr)
            except ImportError:  # an optional runtime is not installed: its backend is not offered
                continue
            _add(found, backend_class, target)
        for point in entry_points(group=ENTRY_POINTS):
            where = f"entry point '{point.name} = {point.value}' ({ENTRY_POINTS})"
            try:
                _add(found, point.load(), where)
            except Exception as exc:  # a broken plug-in must not take the built-in backends down with it
                log.error("%s: not registered: %s", where, exc)
        _BACKENDS.update(found)
        _LOADED = True
    return _BACKENDS


def get(name: str) -> Backend:
    return _registry()[name]


def available() -> dict[str, Backend]:
    """The registered backends by name (a copy)."""
    return dict(_registry())


def resolve(config: ModelConfig, model_dir: Path) -> Backend | None:
    """Settle ``config.platform``/``config.backend`` in place; None for ensembles.
    Part of the config pipeline (:func:`inferd.config.prepare_config`), which it is handed to."""
    backends = _registry()
    if config.platform == "ensemble":
        if config.backend:
            raise ConfigError(f"model '{config.name}': an ensemble cannot also name backend '{config.backend}'")
        return None
    by_platform = {b.platform: b for b in backends.values() if b.platform}
    backend: Backend | None = None
    if config.backend:
        backend = backends.get(config.backend)
        if backend is None:
            raise ConfigError(
                f"model '{config.name}': backend '{config.backend}' is not available; "
                f"inferd has {sorted(backends)}"
            )
    if config.platform:
        by_plat = by_platform.get(config.platform)
        if by_plat is None:
            raise ConfigError(
                f"model '{config.name}': platform '{config.platform}' is not supported; "
                f"inferd supports {sorted(by_platform) + ['ensemble']}"
            )
        if backend is not None and backend is not by_plat:
            raise ConfigError(
                f"model '{config.name}': platform '{config.platform}' contradicts backend '{config.backend}'"
            )
        backend = by_plat
    if backend is None:
        backend = _guess(config, model_dir, backends)
    config.backend = backend.name
    if backend.platform:
        config.platform = backend.platform
    return backend


def _guess(config: ModelConfig, model_dir: Path, backends: dict[str, Backend]) -> Backend:
    wanted = config.default_model_filename
    for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir() and p.name.isdigit()):
        for child in sorted(version_dir.iterdir()):
            if wanted and child.name != wanted:
                continue
            for backend in backends.values():
                if child.suffix in backend.file_suffixes:
                    return backend
    files = [b.default_filename for b in backends.values() if b.file_suffixes and b.default_filename]
    listed = ", ".join(files[:-1]) + (" or " if len(files) > 1 else "") + (files[-1] if files else "model file")
    raise ConfigError(
        f"model '{config.name}': cannot tell which backend runs it: set platform or backend in config.pbtxt "
        f"(no {listed} in its version folders)"
    )

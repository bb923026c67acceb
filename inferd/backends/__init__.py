"""Backends: the runtimes that execute models.

:func:`resolve` picks a model's backend from its config (``platform`` or
``backend``) or, failing both, from the files in its version folders.
"""

from __future__ import annotations

import threading
from pathlib import Path

from inferd.config import ModelConfig
from inferd.backends.base import (
    Backend, BatchResult, Device, ExecutionTimes, InferenceDispatcher, InstanceSpec, ModelInstance,
)
from inferd.errors import ConfigError

__all__ = [
    "Backend", "BatchResult", "Device", "ExecutionTimes", "InferenceDispatcher", "InstanceSpec", "ModelInstance", "get",
    "resolve",
]

_BACKENDS: dict[str, Backend] = {}


_REGISTRY_LOCK = threading.Lock()


def _registry() -> dict[str, Backend]:
    # Models load on several threads at once: the first fills the registry
    # under the lock, and nobody sees it half filled.
    if _BACKENDS:
        return _BACKENDS
    with _REGISTRY_LOCK:
        if _BACKENDS:
            return _BACKENDS
        from inferd.backends.onnxruntime import OnnxRuntimeBackend

        found: dict[str, Backend] = {}
        for backend in (OnnxRuntimeBackend(),):
            found[backend.name] = backend
        try:
            from inferd.backends.torchscript import TorchScriptBackend

            found["pytorch"] = TorchScriptBackend()
        except ImportError:
            pass
        try:
            from inferd.backends.python import PythonBackend

            found["python"] = PythonBackend()
        except ImportError:
            pass
        _BACKENDS.update(found)
    return _BACKENDS


def get(name: str) -> Backend:
    return _registry()[name]


_BY_EXTENSION = {".onnx": "onnxruntime", ".pt": "pytorch", ".py": "python"}


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
            name = _BY_EXTENSION.get(child.suffix)
            if name in backends:
                return backends[name]
    raise ConfigError(
        f"model '{config.name}': cannot tell which backend runs it: set platform or backend in config.pbtxt "
        f"(no model.onnx, model.pt or model.py in its version folders)"
    )

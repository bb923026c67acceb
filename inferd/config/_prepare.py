"""The config pipeline of one model folder: read, settle the backend, complete, validate.

Blocking (it reads files and asks the backend about the model file). The
backend takes part through the :class:`ConfigCompleter` it is (its hooks see
the ``ModelConfig`` being completed: ``resolve`` settles platform/backend,
``complete_config`` is a Python model's ``auto_complete_config``); what comes
out is plain data: the :class:`ModelSpec`, the backend, and the model file of
each selected version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from inferd._proto import model_config_pb2 as mc
from inferd.config._autocomplete import ModelSignature, autocomplete
from inferd.config._capabilities import BackendCapabilities
from inferd.config._parse import parse_config_file
from inferd.config._paths import check_inside
from inferd.config._placement import settle_groups
from inferd.config._spec import ModelSpec, _instance_groups
from inferd.config._validate import check_declared, validate
from inferd.errors import ConfigError


class ConfigCompleter(Protocol):
    """What the pipeline asks of a model's backend (``inferd.backends.Backend`` is one): its
    :class:`BackendCapabilities` (class attributes) and its config hooks."""

    default_filename: str

    def gpu_available(self) -> bool: ...

    def complete_config(self, config: mc.ModelConfig, model_file: Path) -> None: ...

    def signature(self, model_file: Path, model_name: str) -> ModelSignature | None: ...


# Settles the config's platform/backend in place; the backend, or None for an ensemble.
BackendResolver = Callable[[mc.ModelConfig, Path], Any]


@dataclass(frozen=True)
class PreparedConfig:
    spec: ModelSpec
    backend: Any  # what the resolver returned for it
    files: dict[int, Path]  # version -> model file


def read_model_config(name: str, model_dir: Path, override: mc.ModelConfig | None = None,
                      auto_complete: bool = True) -> mc.ModelConfig:
    """The folder's config.pbtxt (or ``override``, RepositoryModelLoad's, or an empty one), named ``name``.
    Without ``auto_complete`` (``--strict-model-config``) a model must bring its config."""
    config_path = model_dir / "config.pbtxt"
    if override is not None:
        config = mc.ModelConfig()
        config.CopyFrom(override)
    elif config_path.exists():
        config = parse_config_file(config_path, model=name)
    elif not auto_complete:
        raise ConfigError(f"model '{name}': no config.pbtxt ({config_path}), and --strict-model-config=true "
                          "forbids completing one from the model file; write one, or serve with "
                          "--strict-model-config=false")
    else:
        config = mc.ModelConfig()
    check_name(config, name)
    return config


def check_name(config: mc.ModelConfig, name: str) -> None:
    """A config takes its folder's name, and may not name another."""
    if not config.name:
        config.name = name
    elif config.name != name:
        raise ConfigError(f"model '{name}': config.pbtxt names the model '{config.name}'; it must match its folder")


def select_versions(config: mc.ModelConfig, available: list[int]) -> list[int]:
    """The versions ``config.version_policy`` asks to load (default: the latest)."""
    name = config.name
    if not available:
        raise ConfigError(f"model '{name}': no version folder (a numbered folder such as {name}/1/)")
    policy = config.version_policy
    kind = policy.WhichOneof("policy_choice")
    if kind == "all":
        return list(available)
    if kind == "specific":
        wanted = sorted(set(policy.specific.versions))
        missing = [v for v in wanted if v not in available]
        if missing:
            raise ConfigError(
                f"model '{name}': version_policy.specific asks for versions {missing}, "
                f"which are not in the repository (available: {available})"
            )
        return wanted
    count = policy.latest.num_versions if kind == "latest" else 1
    return available[-count:]


def prepare_config(name: str, model_dir: Path, available: list[int], resolve: BackendResolver,
                   override: mc.ModelConfig | None = None, auto_complete: bool = True,
                   gpus: Sequence[int] = ()) -> PreparedConfig:
    """Read, auto-complete and validate one (non-ensemble) model folder whose version
    folders are ``available``; ``override``: a config to use instead of ``config.pbtxt``.
    ``auto_complete=False`` is Triton's strict mode: nothing is filled in from the model
    file (nor by a Python model's ``auto_complete_config``); the config is only checked.
    ``gpus``: the GPU indexes instances may be placed on (the server's inventory)."""
    config = read_model_config(name, model_dir, override, auto_complete)
    # What the config says on its own is checked first, as Triton does: a broken config
    # is reported for itself, not for a missing version folder or model file.
    check_declared(config, model_dir=model_dir)
    versions = select_versions(config, available)
    backend: BackendCapabilities | None = resolve(config, model_dir)
    if backend is None:
        raise ConfigError(f"model '{name}': an ensemble is checked against its composing models: "
                          "the ModelManager loads it (inferd.repository.ensembles), not prepare()")
    filename = check_inside(config.default_model_filename, f"model '{name}': default_model_filename") \
        or backend.default_filename
    files: dict[int, Path] = {}
    for version in versions:
        path = model_dir / str(version) / filename
        if not path.exists():
            raise ConfigError(f"model '{name}': version {version} has no model file '{filename}' ({path})")
        files[version] = path
    hooks: ConfigCompleter = backend  # type: ignore[assignment]  # a Backend is both
    if auto_complete:
        hooks.complete_config(config, files[versions[-1]])
    signature = hooks.signature(files[versions[-1]], name)
    if signature is not None and auto_complete:
        autocomplete(config, signature)
    _settle_instance_groups(config, gpus, backend)
    spec = validate(config, model_dir=model_dir, signature=signature, backend=backend)
    for version in versions[:-1]:
        other = hooks.signature(files[version], name)
        if other is not None:
            validate(config, model_dir=model_dir, signature=other, backend=backend)
    return PreparedConfig(spec, backend, files)


def _settle_instance_groups(config: mc.ModelConfig, gpus: Sequence[int], backend: BackendCapabilities) -> None:
    """The groups settled (config/_placement.py) and written back: the config a client reads shows
    the kind, count and GPUs chosen, as Triton's does."""
    settled = settle_groups(config.name, _instance_groups(config), gpus, backend=backend,
                            backend_gpu=bool(gpus) and backend.gpu_available())
    original = [mc.ModelInstanceGroup() for _ in config.instance_group]
    for copy, group in zip(original, config.instance_group):
        copy.CopyFrom(group)
    del config.instance_group[:]
    for i, group in enumerate(settled):
        g = config.instance_group.add()
        if i < len(original):  # what settling does not touch (rate_limiter, ...) stays as written
            g.CopyFrom(original[i])
            del g.gpus[:]
        g.name, g.kind, g.count = group.name, mc.ModelInstanceGroup.Kind.Value(group.kind), group.count
        g.gpus.extend(group.gpus)

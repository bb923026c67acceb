"""An ensemble's config (``platform: "ensemble"``): checked, and turned into plain data.

:func:`check_ensemble_config` says what an ensemble's own config may carry;
:func:`ensemble_config` copies its ``ensemble_scheduling`` into an
:class:`EnsembleConfig`, from which :mod:`inferd.ensemble.graph` builds and
checks the wiring; :func:`prepare_ensemble_config` runs both with the checks
every config gets. Nothing here looks at another model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from inferd._proto import model_config_pb2 as mc
from inferd.config._parse import parse_config_file
from inferd.config._prepare import check_name
from inferd.config._spec import ModelSpec, model_spec
from inferd.config._validate import validate
from inferd.errors import ConfigError

PLATFORM = "ensemble"

# Settings an ensemble may not carry: its composing models batch and execute.
_FORBIDDEN = {
    "instance_group": "an ensemble has no instances of its own; its composing models do",
    "dynamic_batching": "an ensemble does not batch; its composing models' dynamic_batching applies to ensemble traffic",
    "sequence_batching": "sequence batching is not supported by inferd",
    "model_warmup": "an ensemble cannot be warmed up; warm its composing models",
    "optimization": "an ensemble is not executed by a runtime; set optimization on its composing models",
    "default_model_filename": "an ensemble has no model file",
    "cc_model_filenames": "an ensemble has no model file",
    "backend": "an ensemble names no backend",
}


@dataclass(frozen=True, slots=True)
class StepConfig:
    """One ``ensemble_scheduling.step``, as written (checked by the graph)."""

    model_name: str
    model_namespace: str
    model_version: int  # -1 (or 0, unset): the latest version at request time
    input_map: dict[str, str]  # the composing model's input -> ensemble tensor
    output_map: dict[str, str]  # the composing model's output -> ensemble tensor


@dataclass(frozen=True, slots=True)
class EnsembleConfig:
    name: str
    inputs: tuple[str, ...]  # the ensemble's input tensors
    outputs: tuple[str, ...]  # the ensemble's output tensors
    steps: tuple[StepConfig, ...]
    max_inflight_requests: int  # 0: unlimited


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == PLATFORM


def check_ensemble_config(config: mc.ModelConfig) -> None:
    """What an ensemble's own config may say, before any wiring is looked at."""
    name = config.name
    for field, _ in config.ListFields():
        if field.name in _FORBIDDEN:
            raise ConfigError(f"ensemble '{name}': field '{field.name}' is not allowed: {_FORBIDDEN[field.name]}")
    if not config.HasField("ensemble_scheduling"):
        raise ConfigError(f"ensemble '{name}': platform \"ensemble\" needs an ensemble_scheduling block")
    if not config.input:
        raise ConfigError(f"ensemble '{name}': the config must list the ensemble's inputs (Triton requires them)")
    if not config.output:
        raise ConfigError(f"ensemble '{name}': the config must list the ensemble's outputs (Triton requires them)")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for t in tensors:
            if t.HasField("reshape"):
                raise ConfigError(
                    f"ensemble '{name}': {kind} '{t.name}': reshape is not allowed on an ensemble tensor; "
                    "set it on the composing model"
                )
    for t in config.output:
        if t.label_filename:
            raise ConfigError(
                f"ensemble '{name}': output '{t.name}': label_filename is not supported on an ensemble output"
            )


def ensemble_config(config: mc.ModelConfig) -> EnsembleConfig:
    """The ensemble's wiring as written, as plain data."""
    scheduling = config.ensemble_scheduling
    return EnsembleConfig(
        name=config.name,
        inputs=tuple(t.name for t in config.input),
        outputs=tuple(t.name for t in config.output),
        steps=tuple(StepConfig(s.model_name, s.model_namespace, int(s.model_version), dict(s.input_map),
                               dict(s.output_map)) for s in scheduling.step),
        max_inflight_requests=int(scheduling.max_inflight_requests),
    )


def read_ensemble_config(name: str, model_dir: Path) -> mc.ModelConfig | None:
    """The model's config when it is an ensemble; None for any other model."""
    path = model_dir / "config.pbtxt"
    if not path.exists():
        return None
    config = parse_config_file(path, model=name)
    if not is_ensemble(config):
        return None
    check_name(config, name)
    return config


def prepare_ensemble_config(config: mc.ModelConfig, model_dir: Path) -> tuple[ModelSpec, EnsembleConfig]:
    """Check an ensemble's own config: what only an ensemble may (not) carry, then the
    checks every config gets (tensors, parameters, version_policy, refused fields)."""
    check_ensemble_config(config)
    plain = mc.ModelConfig()
    plain.CopyFrom(config)
    plain.ClearField("ensemble_scheduling")
    validate(plain, model_dir=model_dir)
    return model_spec(config), ensemble_config(config)

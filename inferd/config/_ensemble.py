"""An ensemble's config (``platform: "ensemble"``): checked, and turned into plain data.

:func:`check_ensemble_config` says what an ensemble's own config may carry;
:func:`ensemble_config` copies its ``ensemble_scheduling`` into an
:class:`EnsembleConfig`, from which :mod:`inferd.ensemble.graph` builds and
checks the wiring; :func:`prepare_ensemble_config` runs both with the checks
every config gets. Nothing here looks at another model but
:func:`declared_tensors`, which reads a composing model's own config.pbtxt for the
repository's check of the wiring before that model loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    # inferd's step extensions, as written in the ensemble's parameters (STEP_PREFIX<index>.<key>);
    # parsed and checked by the graph. Empty: a plain Triton step.
    rules: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class EnsembleConfig:
    name: str
    inputs: tuple[str, ...]  # the ensemble's input tensors
    outputs: tuple[str, ...]  # the ensemble's output tensors
    steps: tuple[StepConfig, ...]
    max_inflight_requests: int  # 0: unlimited


# Conditional and routed steps: ``parameters { key: "inferd.step.<index>.<rule>" ... }`` on the
# ensemble. A plain Triton server ignores parameters it does not know, so the config stays a
# valid Triton ensemble (there every step always runs its model_name).
STEP_PREFIX = "inferd.step."
STEP_RULES = ("when", "when_row", "otherwise", "route_by", "route")


def step_rules(config: mc.ModelConfig) -> dict[int, dict[str, str]]:
    """The ensemble's ``inferd.step.<index>.<rule>`` parameters, by step index, checked for form."""
    name = config.name
    count = len(config.ensemble_scheduling.step)
    rules: dict[int, dict[str, str]] = {}
    for key, param in sorted(config.parameters.items()):
        if not key.startswith(STEP_PREFIX):
            continue
        index, _, rule = key[len(STEP_PREFIX):].partition(".")
        if not index.isdigit() or rule not in STEP_RULES:
            raise ConfigError(
                f"ensemble '{name}': parameter '{key}' is not a step rule; write "
                f"'{STEP_PREFIX}<step index>.<rule>' with rule one of {', '.join(STEP_RULES)} "
                f"(e.g. '{STEP_PREFIX}1.when')"
            )
        if int(index) >= count:
            raise ConfigError(
                f"ensemble '{name}': parameter '{key}' names step {int(index)}, but ensemble_scheduling has "
                f"{count} step(s) (indices 0..{count - 1})"
            )
        value = param.string_value.strip()
        if not value:
            raise ConfigError(f"ensemble '{name}': parameter '{key}' is empty")
        rules.setdefault(int(index), {})[rule] = value
    return rules


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
    rules = step_rules(config)
    return EnsembleConfig(
        name=config.name,
        inputs=tuple(t.name for t in config.input),
        outputs=tuple(t.name for t in config.output),
        steps=tuple(StepConfig(s.model_name, s.model_namespace, int(s.model_version), dict(s.input_map),
                               dict(s.output_map), rules.get(i, {})) for i, s in enumerate(scheduling.step)),
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


def declared_tensors(name: str, model_dir: Path) -> tuple[dict[str, bool], tuple[str, ...]] | None:
    """The inputs (name -> optional) and outputs model ``name``'s config.pbtxt declares, as written (not
    completed); None when it declares none of either (they come from the model file) or cannot be read
    (the model's own load says why)."""
    path = model_dir / "config.pbtxt"
    if not path.is_file():
        return None
    try:
        config = parse_config_file(path, model=name)
    except ConfigError:
        return None
    if not config.input or not config.output:
        return None
    return {t.name: t.optional for t in config.input}, tuple(t.name for t in config.output)


def prepare_ensemble_config(config: mc.ModelConfig, model_dir: Path) -> tuple[ModelSpec, EnsembleConfig]:
    """Check an ensemble's own config: what only an ensemble may (not) carry, then the
    checks every config gets (tensors, parameters, version_policy, refused fields)."""
    check_ensemble_config(config)
    wiring = ensemble_config(config)
    plain = mc.ModelConfig()
    plain.CopyFrom(config)
    plain.ClearField("ensemble_scheduling")
    validate(plain, model_dir=model_dir)
    return model_spec(config), wiring

"""Reading ``config.pbtxt`` (protobuf text format) into ``ModelConfig``."""

from __future__ import annotations

from pathlib import Path

from typing import Any

from google.protobuf import json_format, text_format

from inferd._proto import model_config_pb2 as mc
from inferd._proto.json import message_to_dict  # noqa: F401  (config's public name for it)
from inferd.config._suggest import parse_problem
from inferd.errors import ConfigError, InvalidArgument


def parse_config_text(text: str, *, model: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        problem = parse_problem(str(exc))
        if problem is None:
            raise ConfigError(f"model '{model}': config.pbtxt is not a valid ModelConfig: {exc}") from None
        raise ConfigError(f"model '{model}': config.pbtxt line {exc.GetLine()}: {problem}") from None
    return config


def parse_config_file(path: Path, *, model: str) -> mc.ModelConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"model '{model}': cannot read {path}: {exc.strerror}") from None
    return parse_config_text(text, model=model)


def config_from_json(name: str, text: str) -> mc.ModelConfig:
    """RepositoryModelLoad's ``config`` parameter: a ModelConfig in JSON, for model ``name``."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except json_format.ParseError as exc:
        problem = parse_problem(str(exc))
        if problem is None:
            raise InvalidArgument(f"failed to load '{name}': parameter 'config' is not a valid "
                                  f"ModelConfig in JSON: {exc}") from None
        raise InvalidArgument(f"failed to load '{name}': parameter 'config': {problem}") from None
    if config.name and config.name != name:
        raise InvalidArgument(f"failed to load '{name}': the config names the model '{config.name}'")
    config.name = name
    return config


def config_from_dict(doc: dict[str, Any]) -> mc.ModelConfig:
    """A config from its JSON form as a dict (what a Python model's ``auto_complete_config``
    returns); ValueError, with the parser's words, when it is not one."""
    config = mc.ModelConfig()
    try:
        json_format.ParseDict(doc, config)
    except (json_format.ParseError, TypeError, ValueError) as exc:
        raise ValueError(str(exc)) from None
    return config


def config_to_text(config: mc.ModelConfig) -> str:
    """``config`` as config.pbtxt text (what :func:`parse_config_text` reads back)."""
    return text_format.MessageToString(config)


def config_to_json(config: mc.ModelConfig) -> str:
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)

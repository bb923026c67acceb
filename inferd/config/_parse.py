"""Reading ``config.pbtxt`` (protobuf text format) into ``ModelConfig``."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import json_format, text_format

from inferd._proto import model_config_pb2 as mc
from inferd.errors import ConfigError


def parse_config_text(text: str, *, model: str) -> mc.ModelConfig:
    config = mc.ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"model '{model}': config.pbtxt is not a valid ModelConfig: {exc}") from None
    return config


def parse_config_file(path: Path, *, model: str) -> mc.ModelConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"model '{model}': cannot read {path}: {exc.strerror}") from None
    return parse_config_text(text, model=model)


def config_from_json(text: str, *, model: str) -> mc.ModelConfig:
    """A config given as JSON (RepositoryModelLoad's ``config`` parameter)."""
    config = mc.ModelConfig()
    try:
        json_format.Parse(text, config)
    except (json_format.ParseError, json.JSONDecodeError) as exc:
        raise ConfigError(f"model '{model}': config override is not a valid ModelConfig JSON: {exc}") from None
    return config


def config_to_json(config: mc.ModelConfig) -> str:
    return json_format.MessageToJson(config, preserving_proto_field_name=True, indent=None)

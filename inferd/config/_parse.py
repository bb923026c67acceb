"""Reading ``config.pbtxt`` (protobuf text format) into ``ModelConfig``."""

from __future__ import annotations

from pathlib import Path

from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from inferd._proto import model_config_pb2 as mc
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


def message_to_dict(message: Message) -> dict[str, Any]:
    """A message as Triton shows it in JSON (HTTP config/statistics answers, a
    Python model's ``args["model_config"]``): proto field names, every field
    present, enum names, and 64-bit integers as numbers rather than strings."""
    doc = json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    _int64_as_numbers(message.DESCRIPTOR, doc)
    return doc


_INT64 = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)


def _int64_as_numbers(descriptor: Any, doc: dict[str, Any]) -> None:
    for f in descriptor.fields:
        value = doc.get(f.name)
        if value is None:
            continue
        if f.message_type is not None:
            if f.message_type.GetOptions().map_entry:
                vf = f.message_type.fields_by_name["value"]
                if vf.message_type is not None:
                    for item in value.values():
                        _int64_as_numbers(vf.message_type, item)
                elif vf.cpp_type in _INT64:
                    for k in value:
                        value[k] = int(value[k])
            elif isinstance(value, list):
                for item in value:
                    _int64_as_numbers(f.message_type, item)
            elif isinstance(value, dict):
                _int64_as_numbers(f.message_type, value)
        elif f.cpp_type in _INT64:
            doc[f.name] = [int(v) for v in value] if isinstance(value, list) else int(value)

"""A protobuf message as Triton renders it in JSON (HTTP config and statistics answers, a Python
model's ``args["model_config"]``). Here, beside the generated code, so that a frontend renders a
``ModelConfig`` without importing the config layer."""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message


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


"""Did-you-mean hints for config parse errors: a misspelt field or enum value.

Protobuf's own parse errors name the message or enum type, whose descriptor (in
inferd's private pool) gives the candidates for :func:`inferd.suggest.did_you_mean`.
"""

from __future__ import annotations

import re

from inferd._proto._pool import POOL
from inferd.suggest import did_you_mean

_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_ENUM_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
_BAD_ENUM_JSON = re.compile(r"Invalid enum value (\w+) for enum type ([\w.]+)")


def _short(full_name: str) -> str:
    return full_name.removeprefix("inference.")  # ModelInput, ModelInstanceGroup.Kind


def _field_problem(type_name: str, field: str) -> str | None:
    try:
        fields = [f.name for f in POOL.FindMessageTypeByName(type_name).fields]
    except KeyError:
        return None
    hint = did_you_mean(field, fields)
    return f"{_short(type_name)} has no field '{field}'" + (hint or f"; its fields: {', '.join(fields)}")


def _enum_problem(type_name: str, value: str) -> str | None:
    try:
        values = [v.name for v in POOL.FindEnumTypeByName(type_name).values if not v.name.endswith("_INVALID")]
    except KeyError:
        return None
    return f"'{value}' is not a {_short(type_name)}{did_you_mean(value, values)} (valid: {', '.join(values)})"


def parse_problem(message: str) -> str | None:
    """A protobuf text/JSON parse error as a sentence with a suggestion, or None when it is
    not about an unknown field or enum value."""
    if m := _NO_FIELD.search(message):
        return _field_problem(m.group(1), m.group(2))
    if m := _NO_ENUM_VALUE.search(message):
        return _enum_problem(m.group(1), m.group(2))
    if m := _BAD_ENUM_JSON.search(message):
        return _enum_problem(m.group(2), m.group(1))
    return None

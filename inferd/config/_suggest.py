"""Did-you-mean hints for config mistakes: a misspelt field, enum value or parameter key.

``difflib.get_close_matches`` ranks the candidates; protobuf's own parse errors name the
message or enum type, whose descriptor (in inferd's private pool) gives the candidates.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable

from inferd._proto._pool import POOL

_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_ENUM_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
_BAD_ENUM_JSON = re.compile(r"Invalid enum value (\w+) for enum type ([\w.]+)")


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest candidate, or "" when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


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

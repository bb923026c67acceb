"""A batch job's input: JSONL, one KServe v2 inference request per line.

Each line is the JSON body of ``POST /v2/models/{model}/infer`` (``inputs``,
and optionally ``outputs``, ``parameters``, ``id``) with one more key,
``custom_id``: a non-empty string, unique in the file, that names the line's
result. Blank lines are skipped. The whole file is checked before a job is
accepted, so a job never stops half-way on a malformed line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable

from inferd.errors import InvalidArgument

CUSTOM_ID = "custom_id"


@dataclass(frozen=True, slots=True)
class Line:
    number: int  # 1-based, in the file
    custom_id: str
    body: dict[str, Any]  # the inference request, without custom_id


def parse_lines(data: bytes | str, what: str = "batch input") -> list[Line]:
    """Every request of a JSONL file; InvalidArgument naming the first bad line."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    lines: list[Line] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{what}, line {number}"
        try:
            doc = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(f"{where}: not valid JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(doc, dict):
            raise InvalidArgument(f"{where}: must be a JSON object (a KServe v2 inference request), "
                                  f"got {type(doc).__name__}")
        custom_id = doc.pop(CUSTOM_ID, None)
        if not isinstance(custom_id, str) or not custom_id:
            raise InvalidArgument(f"{where}: '{CUSTOM_ID}' must be a non-empty string naming the line's result, "
                                  f"got {custom_id!r}")
        if custom_id in seen:
            raise InvalidArgument(f"{where}: {CUSTOM_ID} '{custom_id}' is already used on line {seen[custom_id]}; "
                                  "each line needs its own")
        seen[custom_id] = number
        inputs = doc.get("inputs")
        if not isinstance(inputs, list) or not inputs:
            raise InvalidArgument(f"{where} ({CUSTOM_ID} '{custom_id}'): 'inputs' must be a non-empty list of "
                                  "tensors")
        lines.append(Line(number, custom_id, doc))
    if not lines:
        raise InvalidArgument(f"{what}: no requests (one JSON object per line, each with a '{CUSTOM_ID}')")
    return lines


def remaining(lines: Iterable[Line], done: set[str]) -> list[Line]:
    """The lines whose custom_id has no result yet, in file order."""
    return [line for line in lines if line.custom_id not in done]

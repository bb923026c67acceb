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

import numpy as np

from inferd.dtypes import BY_NAME
from inferd.errors import InvalidArgument
from inferd.types import InferenceRequest, RequestedOutput

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


def to_request(model: str, version: int, line: Line) -> InferenceRequest:
    """The line as a batch-job (background) request: JSON tensors, flat or nested
    ``data``; BYTES elements are strings. The model path checks them against the
    model's config as for any request."""
    where = f"{CUSTOM_ID} '{line.custom_id}' (line {line.number})"
    body = line.body
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(body["inputs"]):
        if not isinstance(tensor, dict) or not isinstance(tensor.get("name"), str):
            raise InvalidArgument(f"{where}: inputs[{i}] must be an object with a 'name'")
        inputs[tensor["name"]] = _array(tensor, f"{where}, input '{tensor['name']}'")
    outputs = body.get("outputs")
    requested = None
    if outputs is not None:
        if not isinstance(outputs, list) or not all(isinstance(o, dict) and isinstance(o.get("name"), str)
                                                    for o in outputs):
            raise InvalidArgument(f"{where}: 'outputs' must be a list of objects with a 'name'")
        requested = [RequestedOutput(o["name"]) for o in outputs]
    parameters = body.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidArgument(f"{where}: 'parameters' must be an object, got {parameters!r}")
    rid = body.get("id", line.custom_id)
    return InferenceRequest(model_name=model, inputs=inputs, model_version=version,
                            id=rid if isinstance(rid, str) else line.custom_id, requested_outputs=requested,
                            parameters=dict(parameters), background=True)


def _array(tensor: dict[str, Any], where: str) -> np.ndarray:
    dtype = BY_NAME.get(tensor.get("datatype"))  # type: ignore[arg-type]
    if dtype is None or dtype.numpy is None:
        raise InvalidArgument(f"{where}: unknown datatype {tensor.get('datatype')!r}; valid: {', '.join(BY_NAME)}")
    shape = tensor.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise InvalidArgument(f"{where}: 'shape' must be a list of integers >= 0, got {shape!r}")
    data = tensor.get("data")
    if data is None:
        raise InvalidArgument(f"{where}: 'data' is missing (batch input carries its tensors as JSON)")
    try:
        if dtype.name == "BYTES":
            flat = np.asarray(data, dtype=np.object_).reshape(-1)
            array = np.empty(flat.size, dtype=np.object_)
            array[:] = [x.encode("utf-8") if isinstance(x, str) else x for x in flat]
        else:
            array = np.asarray(data, dtype=dtype.numpy).reshape(-1)
        return array.reshape(shape)
    except (ValueError, TypeError) as exc:
        raise InvalidArgument(f"{where}: data does not fit shape {shape} of {dtype.name}: {exc}") from None

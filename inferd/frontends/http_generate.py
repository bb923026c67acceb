"""Triton's generate extension (HTTP only): the JSON mapping of a generate request to an
inference request, and of each response to a generate response.

Request (``POST /v2/models/{m}[/versions/{v}]/generate`` or ``/generate_stream``): a JSON object.
``id`` is the request id. Every other key, and every key of the ``parameters`` object, is an
input tensor when the model has an input of that name (a value or a flat list of values; the
shape comes from the model's metadata: fixed dimensions take their size, the innermost
variable one the rest of the values, other variable ones 1), and a request parameter
otherwise (a string, integer, boolean or number).

Response: a JSON object with ``id`` (when the request had one), ``model_name``,
``model_version``, the response's parameters, and every output tensor by name (one element
as the value itself, more as a flat list; BYTES as text), keys in sorted order as Triton
writes them. ``/generate_stream`` sends one such object per response as a server-sent event
(``data: {...}``), a failed one as ``data: {"error": ...}``.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from inferd.facade import ModelMetadata
from inferd.dtypes import BY_NAME, from_numpy
from inferd.errors import InferdError, InvalidArgument
from inferd.frontends.grpc_codec import parse_version
from inferd.frontends.http_codec import array_from_json, json_values
from inferd.types import InferenceRequest, InferenceResponse

PARAMETERS = "parameters"
ONE_RESPONSE = ("generate expects model to produce exactly 1 response, use generate stream for model that "
                "generates various number of responses")


def decode_generate_request(doc: Any, model: ModelMetadata, version: str) -> InferenceRequest:
    """The inference request a generate request's JSON ``doc`` stands for."""
    if not isinstance(doc, dict):
        raise InvalidArgument(f"generate request for model '{model.name}': the JSON body must be an object")
    inputs = {t.name: t for t in model.inputs}
    request = InferenceRequest(model_name=model.name, inputs={},
                               model_version=parse_version(model.name, version))
    for key, value in doc.items():
        if key == "id":
            if not isinstance(value, str):
                raise InvalidArgument(f"generate request for model '{model.name}': 'id' must be a string, "
                                      f"got {json.dumps(value)}")
            request.id = value
        elif key == PARAMETERS and key not in inputs:
            if not isinstance(value, dict):
                raise InvalidArgument(f"generate request for model '{model.name}': expected a JSON object for "
                                      f"keyword 'parameters', got {json.dumps(value)[:60]}")
            for name, item in value.items():
                _map(request, inputs, model.name, name, item)
        else:
            _map(request, inputs, model.name, key, value)
    return request


def _map(request: InferenceRequest, inputs: dict, model: str, key: str, value: Any) -> None:
    """One key: the input tensor of that name, else a request parameter."""
    if key in request.inputs or key in request.parameters:
        raise InvalidArgument(f"generate request for model '{model}': '{key}' is given twice (at the top level "
                              "and in 'parameters')")
    t = inputs.get(key)
    if t is None:
        if isinstance(value, (str, bool, int, float)):
            request.parameters[key] = value
            return
        raise InvalidArgument(
            f"generate request for model '{model}': '{key}' is not an input of the model (its inputs are "
            f"{sorted(inputs)}), so it is a parameter, and a parameter must be a string, integer, boolean or "
            f"number; got {json.dumps(value)[:60]}")
    where = f"input '{key}' for model '{model}'"
    if isinstance(value, list) and any(isinstance(v, (list, dict)) for v in value) or isinstance(value, dict):
        raise InvalidArgument(f"generate request: {where} must be a value or a flat list of values, got "
                              f"{json.dumps(value)[:60]}")
    values = value if isinstance(value, list) else [value]
    dtype = BY_NAME.get(t.datatype)
    if dtype is None:
        raise InvalidArgument(f"generate request: {where} has data type {t.datatype}, which JSON cannot carry")
    request.inputs[key] = array_from_json(values, dtype, _fill(t.shape, len(values), where), where)


def _fill(shape: list[int], count: int, where: str) -> tuple[int, ...]:
    """Triton's two passes: fixed dimensions take their size, the innermost variable one the
    remaining values, every other variable one 1."""
    dims = list(shape)
    remaining = count
    fits = True
    for d in reversed(dims):
        if d != -1:
            fits = fits and d > 0 and remaining % d == 0
            remaining = remaining // d if fits else remaining
    if fits:
        for i in reversed(range(len(dims))):
            if dims[i] == -1:
                dims[i], remaining = remaining, 1
    if not fits or remaining != 1:
        raise InvalidArgument(
            f"generate request: the schema can not convert {where} to a tensor with a proper shape: {count} "
            f"value(s) do not fill its shape {shape}; give a number of values its fixed dimensions divide")
    return tuple(dims)


def generate_response(response: InferenceResponse) -> dict[str, Any]:
    """One response as the generate extension's JSON object."""
    fields: dict[str, Any] = {"model_name": response.model_name, "model_version": str(response.model_version)}
    if response.id:
        fields["id"] = response.id
    for key, value in (response.parameters or {}).items():
        if not isinstance(value, (str, bool, int, float)):
            raise InvalidArgument(f"model '{response.model_name}': response parameter '{key}' is "
                                  f"{type(value).__name__}; the generate extension sends strings, integers, "
                                  "booleans and numbers")
        fields[key] = value
    for name, array in response.outputs.items():
        values = json_values(np.asarray(array), _wire(array), name, response.model_name)
        fields[name] = values[0] if len(values) == 1 else values
    return {key: fields[key] for key in sorted(fields)}


def _wire(array: np.ndarray) -> str:
    return from_numpy(np.asarray(array).dtype).name


def error_json(exc: InferdError | str) -> dict[str, str]:
    return {"error": exc if isinstance(exc, str) else exc.message}


def sse(doc: dict[str, Any]) -> bytes:
    """One server-sent event carrying ``doc``."""
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

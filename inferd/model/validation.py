"""Checking a decoded request against the model's spec, and shaping results.

Runs once per request, on the event loop: it must stay cheap. Messages follow
Triton's wording where clients are known to match on it.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from inferd.config import ModelSpec, TensorSpec
from inferd.errors import InvalidArgument
from inferd.types import InferenceRequest, RequestedOutput


def prepare_inputs(spec: ModelSpec, request: InferenceRequest) -> tuple[dict[str, np.ndarray], int]:
    """The request's inputs in the model's shapes, and its batch size."""
    model = spec.name
    specs = spec.inputs
    inputs = request.inputs
    for name in inputs:
        if name not in specs:
            raise InvalidArgument(
                f"unexpected inference input '{name}' for model '{model}'; its inputs are {list(specs)}"
            )
    if len(inputs) != len(specs):
        missing = [n for n, t in specs.items() if n not in inputs and not t.optional]
        if missing:
            raise InvalidArgument(
                f"expected {len(specs)} inputs but got {len(inputs)} inputs for model '{model}': "
                f"missing {missing}"
            )
    batching = spec.max_batch_size > 0
    rows = -1
    out: dict[str, np.ndarray] = {}
    for name, array in inputs.items():
        t = specs[name]
        if array.dtype != t.datatype.numpy and not (t.datatype.name == "BYTES" and array.dtype.kind == "O"):
            from inferd.dtypes import from_numpy

            got = from_numpy(array.dtype).name
            raise InvalidArgument(
                f"inference input '{name}' data-type is '{got}', but model '{model}' expects '{t.datatype.name}'"
            )
        shape = array.shape
        if batching:
            if len(shape) < 1 or shape[0] < 1:
                raise InvalidArgument(
                    f"inference input '{name}' for model '{model}' has shape {list(shape)}; "
                    f"the first dimension is the batch size and must be >= 1"
                )
            if rows == -1:
                rows = shape[0]
            elif shape[0] != rows:
                raise InvalidArgument(
                    f"inference input '{name}' for model '{model}' has batch size {shape[0]} but another "
                    f"input has {rows}; every input of a request must have the same batch size"
                )
            item_shape = shape[1:]
        else:
            item_shape = shape
        if not _matches(item_shape, t.dims):
            want = ([-1] if batching else []) + list(t.dims)
            raise InvalidArgument(
                f"unexpected shape for input '{name}' for model '{model}'. Expected {want}, got {list(shape)}"
            )
        if t.reshaped:
            lead = (shape[0],) if batching else ()
            array = array.reshape(lead + t.model_dims)
        out[name] = array
    return out, (rows if batching and rows > 0 else 1)


def _matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    for have, want in zip(shape, dims):
        if want != -1 and have != want:
            return False
    return True


def check_requested_outputs(spec: ModelSpec, requested: list[RequestedOutput] | None) -> None:
    if not requested:
        return
    for r in requested:
        if r.name not in spec.outputs:
            raise InvalidArgument(
                f"unexpected inference output '{r.name}' for model '{spec.name}'; its outputs are {list(spec.outputs)}"
            )
        if r.class_count < 0:
            raise InvalidArgument(f"output '{r.name}': class_count must be >= 0, got {r.class_count}")


def shape_outputs(
    spec: ModelSpec, outputs: dict[str, np.ndarray], requested: list[RequestedOutput] | None
) -> dict[str, np.ndarray]:
    """Select the requested outputs, undo reshape, apply classification."""
    batching = spec.max_batch_size > 0
    if requested:
        chosen = [(r.name, r.class_count) for r in requested]
    else:
        chosen = zip(spec.outputs, repeat(0))  # type: ignore[assignment]  # no list built per request
    result: dict[str, np.ndarray] = {}
    for name, class_count in chosen:
        array = outputs[name]
        t = spec.outputs[name]
        if t.reshaped:
            lead = (array.shape[0],) if batching else ()
            array = array.reshape(lead + _concrete(t.dims, array, lead))
        if class_count:
            array = classify(spec.name, t, array, class_count, batching)
        result[name] = array
    return result


def _concrete(dims: tuple[int, ...], array: np.ndarray, lead: tuple[int, ...]) -> tuple[int, ...]:
    if -1 not in dims:
        return dims
    known = int(np.prod([d for d in dims if d != -1])) or 1
    per_row = array.size // (lead[0] if lead else 1)
    return tuple(per_row // known if d == -1 else d for d in dims)


MAX_CLASSIFIED = 1_000_000  # elements of one batch entry the classification extension ranks (Triton's)


def classify(model: str, t: TensorSpec, array: np.ndarray, k: int, batching: bool) -> np.ndarray:
    """Triton's classification extension: top-k as BYTES "value:index[:label]"."""
    if t.datatype.name == "BYTES":
        raise InvalidArgument(f"model '{model}': output '{t.name}' is BYTES and cannot be classified")
    rows = array.reshape(array.shape[0], -1) if batching else array.reshape(1, -1)
    if rows.shape[1] > MAX_CLASSIFIED:  # Triton's bound (#8603): sorting it would cost the server, not the model
        raise InvalidArgument(f"classification output tensor too large: output '{t.name}' of model '{model}' has "
                              f"{rows.shape[1]} elements per batch entry; at most {MAX_CLASSIFIED} can be classified")
    k = min(k, rows.shape[1])
    out = np.empty((rows.shape[0], k), dtype=np.object_)
    labels = t.labels
    # As Triton's std::to_string: integers print as integers, floats with "%f".
    integral = rows.dtype.kind in "iub"
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        for j, idx in enumerate(order):
            text = f"{int(row[idx]) if integral else format(float(row[idx]), 'f')}:{int(idx)}"
            if idx < len(labels):
                text += f":{labels[idx]}"
            out[r, j] = text.encode()
    return out if batching else out[0]

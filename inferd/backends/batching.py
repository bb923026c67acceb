"""Joining a batch's requests into the model's tensors, and splitting its outputs back.

Pure functions over numpy, called where a batch executes
(:meth:`inferd.backends.base.TensorInstance.execute`). ``requests[i]`` holds
request i's tensors in model shapes, with the batch dimension first.

- Without variable-length batching the inputs are concatenated along the batch
  dimension and the outputs cut back by rows.
- Padded inputs (``inferd.padding``) are padded to the batch's longest extent of
  each dimension with their pad value; inferd fills the mask and lengths inputs
  from the reference input's own extents (a request that sent its own keeps it,
  a mask padded with 0); outputs are cut back to each request's extents
  (:class:`inferd.config.Unpad`).
- Triton's ragged batching: an ``allow_ragged_batch`` input becomes one 1-D
  concatenation of every request's elements; ``batch_input`` tensors take the
  values of Triton's backends (``BackendInputCollector``); ``batch_output``
  targets are scattered by each request's source input shape.

The rules are documented in :mod:`inferd.config._varlen`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from inferd.config import MASK, BatchInput, BatchOutput, FilledInput, Unpad, VarlenSpec
from inferd.backends.pool import BufferPool
from inferd.errors import ModelExecutionError

Shape = tuple[int, ...]


@dataclass(slots=True)
class Joined:
    """The model's input tensors for one batch, and what splitting its outputs needs."""

    inputs: dict[str, np.ndarray]
    rows: list[int]  # batch rows of each request
    shapes: list[dict[str, Shape]] = field(default_factory=list)  # each request's own input shapes
    real_elements: int = 0  # elements of request data in padded inputs
    pad_elements: int = 0  # elements of padding added to them


def request_rows(requests: Sequence[Mapping[str, Any]]) -> list[int]:
    """Each request's batch rows (the first dimension of its inputs)."""
    return [len(next(iter(r.values()))) if r else 0 for r in requests]


def join(requests: Sequence[dict[str, np.ndarray]], varlen: VarlenSpec | None = None,
         pool: BufferPool | None = None, max_rows: int = 0) -> Joined:
    """``pool``: take the joined tensors from it (each request copied once, into place);
    ``max_rows``: the model's largest batch, which a pooled buffer is made to hold."""
    rows = request_rows(requests)
    first = requests[0]
    if varlen is None:
        if len(requests) == 1:
            return Joined(first, rows)
        return Joined({name: concatenate(name, [r[name] for r in requests], pool, max_rows) for name in first}, rows)
    joined = Joined({}, rows, [{name: a.shape for name, a in r.items()} for r in requests])
    pads = {p.name: p.pad for p in varlen.padded}
    sent = {f.name: f for f in varlen.filled if f.name in first}
    for name in first:
        arrays = [r[name] for r in requests]
        if name in sent:
            joined.inputs[name] = (pad_to_longest(arrays, 0, pool, name)[0] if sent[name].kind == MASK
                                   else concatenate(name, arrays, pool, max_rows))
        elif name in varlen.ragged:
            joined.inputs[name] = concatenate(name, [a.reshape(-1) for a in arrays], pool)
        elif name in pads:
            array, real = pad_to_longest(arrays, pads[name], pool, name)
            joined.inputs[name] = array
            joined.real_elements += real
            joined.pad_elements += array.size - real
        else:
            joined.inputs[name] = concatenate(name, arrays, pool, max_rows)
    if len(sent) < len(varlen.filled):
        reference = varlen.reference
        assert reference is not None  # a mask or lengths input needs padding, which has a reference
        own = [s[reference][1:] for s in joined.shapes]
        longest = joined.inputs[reference].shape[1:]
        variable = varlen.padded[0].variable
        for f in varlen.filled:
            if f.name not in sent:
                joined.inputs[f.name] = (mask(f, rows, own, longest) if f.kind == MASK
                                         else lengths(f, rows, own, variable))
    for b in varlen.batch_inputs:
        value = batch_input(b, [s[b.source] for s in joined.shapes])
        for target in b.targets:
            joined.inputs[target] = value
    return joined


def concatenate(name: str, arrays: Sequence[np.ndarray], pool: BufferPool | None = None,
                max_rows: int = 0) -> np.ndarray:
    """The arrays joined along dimension 0: the one array itself, or a copy of each into
    one buffer (a pooled one, made to hold ``max_rows`` rows, when ``pool`` is given)."""
    if len(arrays) == 1:
        return arrays[0]
    first = arrays[0]
    if pool is None or first.dtype.kind == "O":
        return np.concatenate(arrays)
    tail = first.shape[1:]
    out = pool.take(name, first.dtype, (sum(len(a) for a in arrays),) + tail, max_rows * math.prod(tail))
    return np.concatenate(arrays, out=out)


def pad_to_longest(arrays: Sequence[np.ndarray], value: object, pool: BufferPool | None = None,
                   name: str = "") -> tuple[np.ndarray, int]:
    """The arrays joined along dimension 0, each padded with ``value`` to the longest
    extent of every other dimension; and how many elements are the arrays' own.
    ``pool``: the joined array is a buffer of its ``name`` key."""
    real = sum(a.size for a in arrays)
    longest = tuple(max(a.shape[d] for a in arrays) for d in range(1, arrays[0].ndim))
    if all(a.shape[1:] == longest for a in arrays):
        return concatenate(name, arrays, pool), real
    total = sum(len(a) for a in arrays)
    dtype = arrays[0].dtype
    if pool is None or dtype.kind == "O":
        out = np.full((total,) + longest, value, dtype=dtype)
    else:
        out = pool.take(name, dtype, (total,) + longest)
        out.fill(value)  # type: ignore[arg-type]
    start = 0
    for a in arrays:
        out[(slice(start, start + len(a)),) + tuple(slice(0, n) for n in a.shape[1:])] = a
        start += len(a)
    return out, real


def mask(f: FilledInput, rows: Sequence[int], own: Sequence[Shape], longest: Shape) -> np.ndarray:
    """1 over each row's own extent of the reference input's first ``len(f.dims)`` dims, 0 beyond."""
    k = len(f.dims)
    out = np.zeros((sum(rows),) + tuple(longest[:k]), dtype=f.dtype)
    start = 0
    for n, extents in zip(rows, own):
        out[(slice(start, start + n),) + tuple(slice(0, e) for e in extents[:k])] = 1
        start += n
    return out


def lengths(f: FilledInput, rows: Sequence[int], own: Sequence[Shape], variable: Sequence[int]) -> np.ndarray:
    """Each row's extent of every variable dimension of the reference input, in ``f``'s dims."""
    per_request = [np.broadcast_to(np.array([extents[d] for d in variable], dtype=f.dtype), (n, len(variable)))
                   for n, extents in zip(rows, own)]
    return np.concatenate(per_request).reshape((sum(rows),) + f.dims)


def batch_input(b: BatchInput, sources: Sequence[Shape]) -> np.ndarray:
    """Triton's batch input ``b`` for requests whose ``b.source`` inputs have these shapes
    (with the batch dimension; element counts include it, as Triton's do)."""
    counts = [math.prod(s) for s in sources]
    kind = b.kind
    if kind == "BATCH_ELEMENT_COUNT":
        return np.array(counts, dtype=b.dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).astype(b.dtype)
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return np.concatenate([[0], np.cumsum(counts)]).astype(b.dtype)
    if kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
        return np.zeros(max(counts), dtype=b.dtype)  # only its shape means anything (Triton leaves it uninitialized)
    items = np.array([list(s[1:]) for s in sources for _ in range(s[0])], dtype=b.dtype)
    items = items.reshape(-1, len(sources[0]) - 1)  # one row per batch item, even for 0 rows
    if kind == "BATCH_ITEM_SHAPE":
        return items
    if kind == "BATCH_ITEM_SHAPE_FLATTEN":
        return items.reshape(-1)
    raise ValueError(f"unknown batch input kind {kind}")  # refused at load; never reached


def split(model: str, joined: Joined, outputs: dict[str, Any],
          varlen: VarlenSpec | None = None) -> list[dict[str, Any]]:
    """Each request's outputs: its rows (views, no copy), cut back to its own extents; batch outputs
    scattered. Outputs may be numpy arrays or torch tensors (kept on a device)."""
    rows = joined.rows
    scatter = {t: b for b in varlen.batch_outputs for t in b.targets} if varlen is not None else {}
    if len(rows) == 1 and not scatter:
        return [outputs]
    unpad = {u.output: u for u in varlen.unpad} if varlen is not None else {}
    results: list[dict[str, Any]] = [{} for _ in rows]
    for name, array in outputs.items():
        if name in scatter:
            for result, piece in zip(results, scattered(model, name, array, scatter[name], joined)):
                result[name] = piece
            continue
        rule = unpad.get(name)
        start = 0
        for i, n in enumerate(rows):
            part = array[start:start + n]
            start += n
            results[i][name] = part if rule is None else cut(model, part, rule, joined.shapes[i][rule.source])
    return results


def cut(model: str, part: np.ndarray, rule: Unpad, source: Shape) -> np.ndarray:
    """``part`` (one request's rows of an output) cut to the request's extents of ``rule.source``."""
    if part.ndim <= max(rule.cuts) + 1:
        raise ModelExecutionError(
            f"model '{model}': output '{rule.output}' has shape {list(part.shape)}, but its dimension(s) "
            f"{list(rule.cuts)} follow input '{rule.source}' (inferd.unpad_outputs)")
    index = (slice(None),) + tuple(slice(0, source[d + 1]) if d in rule.cuts else slice(None)
                                   for d in range(max(rule.cuts) + 1))
    return part[index]


def scattered(model: str, name: str, array: np.ndarray, b: BatchOutput, joined: Joined) -> list[np.ndarray]:
    """BATCH_SCATTER_WITH_INPUT_SHAPE: the output's elements in order, each request taking the
    output's shape with every -1 set to its source input's extent of that dimension."""
    flat = array.reshape(-1)
    pieces = []
    offset = 0
    for shapes in joined.shapes:
        source = shapes[b.source]
        if any(d == -1 and i >= len(source) for i, d in enumerate(b.shape)):
            raise ModelExecutionError(
                f"model '{model}': batch_output '{name}' has shape {list(b.shape)}, with more dimensions than its "
                f"source input '{b.source}' {list(source)}")
        shape = tuple(source[i] if d == -1 else d for i, d in enumerate(b.shape))
        count = math.prod(shape)
        if offset + count > flat.size:
            raise ModelExecutionError(
                f"model '{model}': output '{name}' has {flat.size} elements, fewer than the batch's requests take "
                f"when scattered by input '{b.source}'")
        pieces.append(flat[offset:offset + count].reshape(shape))
        offset += count
    return pieces

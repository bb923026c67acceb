"""Triton's ``model_warmup``: sample requests run on every instance before a
model version reports ready.

Each ``ModelWarmup`` names a sample: ``batch_size`` requests (one row each
for a batching model) whose ``inputs`` are zeros (``zero_data``), random
values (``random_data``, seeded: the same every load) or the contents of
``<model>/warmup/<input_data_file>`` (raw little-endian values, or BYTES
elements as 4-byte length + bytes), executed ``count`` times (0: once) on
each instance. A sample that fails fails the load: a model that cannot run
its own warm-up must not report ready. The config's structure is checked by
``inferd.config`` (``_check_warmup``); files are read here, at load.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from inferd.backends.base import ModelInstance, RequestInputs
from inferd.config import ModelSpec, TensorSpec, WarmupInput
from inferd.errors import ConfigError, InferdError, ModelExecutionError
from inferd.types import InferenceRequest

WARMUP_DIR = "warmup"


@dataclass(frozen=True)
class WarmupSample:
    name: str
    requests: list[dict[str, np.ndarray]]  # one dict of inputs (model shapes) per request
    count: int


def warmup_samples(spec: ModelSpec, model_dir: Path) -> list[WarmupSample]:
    """Every sample of the model's ``model_warmup`` (``spec.warmup``), its data made or read. Blocking."""
    samples = []
    rng = np.random.default_rng(0)
    for w in spec.warmup:
        where = f"model '{spec.name}': model_warmup '{w.name}'"
        batch = max(1, w.batch_size)
        requests: list[dict[str, np.ndarray]] = [{} for _ in range(batch)]
        for name, inp in w.inputs:
            t = spec.inputs[name]
            one = _data(where, name, t, inp, model_dir, rng)
            lead = (1,) if spec.batching else ()
            one = one.reshape(lead + _model_shape(t, one.shape))
            for r in requests:
                r[name] = one
        samples.append(WarmupSample(w.name, requests, max(1, w.count)))
    return samples


def _model_shape(t: TensorSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    return t.model_dims if t.reshaped else shape


def _data(where: str, name: str, t: TensorSpec, inp: WarmupInput, model_dir: Path,
          rng: np.random.Generator) -> np.ndarray:
    shape = inp.dims
    count = int(np.prod(shape)) if shape else 1
    dtype = t.datatype
    choice = inp.data
    if choice == "input_data_file":
        return _from_file(f"{where}: input '{name}'", inp.file, model_dir, t, shape, count)
    if dtype.name == "BYTES":
        if choice == "random_data":
            letters = rng.integers(ord("a"), ord("z") + 1, size=(count, 8), dtype=np.uint8)
            values = [bytes(row) for row in letters]
        else:
            values = [b""] * count
        out = np.empty(count, dtype=np.object_)
        out[:] = values
        return out.reshape(shape)
    np_type = dtype.numpy
    if choice == "random_data":
        if np_type == np.bool_:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        if np.issubdtype(np_type, np.integer):
            return rng.integers(0, 100, size=shape).astype(np_type)
        return rng.random(size=shape).astype(np_type)
    return np.zeros(shape, dtype=np_type)


def _from_file(where: str, filename: str, model_dir: Path, t: TensorSpec, shape: tuple[int, ...],
               count: int) -> np.ndarray:
    folder = (model_dir / WARMUP_DIR).resolve()
    path = (folder / filename).resolve()
    if folder not in path.parents:
        raise ConfigError(f"{where}: input_data_file '{filename}' must name a file inside {model_dir / WARMUP_DIR}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read input_data_file '{filename}' ({path}): {exc.strerror}") from None
    if t.datatype.name == "BYTES":
        values, pos = [], 0
        while pos < len(data) and len(values) < count:
            if pos + 4 > len(data):
                break
            (length,) = struct.unpack_from("<I", data, pos)
            if pos + 4 + length > len(data):
                break
            values.append(bytes(data[pos + 4:pos + 4 + length]))
            pos += 4 + length
        if len(values) != count or pos != len(data):
            raise ConfigError(
                f"{where}: input_data_file '{filename}' must hold {count} BYTES elements "
                "(each a 4-byte little-endian length and its bytes)"
            )
        out = np.empty(count, dtype=np.object_)
        out[:] = values
        return out.reshape(shape)
    expected = count * t.datatype.itemsize
    if len(data) != expected:
        raise ConfigError(
            f"{where}: input_data_file '{filename}' has {len(data)} bytes; dims {list(shape)} of "
            f"{t.datatype.name} need {expected}"
        )
    return np.frombuffer(data, dtype=t.datatype.numpy).reshape(shape)


def run_warmup(spec: ModelSpec, instance: ModelInstance, samples: Sequence[WarmupSample]) -> None:
    """Run every sample on ``instance`` (blocking); raises when one fails."""
    outputs = list(spec.outputs)
    for sample in samples:
        where = f"model '{spec.name}': warmup sample '{sample.name}' on instance '{instance.name}'"
        if instance.wants_requests:
            batch: list = [RequestInputs(InferenceRequest(spec.name, dict(r), id=f"warmup:{sample.name}"))
                           for r in sample.requests]
        else:
            batch = sample.requests
        for _ in range(sample.count):
            try:
                result = instance.execute(batch, outputs)
            except InferdError as exc:
                raise ModelExecutionError(f"{where} failed: {exc.message}") from None
            except Exception as exc:
                raise ModelExecutionError(f"{where} failed: {type(exc).__name__}: {exc}") from None
            for out in result.outputs:
                if isinstance(out, BaseException):
                    raise ModelExecutionError(f"{where} failed: {out}")

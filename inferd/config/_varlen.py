"""Variable-length batching, checked at load: inferd's padding parameters and Triton's ragged batching.

Two ways for requests whose shapes differ to share one execution; both are read
here once, refused with the model, parameter (or field) and value named, and
turned into :class:`VarlenSpec`, plain data for the scheduler (which requests
may share a batch) and the backends (how a batch's tensors are built).

**Padding** (``parameters { key: "inferd.padding" value { string_value: "true" } }``):

- *padded inputs*: every input the client sends whose dims (the model's, after
  ``reshape``) have a -1 and that is not ``allow_ragged_batch``. In a batch each
  variable dimension is padded to the batch's longest with ``inferd.pad_value``
  (``"0"`` by default; ``"VALUE"`` for every padded input or ``"NAME:VALUE,..."``).
- the *reference input* is the first padded input in the config that is not
  ``optional`` (every request sends it). A request's
  *length* is the product of its reference input's variable extents (for text
  ``dims: [ -1 ]``: its number of tokens).
- ``inferd.mask_input`` names a config input inferd fills: 1 where the reference
  input holds the request's own data, 0 where it is padding. Its dims are the
  reference's dims or a prefix of them (``[ -1 ]`` for token ids ``[ -1 ]`` or
  embeddings ``[ -1, 768 ]``).
- ``inferd.lengths_input`` names a config input inferd fills with each row's
  extent of every variable dimension of the reference input (``dims: [ 1 ]`` for
  one, ``[ k ]`` for k; a ``reshape`` applies).
- clients need not send a mask or lengths input: the served config marks them
  ``optional`` (so Triton's clients, perf_analyzer included, may leave them out).
  A request that sends one keeps its own (a mask is then padded with 0), so a
  client written for Triton, which sends both, gets the same results.
- outputs are cut back to each request's own length: an output dimension i that
  is -1 follows dimension i of the reference input when that one is variable
  (``[ -1, 16 ]`` per-token outputs are cut; a pooled ``[ 32 ]`` is left alone).
  ``inferd.unpad_outputs: "OUT:INPUT,OTHER:none"`` makes an output follow another
  padded input, or none (returned as the model computed it for the padded batch).
- ``inferd.length_buckets: "16,32,64"``: a batch holds requests of one bucket only
  (bucket k holds lengths in (bound k-1, bound k]); a request longer than the
  last bound is refused. ``inferd.max_batch_elements``: a batch's rows times its
  longest length stays <= this budget (with buckets it must hold one row of the
  last bound); a request that alone exceeds it is refused.

**Triton's ragged batching**: ``allow_ragged_batch`` inputs are not shape-checked
across requests and reach the model as one 1-D concatenation; ``batch_input``
tensors (BATCH_ELEMENT_COUNT, ...) describe the batch, ``batch_output``
(BATCH_SCATTER_WITH_INPUT_SHAPE) scatters an output by a request's input shape,
as Triton's backends do (``docs/user_guide/ragged_batching.md``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from inferd._proto import model_config_pb2 as mc
from inferd.config._capabilities import TENSOR_BACKEND, BackendCapabilities
from inferd.config._parameters import PREFIX, InferdParameters
from inferd.dtypes import BY_CONFIG
from inferd.errors import ConfigError

MASK, LENGTHS = "mask", "lengths"
_MASK_TYPES = ("TYPE_BOOL", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32")
_LENGTHS_TYPES = ("TYPE_INT32", "TYPE_INT64")
BATCH_INPUT_KINDS = (
    "BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "BATCH_ITEM_SHAPE", "BATCH_ITEM_SHAPE_FLATTEN",
)
SCATTER_WITH_INPUT_SHAPE = "BATCH_SCATTER_WITH_INPUT_SHAPE"
# The padding parameters other than inferd.padding itself: each needs it on.
_PADDING_PARAMETERS = ("pad_value", "lengths_input", "mask_input", "unpad_outputs", "length_buckets",
                       "max_batch_elements")


@dataclass(frozen=True, slots=True)
class PaddedInput:
    name: str
    variable: tuple[int, ...]  # positions in the model dims (without batch) that are -1
    pad: Any  # the pad value, as the input's numpy scalar type


@dataclass(frozen=True, slots=True)
class FilledInput:
    """A config input inferd fills for each batch (mask or lengths); clients never send it."""

    name: str
    kind: str  # MASK or LENGTHS
    dtype: np.dtype
    dims: tuple[int, ...]  # model dims without batch


@dataclass(frozen=True, slots=True)
class Unpad:
    """Output dims cut back to a request's own extent of an input's dims."""

    output: str
    source: str
    cuts: tuple[int, ...]  # model-dim positions (without batch) shared by the output and ``source``


@dataclass(frozen=True, slots=True)
class BatchInput:
    kind: str
    targets: tuple[str, ...]
    dtype: np.dtype  # int32 or float32
    source: str


@dataclass(frozen=True, slots=True)
class BatchOutput:
    targets: tuple[str, ...]
    source: str
    shape: tuple[int, ...]  # [-1 (batch)] + the output's model dims; -1s take the request's input shape


@dataclass(frozen=True, slots=True)
class VarlenSpec:
    padded: tuple[PaddedInput, ...] = ()
    filled: tuple[FilledInput, ...] = ()
    unpad: tuple[Unpad, ...] = ()
    buckets: tuple[int, ...] = ()
    max_batch_elements: int = 0
    ragged: frozenset[str] = frozenset()
    batch_inputs: tuple[BatchInput, ...] = ()
    batch_outputs: tuple[BatchOutput, ...] = ()
    reference: str | None = None  # the padded input whose extents make a request's length

    @property
    def batch_input_targets(self) -> frozenset[str]:
        """Model inputs inferd makes for Triton's batch_input: not config inputs, never sent."""
        return frozenset(t for b in self.batch_inputs for t in b.targets)


def varlen_spec(config: mc.ModelConfig, params: InferdParameters | None = None,
                backend: BackendCapabilities = TENSOR_BACKEND) -> VarlenSpec | None:
    """The model's variable-length batching, or None when it has none. Raises ConfigError
    (also where ``backend``, the model's, does not join batches into tensors)."""
    params = params or InferdParameters.from_config(config)
    ragged = _ragged_inputs(config)
    batch_inputs = _batch_inputs(config)
    batch_outputs = _batch_outputs(config)
    padding = _padding(config, params, ragged)
    if padding is None and not (ragged or batch_inputs or batch_outputs):
        return None
    _check_scheduler(config, "inferd.padding" if padding is not None else "ragged batching", backend)
    return VarlenSpec(**(padding or {}), ragged=ragged, batch_inputs=batch_inputs, batch_outputs=batch_outputs)


def _param(name: str) -> str:
    return PREFIX + name


def _check_scheduler(config: mc.ModelConfig, what: str, backend: BackendCapabilities) -> None:
    model = config.name
    if config.platform == "ensemble":
        raise ConfigError(f"model '{model}': {what} applies to a model's own tensors; an ensemble has none "
                          "(set it on the composing model)")
    if not backend.joins_batches:
        raise ConfigError(f"model '{model}': {what} is for backends that join a batch into one tensor per input "
                          f"(onnxruntime, pytorch), not backend '{backend.name}' (its model sees each request's "
                          "own tensors)")
    if config.HasField("sequence_batching"):
        raise ConfigError(f"model '{model}': {what} works with dynamic_batching or the default scheduler, "
                          "not with sequence_batching")
    if config.max_batch_size < 1:
        raise ConfigError(f"model '{model}': {what} needs max_batch_size >= 1, got {config.max_batch_size} "
                          "(requests share a batch along the batch dimension)")


# -- padding ----------------------------------------------------------------------


def _padding(config: mc.ModelConfig, params: InferdParameters, ragged: frozenset[str]) -> dict[str, Any] | None:
    """The padding fields of the model's VarlenSpec, or None without inferd.padding."""
    model = config.name
    if not params.padding:
        for name in _PADDING_PARAMETERS:
            value = getattr(params, name)
            if value:
                raise ConfigError(f"model '{model}': parameter '{_param(name)}' ('{value}') needs "
                                  f"{_param('padding')}: \"true\"")
        return None
    mask = _filled(config, params.mask_input, "mask_input", MASK, _MASK_TYPES)
    lengths = _filled(config, params.lengths_input, "lengths_input", LENGTHS, _LENGTHS_TYPES)
    filled = tuple(f for f in (mask, lengths) if f is not None)
    if mask is not None and lengths is not None and mask.name == lengths.name:
        raise ConfigError(f"model '{model}': parameters '{_param('mask_input')}' and '{_param('lengths_input')}' "
                          f"both name input '{mask.name}'")
    variable = _variable_inputs(config, {f.name for f in filled} | ragged)
    pads = _pad_values(config, params.pad_value, [t for t, _ in variable])
    padded = tuple(PaddedInput(t.name, positions, pads[t.name]) for t, positions in variable)
    padded_dims = {t.name: _model_dims(t) for t, _ in variable}
    required = [(t, positions) for t, positions in variable if not t.optional]
    if not required:
        # No reference: a request has no length, so nothing may depend on one.
        for name in ("mask_input", "lengths_input", "length_buckets", "max_batch_elements"):
            if getattr(params, name):
                raise ConfigError(f"model '{model}': parameter '{_param(name)}' needs a padded input that every "
                                  f"request sends, but the padded inputs {sorted(padded_dims)} are all optional")
        return {"padded": padded, "unpad": _unpad_rules(config, params.unpad_outputs, padded_dims, None)}
    reference, ref_variable = required[0]
    _check_filled_dims(model, mask, lengths, reference, ref_variable)
    buckets, budget = _limits(config, params)
    return {"padded": padded, "filled": filled, "reference": reference.name, "buckets": buckets,
            "max_batch_elements": budget,
            "unpad": _unpad_rules(config, params.unpad_outputs, padded_dims, reference.name)}


def _variable_inputs(config: mc.ModelConfig, skip: set[str] | frozenset[str]) -> list[tuple[mc.ModelInput, tuple[int, ...]]]:
    """The inputs to pad, with their variable positions: -1 in the model dims, not filled, not ragged."""
    variable = []
    for t in config.input:
        dims = _model_dims(t)
        if t.name not in skip and -1 in dims:
            variable.append((t, tuple(i for i, d in enumerate(dims) if d == -1)))
    if not variable:
        shown = ", ".join(f"{t.name} {list(_model_dims(t))}" for t in config.input) or "none"
        raise ConfigError(f"model '{config.name}': parameter '{_param('padding')}' is 'true' but no input has a "
                          f"variable (-1) dimension to pad (inputs: {shown})")
    return variable


def _check_filled_dims(model: str, mask: FilledInput | None, lengths: FilledInput | None,
                       reference: mc.ModelInput, variable: tuple[int, ...]) -> None:
    ref_dims = _model_dims(reference)
    if mask is not None and (len(mask.dims) > len(ref_dims) or mask.dims != ref_dims[:len(mask.dims)]):
        raise ConfigError(f"model '{model}': parameter '{_param('mask_input')}': input '{mask.name}' has dims "
                          f"{list(mask.dims)}; a mask has the dims of the padded input '{reference.name}' "
                          f"{list(ref_dims)} or a prefix of them")
    if lengths is not None and (-1 in lengths.dims or math.prod(lengths.dims) != len(variable)):
        raise ConfigError(f"model '{model}': parameter '{_param('lengths_input')}': input '{lengths.name}' has "
                          f"dims {list(lengths.dims)}; it holds one length per variable dimension of "
                          f"'{reference.name}' {list(ref_dims)}, so its dims must hold {len(variable)} element(s) "
                          f"(e.g. [ {len(variable)} ])")


def _limits(config: mc.ModelConfig, params: InferdParameters) -> tuple[tuple[int, ...], int]:
    """inferd.length_buckets and inferd.max_batch_elements, checked together."""
    model = config.name
    buckets = _buckets(config, params.length_buckets)
    budget = params.max_batch_elements
    if (buckets or budget) and not config.HasField("dynamic_batching"):
        name = "length_buckets" if buckets else "max_batch_elements"
        raise ConfigError(f"model '{model}': parameter '{_param(name)}' shapes dynamic batches; the model has "
                          "no dynamic_batching block")
    if budget and buckets and budget < buckets[-1]:
        raise ConfigError(f"model '{model}': parameter '{_param('max_batch_elements')}' is {budget}, smaller "
                          f"than one row of the longest bucket ({buckets[-1]} elements); it must be >= {buckets[-1]}")
    return buckets, budget


def _model_dims(t: mc.ModelInput | mc.ModelOutput) -> tuple[int, ...]:
    return tuple(int(d) for d in (t.reshape.shape if t.HasField("reshape") else t.dims))


def _filled(config: mc.ModelConfig, name: str, param: str, kind: str, types: tuple[str, ...]) -> FilledInput | None:
    if not name:
        return None
    model = config.name
    inputs = {t.name: t for t in config.input}
    t = inputs.get(name)
    if t is None:
        raise ConfigError(f"model '{model}': parameter '{_param(param)}' names '{name}', which is not an input "
                          f"of the config (inputs: {sorted(inputs)})")
    type_name = mc.DataType.Name(t.data_type)
    if type_name not in types:
        raise ConfigError(f"model '{model}': parameter '{_param(param)}' names input '{name}' of data_type "
                          f"{type_name}; it must be one of {', '.join(types)}")
    if t.allow_ragged_batch:
        raise ConfigError(f"model '{model}': parameter '{_param(param)}' names input '{name}', which is "
                          "allow_ragged_batch; inferd fills it for every batch")
    dtype = BY_CONFIG[type_name].numpy
    assert dtype is not None  # every mask and lengths type has one
    return FilledInput(name, kind, dtype, _model_dims(t))


def _pad_values(config: mc.ModelConfig, raw: str, padded: list[mc.ModelInput]) -> dict[str, Any]:
    model = config.name
    by_name = {t.name: t for t in padded}
    default = "0"
    given: dict[str, str] = {}
    for item in (p.strip() for p in raw.split(",")) if raw.strip() else ():
        name, sep, value = item.rpartition(":")
        if not sep:
            default = item
            continue
        if name not in by_name:
            raise ConfigError(f"model '{model}': parameter '{_param('pad_value')}' ('{raw}') names '{name}', which "
                              f"is not a padded input (padded inputs: {sorted(by_name)})")
        given[name] = value.strip()
    out = {}
    for t in padded:
        value = given.get(t.name, default)
        out[t.name] = _scalar(config, t, value, raw)
    return out


def _scalar(config: mc.ModelConfig, t: mc.ModelInput, value: str, raw: str) -> Any:
    dtype = BY_CONFIG[mc.DataType.Name(t.data_type)]
    problem = f"model '{config.name}': parameter '{_param('pad_value')}' ('{raw}'): "
    if dtype.name == "BYTES":
        return value.encode()
    np_type = dtype.numpy
    assert np_type is not None  # only BYTES has none
    try:
        if np_type == np.bool_:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError
            return np.bool_(value.lower() in ("true", "1"))
        if np.issubdtype(np_type, np.integer):
            number = int(value)
            info = np.iinfo(np_type)
            if not info.min <= number <= info.max:
                raise ValueError
            return np_type.type(number)
        return np_type.type(float(value))
    except ValueError:
        raise ConfigError(f"{problem}'{value}' is not a {dtype.config} value for input '{t.name}'") from None


def _unpad_rules(config: mc.ModelConfig, raw: str, padded: dict[str, tuple[int, ...]],
                 reference: str | None) -> tuple[Unpad, ...]:
    model = config.name
    outputs = {t.name: t for t in config.output}
    follows: dict[str, str | None] = {}
    for item in (p.strip() for p in raw.split(",")) if raw.strip() else ():
        out, sep, named = item.partition(":")
        out, named = out.strip(), named.strip()
        if not sep or not out or not named:
            raise ConfigError(f"model '{model}': parameter '{_param('unpad_outputs')}' must list OUTPUT:INPUT or "
                              f"OUTPUT:none items, got '{raw}'")
        if out not in outputs:
            raise ConfigError(f"model '{model}': parameter '{_param('unpad_outputs')}' names '{out}', which is not "
                              f"an output (outputs: {sorted(outputs)})")
        if named != "none" and named not in padded:
            raise ConfigError(f"model '{model}': parameter '{_param('unpad_outputs')}' makes output '{out}' follow "
                              f"'{named}', which is not a padded input (padded inputs: {sorted(padded)})")
        follows[out] = None if named == "none" else named
    rules = []
    for t in config.output:
        dims = _model_dims(t)
        explicit = t.name in follows
        source = follows[t.name] if explicit else reference
        if source is None:
            continue
        src = padded[source]
        cuts = tuple(i for i, d in enumerate(dims) if d == -1 and i < len(src) and src[i] == -1)
        if cuts:
            rules.append(Unpad(t.name, source, cuts))
        elif explicit:
            raise ConfigError(f"model '{model}': parameter '{_param('unpad_outputs')}': output '{t.name}' dims "
                              f"{list(dims)} share no variable dimension with input '{source}' {list(src)}")
    return tuple(rules)


def _buckets(config: mc.ModelConfig, raw: str) -> tuple[int, ...]:
    if not raw.strip():
        return ()
    try:
        bounds = tuple(int(p) for p in raw.split(","))
    except ValueError:
        bounds = ()
    if not bounds or bounds[0] < 1 or any(b <= a for a, b in zip(bounds, bounds[1:])):
        raise ConfigError(f"model '{config.name}': parameter '{_param('length_buckets')}' must be strictly "
                          f"increasing integers >= 1 (e.g. \"16,32,64\"), got '{raw}'")
    return bounds


# -- Triton's ragged batching --------------------------------------------------------


def _ragged_inputs(config: mc.ModelConfig) -> frozenset[str]:
    names = []
    for t in config.input:
        if not t.allow_ragged_batch:
            continue
        if t.optional:
            raise ConfigError(f"model '{config.name}': input '{t.name}': allow_ragged_batch is not supported for "
                              "an optional input")
        names.append(t.name)
    return frozenset(names)


def _source(where: str, what: str, sources: Sequence[str], inputs: set[str]) -> str:
    """The one source input Triton's batch inputs and outputs take, a config input."""
    if len(sources) != 1:
        raise ConfigError(f"{where}: {what} expects 1 source input, got {len(sources)}")
    if sources[0] not in inputs:
        raise ConfigError(f"{where}: unknown source input name '{sources[0]}' (inputs: {sorted(inputs)})")
    return sources[0]


def _batch_inputs(config: mc.ModelConfig) -> tuple[BatchInput, ...]:
    model = config.name
    inputs = {t.name for t in config.input}
    seen: set[str] = set()
    out = []
    for i, b in enumerate(config.batch_input):
        where = f"model '{model}': batch_input[{i}]"
        kind = mc.BatchInput.Kind.Name(b.kind)
        source = _source(where, f"batch input kind '{kind}'", b.source_input, inputs)
        if b.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise ConfigError(f"{where}: batch input data type must be TYPE_INT32 or TYPE_FP32, got "
                              f"{mc.DataType.Name(b.data_type)}")
        if not b.target_name:
            raise ConfigError(f"{where}: target_name is empty; name the model input to create")
        for target in b.target_name:
            if target in inputs:
                raise ConfigError(f"{where}: target_name '{target}' is also a config input; a batch input is "
                                  "created by the server, not sent by the client")
            if target in seen:
                raise ConfigError(f"{where}: target_name '{target}' can only be specified once")
            seen.add(target)
        dtype = np.dtype(np.int32 if b.data_type == mc.TYPE_INT32 else np.float32)
        out.append(BatchInput(kind, tuple(b.target_name), dtype, source))
    return tuple(out)


def _batch_outputs(config: mc.ModelConfig) -> tuple[BatchOutput, ...]:
    model = config.name
    inputs = {t.name for t in config.input}
    outputs = {t.name: t for t in config.output}
    seen: set[str] = set()
    out = []
    for i, b in enumerate(config.batch_output):
        where = f"model '{model}': batch_output[{i}]"
        kind = mc.BatchOutput.Kind.Name(b.kind)
        source = _source(where, f"batch output kind '{kind}'", b.source_input, inputs)
        if not b.target_name:
            raise ConfigError(f"{where}: target_name is empty; name the outputs to scatter")
        for target in b.target_name:
            if target not in outputs:
                raise ConfigError(f"{where}: unknown target output name '{target}' (outputs: {sorted(outputs)})")
            if target in seen:
                raise ConfigError(f"{where}: target output name '{target}' can only be specified once")
            seen.add(target)
        # Triton's backends take the scatter shape from the first target's config.
        shape = (-1,) + _model_dims(outputs[b.target_name[0]])
        out.append(BatchOutput(tuple(b.target_name), source, shape))
    return tuple(out)

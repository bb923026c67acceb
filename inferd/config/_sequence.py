"""``sequence_batching`` and ``model_transaction_policy``: checked at load,
turned into plain data for the sequence batcher.

:func:`normalize_sequence_batching` fills in Triton's defaults in place (the
config a client reads shows them, as Triton's does): ``direct {}`` when no
strategy is named, ``max_sequence_idle_microseconds`` 1000000 when 0, and
``oldest.preferred_batch_size`` = [max_batch_size] when none is listed.
:func:`sequence_policy` checks the block and returns a :class:`SequencePolicy`;
:func:`check_sequence_signature` checks the control and state tensors
against what the model file says. Every message names the model and field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inferd._proto import model_config_pb2 as mc
from inferd.config._capabilities import TENSOR_BACKEND, BackendCapabilities
from inferd.config._iterative import check_iterative
from inferd.dtypes import BY_CONFIG, DataType, decode_bytes
from inferd.config._paths import check_inside
from inferd.errors import ConfigError, InferdError

IDLE_DEFAULT_US = 1_000_000  # Triton's SEQUENCE_IDLE_DEFAULT_MICROSECONDS

START, END, READY, CORRID = "START", "END", "READY", "CORRID"
_KIND = {
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START: START,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END: END,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY: READY,
    mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_CORRID: CORRID,
}
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


@dataclass(frozen=True, slots=True)
class Control:
    """One control input the batcher fills in for every row of a batch."""

    kind: str  # START, END, READY or CORRID
    input: str  # the model's input tensor
    datatype: DataType
    false: object = None  # START/END/READY: the values meaning false and true
    true: object = None


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One implicit state: fed to ``input`` and read back from ``output``.

    ``initial`` is the state a sequence starts with: ``initial_state`` (zeros or its
    data file), else zeros (empty strings for TYPE_STRING), each variable dimension
    1, as Triton starts it; after each request the state is what the model returned
    for ``output``, whose variable dimensions may differ from the last."""

    input: str
    output: str
    datatype: DataType
    dims: tuple[int, ...]
    initial: np.ndarray  # the state at the start of a sequence (``dims``, concrete)


@dataclass(frozen=True, slots=True)
class SequencePolicy:
    strategy: str  # "direct" or "oldest"
    max_batch_size: int
    idle_us: int
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0  # direct
    max_candidate_sequences: int = 1  # oldest
    preferred_batch_sizes: tuple[int, ...] = ()  # oldest
    controls: tuple[Control, ...] = ()
    states: tuple[StateSpec, ...] = ()
    corrid_string: bool = False  # the CORRID control is TYPE_STRING
    corrid_numeric: bool = False  # the CORRID control is an integer type
    iterative: bool = False  # iterative_sequence: one request is a whole sequence, run step by step

    @property
    def max_rows(self) -> int:
        return max(self.max_batch_size, 1)

    @property
    def max_queue_delay_s(self) -> float:
        """``max_queue_delay_microseconds`` in seconds, the unit the schedulers' clocks count in."""
        return self.max_queue_delay_us / 1e6

    @property
    def slots_per_instance(self) -> int:
        """Sequences one instance serves at once (more wait in the backlog)."""
        return self.max_rows if self.strategy == "direct" else self.max_candidate_sequences


def sequence_tensor_names(config: mc.ModelConfig) -> tuple[set[str], set[str]]:
    """The input and output tensor names the sequence batcher supplies and consumes
    (control inputs, state inputs; state outputs): never listed as config tensors."""
    if not config.HasField("sequence_batching"):
        return set(), set()
    sb = config.sequence_batching
    inputs = {c.name for c in sb.control_input if c.name} | {s.input_name for s in sb.state if s.input_name}
    outputs = {s.output_name for s in sb.state if s.output_name}
    return inputs, outputs


def normalize_sequence_batching(config: mc.ModelConfig) -> None:
    if not config.HasField("sequence_batching"):
        return
    sb = config.sequence_batching
    if sb.max_sequence_idle_microseconds == 0:
        sb.max_sequence_idle_microseconds = IDLE_DEFAULT_US
    if sb.WhichOneof("strategy_choice") is None:
        sb.direct.SetInParent()
    if sb.HasField("oldest") and not sb.oldest.preferred_batch_size and config.max_batch_size > 0:
        sb.oldest.preferred_batch_size.append(config.max_batch_size)


def sequence_policy(config: mc.ModelConfig, model_dir: Path | None = None,
                    backend: BackendCapabilities | None = TENSOR_BACKEND) -> SequencePolicy | None:
    """The checked ``sequence_batching`` block (None when the config has none); ``backend``:
    the model's (what it can do decides what an iterative sequence may ask; None: not settled yet)."""
    if not config.HasField("sequence_batching"):
        return None
    name = config.name
    sb = config.sequence_batching
    where = f"model '{name}': sequence_batching"
    if sb.iterative_sequence:
        check_iterative(config, where, backend)
    idle = int(sb.max_sequence_idle_microseconds) or IDLE_DEFAULT_US
    strategy = sb.WhichOneof("strategy_choice") or "direct"
    kwargs: dict[str, object] = {}
    if strategy == "direct":
        d = sb.direct
        util = float(d.minimum_slot_utilization)
        if not 0.0 <= util <= 1.0 or math.isnan(util):
            raise ConfigError(f"{where}.direct.minimum_slot_utilization must be in [0.0, 1.0], got {util}")
        kwargs.update(max_queue_delay_us=int(d.max_queue_delay_microseconds), minimum_slot_utilization=util)
    else:
        o = sb.oldest
        # preserve_ordering needs nothing more here: an instance runs one batch at a time and
        # answers its rows together, so each instance answers in the order it took requests,
        # which is what Triton's per-instance dynamic batcher promises.
        if o.max_candidate_sequences < 1:
            raise ConfigError(
                f"{where}.oldest.max_candidate_sequences must be >= 1 (the sequences each instance batches "
                f"together), got {o.max_candidate_sequences}"
            )
        preferred = tuple(int(p) for p in o.preferred_batch_size)
        for p in preferred:
            if p < 1 or p > max(config.max_batch_size, 1):
                raise ConfigError(
                    f"{where}.oldest.preferred_batch_size {p} must be in 1..max_batch_size "
                    f"({config.max_batch_size})"
                )
        if len(set(preferred)) != len(preferred):
            raise ConfigError(f"{where}.oldest.preferred_batch_size lists a size twice: {list(preferred)}")
        kwargs.update(max_queue_delay_us=int(o.max_queue_delay_microseconds),
                      max_candidate_sequences=int(o.max_candidate_sequences),
                      preferred_batch_sizes=tuple(sorted(preferred)))
    controls = _controls(config, where)
    corrid = next((c for c in controls if c.kind == CORRID), None)
    states = tuple(_state(config, where, i, s, model_dir) for i, s in enumerate(sb.state))
    _check_names(config, where, controls, states)
    if states and config.model_transaction_policy.decoupled and not sb.iterative_sequence:
        raise ConfigError(f"{where}.state: implicit state is not supported for decoupled models "
                          "(except with iterative_sequence: true)")
    return SequencePolicy(
        strategy=strategy,
        max_batch_size=int(config.max_batch_size),
        idle_us=idle,
        controls=controls,
        states=states,
        corrid_string=corrid is not None and corrid.datatype.name == "BYTES",
        corrid_numeric=corrid is not None and corrid.datatype.name != "BYTES",
        iterative=bool(sb.iterative_sequence),
        **kwargs,  # type: ignore[arg-type]
    )


def _controls(config: mc.ModelConfig, where: str) -> tuple[Control, ...]:
    out: list[Control] = []
    seen_kinds: dict[str, str] = {}
    kind_of: dict[str, str] = {}  # control tensor -> the kind it was first declared for
    for i, ci in enumerate(config.sequence_batching.control_input):
        at = f"{where}.control_input[{i}]"
        if not ci.name:
            raise ConfigError(f"{at} has no name")
        at = f"{where}.control_input '{ci.name}'"
        if len(ci.control) != 1:
            raise ConfigError(f"{at} must have exactly one control, got {len(ci.control)}")
        c = ci.control[0]
        kind = _KIND.get(c.kind)
        if kind is None:
            raise ConfigError(f"{at}: unknown control kind {c.kind}")
        kind_name = mc.ModelSequenceBatching.Control.Kind.Name(c.kind)
        if ci.name in kind_of:
            raise ConfigError(
                f"{where}: control tensor '{ci.name}' is declared for {kind_of[ci.name]} and for {kind_name}; "
                "a control tensor carries one control kind: give each control_input its own tensor name")
        kind_of[ci.name] = kind_name
        if kind in seen_kinds:
            raise ConfigError(
                f"{where}: control {kind_name} is given twice (inputs '{seen_kinds[kind]}' and '{ci.name}')")
        seen_kinds[kind] = ci.name
        given = [f for f in ("int32_false_true", "fp32_false_true", "bool_false_true") if len(getattr(c, f))]
        if kind == CORRID:
            if given:
                raise ConfigError(f"{at}: control {kind_name} takes data_type, not {given[0]}")
            dtype_name = mc.DataType.Name(c.data_type)
            if dtype_name not in _CORRID_TYPES:
                raise ConfigError(
                    f"{at}: unexpected data type {dtype_name} for control {kind_name}; allowed data types are "
                    + ", ".join(_CORRID_TYPES)
                )
            out.append(Control(kind, ci.name, BY_CONFIG[dtype_name]))
            continue
        if len(given) != 1:
            raise ConfigError(
                f"{at}: control {kind_name} must give exactly one of int32_false_true, fp32_false_true and "
                f"bool_false_true, got {given or 'none'}"
            )
        field = given[0]
        values = list(getattr(c, field))
        if len(values) != 2:
            raise ConfigError(f"{at}: {field} must list 2 values (false, true), got {values}")
        if c.data_type != mc.TYPE_INVALID:
            raise ConfigError(f"{at}: control {kind_name} takes its type from {field}; data_type must not be set")
        dtype = BY_CONFIG[{"int32_false_true": "TYPE_INT32", "fp32_false_true": "TYPE_FP32",
                           "bool_false_true": "TYPE_BOOL"}[field]]
        out.append(Control(kind, ci.name, dtype, values[0], values[1]))
    return tuple(out)


def _state(config: mc.ModelConfig, where: str, i: int, s: mc.ModelSequenceBatching.State,
           model_dir: Path | None) -> StateSpec:
    at = f"{where}.state[{i}]"
    if not s.input_name or not s.output_name:
        raise ConfigError(f"{at} needs both input_name and output_name")
    at = f"{where}.state '{s.input_name}'"
    if s.data_type == mc.TYPE_INVALID:
        raise ConfigError(f"{at}: data_type is missing")
    dtype_name = mc.DataType.Name(s.data_type)
    dtype = BY_CONFIG.get(dtype_name)
    if dtype is None or dtype.numpy is None:
        raise ConfigError(f"{at}: data_type {dtype_name} is not supported")
    if s.use_same_buffer_for_input_output or s.use_growable_memory:
        raise ConfigError(
            f"{at}: use_same_buffer_for_input_output and use_growable_memory are GPU buffer options "
            "that inferd does not support")
    dims = tuple(int(d) for d in s.dims)
    if not dims:
        raise ConfigError(f"{at}: dims is empty")
    for d in dims:
        if d < -1 or d == 0:
            raise ConfigError(f"{at}: dims {list(dims)} has {d}; each dimension must be >= 1, or -1 for variable")
    if len(s.initial_state) > 1:
        raise ConfigError(f"{at}: initial_state may be given once, got {len(s.initial_state)}")
    if not s.initial_state:
        # Triton's start: zeros, each variable dimension 1.
        start = tuple(1 if d == -1 else d for d in dims)
        return StateSpec(s.input_name, s.output_name, dtype, dims, _readonly(_zeros(start, dtype)))
    init = s.initial_state[0]
    iat = f"{at}: initial_state"
    if init.data_type != s.data_type:
        raise ConfigError(
            f"{iat} data_type {mc.DataType.Name(init.data_type)} must match the state's {dtype_name}")
    idims = tuple(int(d) for d in init.dims)
    if not idims or any(d < 1 for d in idims):
        raise ConfigError(f"{iat} dims {list(idims)} must all be >= 1")
    if len(idims) != len(dims) or any(want not in (-1, have) for want, have in zip(dims, idims)):
        raise ConfigError(f"{iat} dims {list(idims)} do not fit the state's dims {list(dims)}")
    choice = init.WhichOneof("state_data")
    if choice == "zero_data" and init.zero_data:
        return StateSpec(s.input_name, s.output_name, dtype, dims, _readonly(_zeros(idims, dtype)))
    if choice == "data_file":
        check_inside(init.data_file, f"{iat}: data_file")
        if model_dir is None:  # checked without the model's folder (unit tests): zeros stand in
            return StateSpec(s.input_name, s.output_name, dtype, dims, _readonly(_zeros(idims, dtype)))
        path = model_dir / "initial_state" / init.data_file
        try:
            raw = path.read_bytes()
        except OSError:
            raise ConfigError(f"{iat}: data_file '{init.data_file}' not found (looked for {path})") from None
        return StateSpec(s.input_name, s.output_name, dtype, dims, _readonly(_from_file(iat, path, raw, idims, dtype)))
    raise ConfigError(f"{iat} must set zero_data: true or data_file")


def _zeros(shape: tuple[int, ...], dtype: DataType) -> np.ndarray:
    """Zeros of ``dtype``; for TYPE_STRING empty strings (Triton zeroes the length prefixes)."""
    if dtype.name == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, dtype=dtype.numpy)


def _from_file(where: str, path: Path, raw: bytes, shape: tuple[int, ...], dtype: DataType) -> np.ndarray:
    """An initial state's data file, as Triton reads it: raw little-endian elements (extra bytes
    are ignored), or for TYPE_STRING the wire's length-prefixed strings."""
    count = math.prod(shape)
    if dtype.name == "BYTES":
        try:
            return decode_bytes(raw, count, f"{where}: data_file {path}").reshape(shape)
        except InferdError as exc:
            raise ConfigError(str(exc)) from None
    expected = count * dtype.itemsize
    if len(raw) < expected:
        raise ConfigError(
            f"{where}: data_file {path} holds {len(raw)} bytes; dims {list(shape)} of {dtype.config} "
            f"need {expected}")
    return np.frombuffer(raw[:expected], dtype=dtype.numpy).reshape(shape).copy()


def _readonly(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _check_names(config: mc.ModelConfig, where: str, controls: tuple[Control, ...],
                 states: tuple[StateSpec, ...]) -> None:
    inputs = {t.name for t in config.input}
    outputs = {t.name for t in config.output}
    supplied: dict[str, str] = {}
    for c in controls:
        supplied[c.input] = f"control input '{c.input}'"
    for s in states:
        if s.input in supplied:
            raise ConfigError(f"{where}: state input '{s.input}' is also {supplied[s.input]}")
        supplied[s.input] = f"state input '{s.input}'"
    for tensor, what in supplied.items():
        if tensor in inputs:
            raise ConfigError(
                f"{where}: {what} is also listed in input; the sequence batcher supplies it, so it must not be "
                "a config input")
    seen_out: set[str] = set()
    for s in states:
        if s.output in outputs:
            raise ConfigError(
                f"{where}: state output '{s.output}' is also listed in output; the sequence batcher consumes it, "
                "so it must not be a config output")
        if s.output in seen_out:
            raise ConfigError(f"{where}: state output '{s.output}' is given twice")
        seen_out.add(s.output)


def check_sequence_signature(config: mc.ModelConfig, policy: SequencePolicy, signature) -> None:  # type: ignore[no-untyped-def]
    """Control and state tensors against the model file's own (ONNX, TorchScript)."""
    where = f"model '{config.name}': sequence_batching"
    inputs = {t.name: t for t in signature.inputs}
    outputs = {t.name: t for t in signature.outputs}
    batch = 1 if config.max_batch_size > 0 else 0
    wanted = [(f"control input '{c.input}'", c.input, c.datatype, inputs, "inputs") for c in policy.controls]
    for s in policy.states:
        wanted.append((f"state input '{s.input}'", s.input, s.datatype, inputs, "inputs"))
        wanted.append((f"state output '{s.output}'", s.output, s.datatype, outputs, "outputs"))
    for what, tensor, dtype, available, kind in wanted:
        found = available.get(tensor)
        if found is None:
            raise ConfigError(
                f"{where}: {what} is not in the model file, whose {kind} are {sorted(available) or 'none'}")
        if found.datatype is not None and found.datatype.name != dtype.name:
            raise ConfigError(
                f"{where}: {what} has data type {dtype.config} in the config but {found.datatype.config} "
                "in the model file")
        if batch and found.shape and found.shape[0] != -1:
            raise ConfigError(
                f"{where}: {what}: max_batch_size is {config.max_batch_size} but the model file fixes its first "
                f"dimension to {found.shape[0]}")
    for s in policy.states:
        found = inputs[s.input]
        if len(found.shape) != len(s.dims) + batch:
            raise ConfigError(
                f"{where}: state input '{s.input}' has dims {list(s.dims)} but the model file's shape is "
                f"{list(found.shape)}" + (" (max_batch_size > 0 adds a batch dimension)" if batch else ""))


def decoupled_problem(config: mc.ModelConfig, backend: BackendCapabilities = TENSOR_BACKEND) -> str | None:
    """Why ``model_transaction_policy`` cannot be honoured by ``backend``, or None."""
    if not config.model_transaction_policy.decoupled:
        return None
    if not backend.decoupled and not config.sequence_batching.iterative_sequence:
        name = config.backend or config.platform
        return (f"model '{config.name}': model_transaction_policy.decoupled is only supported for Python models "
                f"(backend: \"python\") and iterative sequence models (each step's outputs are a response); "
                f"this model's backend is '{name or 'unknown'}'")
    return None

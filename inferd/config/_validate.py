"""Validation of a ``ModelConfig`` at load time.

Every field of ``ModelConfig`` is either honoured or refused here with a
message naming the model, field and value: nothing is silently ignored. The
tables below say which is which; a feature that lands moves its field from
``_REFUSED`` to ``_HONOURED``.
"""

from __future__ import annotations

import math
from pathlib import Path

from inferd._proto import model_config_pb2 as mc
from inferd.config._autocomplete import ModelSignature, SignatureTensor
from inferd.config._batching import check_dynamic_batching
from inferd.config._capabilities import TENSOR_BACKEND, BackendCapabilities
from inferd.config._optimization import check_accelerators, histogram_buckets, metric_tags
from inferd.config._sequence import (
    check_sequence_signature, decoupled_problem, normalize_sequence_batching, sequence_policy, sequence_tensor_names,
)
from inferd.config._spec import ModelSpec, model_spec
from inferd.config._paths import check_inside
from inferd.config._varlen import VarlenSpec, varlen_spec
from inferd.errors import ConfigError

_HONOURED = {
    "name", "platform", "backend", "version_policy", "max_batch_size", "input", "output",
    "instance_group", "default_model_filename", "parameters", "dynamic_batching", "optimization",
    "runtime", "model_warmup", "sequence_batching", "model_transaction_policy", "batch_input", "batch_output",
    "response_cache", "model_metrics", "metric_tags",
}
_REFUSED = {
    "ensemble_scheduling": "ensemble_scheduling is only valid with platform: \"ensemble\"",
    "model_repository_agents": "repository agents are not supported by inferd",
    "cc_model_filenames": "cc_model_filenames (per-GPU-architecture files) is not supported by inferd",
    "model_operations": "model_operations is not supported by inferd",
}
# Optimization settings: graph.level maps onto the runtime's optimization level;
# pinned-memory hints have no effect on CPU instances and are accepted as hints; accelerators and
# the CUDA settings go to the backend, which maps what its runtime can and warns about the rest
# (config/_optimization.py): none of them changes an answer.
_OPTIMIZATION_HONOURED = {"graph", "input_pinned_memory", "output_pinned_memory", "priority", "cuda",
                          "execution_accelerators", "gather_kernel_buffer_threshold", "eager_batching"}


def check_declared(config: mc.ModelConfig, *, model_dir: Path | None = None,
                   refused: dict[str, str] | None = None, backend: BackendCapabilities | None = None) -> None:
    """The checks a config passes on its own, before any model file is read.

    Triton runs these when it reads a config, before it looks for version
    folders, so a broken config is reported for what is wrong in it, not for
    a missing folder: fields inferd refuses, max_batch_size, version_policy,
    optimization, every listed tensor (dims, reshape), instance groups,
    dynamic_batching's ordering rules and sequence_batching. Auto-complete
    only adds tensors to an empty list, so nothing checked here can change.
    ``backend``: the model's, once settled (None before: what depends on it waits for :func:`validate`).
    """
    name = config.name
    table = dict(_REFUSED)
    if refused is not None:
        table.update(refused)
    for field, _ in config.ListFields():
        if field.name in table and field.name not in _HONOURED:
            raise ConfigError(f"model '{name}': field '{field.name}': {table[field.name]}")
        if field.name not in _HONOURED and field.name not in table:
            raise ConfigError(f"model '{name}': field '{field.name}' is not supported by inferd")

    if config.max_batch_size < 0:
        raise ConfigError(f"model '{name}': max_batch_size must be >= 0, got {config.max_batch_size}")
    _check_version_policy(config)
    _check_optimization(config)
    _check_tensors(name, "input", config.input, config.max_batch_size)
    _check_tensors(name, "output", config.output, config.max_batch_size)
    _check_instance_groups(config)
    check_dynamic_batching(config)
    sequence_policy(config, model_dir, backend)


def validate(
    config: mc.ModelConfig,
    *,
    model_dir: Path | None = None,
    signature: ModelSignature | None = None,
    refused: dict[str, str] | None = None,
    backend: BackendCapabilities = TENSOR_BACKEND,
) -> ModelSpec:
    """Check ``config`` (already auto-completed) and return its plain-data spec.

    ``signature`` is what the model file says about its tensors, where the
    backend can tell; ``refused`` lets a caller (the ensemble loader, say)
    override the table of refused fields; ``backend``: the model's, whose
    capabilities decide what its config may ask (the pipeline hands the settled
    one; without it the config is checked as a tensor backend's).
    """
    name = config.name
    check_declared(config, model_dir=model_dir, refused=refused, backend=backend)
    if not config.input and config.platform != "ensemble" and not backend.undeclared_inputs:
        raise ConfigError(f"model '{name}': the config lists no input and the model file does not say")
    if not config.output:
        raise ConfigError(f"model '{name}': the config lists no output and the model file does not say")
    labels: dict[str, tuple[str, ...]] = {}
    for t in config.output:
        if t.label_filename:
            labels[t.name] = _read_labels(name, t, model_dir)
    varlen = varlen_spec(config, backend=backend)
    for t in config.input:
        if varlen is not None and any(f.name == t.name for f in varlen.filled):
            t.optional = True  # inferd fills a mask or lengths input the request leaves out
    _check_warmup(config)
    problem = decoupled_problem(config, backend) or _response_cache_problem(config)
    if problem:
        raise ConfigError(problem)
    normalize_sequence_batching(config)
    sequence = sequence_policy(config, model_dir, backend)
    if signature is not None:
        if sequence is not None:
            check_sequence_signature(config, sequence, signature)
        _check_against_signature(config, signature, varlen)
    # An input and an output may share a name (Triton allows it).
    return model_spec(config, labels, model_dir=model_dir, sequence=sequence, varlen=varlen)


def _response_cache_problem(config: mc.ModelConfig) -> str | None:
    """Where Triton refuses the response cache: sequences and decoupled models (its words)."""
    if not config.response_cache.enable:
        return None
    if config.HasField("sequence_batching"):
        return (f"Response Cache does not currently support model {config.name} with sequence batching "
                "scheduler. Please disable the response cache.")
    if config.model_transaction_policy.decoupled:
        return (f"Response Cache does not currently support model {config.name} with 'decoupled' transaction "
                "policy. Please disable the response cache.")
    return None


def _check_version_policy(config: mc.ModelConfig) -> None:
    vp = config.version_policy
    kind = vp.WhichOneof("policy_choice")
    if kind == "latest" and vp.latest.num_versions < 1:
        raise ConfigError(
            f"model '{config.name}': version_policy.latest.num_versions must be >= 1, "
            f"got {vp.latest.num_versions}"
        )
    if kind == "specific":
        if not vp.specific.versions:
            raise ConfigError(f"model '{config.name}': version_policy.specific lists no versions")
        bad = [v for v in vp.specific.versions if v < 1]
        if bad:
            raise ConfigError(f"model '{config.name}': version_policy.specific.versions must be >= 1, got {bad}")


def _check_optimization(config: mc.ModelConfig) -> None:
    for field, value in config.optimization.ListFields():
        if field.name not in _OPTIMIZATION_HONOURED:
            raise ConfigError(
                f"model '{config.name}': optimization.{field.name} is not supported by inferd "
                f"(supported: {', '.join(sorted(_OPTIMIZATION_HONOURED))})"
            )
    check_accelerators(config)
    histogram_buckets(config)  # refused here, before any model file is read, as Triton does
    metric_tags(config)
    level = config.optimization.graph.level
    if level not in (-1, 0, 1, 2):
        raise ConfigError(f"model '{config.name}': optimization.graph.level must be -1, 0, 1 or 2, got {level}")


def _check_tensors(model: str, kind: str, tensors, max_batch_size: int) -> None:  # type: ignore[no-untyped-def]
    seen: set[str] = set()
    for i, t in enumerate(tensors):
        where = f"model '{model}': {kind}[{i}]"
        if not t.name:
            raise ConfigError(f"{where} has no name")
        where = f"model '{model}': {kind} '{t.name}'"
        if t.name in seen:
            raise ConfigError(f"model '{model}': {kind} name '{t.name}' appears twice")
        seen.add(t.name)
        if t.data_type == mc.TYPE_INVALID:
            raise ConfigError(f"{where}: data_type is missing or TYPE_INVALID")
        if mc.DataType.Name(t.data_type) not in _KNOWN_TYPES:
            raise ConfigError(f"{where}: data_type {mc.DataType.Name(t.data_type)} is not supported")
        if not t.dims:
            raise ConfigError(f"{where}: dims is empty (use dims: [1] with reshape: {{ shape: [] }} for a scalar)")
        _check_dims(where, "dims", t.dims)
        if t.HasField("reshape"):
            _check_dims(where, "reshape.shape", t.reshape.shape)
            _check_reshape(where, list(t.dims), list(t.reshape.shape), max_batch_size)
        if t.is_shape_tensor:
            raise ConfigError(f"{where}: is_shape_tensor is only meaningful for TensorRT and not supported")
        if t.is_non_linear_format_io:
            raise ConfigError(f"{where}: is_non_linear_format_io is not supported")


_KNOWN_TYPES = {
    "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16",
    "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16",
}


def _check_dims(where: str, field: str, dims) -> None:  # type: ignore[no-untyped-def]
    for d in dims:
        if d < -1 or d == 0:
            raise ConfigError(f"{where}: {field} {list(dims)} has {d}; each dimension must be >= 1, or -1 for variable")


def _check_reshape(where: str, dims: list[int], shape: list[int], max_batch_size: int) -> None:
    """Triton's reshape rules: the same elements in both, variable dimensions kept in place."""
    if not shape and max_batch_size == 0:
        raise ConfigError(
            f"{where}: reshape.shape [] on a model that does not batch (max_batch_size 0) would make the tensor a "
            "scalar, which reshape does not support; give reshape.shape at least one dimension, or set "
            "max_batch_size > 0 (an empty reshape means one value per batch row)"
        )
    if (-1 in dims) != (-1 in shape):
        raise ConfigError(f"{where}: reshape.shape {shape} and dims {dims} must both be fixed or both be variable")
    if -1 not in dims:
        if math.prod(dims) != math.prod(shape):
            raise ConfigError(
                f"{where}: reshape.shape {shape} has {math.prod(shape)} elements but dims {dims} has {math.prod(dims)}"
            )
        return
    # Both variable: each run of fixed dimensions before, between and after the
    # variable ones must hold as many elements in both ([2, 4, -1, 6] -> [8, -1, 1, 6]).
    have, want = _runs(dims), _runs(shape)
    if len(have) != len(want):
        raise ConfigError(
            f"{where}: reshape.shape {shape} has {len(want) - 1} variable dimension(s) but dims {dims} has "
            f"{len(have) - 1}; reshape keeps each variable dimension, so both need the same number of -1"
        )
    if have != want:
        raise ConfigError(
            f"{where}: reshape.shape {shape} and dims {dims} hold different numbers of elements around their "
            f"variable dimensions (reshape.shape: {want}, dims: {have}); each run of fixed dimensions before, "
            "between and after the -1s must hold the same number of elements in both"
        )


def _runs(dims: list[int]) -> list[int]:
    """Element counts of the runs of fixed dimensions that the -1s separate."""
    runs, current = [], 1
    for d in dims:
        if d == -1:
            runs.append(current)
            current = 1
        else:
            current *= d
    return runs + [current]


def _read_labels(model: str, t: mc.ModelOutput, model_dir: Path | None) -> tuple[str, ...]:
    check_inside(t.label_filename, f"model '{model}': output '{t.name}': label_filename")
    if model_dir is None:
        return ()
    path = model_dir / t.label_filename
    try:
        return tuple(line.rstrip("\r\n") for line in path.read_text().splitlines())
    except OSError:
        raise ConfigError(
            f"model '{model}': output '{t.name}': label_filename '{t.label_filename}' not found in {model_dir}"
        ) from None


def _check_instance_groups(config: mc.ModelConfig) -> None:
    for i, g in enumerate(config.instance_group):
        where = f"model '{config.name}': instance_group[{i}]"
        if g.count < 0:
            raise ConfigError(f"{where}: count must be >= 1, got {g.count}")
        if g.kind == mc.ModelInstanceGroup.KIND_CPU and g.gpus:
            raise ConfigError(f"{where}: kind KIND_CPU cannot list gpus {list(g.gpus)}")
        if g.kind == mc.ModelInstanceGroup.KIND_MODEL:
            raise ConfigError(f"{where}: kind KIND_MODEL is not supported; use KIND_CPU, KIND_GPU or KIND_AUTO")
        if any(gpu < 0 for gpu in g.gpus):
            raise ConfigError(f"{where}: gpus {list(g.gpus)} must be >= 0")
        _check_rate_limiter(where, g.rate_limiter)
        for field in ("secondary_devices", "profile", "passive", "host_policy"):
            value = getattr(g, field)
            if (field in ("passive", "host_policy") and value) or (
                field not in ("passive", "host_policy") and (value if not hasattr(value, "ListFields") else value.ListFields())
            ):
                raise ConfigError(f"{where}: {field} is not supported by inferd")


def _check_rate_limiter(where: str, limiter: mc.ModelRateLimiter) -> None:
    seen: set[str] = set()
    for j, r in enumerate(limiter.resources):
        if not r.name:
            raise ConfigError(f"{where}: rate_limiter.resources[{j}] has no name")
        if r.name in seen:
            raise ConfigError(f"{where}: rate_limiter lists resource '{r.name}' twice; give it once, with the "
                              "count one instance needs")
        seen.add(r.name)


def _check_warmup(config: mc.ModelConfig) -> None:
    """Triton's ModelWarmup: each sample names real inputs with their type, concrete
    dims and one data source; its batch fits the model. Files are read at load."""
    inputs = {t.name: t for t in config.input}
    for i, w in enumerate(config.model_warmup):
        where = f"model '{config.name}': model_warmup[{i}]"
        if not w.name:
            raise ConfigError(f"{where}: name is required")
        where = f"model '{config.name}': model_warmup '{w.name}'"
        if config.max_batch_size > 0 and w.batch_size > config.max_batch_size:
            raise ConfigError(f"{where}: batch_size {w.batch_size} exceeds max_batch_size {config.max_batch_size}")
        if config.max_batch_size == 0 and w.batch_size > 1:
            raise ConfigError(f"{where}: batch_size must be 1 for a model that does not batch (max_batch_size 0), "
                              f"got {w.batch_size}")
        for name in sorted(w.inputs):
            inp = w.inputs[name]
            t = inputs.get(name)
            at = f"{where}: input '{name}'"
            if t is None:
                raise ConfigError(f"{at} is not an input of the model (its inputs are {sorted(inputs)})")
            if inp.data_type != t.data_type:
                raise ConfigError(f"{at}: data_type {mc.DataType.Name(inp.data_type)} does not match the input's "
                                  f"{mc.DataType.Name(t.data_type)}")
            dims = list(inp.dims)
            want = list(t.dims)
            if any(d < 1 for d in dims) or len(dims) != len(want) or any(
                    w_ != -1 and d != w_ for d, w_ in zip(dims, want)):
                raise ConfigError(f"{at}: dims {dims} must be concrete (each >= 1) and match the input's dims {want}"
                                  " (without the batch dimension)")
            if inp.WhichOneof("input_data_type") is None:
                raise ConfigError(f"{at}: give one of zero_data, random_data or input_data_file")
            if inp.WhichOneof("input_data_type") == "input_data_file":
                check_inside(inp.input_data_file, f"{at}: input_data_file")
        missing = [n for n, t in inputs.items() if n not in w.inputs and not getattr(t, "optional", False)]
        if missing:
            raise ConfigError(f"{where}: no data for inputs {missing}; a warm-up sample gives every input")


def _check_against_signature(config: mc.ModelConfig, signature: ModelSignature, varlen: VarlenSpec | None) -> None:
    batch = 1 if config.max_batch_size > 0 else 0
    model_inputs = {t.name: t for t in signature.inputs}
    model_outputs = {t.name: t for t in signature.outputs}
    ragged = varlen.ragged if varlen is not None else frozenset()
    scattered = {n for b in varlen.batch_outputs for n in b.targets} if varlen is not None else set()
    for kind, tensors, available in (
        ("input", config.input, model_inputs),
        ("output", config.output, model_outputs),
    ):
        for t in tensors:
            where = f"model '{config.name}': {kind} '{t.name}'"
            found = available.get(t.name)
            if found is None:
                raise ConfigError(
                    f"{where} is not in the model file, whose {kind}s are {sorted(available) or 'none'}"
                )
            if t.name in ragged or t.name in scattered:
                _compare_ragged(where, t, found, ragged=t.name in ragged)
            else:
                _compare(where, config, t, found, batch)
    made = set()
    for b in varlen.batch_inputs if varlen is not None else ():
        for target in b.targets:
            found = model_inputs.get(target)
            where = f"model '{config.name}': batch_input target '{target}'"
            if found is None:
                raise ConfigError(f"{where} is not an input of the model file, whose inputs are {sorted(model_inputs)}")
            if found.datatype is not None and found.datatype.numpy != b.dtype:
                raise ConfigError(f"{where}: the batch input's data type ({b.dtype}) contradicts the model file, "
                                  f"which has {found.datatype.config}")
            made.add(target)
    listed = {t.name for t in config.input} | sequence_tensor_names(config)[0] | made
    for name, t in model_inputs.items():
        if name not in listed and not t.optional:
            raise ConfigError(f"model '{config.name}': the model file has input '{name}' that the config does not list")


def _compare_ragged(where: str, t, found: SignatureTensor, ragged: bool) -> None:  # type: ignore[no-untyped-def]
    """A ragged input reaches the model as one 1-D concatenation; a batch output's shape is the model's own."""
    declared = mc.DataType.Name(t.data_type)
    if found.datatype is not None and found.datatype.config != declared:
        raise ConfigError(f"{where}: data_type {declared} contradicts the model file, which has {found.datatype.config}")
    if ragged and list(found.shape) != [-1]:
        raise ConfigError(f"{where}: allow_ragged_batch expects the model file to take it with shape [-1] (the "
                          f"requests' elements concatenated), but the model file has {list(found.shape)}")


def _compare(where: str, config: mc.ModelConfig, t, found: SignatureTensor, batch: int) -> None:  # type: ignore[no-untyped-def]
    declared = mc.DataType.Name(t.data_type)
    if found.datatype is not None and found.datatype.config != declared:
        raise ConfigError(f"{where}: data_type {declared} contradicts the model file, which has {found.datatype.config}")
    shape = list(t.reshape.shape) if t.HasField("reshape") else list(t.dims)
    if len(found.shape) != len(shape) + batch:
        full = (["-1 (batch)"] if batch else []) + [str(d) for d in shape]
        raise ConfigError(
            f"{where}: dims {list(t.dims)} (model shape [{', '.join(full)}]) contradict the model file's "
            f"shape {list(found.shape)}"
            + (" (max_batch_size > 0 adds a batch dimension)" if batch else "")
        )
    if batch and found.shape[0] != -1:
        raise ConfigError(
            f"{where}: max_batch_size is {config.max_batch_size} but the model file fixes the first "
            f"dimension to {found.shape[0]}, so it cannot batch"
        )
    for i, (want, have) in enumerate(zip(shape, found.shape[batch:])):
        if want != -1 and have != -1 and want != have:
            raise ConfigError(
                f"{where}: dims {list(t.dims)} contradict the model file's shape {list(found.shape)} "
                f"at dimension {i + batch} ({want} vs {have})"
            )

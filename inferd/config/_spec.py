"""Plain-data views of a validated config, for the layers below it.

:func:`model_spec` turns a checked ``ModelConfig`` into a :class:`ModelSpec`:
tensors, instance groups, warm-up samples, the transaction policy, the
dynamic and sequence batching blocks, and the backend's parameters. The rest
of the server reads these and never the protobuf; ``ModelSpec.config`` keeps
the message only to be handed back as it is (the ModelConfig RPC) or rendered
here (:meth:`ModelSpec.config_dict`, :meth:`ModelSpec.config_bytes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferd._proto import model_config_pb2 as mc
from inferd.config._openai import OpenAISpec, openai_spec
from inferd.config._batching import DynamicBatching, dynamic_batching
from inferd.config._parameters import InferdParameters
from inferd.config._optimization import Optimization, histogram_buckets, metric_tags, optimization
from inferd.config._parse import message_to_dict
from inferd.config._sequence import SequencePolicy, sequence_policy
from inferd.config._varlen import VarlenSpec, varlen_spec
from inferd.dtypes import BY_CONFIG, DataType

# Instance kinds, as the config names them.
KIND_AUTO, KIND_CPU, KIND_GPU = "KIND_AUTO", "KIND_CPU", "KIND_GPU"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    name: str
    datatype: DataType
    dims: tuple[int, ...]  # as the client sees it, without the batch dimension
    model_dims: tuple[int, ...]  # as the model sees it (reshape), without batch
    optional: bool = False
    labels: tuple[str, ...] = ()
    reshaped: bool = field(init=False)  # the model sees other dims than the client (read per request)

    def __post_init__(self) -> None:
        object.__setattr__(self, "reshaped", self.dims != self.model_dims)


@dataclass(frozen=True, slots=True)
class RateLimitResource:
    """One resource of an instance group's ``rate_limiter``: ``count`` units per execution."""

    name: str
    count: int
    is_global: bool = False  # shared by every device, not one per device


@dataclass(frozen=True, slots=True)
class InstanceGroup:
    """One ``instance_group``: ``count`` instances of ``kind`` (on each of ``gpus`` for KIND_GPU);
    ``rate_limited``: it has a ``rate_limiter`` block (``resources``, ``rate_priority``)."""

    name: str  # "" : named after the model and the group's index
    kind: str  # KIND_AUTO, KIND_CPU or KIND_GPU
    count: int
    gpus: tuple[int, ...] = ()
    rate_limited: bool = False
    resources: tuple[RateLimitResource, ...] = ()
    rate_priority: int = 0


@dataclass(frozen=True, slots=True)
class WarmupInput:
    dims: tuple[int, ...]
    data: str | None  # "zero_data", "random_data", "input_data_file" (None: zeros)
    file: str = ""  # input_data_file: a file in <model>/warmup/


@dataclass(frozen=True, slots=True)
class WarmupSample:
    """One ``model_warmup`` entry: ``batch_size`` requests of ``inputs``, run ``count`` times."""

    name: str
    batch_size: int
    count: int
    inputs: tuple[tuple[str, WarmupInput], ...]  # by input name, sorted


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    params: InferdParameters
    config: mc.ModelConfig = field(repr=False)  # opaque below config/: handed back as it is
    decoupled: bool = False  # model_transaction_policy.decoupled: any number of responses per request
    parameters: dict[str, str] = field(default_factory=dict)  # the config's parameters (backend settings)
    graph_optimization_level: int = 0  # optimization.graph.level
    instance_groups: tuple[InstanceGroup, ...] = ()
    warmup: tuple[WarmupSample, ...] = ()
    dynamic_batching: DynamicBatching | None = None
    sequence: SequencePolicy | None = None  # sequence_batching
    # Variable-length batching (padding, ragged batching), None without it.
    varlen: VarlenSpec | None = None
    # Model inputs inferd makes for Triton's batch_input: not config inputs, so not in ``inputs``
    # (what a client may send, what model metadata lists). A mask or lengths input (inferd.padding)
    # is in ``inputs``, optional: inferd fills it when a request leaves it out.
    filled_inputs: dict[str, TensorSpec] = field(default_factory=dict)
    response_cache: bool = False  # response_cache.enable: used when the server has a cache
    openai: OpenAISpec | None = None  # served under /v1 (config/_openai.py)
    # optimization.execution_accelerators / cuda / ...: what the backend may map onto its runtime.
    optimization: Optimization = Optimization()
    histogram_buckets: dict[str, tuple[float, ...]] = field(default_factory=dict)  # model_metrics, by family
    metric_tags: tuple[tuple[str, str], ...] = ()  # extra labels on this model's /metrics series
    load_warnings: tuple[str, ...] = ()  # said once when the model loads (model_metrics families ignored)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def config_dict(self) -> dict[str, Any]:
        """The config as Triton shows it in JSON (a Python model's ``args["model_config"]``)."""
        return message_to_dict(self.config)

    def config_bytes(self) -> bytes:
        """The config, serialized deterministically: equal bytes, equal configs (reload checks)."""
        return self.config.SerializeToString(deterministic=True)


def tensor_spec(t: mc.ModelInput | mc.ModelOutput, labels: tuple[str, ...] = ()) -> TensorSpec:
    dims = tuple(int(d) for d in t.dims)
    model_dims = tuple(int(d) for d in t.reshape.shape) if t.HasField("reshape") else dims
    return TensorSpec(
        name=t.name,
        datatype=BY_CONFIG[mc.DataType.Name(t.data_type)],
        dims=dims,
        model_dims=model_dims,
        optional=bool(getattr(t, "optional", False)),
        labels=labels,
    )


def _instance_groups(config: mc.ModelConfig) -> tuple[InstanceGroup, ...]:
    return tuple(
        InstanceGroup(g.name, mc.ModelInstanceGroup.Kind.Name(g.kind), int(g.count), tuple(int(x) for x in g.gpus),
                      rate_limited=g.HasField("rate_limiter"),
                      resources=tuple(RateLimitResource(r.name, int(r.count), bool(getattr(r, "global")))
                                      for r in g.rate_limiter.resources),
                      rate_priority=int(g.rate_limiter.priority))
        for g in config.instance_group
    )


def _warmup(config: mc.ModelConfig) -> tuple[WarmupSample, ...]:
    samples = []
    for w in config.model_warmup:
        inputs = []
        for name in sorted(w.inputs):
            inp = w.inputs[name]
            inputs.append((name, WarmupInput(tuple(int(d) for d in inp.dims), inp.WhichOneof("input_data_type"),
                                             inp.input_data_file)))
        samples.append(WarmupSample(w.name, int(w.batch_size), int(w.count), tuple(inputs)))
    return tuple(samples)


def model_spec(config: mc.ModelConfig, labels: dict[str, tuple[str, ...]] | None = None, *,
               model_dir: Path | None = None, sequence: SequencePolicy | None = None,
               varlen: VarlenSpec | None = None) -> ModelSpec:
    """The plain view of a checked ``config``; ``sequence`` and ``varlen``: its sequence policy
    and variable-length batching when the caller has them already (checked against its backend:
    :func:`~inferd.config.validate`; else they are read, with ``model_dir`` for initial-state files)."""
    labels = labels or {}
    if sequence is None:
        sequence = sequence_policy(config, model_dir)
    params = InferdParameters.from_config(config)
    if varlen is None:
        varlen = varlen_spec(config, params)
    filled_inputs = {}
    for b in varlen.batch_inputs if varlen is not None else ():
        dtype = BY_CONFIG["TYPE_INT32" if b.dtype == "int32" else "TYPE_FP32"]
        for target in b.targets:
            filled_inputs[target] = TensorSpec(target, dtype, (-1,), (-1,))
    buckets, bucket_warnings = histogram_buckets(config)
    return ModelSpec(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        inputs={t.name: tensor_spec(t) for t in config.input},
        outputs={t.name: tensor_spec(t, labels.get(t.name, ())) for t in config.output},
        params=params,
        config=config,
        decoupled=bool(config.model_transaction_policy.decoupled),
        parameters={k: v.string_value for k, v in config.parameters.items()},
        graph_optimization_level=int(config.optimization.graph.level),
        instance_groups=_instance_groups(config),
        warmup=_warmup(config),
        dynamic_batching=dynamic_batching(config),
        sequence=sequence,
        varlen=varlen,
        filled_inputs=filled_inputs,
        response_cache=bool(config.response_cache.enable),
        openai=openai_spec(config, model_dir),
        optimization=optimization(config),
        histogram_buckets=buckets,
        metric_tags=metric_tags(config),
        load_warnings=tuple(bucket_warnings),
    )

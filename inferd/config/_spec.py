"""Plain-data views of a validated config, for the layers below it."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferd._proto import model_config_pb2 as mc
from inferd.config._parameters import InferdParameters
from inferd.config._varlen import VarlenSpec, varlen_spec
from inferd.dtypes import BY_CONFIG, DataType


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
class ModelSpec:
    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    params: InferdParameters
    config: mc.ModelConfig = field(repr=False)
    # Variable-length batching (padding, ragged batching), None without it.
    varlen: VarlenSpec | None = None
    # Model inputs inferd makes for Triton's batch_input: not config inputs, so not in ``inputs``
    # (what a client may send, what model metadata lists). A mask or lengths input (inferd.padding)
    # is in ``inputs``, optional: inferd fills it when a request leaves it out.
    filled_inputs: dict[str, TensorSpec] = field(default_factory=dict)

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0


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


def model_spec(config: mc.ModelConfig, labels: dict[str, tuple[str, ...]] | None = None) -> ModelSpec:
    labels = labels or {}
    params = InferdParameters.from_config(config)
    varlen = varlen_spec(config, params)
    filled_inputs = {}
    for b in varlen.batch_inputs if varlen is not None else ():
        dtype = BY_CONFIG["TYPE_INT32" if b.dtype == "int32" else "TYPE_FP32"]
        for target in b.targets:
            filled_inputs[target] = TensorSpec(target, dtype, (-1,), (-1,))
    return ModelSpec(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        inputs={t.name: tensor_spec(t) for t in config.input},
        outputs={t.name: tensor_spec(t, labels.get(t.name, ())) for t in config.output},
        params=params,
        config=config,
        varlen=varlen,
        filled_inputs=filled_inputs,
    )

"""Filling in what a config leaves out, from the model file's own signature.

As Triton does: a missing ``input``/``output`` list is taken from the model;
a model whose every tensor has a variable first dimension, given no
``max_batch_size``, is taken to batch, with Triton's default maximum of 4 and
``dynamic_batching`` on.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferd._proto import model_config_pb2 as mc
from inferd.dtypes import DataType
from inferd.config._sequence import sequence_tensor_names

DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config default-max-batch-size


@dataclass(frozen=True, slots=True)
class SignatureTensor:
    name: str
    datatype: DataType | None  # None: the model accepts several types (python models)
    shape: tuple[int, ...]  # -1 for a variable dimension, including the batch one
    # The model has a default for it (an ONNX initializer a request may override):
    # a config may list it, and need not; auto-complete leaves it out, as Triton does.
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelSignature:
    """What a model file says about its own tensors."""

    inputs: tuple[SignatureTensor, ...]
    outputs: tuple[SignatureTensor, ...]

    def all_batchable(self) -> bool:
        tensors = tuple(t for t in self.inputs if not t.optional) + self.outputs
        return bool(tensors) and all(len(t.shape) >= 1 and t.shape[0] == -1 for t in tensors)


def autocomplete(config: mc.ModelConfig, signature: ModelSignature) -> None:
    """Complete ``config`` in place from ``signature``; never overrides what is set."""
    if not config.input and not config.output and config.max_batch_size == 0:
        if signature.all_batchable():
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
            if not config.HasField("dynamic_batching") and not config.HasField("sequence_batching"):
                config.dynamic_batching.SetInParent()
    strip = 1 if config.max_batch_size > 0 else 0
    # The sequence batcher supplies control and state inputs and consumes state outputs.
    supplied, consumed = sequence_tensor_names(config)
    if not config.input:
        for t in signature.inputs:
            if not t.optional and t.name not in supplied:
                _add(config.input.add(), t, strip)
    if not config.output:
        for t in signature.outputs:
            if t.name not in consumed:
                _add(config.output.add(), t, strip)


def _add(target: mc.ModelInput | mc.ModelOutput, t: SignatureTensor, strip: int) -> None:
    target.name = t.name
    if t.datatype is not None:
        target.data_type = mc.DataType.Value(t.datatype.config)
    dims = list(t.shape[strip:]) or [1]
    if not t.shape[strip:]:
        # A scalar per batch item: Triton presents it as [1] reshaped to [].
        target.reshape.SetInParent()
    target.dims.extend(dims)

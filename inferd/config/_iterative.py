"""``sequence_batching { iterative_sequence: true }``: the checks of its own.

An iterative sequence is one request that the sequence batcher runs step by
step (continuous batching). A Python model ends a sequence by releasing its
request without ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``; a tensor step
model (ONNX, TorchScript) has no such call, so it names an output that ends
the sequence when nonzero (``inferd.iterative_end_output``), or each request
gives its ``max_tokens``.
"""

from __future__ import annotations

import math

from inferd._proto import model_config_pb2 as mc
from inferd.config._capabilities import TENSOR_BACKEND, BackendCapabilities
from inferd.errors import ConfigError

END_OUTPUT = "inferd.iterative_end_output"
_END_TYPES = ("TYPE_BOOL", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64",
              "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64")


def end_output(config: mc.ModelConfig) -> str:
    """The tensor step model's end output ('' when it has none)."""
    param = config.parameters.get(END_OUTPUT)
    return param.string_value.strip() if param is not None else ""


def check_iterative(config: mc.ModelConfig, where: str,
                    backend: BackendCapabilities | None = TENSOR_BACKEND) -> None:
    """The end output's checks; ``backend`` None: not settled yet (a config checked before its
    backend is known), so they wait for validation, which is handed it."""
    name = end_output(config)
    if not name or backend is None:
        return
    if backend.ends_sequences_by_release:
        raise ConfigError(
            f"model '{config.name}': parameter '{END_OUTPUT}' is for tensor step models; a model of "
            f"backend '{backend.name}' ends its sequence by releasing the request without "
            "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE")
    found = next((t for t in config.output if t.name == name), None)
    if found is None:
        raise ConfigError(
            f"model '{config.name}': parameter '{END_OUTPUT}' names output '{name}', which is not in the config's "
            f"outputs {[t.name for t in config.output]}")
    dtype = mc.DataType.Name(found.data_type)
    if dtype not in _END_TYPES:
        raise ConfigError(
            f"{where}: end output '{name}' has data type {dtype}; it must be TYPE_BOOL or an integer type")
    if math.prod(int(d) for d in found.dims) != 1:
        raise ConfigError(f"{where}: end output '{name}' must hold one value per row (dims [1]), "
                          f"got dims {list(found.dims)}")

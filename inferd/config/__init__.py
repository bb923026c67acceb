"""Model configuration: parse ``config.pbtxt``, auto-complete it, validate it.

The protobuf ``ModelConfig`` stops here. The public surface is the pipeline
(:func:`prepare_config` for a model folder, :func:`prepare_ensemble_config`
for an ensemble's, and the pieces they are made of: parse, auto-complete,
validate, select versions) and the plain-data specs the layers below the
config read instead of protobuf: :class:`ModelSpec` (tensors, instance
groups, warm-up, transaction policy, batching blocks, backend parameters),
:class:`EnsembleConfig`, :class:`DynamicBatching`, the sequence policy.
``ModelConfig`` is exported as a type only, for code that passes a message
through without reading it (and the backends' config hooks, which complete it).
"""

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.config._autocomplete import ModelSignature, SignatureTensor, autocomplete
from inferd.config._capabilities import TENSOR_BACKEND, BackendCapabilities
from inferd.config._batching import DELAY, REJECT, DynamicBatching, QueuePolicy, dynamic_batching
from inferd.config._ensemble import (
    EnsembleConfig, StepConfig, check_ensemble_config, declared_tensors, ensemble_config, is_ensemble,
    prepare_ensemble_config, read_ensemble_config,
)
from inferd.config._openai import OpenAIModel, OpenAISpec
from inferd.config._optimization import Accelerator, CudaOptions, Optimization, ignored_line
from inferd.config._parameters import InferdParameters
from inferd.config._parse import (
    config_from_dict, config_from_json, config_to_json, config_to_text, message_to_dict, parse_config_file,
    parse_config_text,
)
from inferd.config._placement import placements, settle_groups
from inferd.config._prepare import (
    BackendResolver, ConfigCompleter, PreparedConfig, check_name, prepare_config, read_model_config, select_versions,
)
from inferd.config._sequence import CORRID, END, READY, START, Control, SequencePolicy, StateSpec
from inferd.config._spec import (
    KIND_AUTO, KIND_CPU, KIND_GPU, InstanceGroup, ModelSpec, RateLimitResource, TensorSpec, WarmupInput, WarmupSample,
    model_spec,
)
from inferd.config._validate import check_declared, validate
from inferd.config._varlen import (
    LENGTHS, MASK, BatchInput, BatchOutput, FilledInput, PaddedInput, Unpad, VarlenSpec, varlen_spec,
)

__all__ = [
    "CORRID", "DELAY", "END", "KIND_AUTO", "KIND_CPU", "KIND_GPU", "LENGTHS", "MASK", "READY", "REJECT", "START",
    "BatchInput", "BatchOutput", "FilledInput", "PaddedInput", "Unpad", "VarlenSpec", "varlen_spec",
    "TENSOR_BACKEND", "BackendCapabilities", "BackendResolver", "ConfigCompleter", "Control", "DynamicBatching", "EnsembleConfig", "InferdParameters",
    "InstanceGroup", "ModelConfig", "OpenAIModel", "OpenAISpec", "ModelSignature", "ModelSpec", "PreparedConfig", "QueuePolicy",
    "RateLimitResource", "SequencePolicy", "SignatureTensor", "StateSpec", "StepConfig", "TensorSpec", "WarmupInput",
    "WarmupSample", "autocomplete", "check_declared", "check_ensemble_config", "check_name", "config_from_dict", "declared_tensors",
    "config_from_json", "config_to_json", "config_to_text",
    "dynamic_batching", "ensemble_config", "is_ensemble", "message_to_dict", "model_spec", "parse_config_file",
    "parse_config_text", "placements", "prepare_config", "prepare_ensemble_config", "read_ensemble_config",
    "read_model_config", "select_versions", "settle_groups", "validate",
    "Accelerator", "CudaOptions", "Optimization", "ignored_line",
]

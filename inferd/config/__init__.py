"""Model configuration: parse ``config.pbtxt``, auto-complete it, validate it.

The public surface is :func:`parse_config_text`, :func:`autocomplete`,
:func:`validate` and the plain-data views (:class:`TensorSpec`,
:class:`ModelSpec`) that the layers below the config use instead of protobuf.
"""

from inferd.config._parse import config_to_json, message_to_dict, parse_config_file, parse_config_text
from inferd.config._spec import ModelSpec, TensorSpec, model_spec
from inferd.config._validate import validate
from inferd.config._autocomplete import autocomplete, ModelSignature, SignatureTensor
from inferd.config._parameters import InferdParameters
from inferd.config._varlen import (
    LENGTHS, MASK, BatchInput, BatchOutput, FilledInput, PaddedInput, Unpad, VarlenSpec, varlen_spec,
)

__all__ = [
    "LENGTHS",
    "MASK",
    "BatchInput",
    "BatchOutput",
    "FilledInput",
    "PaddedInput",
    "Unpad",
    "VarlenSpec",
    "varlen_spec",
    "InferdParameters",
    "ModelSignature",
    "ModelSpec",
    "SignatureTensor",
    "TensorSpec",
    "autocomplete",
    "config_to_json",
    "message_to_dict",
    "model_spec",
    "parse_config_file",
    "parse_config_text",
    "validate",
]

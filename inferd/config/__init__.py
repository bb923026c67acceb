"""Model configuration: parse ``config.pbtxt``, auto-complete it, validate it.

The public surface is :func:`parse_config_text`, :func:`autocomplete`,
:func:`check_declared` (what a config passes on its own, before any model
file is read), :func:`validate` and the plain-data views (:class:`TensorSpec`,
:class:`ModelSpec`) that the layers below the config use instead of protobuf.
"""

from inferd.config._parse import config_to_json, message_to_dict, parse_config_file, parse_config_text
from inferd.config._spec import ModelSpec, TensorSpec, model_spec
from inferd.config._validate import check_declared, validate
from inferd.config._autocomplete import autocomplete, ModelSignature, SignatureTensor
from inferd.config._parameters import InferdParameters

__all__ = [
    "InferdParameters",
    "ModelSignature",
    "ModelSpec",
    "SignatureTensor",
    "TensorSpec",
    "autocomplete",
    "check_declared",
    "config_to_json",
    "message_to_dict",
    "model_spec",
    "parse_config_file",
    "parse_config_text",
    "validate",
]

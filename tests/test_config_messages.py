"""Config mistakes get a did-you-mean: misspelt fields (at any depth), enum values (with
the valid ones listed) and ``inferd.*`` parameter keys; in config.pbtxt and in a JSON override."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from repo_builder import add_model, config

from inferd._proto import model_config_pb2 as mc
from inferd.config import InferdParameters, parse_config_text
from inferd.config._parse import config_from_json
from inferd.errors import ConfigError, InvalidArgument
from inferd.examples import onnx_models as om


def _refusal(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config_text(text, model="m")
    return info.value.message


@pytest.mark.parametrize("text, expected", [
    ("max_batch_sise: 4", "model 'm': config.pbtxt line 1: ModelConfig has no field 'max_batch_sise'; "
                          "did you mean 'max_batch_size'?"),
    ('name: "m"\ninput [ { name: "a" dim: [ 1 ] } ]', "config.pbtxt line 2: ModelInput has no field 'dim'; "
                                                     "did you mean 'dims'?"),
    ("dynamic_batching { max_queue_delay_microsecond: 5 }",
     "ModelDynamicBatching has no field 'max_queue_delay_microsecond'; did you mean 'max_queue_delay_microseconds'?"),
])
def test_a_misspelt_field_gets_the_closest_name(text: str, expected: str) -> None:
    assert expected in _refusal(text)


def test_a_field_far_from_any_lists_the_message_fields() -> None:
    message = _refusal("zzzz: 3")
    assert "ModelConfig has no field 'zzzz'; its fields: name, platform, backend," in message
    assert "did you mean" not in message


def test_a_misspelt_enum_value_gets_the_closest_and_the_valid_ones() -> None:
    message = _refusal('input [ { name: "a" data_type: TYPE_INT23 dims: [ 1 ] } ]')
    assert "'TYPE_INT23' is not a DataType; did you mean 'TYPE_INT32'? (valid: TYPE_BOOL, TYPE_UINT8," in message
    assert "TYPE_INVALID" not in message
    message = _refusal("instance_group [ { kind: KIND_CPUU } ]")
    assert "'KIND_CPUU' is not a ModelInstanceGroup.Kind; did you mean 'KIND_CPU'?" in message
    assert "(valid: KIND_AUTO, KIND_GPU, KIND_CPU, KIND_MODEL)" in message


def test_other_parse_errors_keep_protobufs_words() -> None:
    assert "Couldn't parse integer" in _refusal('max_batch_size: "x"')


def test_a_json_override_gets_the_same_hints() -> None:
    for text, expected in [('{"max_batch_sise": 3}', "did you mean 'max_batch_size'?"),
                           ('{"input": [{"data_type": "TYPE_FP23"}]}', "did you mean 'TYPE_FP32'?")]:
        with pytest.raises(InvalidArgument, match="failed to load 'm': parameter 'config': ") as info:
            config_from_json("m", text)
        assert expected in info.value.message


def test_a_misspelt_inferd_parameter_gets_the_closest_key() -> None:
    config = mc.ModelConfig(name="m")
    config.parameters["inferd.split_large_request"].string_value = "true"
    with pytest.raises(ConfigError) as info:
        InferdParameters.from_config(config)
    assert ("unknown parameter 'inferd.split_large_request'; did you mean 'inferd.split_large_requests'? "
            "(known inferd parameters: inferd.batch_wait, inferd.default_priority_level, inferd.execution,") in info.value.message


def test_inferd_check_shows_the_hint(tmp_path: Path) -> None:
    text = config("typo", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 0)
    add_model(tmp_path, "typo", om.identity(np.float32, [4], batch=False), text.replace("max_batch_size", "max_batch_sise"))
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", "check", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert "typo: UNAVAILABLE: model 'typo': config.pbtxt line" in proc.stdout
    assert "has no field 'max_batch_sise'; did you mean 'max_batch_size'?" in proc.stdout

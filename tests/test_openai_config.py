"""A model's /v1 settings (inferd/config/_openai.py), read and checked at load: what a typo, a bad value or a
missing file is told, and what a good config gives. No server."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tokenizers")

from inferd.config import parse_config_text  # noqa: E402
from inferd.config._openai import openai_spec  # noqa: E402
from inferd.errors import ConfigError  # noqa: E402
from inferd.examples import text_assets  # noqa: E402

_GENERATOR = '''name: "g"
backend: "python"
max_batch_size: 4
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
'''
_ENCODER = '''name: "e"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "IDS" data_type: TYPE_INT64 dims: [ -1 ] } ]
output [ { name: "VEC" data_type: TYPE_FP32 dims: [ -1, 8 ] } ]
'''


def _config(base: str, **params: str):  # type: ignore[no-untyped-def]
    text = base + "".join(f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in params.items())
    return parse_config_text(text, model="m")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "tokenizer.json").write_bytes(text_assets.byte_tokenizer())
    (tmp_path / "chat_template.jinja").write_text(text_assets.CHAT_TEMPLATE)
    return tmp_path


def test_a_chat_model_gets_its_tokenizer_template_and_tensors(folder):
    spec = openai_spec(_config(_GENERATOR, **{"inferd.openai": "chat", "inferd.openai.max_context": "64"}), folder)
    assert spec is not None and spec.kind == "chat"
    assert spec.chat_template == text_assets.CHAT_TEMPLATE and spec.tokenizer
    assert (spec.text_input, spec.text_output, spec.text_shape, spec.max_context) == ("PROMPT", "TEXT", (1, 1), 64)
    assert spec.without_assets().tokenizer == "" and spec.without_assets().digest == spec.digest
    assert openai_spec(_config(_GENERATOR), folder) is None


@pytest.mark.parametrize("params, words", [
    ({"inferd.openai": "chatbot"}, "must be one of chat, completion, embedding, got 'chatbot'"),
    ({"inferd.openai": "chat", "inferd.openai.tokeniser": "t.json"}, "did you mean 'inferd.openai.tokenizer'"),
    ({"inferd.openai": "chat", "inferd.openai.tokenizer": "missing.json"}, "no file 'missing.json'"),
    ({"inferd.openai": "chat", "inferd.openai.tokenizer": "../t.json"}, "inside the model's folder"),
    ({"inferd.openai": "chat", "inferd.openai.max_context": "-1"}, "must be an integer >= 0, got '-1'"),
    ({"inferd.openai": "chat", "inferd.openai.text_input": "NOPE"}, "names 'NOPE', which is not an input"),
])
def test_wrong_settings_fail_the_load_naming_them(folder, params, words):
    with pytest.raises(ConfigError) as info:
        openai_spec(_config(_GENERATOR, **params), folder)
    assert words in info.value.message and "model 'g'" in info.value.message


def test_a_broken_template_or_tokenizer_is_refused(folder):
    (folder / "chat_template.jinja").write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="chat_template line 1"):
        openai_spec(_config(_GENERATOR, **{"inferd.openai": "chat"}), folder)
    (folder / "tokenizer.json").write_text("{}")
    with pytest.raises(ConfigError, match="not a tokenizer.json"):
        openai_spec(_config(_GENERATOR, **{"inferd.openai": "completion"}), folder)


def test_embedding_pooling_and_dimensions(folder):
    spec = openai_spec(_config(_ENCODER, **{"inferd.openai": "embedding", "inferd.openai.pooling": "mean",
                                            "inferd.openai.dimensions": "4,2"}), folder)
    assert spec is not None
    assert (spec.ids_input, spec.ids_dtype, spec.embedding_output, spec.pooling, spec.dimensions,
            spec.full_dimension) == ("IDS", "int64", "VEC", "mean", (2, 4), 8)
    with pytest.raises(ConfigError, match=r"must have dims \[dim\]"):
        openai_spec(_config(_ENCODER, **{"inferd.openai": "embedding"}), folder)
    with pytest.raises(ConfigError, match="sizes 1..8"):
        openai_spec(_config(_ENCODER, **{"inferd.openai": "embedding", "inferd.openai.pooling": "mean",
                                         "inferd.openai.dimensions": "9"}), folder)

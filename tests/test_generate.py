"""Triton's generate extension on HTTP against a real server: POST .../generate and
.../generate_stream (server-sent events), the JSON mapping of inputs, parameters and
outputs, plain and decoupled models, and the errors."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from conftest import running
from inferd.examples.build import build_repository
from repo_builder import add_model, config

# A plain Python model: text_output = text_input upper-cased + the 'suffix' parameter;
# tokens = max_tokens * 2; the request's parameters come back as JSON in 'params'.
_TEXT_MODEL = b'''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            tokens = pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy()
            params = json.loads(request.parameters())
            reply = text.decode().upper() + str(params.get("suffix", ""))
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", np.array([reply.encode()], dtype=np.object_)),
                pb_utils.Tensor("tokens", (tokens * 2).astype(np.int32)),
                pb_utils.Tensor("params", np.array([json.dumps(params, sort_keys=True).encode()], dtype=np.object_)),
            ]))
        return out
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("generate")
    build_repository(repo, only=["repeat_decoupled"], log=None)
    add_model(repo, "text", _TEXT_MODEL, config(
        "text", [("text_input", "TYPE_STRING", [1]), ("max_tokens", "TYPE_INT32", [1])],
        [("text_output", "TYPE_STRING", [1]), ("tokens", "TYPE_INT32", [1]), ("params", "TYPE_STRING", [1])], 4,
        platform=None, extra='backend: "python"\n'), filename="model.py")
    with running(repo) as server:
        yield server


def _post(server, path: str, doc) -> tuple[int, str, bytes]:  # type: ignore[no-untyped-def]
    body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def _events(body: bytes) -> list[dict]:
    chunks = [c for c in body.decode().split("\n\n") if c]
    assert all(c.startswith("data: ") for c in chunks), body
    return [json.loads(c[len("data: "):]) for c in chunks]


def test_generate_maps_inputs_parameters_and_outputs(server):
    status, media, body = _post(server, "/v2/models/text/generate", {
        "id": "42", "text_input": "hello", "parameters": {"max_tokens": 5, "suffix": "!", "temperature": 0.5,
                                                         "stream": False}})
    assert (status, media) == (200, "application/json")
    doc = json.loads(body)
    assert list(doc) == sorted(doc)  # Triton writes the keys in order
    assert doc == {"id": "42", "model_name": "text", "model_version": "1", "text_output": "HELLO!", "tokens": 10,
                   "params": json.dumps({"stream": False, "suffix": "!", "temperature": 0.5}, sort_keys=True)}


def test_top_level_keys_are_inputs_or_parameters_too(server):
    status, _, body = _post(server, "/v2/models/text/versions/1/generate",
                            {"text_input": ["abc"], "max_tokens": [2], "suffix": "?"})
    assert status == 200
    doc = json.loads(body)
    assert doc["text_output"] == "ABC?" and doc["tokens"] == 4 and "id" not in doc


def test_generate_stream_of_a_plain_model_is_one_event(server):
    status, media, body = _post(server, "/v2/models/text/generate_stream", {"text_input": "x", "max_tokens": 1})
    assert (status, media) == (200, "text/event-stream; charset=utf-8")
    (event,) = _events(body)
    assert event["text_output"] == "X" and event["tokens"] == 2


def test_generate_stream_of_a_decoupled_model_is_one_event_per_response(server):
    status, _, body = _post(server, "/v2/models/repeat_decoupled/generate_stream",
                            {"id": "r", "IN": [7, 8], "REPEAT": 3})
    assert status == 200
    assert _events(body) == [{"IDX": i, "OUT": [7, 8], "id": "r", "model_name": "repeat_decoupled",
                              "model_version": "1"} for i in range(3)]


def test_generate_needs_exactly_one_response(server):
    status, _, body = _post(server, "/v2/models/repeat_decoupled/generate", {"IN": [1], "REPEAT": 1})
    assert status == 200 and json.loads(body)["OUT"] == 1
    status, _, body = _post(server, "/v2/models/repeat_decoupled/generate", {"IN": [1], "REPEAT": 2})
    assert status == 500
    assert json.loads(body) == {"error": "generate expects model to produce exactly 1 response, use generate "
                                         "stream for model that generates various number of responses "
                                         "(model 'repeat_decoupled' sent 2)"}


def test_an_error_response_in_a_stream(server):
    status, media, body = _post(server, "/v2/models/repeat_decoupled/generate_stream", {"IN": [1], "REPEAT": -1})
    assert (status, media) == (400, "text/event-stream; charset=utf-8")  # the first response's status
    assert _events(body) == [{"error": "model 'repeat_decoupled': REPEAT must be >= 0, got -1"}]


@pytest.mark.parametrize("path, doc, status, message", [
    ("/v2/models/nope/generate", {"text_input": "x"}, 404, "Request for unknown model: 'nope' is not found"),
    ("/v2/models/repeat_decoupled/generate_stream", {"IN": [1], "REPEAT": [1, 2]}, 400,
     "generate request: the schema can not convert input 'REPEAT' for model 'repeat_decoupled' to a tensor with "
     "a proper shape: 2 value(s) do not fill its shape [1]; give a number of values its fixed dimensions divide"),
    ("/v2/models/text/generate", {"text_input": "x", "max_tokens": [1, 2]}, 400,  # shape [2, 1]: batch 2
     "inference input 'max_tokens' for model 'text' has batch size 2 but another input has 1; every input of a "
     "request must have the same batch size"),
    ("/v2/models/text/generate", {"text_input": "x", "max_tokens": 1, "stop": ["a", "b"]}, 400,
     "generate request for model 'text': 'stop' is not an input of the model (its inputs are ['max_tokens', "
     "'text_input']), so it is a parameter, and a parameter must be a string, integer, boolean or number; got "
     '["a", "b"]'),
    ("/v2/models/text/generate", {"text_input": "x", "max_tokens": 1, "parameters": [1]}, 400,
     "generate request for model 'text': expected a JSON object for keyword 'parameters', got [1]"),
    ("/v2/models/text/generate", {"text_input": "x", "max_tokens": 1, "parameters": {"max_tokens": 2}}, 400,
     "generate request for model 'text': 'max_tokens' is given twice (at the top level and in 'parameters')"),
    ("/v2/models/text/generate", {"id": 7, "text_input": "x"}, 400,
     "generate request for model 'text': 'id' must be a string, got 7"),
    ("/v2/models/text/generate_stream", {"text_input": "x"}, 400,
     "expected 2 inputs but got 1 inputs for model 'text': missing ['max_tokens']"),
])
def test_refused_generate_requests(server, path, doc, status, message):
    """Refused before the model's path (unknown model, a body that does not map): a JSON error;
    refused by the model's own checks on /generate_stream: an event, with that status."""
    got, media, body = _post(server, path, doc)
    assert got == status
    if "missing" in message:
        assert media == "text/event-stream; charset=utf-8" and _events(body) == [{"error": message}]
    else:
        assert media == "application/json" and json.loads(body) == {"error": message}

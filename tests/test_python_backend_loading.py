"""Triton's model loading API in a Python model (``pb_utils.load_model``, ``unload_model``,
``is_model_ready``), through a real server in explicit model control mode: a ``loader`` model
runs each call a client asks it for and answers what it returned or raised; and a model's own
``is_ready()`` (sync, async, raising, answering a non-bool) behind the model-ready endpoints. One
server for the module; the mode rules (none / poll refuse) are checked on the repository's
control directly."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import running
from repo_builder import add_python_model

# Runs the call named in its JSON input: {"op": "ready" | "load" | "unload", ...the call's arguments}.
LOADER = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


def run(call):
    op = call.pop("op")
    if op == "ready":
        return pb_utils.is_model_ready(**call)
    if op == "load":
        if "files" in call and isinstance(call["files"], dict):
            call["files"] = {k: v.encode() for k, v in call["files"].items()}
        return pb_utils.load_model(**call)
    if op == "unload":
        return pb_utils.unload_model(**call)
    raise ValueError(op)


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            call = json.loads(pb_utils.get_input_tensor_by_name(request, "CALL").as_numpy()[0])
            try:
                answer = {"result": run(call)}
            except pb_utils.TritonModelException as exc:
                answer = {"error": str(exc)}
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("ANSWER", np.array([json.dumps(answer).encode()], np.object_))]))
        return out
'''

# A model the loader loads: OUT = IN + ADD (ADD differs between the repository's copy and the files').
ADDER = '''
import numpy as np
import triton_python_backend_utils as pb_utils

ADD = {add}


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() + ADD)]) for r in requests]
'''

# is_ready() says what the file "state" next to it says: "yes" -> True, "no" -> False, "raise" -> an
# exception, "text" -> a string; async when KIND is "async".
MOODY = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils

KIND = "{kind}"


class TritonPythonModel:
    def initialize(self, args):
        self.state = os.path.join(pb_utils.get_model_dir(), "state")

    def check(self):
        with open(self.state) as f:
            said = f.read().strip()
        if said == "raise":
            raise RuntimeError("the database is down")
        return {{"yes": True, "no": False}}.get(said, said)

    if KIND == "async":
        async def is_ready(self):
            return self.check()
    else:
        def is_ready(self):
            return self.check()

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
'''

ADDER_CONFIG = '''
    backend: "python"
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
'''

ADDER_JSON = json.dumps({
    "backend": "python",
    "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
    "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_loading")
    add_python_model(repo, "loader", LOADER, '''
        backend: "python"
        input [ { name: "CALL" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "ANSWER" data_type: TYPE_STRING dims: [ 1 ] } ]
    ''')
    add_python_model(repo, "adder", ADDER.format(add=1), ADDER_CONFIG)
    for kind in ("sync", "async"):
        add_python_model(repo, f"moody_{kind}", MOODY.format(kind=kind), ADDER_CONFIG)
        (repo / f"moody_{kind}" / "1" / "state").write_text("yes")
    loads = ["--load-model", "loader", "--load-model", "moody_sync", "--load-model", "moody_async"]
    with running(repo, extra_args=["--model-control-mode", "explicit", *loads]) as s:
        s.repo = repo
        yield s


@pytest.fixture(scope="module")
def client(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        yield c


def _call(client, **call) -> dict:
    inp = httpclient.InferInput("CALL", [1], "BYTES")
    inp.set_data_from_numpy(np.array([json.dumps(call).encode()], np.object_))
    return json.loads(client.infer("loader", [inp]).as_numpy("ANSWER")[0])


def _add(client, model: str, value: int) -> int:
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([value], np.int32))
    return int(client.infer(model, [inp]).as_numpy("OUT")[0])


pytestmark = pytest.mark.server


def test_load_then_unload_a_repository_model(client):
    assert _call(client, op="ready", model_name="adder") == {"result": False}
    assert not client.is_model_ready("adder")
    assert _call(client, op="load", model_name="adder") == {"result": None}
    # Ready when load_model returns, for the model and for clients.
    assert _call(client, op="ready", model_name="adder") == {"result": True}
    assert _call(client, op="ready", model_name="adder", model_version="1") == {"result": True}
    assert _call(client, op="ready", model_name="adder", model_version="2") == {"result": False}
    assert client.is_model_ready("adder")
    assert _add(client, "adder", 5) == 6
    assert _call(client, op="unload", model_name="adder") == {"result": None}
    # Refused at once once unload_model returned (its accepted requests may still finish).
    assert _call(client, op="ready", model_name="adder") == {"result": False}
    assert not client.is_model_ready("adder")


def test_load_from_files_with_a_config(client):
    files = {"file:1/model.py": ADDER.format(add=100)}
    assert _call(client, op="load", model_name="made", config=ADDER_JSON, files=files) == {"result": None}
    assert _add(client, "made", 5) == 105
    assert _call(client, op="unload", model_name="made", unload_dependents=True) == {"result": None}
    assert _call(client, op="ready", model_name="made") == {"result": False}


def test_a_config_override_replaces_config_pbtxt(client):
    # The repository's adder with a config that renames nothing but limits the versions to 1.
    override = json.loads(ADDER_JSON)
    override["version_policy"] = {"specific": {"versions": [1]}}
    assert _call(client, op="load", model_name="adder", config=json.dumps(override)) == {"result": None}
    try:
        config = client.get_model_config("adder")
        assert config["version_policy"] == {"specific": {"versions": [1]}}, config
    finally:
        assert _call(client, op="unload", model_name="adder") == {"result": None}


@pytest.mark.parametrize("call, words", [
    ({"op": "load", "model_name": "nothing"},
     "Failed to load model: failed to load 'nothing': no such model in the model repositories"),
    ({"op": "load", "model_name": "adder", "config": "{not json"}, "Failed to load model: "),
    ({"op": "load", "model_name": "adder", "files": ["file:1/model.py"]},
     "failed to load model 'adder', files should be a dictionary of file paths and file contents"),
    ({"op": "load", "model_name": "made", "config": ADDER_JSON, "files": {"1/model.py": "x = 1"}},
     "Failed to load model: "),
    ({"op": "unload", "model_name": "nothing"}, "Failed to unload model: failed to unload 'nothing': no such model"),
    ({"op": "ready", "model_name": "adder", "model_version": "one"},
     "Failed to check model readiness: failed to get model version from specified version string 'one', "
     "version should be an integral value > 0"),
    ({"op": "ready", "model_name": "adder", "model_version": "-3"},
     "version string '-3', version should be an integral value > 0"),
])
def test_misuse_raises_triton_model_exception(client, call, words):
    answer = _call(client, **call)
    assert "error" in answer, answer
    assert words in answer["error"], answer
    if call.get("model_name") == "made":  # a bad files key names the key
        assert "1/model.py" in answer["error"], answer


def test_a_missing_model_is_not_ready_rather_than_an_error(client):
    assert _call(client, op="ready", model_name="nothing") == {"result": False}


@pytest.mark.parametrize("mode, words", [
    ("none", "explicit model load / unload is not supported in model control mode none"),
    ("poll", "explicit model load / unload is not allowed if polling is enabled"),
])
def test_the_api_obeys_the_model_control_mode(tmp_path, mode, words):
    from inferd.errors import InferdError
    from inferd.repository.manager import ModelManager

    manager = ModelManager([tmp_path], mode=mode)
    control = manager.dispatcher

    async def attempts() -> list[str]:
        found = []
        for call in (control.load_model("adder", "", {}), control.unload_model("adder", False)):
            try:
                await call
                found.append("no error")
            except InferdError as exc:
                found.append(exc.message)
        return found

    loaded, unloaded = asyncio.run(attempts())
    assert loaded.startswith("failed to load 'adder': ") and words in loaded, loaded
    assert unloaded.startswith("failed to unload 'adder': ") and words in unloaded, unloaded


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_is_ready_decides_the_models_readiness(server, client, kind):
    import tritonclient.grpc as grpcclient

    model = f"moody_{kind}"
    state = server.repo / model / "1" / "state"
    g = grpcclient.InferenceServerClient(server.url)
    try:
        seen = []
        for said in ("yes", "no", "raise", "text", "yes"):
            state.write_text(said)
            seen.append((said, client.is_model_ready(model), g.is_model_ready(model)))
        assert seen == [("yes", True, True), ("no", False, False), ("raise", False, False),
                        ("text", False, False), ("yes", True, True)]
        # pb_utils.is_model_ready asks the model's own check too (Triton's ServerModelIsReady does),
        # and so does the server's readiness (Triton's strict readiness).
        state.write_text("no")
        assert _call(client, op="ready", model_name=model) == {"result": False}
        assert not client.is_server_ready()
        state.write_text("yes")
        assert _call(client, op="ready", model_name=model) == {"result": True}
        assert client.is_server_ready()
    finally:
        state.write_text("yes")
        g.close()
    assert "the database is down" in server.log() and "must return a bool, got str" in server.log()

"""RepositoryModelLoad with the model's files in the request (``config`` plus
``file:<relative path>`` parameters), over gRPC and HTTP, through tritonclient on a real
server: a model known only from the request, a repository model reloaded from other files,
and Triton's answers to malformed overrides (INTERNAL "failed to poll from model
repository", with what was wrong)."""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

IO = ([("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])])
CONFIG = json.dumps({"platform": "onnxruntime_onnx", "max_batch_size": 2,
                     "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                     "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]})
POLL = "failed to poll from model repository"


def _scale(factor: float) -> bytes:
    return om.serialize(om.scale(4, factor=factor))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("overrides")
    add_model(repo, "scaler", om.scale(4, factor=2.0), config("scaler", *IO, 2))
    with running(repo, extra_args=["--model-control-mode", "explicit", "--load-model", "scaler"]) as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


def _times(client, model: str) -> float:  # type: ignore[no-untyped-def]
    x = np.ones((1, 4), dtype=np.float32)
    i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    return float(client.infer(model, [i]).as_numpy("OUTPUT0")[0, 0])


def _http_load(server, model: str, parameters: dict) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/{model}/load",
                                     data=json.dumps({"parameters": parameters}).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, {}
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_model_known_only_from_the_request(client):
    client.load_model("sent", config=CONFIG, files={"file:1/model.onnx": _scale(5.0)})
    assert client.is_model_ready("sent") and _times(client, "sent") == 5.0
    assert client.get_model_config("sent").config.max_batch_size == 2
    client.unload_model("sent")
    assert not client.is_model_ready("sent")
    with pytest.raises(InferenceServerException) as exc:  # its files went with it: nothing to load
        client.load_model("sent")
    assert exc.value.message() == "failed to load 'sent': no such model in the model repositories"


def test_a_repository_model_reloaded_from_other_files_and_back(client):
    assert _times(client, "scaler") == 2.0
    client.load_model("scaler", config=CONFIG, files={"file:3/model.onnx": _scale(7.0)})
    assert _times(client, "scaler") == 7.0
    assert client.get_model_metadata("scaler").versions == ["3"]
    client.load_model("scaler")  # no files: its folder in the repository again
    assert _times(client, "scaler") == 2.0 and client.get_model_metadata("scaler").versions == ["1"]


def test_over_http_files_are_base64(server, client):
    content = base64.b64encode(_scale(3.0)).decode()
    assert _http_load(server, "scaler", {"config": CONFIG, "file:1/model.onnx": content}) == (200, {})
    assert _times(client, "scaler") == 3.0
    status, body = _http_load(server, "scaler", {"config": CONFIG, "file:1/model.onnx": "not base64!"})
    assert status == 400 and body["error"].startswith(
        "RepositoryModelLoad: parameter 'file:1/model.onnx' must be the file's content, base64-encoded")
    client.load_model("scaler")


@pytest.mark.parametrize("parameters, detail", [
    ({"files": {"file:1/model.onnx": b"x"}},
     "load parameter 'config' must be specified for model file override (the files form the whole model "
     "folder; 'config' is its config.pbtxt, in JSON)"),
    ({"config": CONFIG, "files": {"file:../escape.onnx": b"x"}},
     "invalid file parameter 'file:../escape.onnx': the path must be relative and stay within the model "
     "folder (e.g. 'file:1/model.onnx')"),
    ({"config": CONFIG, "files": {"file:/etc/model.onnx": b"x"}},
     "invalid file parameter 'file:/etc/model.onnx': the path must be relative and stay within the model "
     "folder (e.g. 'file:1/model.onnx')"),
    ({"config": "{}", "files": {"file:" + "A" * 256: b"a"}},
     "invalid file parameter 'file:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA...': a path component "
     "is 256 bytes long; the file system allows at most 255"),
])
def test_malformed_overrides_answer_internal_as_triton_does(client, parameters, detail):
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("scaler", **parameters)
    assert exc.value.status() == "StatusCode.INTERNAL"
    assert exc.value.message() == f"failed to load 'scaler', {POLL}: {detail}"
    assert _times(client, "scaler") == 2.0  # what served before still serves


def test_a_file_where_another_needs_a_folder(client):
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("scaler", config=CONFIG, files={"file:1": b"x", "file:1/model.onnx": b"y"})
    assert exc.value.status() == "StatusCode.INTERNAL"
    message = exc.value.message()  # the second of the two written is the one named (a map has no order)
    assert message.startswith(f"failed to load 'scaler', {POLL}: invalid file parameter 'file:1")
    assert message.endswith("': it names a folder as a file, or a file as a folder, of another file parameter")


def test_a_file_parameter_must_be_bytes(server, client):
    from tritonclient.grpc import service_pb2, service_pb2_grpc
    import grpc

    request = service_pb2.RepositoryModelLoadRequest(model_name="scaler")
    request.parameters["config"].string_param = CONFIG
    request.parameters["file:1/model.onnx"].string_param = "text, not bytes"
    with grpc.insecure_channel(server.url) as channel, pytest.raises(grpc.RpcError) as exc:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request, timeout=60)
    assert exc.value.code() == grpc.StatusCode.INTERNAL
    assert exc.value.details() == (f"failed to load 'scaler', {POLL}: file parameter 'file:1/model.onnx' must have "
                                   "bytes type for its value (the file's content), got str")


def test_a_broken_model_in_the_files_fails_to_load_and_the_old_one_serves(client):
    with pytest.raises(InferenceServerException) as exc:
        client.load_model("scaler", config=CONFIG, files={"file:1/model.onnx": b"not an onnx file"})
    assert exc.value.message().startswith("failed to load 'scaler': ") and "cannot load" in exc.value.message()
    assert _times(client, "scaler") == 2.0

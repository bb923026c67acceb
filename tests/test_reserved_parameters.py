"""Issue 47 item 2: request parameters Triton reserves (keys starting with ``triton_``) are refused in
Triton's words, and --grpc-header-forward-pattern / --http-header-forward-pattern forward matching
headers into the request's parameters, refusing a reserved name. Pure checks first, then a real
server with tritonclient over both protocols (both process modes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from inferd.errors import InvalidArgument
from inferd.frontends.parameters import GRPC_RESERVED, HTTP_RESERVED, HeaderForward, reserved_parameter

GRPC_TEXT = ("parameter keys starting with 'triton_' are reserved for Triton usage. Only the following keys "
             "starting with 'triton_' are allowed: triton_enable_empty_final_response")
HTTP_TEXT = "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified."

ECHO = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            text = json.dumps(json.loads(request.parameters()), sort_keys=True).encode()
            out.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("PARAMS", np.array([text], dtype=np.object_))]))
        return out
'''
ECHO_CONFIG = '''name: "echo_params"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "PARAMS" data_type: TYPE_STRING dims: [ 1 ] } ]
'''


def test_the_messages_are_tritons() -> None:
    assert GRPC_RESERVED == GRPC_TEXT and HTTP_RESERVED == HTTP_TEXT


@pytest.mark.parametrize("keys, protocol, found", [
    (["priority", "timeout", "sequence_id", "custom"], "grpc", None),
    (["triton_enable_empty_final_response"], "grpc", None),  # the one gRPC takes
    (["triton_enable_empty_final_response"], "http", "triton_enable_empty_final_response"),
    (["ok", "triton_anything"], "grpc", "triton_anything"),
    (["triton_anything"], "http", "triton_anything"),
    (["tritonish"], "grpc", None),
])
def test_reserved_keys(keys, protocol, found) -> None:  # type: ignore[no-untyped-def]
    assert reserved_parameter(keys, protocol) == found


def test_headers_are_forwarded_by_a_case_insensitive_search_and_reserved_names_refused() -> None:
    forward = HeaderForward("^x-fwd")
    assert forward.forwarded([("x-fwd-user", "ada"), ("X-FWD-Team", "ops"), ("other", "no")]) == {
        "x-fwd-user": "ada", "X-FWD-Team": "ops"}
    assert HeaderForward("user").forwarded([("x-user-id", "7")]) == {"x-user-id": "7"}  # anywhere in the name
    for name in ("priority", "sequence_id", "triton_x", "binary_data_output", "headers"):
        with pytest.raises(InvalidArgument) as exc:
            HeaderForward(".*").forwarded([(name, "1")])
        assert exc.value.message == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    with pytest.raises(ValueError, match="not a regular expression"):
        HeaderForward("(")


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    from conftest import running

    repo = tmp_path_factory.mktemp("reserved_repo")
    (repo / "echo_params" / "1").mkdir(parents=True)
    (repo / "echo_params" / "1" / "model.py").write_text(ECHO)
    (repo / "echo_params" / "config.pbtxt").write_text(ECHO_CONFIG)
    args = ["--grpc-header-forward-pattern", "^x-fwd|^triton_|^priority$",
            "--http-header-forward-pattern", "^x-fwd|^triton_|^priority$"]
    with running(repo, extra_args=args) as s:
        yield s


# tritonclient refuses reserved keys before sending; the raw stub and plain HTTP send what a client
# in another language could.

def _grpc_infer(server, parameters=None, headers=None):  # type: ignore[no-untyped-def]
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="echo_params")
    tensor = request.inputs.add(name="IN", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    for key, value in (parameters or {}).items():
        p = request.parameters[key]
        if isinstance(value, bool):
            p.bool_param = value
        elif isinstance(value, int):
            p.int64_param = value
        else:
            p.string_param = value
    with grpc.insecure_channel(server.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            response = stub.ModelInfer(request, metadata=list((headers or {}).items()), timeout=60)
        except grpc.RpcError as exc:
            raise InferenceServerException(exc.details(), status=str(exc.code())) from None
    return json.loads(response.raw_output_contents[0][4:])


def _http_infer(server, parameters=None, headers=None):  # type: ignore[no-untyped-def]
    import urllib.error
    import urllib.request

    body = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    if parameters:
        body["parameters"] = parameters
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/echo_params/infer",
                                     json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            doc = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        raise InferenceServerException(json.loads(exc.read())["error"], status=str(exc.code)) from None
    return json.loads(doc["outputs"][0]["data"][0])


def test_grpc_refuses_triton_keys_but_the_empty_final_response_flag(server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as exc:
        _grpc_infer(server, {"triton_priority": 1})
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert exc.value.message().startswith(GRPC_TEXT) and "'triton_priority'" in exc.value.message()
    assert _grpc_infer(server, {"triton_enable_empty_final_response": True, "mine": 3}) == {
        "mine": 3, "triton_enable_empty_final_response": True}


def test_http_refuses_every_triton_key(server) -> None:  # type: ignore[no-untyped-def]
    for key in ("triton_enable_empty_final_response", "triton_other"):
        with pytest.raises(InferenceServerException) as exc:
            _http_infer(server, {key: True})
        assert exc.value.status() == "400"
        assert exc.value.message().startswith(HTTP_TEXT) and f"'{key}'" in exc.value.message()
    assert _http_infer(server, {"mine": "x"}) == {"mine": "x"}


def test_the_reserved_keys_keep_their_meaning(server) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as exc:
        _grpc_infer(server, {"priority": -1})
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "'priority'" in exc.value.message()
    assert _http_infer(server, {"priority": 0, "timeout": 0}) == {"priority": 0, "timeout": 0}


def test_matching_headers_become_parameters_on_both_protocols(server) -> None:  # type: ignore[no-untyped-def]
    assert _grpc_infer(server, {"mine": 1}, {"x-fwd-user": "ada", "x-other": "no"}) == {"mine": 1, "x-fwd-user": "ada"}
    assert _http_infer(server, {"mine": 1}, {"x-fwd-user": "ada", "x-other": "no"}) == {"mine": 1, "x-fwd-user": "ada"}


def test_a_forwarded_header_with_a_reserved_name_is_refused(server) -> None:  # type: ignore[no-untyped-def]
    for name in ("triton_x", "priority"):
        with pytest.raises(InferenceServerException) as exc:
            _grpc_infer(server, None, {name: "1"})
        assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert exc.value.message() == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
        with pytest.raises(InferenceServerException) as exc:
            _http_infer(server, None, {name: "1"})
        assert exc.value.status() == "400"
        assert exc.value.message() == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."


def test_stream_requests_take_the_forwarded_headers(server) -> None:  # type: ignore[no-untyped-def]
    import queue

    got: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(lambda result, error: got.put((result, error)), headers={"x-fwd-trace": "t1"})
        x = grpcclient.InferInput("IN", [1], "FP32").set_data_from_numpy(np.ones(1, np.float32))
        client.async_stream_infer("echo_params", [x], parameters={"mine": 2})
        result, error = got.get(timeout=60)
        client.stop_stream()
    assert error is None, error
    assert json.loads(result.as_numpy("PARAMS")[0]) == {"mine": 2, "x-fwd-trace": "t1"}

"""A bad request says what would be valid, on gRPC and HTTP alike: the datatypes (with
the config spelling TYPE_INT32 pointed at INT32), a missing datatype by name, a
misspelt model's likely name, and the versions that are loaded."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from inferd.dtypes import datatype_problem

VALID = "(valid: BOOL, UINT8, UINT16, UINT32, UINT64, INT8, INT16, INT32, INT64, FP16, FP32, FP64, BYTES, BF16)"
ROW = list(range(16))


@pytest.fixture(scope="module")
def server(example_server):  # type: ignore[no-untyped-def]
    return example_server


def _grpc_error(stub, model: str, datatype: str, version: str = "") -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for name, dt in (("INPUT0", datatype), ("INPUT1", "INT32")):
        request.inputs.add(name=name, datatype=dt, shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    return info.value.code(), info.value.details()


def _http_error(server, path: str, first: dict[str, Any]) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "data": ROW, **first},
                       {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": ROW}]}
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=json.dumps(body).encode())
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(request, timeout=30)
    return info.value.code, json.loads(info.value.read())["error"]


CONFIG_SPELLING = ("input 'INPUT0' for model 'simple': unknown datatype 'TYPE_INT32': that is the config's "
                   f"spelling; a request says 'INT32' {VALID}")
MISSING = f"input 'INPUT0' for model 'simple': missing 'datatype' {VALID}"


def test_the_config_spelling_points_at_the_request_spelling(stub, server) -> None:  # type: ignore[no-untyped-def]
    assert _grpc_error(stub, "simple", "TYPE_INT32") == (grpc.StatusCode.INVALID_ARGUMENT, CONFIG_SPELLING)
    assert _http_error(server, "/v2/models/simple/infer", {"datatype": "TYPE_INT32"}) == (400, CONFIG_SPELLING)


def test_a_missing_datatype_is_named(stub, server) -> None:  # type: ignore[no-untyped-def]
    assert _grpc_error(stub, "simple", "") == (grpc.StatusCode.INVALID_ARGUMENT, MISSING)
    assert _http_error(server, "/v2/models/simple/infer", {}) == (400, MISSING)


def test_a_misspelt_datatype_gets_the_closest() -> None:
    assert datatype_problem("FP23") == f"unknown datatype 'FP23'; did you mean 'FP32'? {VALID}"
    assert datatype_problem("int32") == f"unknown datatype 'int32'; did you mean 'INT32'? {VALID}"
    assert datatype_problem(5) == f"unknown datatype 5 {VALID}"


def test_an_unknown_model_gets_a_did_you_mean(stub, server) -> None:  # type: ignore[no-untyped-def]
    code, details = _grpc_error(stub, "simpel", "INT32")
    assert code == grpc.StatusCode.NOT_FOUND
    assert details == "Request for unknown model: 'simpel' is not found; did you mean 'simple'?"
    status, error = _http_error(server, "/v2/models/simpel/infer", {"datatype": "INT32"})
    assert (status, error) == (404, details)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelMetadata(pb.ModelMetadataRequest(name="simple_strnig"))
    assert info.value.details().endswith("did you mean 'simple_string'?")


def test_a_name_like_none_gets_no_suggestion(stub) -> None:  # type: ignore[no-untyped-def]
    assert _grpc_error(stub, "zzzzzz", "INT32")[1] == "Request for unknown model: 'zzzzzz' is not found"


def test_an_unknown_version_lists_the_loaded_ones(stub, server) -> None:  # type: ignore[no-untyped-def]
    expected = "Request for unknown model: 'simple' version 3 is not found; loaded versions: 1"
    assert _grpc_error(stub, "simple", "INT32", version="3") == (grpc.StatusCode.NOT_FOUND, expected)
    assert _http_error(server, "/v2/models/simple/versions/3/infer", {"datatype": "INT32"}) == (404, expected)

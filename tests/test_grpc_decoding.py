"""Bytes that are not a valid message: every RPC answers INVALID_ARGUMENT naming the method
and the message it expected (not UNKNOWN with a Python exception's name); a stream answers
the bad message with an error response and carries on."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2

from inferd._proto import grpc_service_pb2 as pb

GARBAGE = b"\xff\xff\xff\xff\x0f"  # a field header with a truncated varint: no message parses it
METHODS = [(m.name, m.input_type.full_name, m.client_streaming)
           for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]


@pytest.fixture(scope="module")
def channel(example_server):  # type: ignore[no-untyped-def]
    with grpc.insecure_channel(example_server.url) as ch:
        yield ch


@pytest.mark.parametrize("method, request_type", [(n, t) for n, t, streaming in METHODS if not streaming])
def test_undecodable_unary_request_is_invalid_argument(channel, method, request_type):
    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}",
                               request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        call(GARBAGE, timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(
        f"{method}: the request (5 bytes) is not a valid {request_type} message (")
    assert info.value.details().endswith(f"send a serialized {request_type} as defined in grpc_service.proto")


def test_undecodable_stream_message_gets_an_error_response_and_the_stream_goes_on(channel):
    good = service_pb2.ModelInferRequest(model_name="simple", id="after")
    for name in ("INPUT0", "INPUT1"):
        t = good.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        del t  # the data travels as raw contents
        good.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",
                                   request_serializer=None, response_deserializer=None)
    answers = [service_pb2.ModelStreamInferResponse.FromString(b)
               for b in stream(iter([GARBAGE, good.SerializeToString()]), timeout=60)]
    errors = [a for a in answers if a.error_message]
    ok = [a for a in answers if not a.error_message]
    assert len(errors) == 1 and errors[0].error_message.startswith(
        "ModelStreamInfer: the request (5 bytes) is not a valid inference.ModelInferRequest message (")
    assert len(ok) == 1 and ok[0].infer_response.id == "after"


def test_valid_requests_still_work(example_server):
    client = grpcclient.InferenceServerClient(example_server.url)
    assert client.is_server_live() and client.get_model_metadata("simple").name == "simple"
    client.close()

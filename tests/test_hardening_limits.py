"""Issue 47 item 3: the limits Triton added in 2025-2026, with Triton's texts: a chunked body of more than
65,536 non-empty chunks, a gzip/deflate body that inflates past --http-max-input-size, JSON ``data``
nested 100 deep, shapes whose element count or byte size passes int64 (refused before anything is
allocated), a classification output of more than 1,000,000 elements per batch entry. The pure checks
first, then a real server (both process modes)."""

from __future__ import annotations

import gzip
import json
import socket
import urllib.error
import urllib.request
import zlib

import numpy as np
import pytest

from inferd.config import TensorSpec
from inferd.dtypes import BY_NAME, element_count
from inferd.errors import InvalidArgument
from inferd.frontends.http_codec import array_from_json
from inferd.frontends.http_limits import decompress
from inferd.model.validation import classify

INT64_MAX = 2**63 - 1
ELEMENTS = "causes total element count to exceed maximum size of 9223372036854775807"
BYTE_SIZE = "byte size overflow for input 'INPUT0'"
TOO_DEEP = "JSON nesting depth exceeds maximum allowed limit (100)"
CHUNKS = ("Chunked request body exceeds maximum of 65536 non-empty chunks. Send fewer or larger HTTP chunks.")
LIMIT = 1 << 17  # the test server's --http-max-input-size
INFLATED = (f"Decompressed data size exceeds the maximum allowed value of {LIMIT} bytes. Use --http-max-input-size "
            "to increase the limit.")
CLASSIFIED = "classification output tensor too large"


def _nested(depth: int, value: object) -> object:
    for _ in range(depth):
        value = [value]
    return value


# -- the pure checks ---------------------------------------------------------------------------


def test_shapes_past_int64_are_refused_in_tritons_words_before_any_allocation() -> None:
    where = "input 'INPUT0' for model 'm'"
    with pytest.raises(InvalidArgument, match=ELEMENTS):
        element_count([2**4, 2**60 + 2], where, 4)  # Triton's own payloads (L0_http)
    with pytest.raises(InvalidArgument) as exc:
        element_count([2**2, 2**60 + 2], where, 4)
    assert exc.value.message.startswith(BYTE_SIZE) and "element count (4611686018427387912) * data type size (4)" \
        in exc.value.message
    with pytest.raises(InvalidArgument, match="holds more elements than any tensor can"):
        element_count([2**30, 2**31], where, 1)  # within int64 but past what numpy sizes: inferd's words
    assert element_count([0, 2**40], where, 4) == 0
    with pytest.raises(InvalidArgument, match=ELEMENTS):  # the JSON decoder counts before it reads 'data'
        array_from_json([1.0], BY_NAME["FP32"], (2**4, 2**60 + 2), where)


def test_json_data_nested_100_deep_is_refused_and_49_levels_read() -> None:
    fp32 = BY_NAME["FP32"]
    assert array_from_json(_nested(50, 1.5), fp32, (1, 1), "input 'X'").tolist() == [[1.5]]  # Triton reads it too
    assert array_from_json(_nested(99, 1.5), fp32, (1,), "input 'X'").tolist() == [1.5]
    for depth in (100, 120):
        with pytest.raises(InvalidArgument) as exc:
            array_from_json(_nested(depth, 1.5), fp32, (1,), "input 'X'")
        assert exc.value.message.startswith(f"input 'X': {TOO_DEEP}")


def test_a_body_that_inflates_past_the_limit_is_refused_in_tritons_words() -> None:
    body = b"x" * 1000
    assert decompress(gzip.compress(body), "gzip", 1000) == body
    assert decompress(zlib.compress(body), "deflate", 1000) == body
    for encoding, packed in (("gzip", gzip.compress(body + b"y")), ("deflate", zlib.compress(body + b"y"))):
        with pytest.raises(InvalidArgument) as exc:
            decompress(packed, encoding, 1000)
        assert exc.value.message == ("Decompressed data size exceeds the maximum allowed value of 1000 bytes. Use "
                                     "--http-max-input-size to increase the limit.")


def test_classification_ranks_at_most_a_million_elements_per_batch_entry() -> None:
    spec = TensorSpec("OUT", BY_NAME["FP32"], (-1,), (-1,))
    assert classify("m", spec, np.zeros((2, 1_000_000), np.float32), 1, batching=True).shape == (2, 1)
    with pytest.raises(InvalidArgument) as exc:
        classify("m", spec, np.zeros((2, 1_000_001), np.float32), 1, batching=True)
    assert exc.value.message.startswith(CLASSIFIED) and "1000001 elements per batch entry" in exc.value.message


# -- through a server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    from conftest import running
    from repo_builder import add_model, config

    from inferd.examples import onnx_models as om

    repo = tmp_path_factory.mktemp("limits_repo")
    add_model(repo, "ident", om.identity(np.float32, [-1], batch=False),
              config("ident", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    add_model(repo, "ident2d", om.identity(np.float32, [-1, -1], batch=False),
              config("ident2d", [("INPUT0", "TYPE_FP32", [-1, -1])], [("OUTPUT0", "TYPE_FP32", [-1, -1])], 0))
    with running(repo, extra_args=["--http-max-input-size", str(LIMIT)]) as s:
        yield s


def _post(server, path: str, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    request = urllib.request.Request(f"http://{server.http_url}{path}", data=body,
                                     headers={"Content-Type": "application/json", **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _infer_body(shape: list[int], data: object) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": shape, "datatype": "FP32", "data": data}]}).encode()


def test_http_shapes_past_int64(server) -> None:  # type: ignore[no-untyped-def]
    status, doc = _post(server, "/v2/models/ident2d/infer", _infer_body([2**4, 2**60 + 2], [1.0]))
    assert status == 400 and ELEMENTS in doc["error"] and "'INPUT0'" in doc["error"]
    status, doc = _post(server, "/v2/models/ident2d/infer", _infer_body([2**2, 2**60 + 2], [1.0]))
    assert status == 400 and doc["error"].startswith(BYTE_SIZE)


def test_grpc_shapes_past_int64(server) -> None:  # type: ignore[no-untyped-def]
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="ident2d")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[2**4, 2**60 + 2])
    request.raw_input_contents.append(b"\0" * 4)
    with grpc.insecure_channel(server.url) as channel:
        with pytest.raises(grpc.RpcError) as exc:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=60)
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT and ELEMENTS in exc.value.details()


def test_http_json_data_nesting(server) -> None:  # type: ignore[no-untyped-def]
    status, doc = _post(server, "/v2/models/ident2d/infer", _infer_body([1, 1], _nested(50, 2.5)))
    assert status == 200 and doc["outputs"][0]["data"] == [2.5]
    status, doc = _post(server, "/v2/models/ident2d/infer", _infer_body([1, 1], _nested(120, 2.5)))
    assert status == 400 and TOO_DEEP in doc["error"]


def test_http_body_inflating_past_the_limit_is_a_400(server) -> None:  # type: ignore[no-untyped-def]
    bomb = gzip.compress(_infer_body([2], [1.0, 2.0]) + b" " * (4 * LIMIT))
    assert len(bomb) < LIMIT
    status, doc = _post(server, "/v2/models/ident/infer", bomb, {"Content-Encoding": "gzip"})
    assert (status, doc) == (400, {"error": INFLATED})
    status, doc = _post(server, "/v2/models/ident/infer", gzip.compress(_infer_body([2], [1.0, 2.0])),
                        {"Content-Encoding": "gzip"})
    assert status == 200 and doc["outputs"][0]["data"] == [1.0, 2.0]


def _chunked(server, body: bytes, chunks: int, sock: socket.socket | None = None) -> tuple[int, bytes]:  # type: ignore[no-untyped-def]
    """POST ``body`` as ``chunks`` chunks (the last ones carry what is left), then read the answer; on
    ``sock`` (a kept-alive connection) when given, else on a connection of its own."""
    if sock is None:
        host, port = server.http_url.split(":")
        with socket.create_connection((host, int(port)), timeout=60) as own:
            return _chunked(server, body, chunks, own)
    size = len(body) // chunks
    parts = [body[i * size:(i + 1) * size] for i in range(chunks - 1)] + [body[(chunks - 1) * size:]]
    head = ("POST /v2/models/ident/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()
    sock.sendall(head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < _length(answer):
        more = sock.recv(65536)
        if not more:
            break
        answer += more
    status = int(answer.split(b" ", 2)[1])
    return status, answer.split(b"\r\n\r\n", 1)[1]


def _length(answer: bytes) -> int:
    for line in answer.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 30


def test_a_chunked_body_of_more_than_65536_chunks_is_refused(server) -> None:  # type: ignore[no-untyped-def]
    body = _infer_body([2], [1.0, 2.0])
    body += b" " * (65537 - len(body))  # one byte a chunk
    status, answer = _chunked(server, body[:65536], 65536)
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]
    status, answer = _chunked(server, body, 65537)
    assert (status, json.loads(answer)) == (400, {"error": CHUNKS})
    status, answer = _chunked(server, _infer_body([2], [3.0, 4.0]), 4)  # the next connection is served
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [3.0, 4.0]
    host, port = server.http_url.split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:  # counted per request, not connection
        for _ in range(2):
            status, answer = _chunked(server, body[:40000], 40000, sock)
            assert status == 200 and json.loads(answer)["outputs"][0]["data"] == [1.0, 2.0]


def test_grpc_classification_of_more_than_a_million_elements(server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with grpcclient.InferenceServerClient(server.url) as client:
        for n, refused in ((1_000_000, False), (1_000_001, True)):
            x = grpcclient.InferInput("INPUT0", [n], "FP32").set_data_from_numpy(np.arange(n, dtype=np.float32))
            out = grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)
            if not refused:
                got = client.infer("ident", [x], outputs=[out]).as_numpy("OUTPUT0")
                assert got.tolist() == [f"{n - 1:f}:{n - 1}".encode()]
                continue
            with pytest.raises(InferenceServerException) as exc:
                client.infer("ident", [x], outputs=[out])
            assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert exc.value.message().startswith(CLASSIFIED) and "'ident'" in exc.value.message()

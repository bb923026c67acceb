"""Issue #2: every GRPCInferenceService RPC, through tritonclient.grpc (sync and aio),
against a real ``inferd serve`` over a repository built in tmp_path."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from repo_builder import add_model, config

INT16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
LABELS = ["cat", "dog", "bird", "fish"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("rpcs")
    add_model(repo, "simple", om.add_sub(np.int32, 16, batch=True),
              config("simple", INT16, OUT16, 8, extra="dynamic_batching { }\n"))
    add_model(repo, "add_sub", om.add_sub(np.int32, 16, batch=False), config("add_sub", INT16, OUT16, 0))
    add_model(repo, "stats_model", om.add_sub(np.int32, 16, batch=True), config("stats_model", INT16, OUT16, 8))
    add_model(repo, "strings", om.identity(object, [-1], batch=True),
              config("strings", [("INPUT0", "TYPE_STRING", [-1])], [("OUTPUT0", "TYPE_STRING", [-1])], 4))
    add_model(repo, "classifier", om.identity(np.float32, [4], batch=True),
              config("classifier", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 4,
                     output_extra={"OUTPUT0": 'label_filename: "labels.txt"'}))
    (repo / "classifier" / "labels.txt").write_text("\n".join(LABELS) + "\n")
    # dims contradict the model file ([16]): fails to load, the others serve.
    add_model(repo, "broken", om.add_sub(np.int32, 16, batch=True),
              config("broken", [("INPUT0", "TYPE_INT32", [15]), ("INPUT1", "TYPE_INT32", [16])], OUT16, 8))
    with running(repo) as server:
        yield server


def _inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    out = []
    for name, x in (("INPUT0", a), ("INPUT1", b)):
        i = grpcclient.InferInput(name, list(x.shape), "INT32")
        i.set_data_from_numpy(x)
        out.append(i)
    return out


def _ab(rows: int | None) -> tuple[np.ndarray, np.ndarray]:
    shape = (16,) if rows is None else (rows, 16)
    a = np.arange(np.prod(shape), dtype=np.int32).reshape(shape)
    b = np.full(shape, 3, dtype=np.int32)
    return a, b


# -- health and metadata --------------------------------------------------------------


def test_server_live_and_ready(client):
    assert client.is_server_live() is True
    # Strict readiness, as Triton: one model failed to load, so the server is not ready.
    assert client.is_server_ready() is False


def test_server_metadata(client):
    md = client.get_server_metadata()
    assert md.name == "triton" and md.version == "0.1.0"
    assert md.version
    assert {"classification", "model_repository", "statistics", "model_configuration"} <= set(md.extensions)


def test_model_ready(client):
    assert client.is_model_ready("simple") is True
    assert client.is_model_ready("simple", "1") is True
    assert client.is_model_ready("simple", "2") is False
    assert client.is_model_ready("broken") is False
    assert client.is_model_ready("no_such_model") is False


def test_model_metadata(client):
    md = client.get_model_metadata("simple")
    assert md.name == "simple"
    assert list(md.versions) == ["1"]
    assert md.platform == "onnxruntime_onnx"
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [
        ("INPUT0", "INT32", [-1, 16]), ("INPUT1", "INT32", [-1, 16])]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.outputs] == [
        ("OUTPUT0", "INT32", [-1, 16]), ("OUTPUT1", "INT32", [-1, 16])]
    # A model that does not batch has no -1 batch dimension.
    md = client.get_model_metadata("add_sub", "1")
    assert [list(t.shape) for t in md.inputs] == [[16], [16]]
    md = client.get_model_metadata("strings")
    assert [(t.datatype, list(t.shape)) for t in md.inputs] == [("BYTES", [-1, -1])]


def test_model_config(client):
    cfg = client.get_model_config("simple").config
    assert cfg.name == "simple"
    assert cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 8
    assert [(t.name, list(t.dims)) for t in cfg.input] == [("INPUT0", [16]), ("INPUT1", [16])]
    assert [t.name for t in cfg.output] == ["OUTPUT0", "OUTPUT1"]
    assert cfg.HasField("dynamic_batching")
    assert client.get_model_config("classifier").config.output[0].label_filename == "labels.txt"


# -- inference ------------------------------------------------------------------------


def test_infer_raw(client):
    a, b = _ab(1)
    result = client.infer("simple", _inputs(a, b))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    response = result.get_response()
    assert response.model_name == "simple"
    assert response.model_version == "1"
    assert [o.datatype for o in response.outputs] == ["INT32", "INT32"]


def test_infer_no_batch_model(client):
    a, b = _ab(None)
    result = client.infer("add_sub", _inputs(a, b), model_version="1")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    assert result.as_numpy("OUTPUT0").shape == (16,)


def test_infer_request_id_echoed(client):
    a, b = _ab(1)
    result = client.infer("simple", _inputs(a, b), request_id="req-42")
    assert result.get_response().id == "req-42"


def test_infer_requested_output_subset(client):
    a, b = _ab(2)
    result = client.infer("simple", _inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("rows", [1, 3, 8])
def test_infer_batch_up_to_max_batch_size(client, rows):
    a, b = _ab(rows)
    result = client.infer("simple", _inputs(a, b))
    assert result.as_numpy("OUTPUT0").shape == (rows, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


def test_infer_bytes_length_prefixed(client):
    data = np.array([[b"hello", b"", b"a\x00b", "\u00e9t\u00e9".encode()],
                     [b"x" * 1000, b"y", b"zz", b"!"]], dtype=np.object_)
    i = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
    i.set_data_from_numpy(data)
    result = client.infer("strings", [i])
    out = result.as_numpy("OUTPUT0")
    assert out.shape == data.shape
    assert out.tolist() == data.tolist()
    # On the wire: 4-byte little-endian length before each element.
    raw = result.get_response().raw_output_contents[0]
    assert raw[:9] == b"\x05\x00\x00\x00hello"
    assert raw[9:13] == b"\x00\x00\x00\x00"
    assert len(raw) == sum(4 + len(x) for x in data.ravel())


def test_infer_typed_contents(stub):
    """A request with typed ``contents`` (no raw_input_contents), built by hand."""
    request = service_pb2.ModelInferRequest(model_name="simple", id="typed-1")
    for name, values in (("INPUT0", list(range(32))), ("INPUT1", [2] * 32)):
        t = request.inputs.add(name=name, datatype="INT32", shape=[2, 16])
        t.contents.int_contents.extend(values)
    request.outputs.add(name="OUTPUT0")
    response = stub.ModelInfer(request)
    assert response.id == "typed-1"
    assert [o.name for o in response.outputs] == ["OUTPUT0"]
    assert list(response.outputs[0].shape) == [2, 16]
    out = np.frombuffer(response.raw_output_contents[0], dtype=np.int32).reshape(2, 16)
    np.testing.assert_array_equal(out, np.arange(32).reshape(2, 16) + 2)


def test_typed_contents_with_raw_input_contents_is_refused_in_tritons_words(stub):
    """Triton's explicit-content example clients match on this message."""
    import grpc

    request = service_pb2.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="INT32", shape=[1, 16]).contents.int_contents.extend(range(16))
    request.raw_input_contents.append(np.arange(8, dtype=np.int32).tobytes())
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "contents field must not be specified when using raw_input_contents for 'INPUT0' for model 'simple'; "
        "send every input as raw_input_contents, or every one in its contents")


def test_a_version_that_is_not_a_number_is_refused_in_tritons_words(stub):
    import grpc

    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(service_pb2.ModelInferRequest(model_name="simple", model_version="wrong_specification"))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        "failed to get model version from specified version string 'wrong_specification' for model 'simple'; "
        "a version is a non-negative integer, or empty for the model's latest")


def test_infer_typed_bytes_contents(stub):
    request = service_pb2.ModelInferRequest(model_name="strings")
    t = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 3])
    t.contents.bytes_contents.extend([b"one", b"", b"three"])
    response = stub.ModelInfer(request)
    assert response.outputs[0].datatype == "BYTES"
    assert response.raw_output_contents[0] == b"\x03\x00\x00\x00one\x00\x00\x00\x00\x05\x00\x00\x00three"


# -- classification extension -----------------------------------------------------------


def test_classification(client):
    x = np.array([[0.1, 0.7, 0.05, 0.15], [4.0, 1.0, 2.0, 3.0]], dtype=np.float32)
    i = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("classifier", [i], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    response = result.get_response()
    assert response.outputs[0].datatype == "BYTES"
    assert list(response.outputs[0].shape) == [2, 2]
    out = result.as_numpy("OUTPUT0")
    assert out.tolist() == [[b"0.700000:1:dog", b"0.150000:3:fish"], [b"4.000000:0:cat", b"3.000000:3:fish"]]


def test_classification_without_labels_and_full_output(client):
    a, b = _ab(1)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0", class_count=1), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", _inputs(a, b), outputs=outputs)
    # a + b = [3..18]: the largest is index 15, no label file -> "value:index";
    # an INT32 value prints as an integer (Triton's std::to_string).
    assert result.as_numpy("OUTPUT0").tolist() == [[b"18:15"]]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_classification_non_batching_model(client):
    a, b = _ab(None)
    b[5] = 100
    result = client.infer("add_sub", _inputs(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=3)])
    # No batch dimension: one list of class_count entries over the whole output.
    assert list(result.get_output("OUTPUT0").shape) == [3]
    assert result.as_numpy("OUTPUT0").tolist() == [b"105:5", b"18:15", b"17:14"]


def test_classification_count_larger_than_classes(client):
    x = np.array([[0.5, 0.25, 1.0, 0.0]], dtype=np.float32)
    i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    result = client.infer("classifier", [i], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=10)])
    assert result.as_numpy("OUTPUT0").tolist() == [
        [b"1.000000:2:bird", b"0.500000:0:cat", b"0.250000:1:dog", b"0.000000:3:fish"]]


async def test_concurrent_requests_each_get_their_own_rows(server):
    """Dynamic batching joins concurrent requests into one execution and splits the
    results back: every request must get exactly its own rows."""
    import asyncio

    client = aioclient.InferenceServerClient(server.url)
    try:
        sizes = [1, 2, 3, 1, 4, 2, 1, 3, 2, 1, 1, 5]

        async def one(k: int, rows: int):
            a = np.full((rows, 16), k, dtype=np.int32) + np.arange(rows, dtype=np.int32)[:, None] * 1000
            b = np.full((rows, 16), k, dtype=np.int32)
            result = await client.infer("simple", _inputs(a, b), request_id=f"r{k}")
            return k, a, b, result

        before = (await client.get_inference_statistics("simple")).model_stats[0]
        for k, a, b, result in await asyncio.gather(*(one(k, rows) for k, rows in enumerate(sizes))):
            assert result.get_response().id == f"r{k}"
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        after = (await client.get_inference_statistics("simple")).model_stats[0]
        assert after.inference_count - before.inference_count == sum(sizes)
        assert after.inference_stats.success.count - before.inference_stats.success.count == len(sizes)
        assert 1 <= after.execution_count - before.execution_count <= len(sizes)
    finally:
        await client.close()


# -- statistics -----------------------------------------------------------------------


def _stats(client, name):
    stats = client.get_inference_statistics(name).model_stats
    assert len(stats) == 1
    return stats[0]


def test_model_statistics(client):
    before = _stats(client, "stats_model")
    sent = [1, 4, 4, 2]
    started_ms = time.time_ns() // 1_000_000
    for rows in sent:
        a, b = _ab(rows)
        client.infer("stats_model", _inputs(a, b))
    finished_ms = time.time_ns() // 1_000_000
    after = _stats(client, "stats_model")
    assert after.name == "stats_model" and after.version == "1"
    assert after.inference_count - before.inference_count == sum(sent)
    assert after.execution_count - before.execution_count == len(sent)
    s0, s1 = before.inference_stats, after.inference_stats
    assert s1.success.count - s0.success.count == len(sent)
    assert s1.fail.count == s0.fail.count
    for field in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        d1, d0 = getattr(s1, field), getattr(s0, field)
        assert d1.count - d0.count == len(sent), field
        assert d1.ns > d0.ns, field
    # last_inference is wall-clock milliseconds of the last request (1 s slack for clock steps).
    assert started_ms - 1000 <= after.last_inference <= finished_ms + 1000
    batches = {b.batch_size: b for b in after.batch_stats}
    old = {b.batch_size: b.compute_infer.count for b in before.batch_stats}
    assert {k: batches[k].compute_infer.count - old.get(k, 0) for k in batches} == {1: 1, 2: 1, 4: 2}
    for b in after.batch_stats:
        assert b.compute_infer.ns > 0 and b.compute_input.count == b.compute_infer.count

    # A refused request counts as one failure and no inference.
    a, b = _ab(1)
    with pytest.raises(InferenceServerException):
        client.infer("stats_model", _inputs(a[:, :15], b[:, :15]))
    failed = _stats(client, "stats_model")
    assert failed.inference_stats.fail.count == s1.fail.count + 1
    assert failed.inference_stats.fail.ns > s1.fail.ns
    assert failed.inference_count == after.inference_count


def test_model_statistics_all_models(client):
    names = {(s.name, s.version) for s in client.get_inference_statistics().model_stats}
    assert {("simple", "1"), ("add_sub", "1"), ("strings", "1"), ("classifier", "1"), ("stats_model", "1")} <= names
    assert not any(n == "broken" for n, _ in names)
    with pytest.raises(InferenceServerException) as exc:
        client.get_inference_statistics("no_such_model")
    assert exc.value.status() == "StatusCode.NOT_FOUND"
    assert "no_such_model" in exc.value.message()


# -- repository -----------------------------------------------------------------------


def test_repository_index(client):
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert set(index) == {"simple", "add_sub", "stats_model", "strings", "classifier", "broken"}
    for name in ("simple", "add_sub", "stats_model", "strings", "classifier"):
        assert (index[name].state, index[name].version, index[name].reason) == ("READY", "1", "")
    broken = index["broken"]
    assert broken.state == "UNAVAILABLE"
    assert "broken" in broken.reason and "INPUT0" in broken.reason and "[15]" in broken.reason


def test_repository_index_ready_only(stub):
    response = stub.RepositoryIndex(service_pb2.RepositoryIndexRequest(ready=True))
    assert {m.name for m in response.models} == {"simple", "add_sub", "stats_model", "strings", "classifier"}


def test_broken_model_is_unavailable_while_others_serve(client):
    a, b = _ab(1)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("broken", _inputs(a, b))
    assert exc.value.status() == "StatusCode.UNAVAILABLE"
    assert "broken" in exc.value.message()
    assert client.infer("simple", _inputs(a, b)).as_numpy("OUTPUT0") is not None


# -- not implemented yet ----------------------------------------------------------------


@pytest.mark.parametrize("call", [
    lambda c: c.load_model("simple"),
    lambda c: c.unload_model("simple"),
], ids=["load", "unload"])
def test_unimplemented(client, call):
    """Model control is off in the default mode (none), as Triton; tests/test_model_control.py has the rest."""
    with pytest.raises(InferenceServerException) as exc:
        call(client)
    assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "not supported" in exc.value.message()
    assert client.is_server_live()


def test_stream_infer(client):
    import queue

    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        a, b = _ab(1)
        client.async_stream_infer("simple", _inputs(a, b), request_id="s1")
        result, error = results.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None
    assert result.get_response().id == "s1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


# -- the aio client -------------------------------------------------------------------


async def test_aio_client(server):
    client = aioclient.InferenceServerClient(server.url)
    try:
        assert await client.is_server_live() is True
        assert await client.is_server_ready() is False
        assert (await client.get_server_metadata()).name == "triton"
        assert await client.is_model_ready("simple") is True
        assert await client.is_model_ready("broken") is False
        md = await client.get_model_metadata("simple")
        assert md.platform == "onnxruntime_onnx" and list(md.inputs[0].shape) == [-1, 16]
        assert (await client.get_model_config("simple")).config.max_batch_size == 8
        index = {m.name: m.state for m in (await client.get_model_repository_index()).models}
        assert index["broken"] == "UNAVAILABLE" and index["simple"] == "READY"

        before = (await client.get_inference_statistics("simple")).model_stats[0]
        a, b = _ab(3)
        result = await client.infer("simple", _inputs(a, b), request_id="aio-1",
                                    outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
        assert result.get_response().id == "aio-1"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        assert result.as_numpy("OUTPUT1") is None
        after = (await client.get_inference_statistics("simple")).model_stats[0]
        assert after.inference_count - before.inference_count == 3
        assert after.inference_stats.success.count - before.inference_stats.success.count == 1

        x = np.array([[0.0, 0.0, 9.0, 1.0]], dtype=np.float32)
        i = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        i.set_data_from_numpy(x)
        result = await client.infer("classifier", [i], outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)])
        assert result.as_numpy("OUTPUT0").tolist() == [[b"9.000000:2:bird"]]

        with pytest.raises(InferenceServerException) as exc:
            await client.infer("no_such_model", _inputs(a, b))
        assert exc.value.status() == "StatusCode.NOT_FOUND"
        with pytest.raises(InferenceServerException) as exc:
            await client.load_model("simple")
        assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
    finally:
        await client.close()


def test_server_name_option(start_server, tmp_path):
    """--server-name: the name ServerMetadata answers over gRPC and HTTP (default 'triton')."""
    import tritonclient.http as httpclient

    (tmp_path / "empty").mkdir()
    server = start_server(tmp_path / "empty", ["--server-name", "inferd"])
    assert grpcclient.InferenceServerClient(server.url).get_server_metadata().name == "inferd"
    metadata = httpclient.InferenceServerClient(server.http_url).get_server_metadata()
    assert metadata["name"] == "inferd" and metadata["version"] == "0.1.0"

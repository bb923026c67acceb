"""Issue #7: Triton's system shared memory extension, through tritonclient's own
shared memory utilities against a real server; the region bookkeeping and the
zero-copy read in-process; perf_analyzer --shared-memory system."""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from conftest import ServerProcess
from inferd.dtypes import BY_NAME
from inferd.errors import AlreadyExists, InvalidArgument, NotFound
from inferd.dataplane.shared_memory import SharedMemoryManager
from inferd.frontends.grpc_codec import shm_ref



@pytest.fixture(scope="module")
def server(example_repository):
    s = ServerProcess(example_repository, ["--allow-client-shm"])
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions():
    """Create shm regions with unique keys; destroyed after the test."""
    made = []

    def make(name: str, size: int):
        handle = shm.create_shared_memory_region(name, f"/inferd_test_{uuid.uuid4().hex[:12]}", size)
        made.append(handle)
        return handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def _key(handle) -> str:
    return handle._shm_key


def _simple_inputs(a: np.ndarray, b: np.ndarray):
    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "INT32"), grpcclient.InferInput("INPUT1", list(b.shape), "INT32")]
    return inputs


def _status(error) -> str:
    return error.value.status()


# -- inference through regions ----------------------------------------------------------


def test_simple_inputs_and_outputs_in_shared_memory(client, regions):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    nbytes = a.nbytes
    ip = regions("input_data", nbytes * 2)
    op = regions("output_data", nbytes * 2)
    shm.set_shared_memory_region(ip, [a])
    shm.set_shared_memory_region(ip, [b], offset=nbytes)
    client.register_system_shared_memory("input_data", _key(ip), nbytes * 2)
    client.register_system_shared_memory("output_data", _key(op), nbytes * 2)

    inputs = _simple_inputs(a, b)
    inputs[0].set_shared_memory("input_data", nbytes)
    inputs[1].set_shared_memory("input_data", nbytes, offset=nbytes)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory("output_data", nbytes)
    outputs[1].set_shared_memory("output_data", nbytes, offset=nbytes)
    result = client.infer("simple", inputs, outputs=outputs)

    response = result.get_response()
    assert [o.name for o in response.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert [list(o.shape) for o in response.outputs] == [[1, 16], [1, 16]]
    assert all(len(raw) == 0 for raw in response.raw_output_contents)  # the data went to the region
    out0 = shm.get_contents_as_numpy(op, np.int32, [1, 16])
    out1 = shm.get_contents_as_numpy(op, np.int32, [1, 16], offset=nbytes)
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)

    # The client rewrites its input region and asks again: the server sees the new values.
    shm.set_shared_memory_region(ip, [a * 10])
    client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [1, 16]), a * 10 + b)


def test_mixed_shared_memory_and_inline_tensors(client, regions):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    ip = regions("in_b", b.nbytes)
    op = regions("out_1", b.nbytes)
    shm.set_shared_memory_region(ip, [b])
    client.register_system_shared_memory("in_b", _key(ip), b.nbytes)
    client.register_system_shared_memory("out_1", _key(op), b.nbytes)
    inputs = _simple_inputs(a, b)
    inputs[0].set_data_from_numpy(a)  # inline, raw_input_contents[0]
    inputs[1].set_shared_memory("in_b", b.nbytes)
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    outputs[1].set_shared_memory("out_1", b.nbytes)
    result = client.infer("simple", inputs, outputs=outputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [2, 16]), a - b)


def test_region_registered_at_an_offset(client, regions):
    """Offsets in a request are relative to the registered window, not the shm object."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    handle = regions("big", 4096 + 2 * a.nbytes)
    shm.set_shared_memory_region(handle, [a, a], offset=4096)
    client.register_system_shared_memory("window", _key(handle), 2 * a.nbytes, offset=4096)
    status = client.get_system_shared_memory_status("window").regions["window"]
    assert (status.key, status.offset, status.byte_size) == (_key(handle), 4096, 2 * a.nbytes)
    inputs = _simple_inputs(a, a)
    inputs[0].set_shared_memory("window", a.nbytes)
    inputs[1].set_shared_memory("window", a.nbytes, offset=a.nbytes)
    result = client.infer("simple", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_bytes_tensors_in_shared_memory(client, regions):
    values = np.array([[b"hello", b"", b"shared memory"] + [b"x%d" % i for i in range(13)]], dtype=np.object_)
    data = serialize_byte_tensor(values)
    size = len(data.item())
    ip = regions("str_in", size)
    op = regions("str_out", size)
    shm.set_shared_memory_region(ip, [data])  # tritonclient takes BYTES serialized
    client.register_system_shared_memory("str_in", _key(ip), size)
    client.register_system_shared_memory("str_out", _key(op), size)
    i = grpcclient.InferInput("INPUT0", [1, 16], "BYTES")
    i.set_shared_memory("str_in", size)
    o = grpcclient.InferRequestedOutput("OUTPUT0")
    o.set_shared_memory("str_out", size)
    client.infer("simple_string", [i], outputs=[o])
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.object_, [1, 16]), values)


def test_shared_memory_through_model_stream_infer(client, regions):
    import queue

    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    ip, op = regions("s_in", 2 * a.nbytes), regions("s_out", a.nbytes)
    shm.set_shared_memory_region(ip, [a, a])
    client.register_system_shared_memory("s_in", _key(ip), 2 * a.nbytes)
    client.register_system_shared_memory("s_out", _key(op), a.nbytes)
    inputs = _simple_inputs(a, a)
    inputs[0].set_shared_memory("s_in", a.nbytes)
    inputs[1].set_shared_memory("s_in", a.nbytes, offset=a.nbytes)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("s_out", a.nbytes)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        client.async_stream_infer("simple", inputs, outputs=[out])
        result, error = results.get(timeout=30)
    finally:
        client.stop_stream()
    assert error is None
    np.testing.assert_array_equal(shm.get_contents_as_numpy(op, np.int32, [1, 16]), a + a)


# -- registration ------------------------------------------------------------------------


def test_register_status_unregister(client, regions):
    h1, h2 = regions("r1", 64), regions("r2", 128)
    client.register_system_shared_memory("r1", _key(h1), 64)
    client.register_system_shared_memory("r2", _key(h2), 128, offset=0)
    regs = client.get_system_shared_memory_status().regions
    assert {n: (r.key, r.byte_size) for n, r in regs.items()} == {"r1": (_key(h1), 64), "r2": (_key(h2), 128)}

    with pytest.raises(InferenceServerException) as exc:
        client.register_system_shared_memory("r1", _key(h2), 64)
    assert _status(exc) == "StatusCode.ALREADY_EXISTS" and "r1" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        client.get_system_shared_memory_status("nope")
    assert _status(exc) == "StatusCode.NOT_FOUND" and "nope" in exc.value.message()

    client.unregister_system_shared_memory("r1")
    assert set(client.get_system_shared_memory_status().regions) == {"r2"}
    client.unregister_system_shared_memory("r1")  # unknown: nothing to do, as Triton
    client.unregister_system_shared_memory()  # all
    assert not client.get_system_shared_memory_status().regions


@pytest.mark.parametrize("key, offset, size, words", [
    ("/../../etc/passwd", 0, 16, ["not a shared memory object name"]),
    ("/a/b", 0, 16, ["not a shared memory object name"]),
    ("..", 0, 16, ["not a shared memory object name"]),
    ("/inferd_test_missing_key", 0, 16, ["unable to open", "No such file"]),
    (None, 0, 4096, ["beyond the end"]),  # larger than the object
    (None, 64, 1, ["beyond the end"]),  # the window ends past the object
    (None, 0, 0, ["byte_size must be > 0"]),
], ids=["traversal", "slash", "dotdot", "missing", "too_big", "offset_past_end", "zero"])
def test_register_refuses_what_it_cannot_map(client, regions, key, offset, size, words):
    handle = regions("bad", 64)
    with pytest.raises(InferenceServerException) as exc:
        client.register_system_shared_memory("bad", key or _key(handle), size, offset=offset)
    assert _status(exc) == "StatusCode.INVALID_ARGUMENT"
    for word in words:
        assert word in exc.value.message(), exc.value.message()
    assert not client.get_system_shared_memory_status().regions


# -- requests that do not fit their region -------------------------------------------------


def _one_input_request(client, region: str, size: int, offset: int = 0):
    a = np.ones((1, 16), dtype=np.int32)
    inputs = _simple_inputs(a, a)
    inputs[0].set_shared_memory(region, size, offset=offset)
    inputs[1].set_data_from_numpy(a)
    return client.infer("simple", inputs)


@pytest.mark.parametrize("size, offset, words", [
    (64, 32, ["invalid offset + byte size", "'in64'", "offset 32", "64 bytes"]),
    (64, 100, ["invalid offset + byte size", "'in64'"]),
    (128, 0, ["invalid offset + byte size", "'in64'"]),
    (32, 0, ["'in64'", "byte size 32", "64 bytes", "INPUT0"]),
], ids=["offset_plus_size", "offset_past_end", "size_past_end", "size_not_the_tensors"])
def test_bad_input_offsets_and_sizes(client, regions, size, offset, words):
    handle = regions("in64", 64)
    client.register_system_shared_memory("in64", _key(handle), 64)
    with pytest.raises(InferenceServerException) as exc:
        _one_input_request(client, "in64", size, offset)
    assert _status(exc) == "StatusCode.INVALID_ARGUMENT"
    for word in words:
        assert word in exc.value.message(), exc.value.message()


def test_unknown_region_is_not_found(client):
    with pytest.raises(InferenceServerException) as exc:
        _one_input_request(client, "never_registered", 64)
    assert _status(exc) == "StatusCode.NOT_FOUND"
    assert "never_registered" in exc.value.message() and "INPUT0" in exc.value.message()


def test_output_region_too_small_or_out_of_bounds(client, regions):
    a = np.ones((1, 16), dtype=np.int32)
    handle = regions("out_small", 64)
    client.register_system_shared_memory("out_small", _key(handle), 64)
    inputs = _simple_inputs(a, a)
    for i in inputs:
        i.set_data_from_numpy(a)
    out = grpcclient.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory("out_small", 32)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs, outputs=[out])
    assert _status(exc) == "StatusCode.INVALID_ARGUMENT"
    assert "'out_small'" in exc.value.message() and "64 bytes" in exc.value.message() and "OUTPUT0" in exc.value.message()
    out.set_shared_memory("out_small", 64, offset=8)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("simple", inputs, outputs=[out])
    assert _status(exc) == "StatusCode.INVALID_ARGUMENT" and "'out_small'" in exc.value.message()


def test_unregistered_region_is_refused_afterwards(client, regions):
    handle = regions("gone", 64)
    client.register_system_shared_memory("gone", _key(handle), 64)
    client.unregister_system_shared_memory("gone")
    with pytest.raises(InferenceServerException) as exc:
        _one_input_request(client, "gone", 64)
    assert _status(exc) == "StatusCode.NOT_FOUND"


# -- off by default (Triton's --allow-client-shm) -----------------------------------------------

DISABLED = "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable."


def test_without_allow_client_shm_registration_is_refused_in_tritons_words(start_server, tmp_path, regions):
    """The default: every register and unregister, system and CUDA, named or all, answers UNIMPLEMENTED / 501
    with Triton's message, through gRPC and HTTP alike (a worker forwards them to the core, which decides);
    the status calls still answer, with no region; a tensor naming a region is refused as unknown."""
    import tritonclient.http as httpclient

    server = start_server(tmp_path)  # an empty repository: the shared memory calls need no model
    handle = regions("off", 64)
    grpc_client = grpcclient.InferenceServerClient(server.url)
    http_client = httpclient.InferenceServerClient(server.http_url)
    calls = [
        lambda c: c.register_system_shared_memory("off", _key(handle), 64),
        lambda c: c.unregister_system_shared_memory("off"),
        lambda c: c.unregister_system_shared_memory(),
        lambda c: c.register_cuda_shared_memory("gpu", b"\0" * 64 if c is grpc_client else "AAAA", 0, 64),
        lambda c: c.unregister_cuda_shared_memory("gpu"),
        lambda c: c.unregister_cuda_shared_memory(),
    ]
    try:
        for client, status in ((grpc_client, "StatusCode.UNIMPLEMENTED"), (http_client, "501")):
            for call in calls:
                with pytest.raises(InferenceServerException) as exc:
                    call(client)
                assert (exc.value.status(), exc.value.message()) == (status, DISABLED)
        assert not grpc_client.get_system_shared_memory_status().regions
        assert not grpc_client.get_cuda_shared_memory_status().regions
        assert http_client.get_system_shared_memory_status() == []
        assert http_client.get_cuda_shared_memory_status() == []
    finally:
        grpc_client.close()
        http_client.close()


# -- CUDA shared memory ---------------------------------------------------------------------


def test_cuda_shared_memory_has_nothing_and_refuses_registration(client):
    assert not client.get_cuda_shared_memory_status().regions
    client.unregister_cuda_shared_memory()  # clients clear all regions at start-up
    client.unregister_cuda_shared_memory("x")
    with pytest.raises(InferenceServerException) as exc:
        client.register_cuda_shared_memory("cu", b"\0" * 64, 0, 64)
    assert _status(exc) == "StatusCode.UNIMPLEMENTED"
    assert "CUDA" in exc.value.message() and "system shared memory" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        client.get_cuda_shared_memory_status("cu")
    assert _status(exc) == "StatusCode.NOT_FOUND"


# -- in-process: the manager --------------------------------------------------------------------


def _ref(manager: SharedMemoryManager, params: dict, where: str):  # type: ignore[no-untyped-def]
    """A tensor's parameters checked as a frontend does, then bound to its region as the data plane does."""
    return manager.bind(shm_ref(params, where))


def _shm_file(tmp_path: Path, name: str, data: bytes) -> str:
    (tmp_path / name).write_bytes(data)
    return f"/{name}"


def test_reads_are_zero_copy_and_read_only(tmp_path):
    manager = SharedMemoryManager(tmp_path)
    values = np.arange(8, dtype=np.float32)
    key = _shm_file(tmp_path, "f32", b"\0" * 64 + values.tobytes())
    manager.register("r", key, 64, values.nbytes)
    ref = _ref(manager, {"shared_memory_region": "r", "shared_memory_byte_size": values.nbytes}, "input 'X'")
    array = ref.read(BY_NAME["FP32"], (2, 4), "input 'X'")
    np.testing.assert_array_equal(array, values.reshape(2, 4))
    assert not array.flags.writeable  # a model cannot write into the client's memory
    # The same memory: what the client writes now shows through the array (no copy was made).
    ref.write(np.full(8, 5, dtype=np.float32), "output 'Y'")
    np.testing.assert_array_equal(array, np.full((2, 4), 5, dtype=np.float32))
    # Unregistering while the array is alive does not break it; the region is gone for new requests.
    manager.unregister("r")
    assert array.sum() == 40
    with pytest.raises(NotFound):
        _ref(manager, {"shared_memory_region": "r", "shared_memory_byte_size": 4}, "input 'X'")
    with pytest.raises(NotFound):
        ref.read(BY_NAME["FP32"], (2, 4), "input 'X'")


def test_unaligned_offsets_are_copied(tmp_path):
    manager = SharedMemoryManager(tmp_path)
    values = np.arange(4, dtype=np.int32)
    key = _shm_file(tmp_path, "odd", b"\0" + values.tobytes())
    manager.register("odd", key, 0, 1 + values.nbytes)
    ref = _ref(manager, {"shared_memory_region": "odd", "shared_memory_offset": 1,
                       "shared_memory_byte_size": values.nbytes}, "input 'X'")
    array = ref.read(BY_NAME["INT32"], (4,), "input 'X'")
    np.testing.assert_array_equal(array, values)
    assert array.flags.aligned


def test_manager_refusals(tmp_path):
    manager = SharedMemoryManager(tmp_path)
    key = _shm_file(tmp_path, "k", b"\0" * 32)
    os.symlink(tmp_path / "k", tmp_path / "link")
    with pytest.raises(InvalidArgument, match="unable to open"):
        manager.register("l", "/link", 0, 32)  # symlinks are not followed
    (tmp_path / "dir").mkdir()
    with pytest.raises(InvalidArgument, match="Is a directory"):
        manager.register("d", "/dir", 0, 32)
    manager.register("k", key, 0, 32)
    with pytest.raises(AlreadyExists):
        manager.register("k", key, 0, 32)
    for params, word in [
        ({"shared_memory_region": "k"}, "is required"),
        ({"shared_memory_region": "k", "shared_memory_byte_size": -1}, "non-negative"),
        ({"shared_memory_region": "k", "shared_memory_byte_size": 8, "shared_memory_offset": "1"}, "non-negative"),
        ({"shared_memory_byte_size": 8}, "without 'shared_memory_region'"),
        ({"shared_memory_region": "k", "shared_memory_byte_size": 33}, r"invalid offset \+ byte size"),
    ]:
        with pytest.raises(InvalidArgument, match=word):
            _ref(manager, params, "input 'X'")
    manager.close()
    assert not manager.status()


# -- perf_analyzer ------------------------------------------------------------------------------


def test_perf_analyzer_with_system_shared_memory(server, client, perf_analyzer):
    result = subprocess.run(
        [perf_analyzer, "-m", "mlp", "-u", server.url, "-i", "grpc", "--shared-memory", "system",
         "--concurrency-range", "2", "--measurement-mode", "count_windows", "--measurement-request-count", "100",
         # This checks that it works, not how fast: a busy machine must not fail it for instability.
         "--stability-percentage", "1000", "--max-trials", "3"],
        capture_output=True, text=True, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Throughput" in result.stdout
    # perf_analyzer cleans up after itself: no region stays registered.
    assert not client.get_system_shared_memory_status().regions

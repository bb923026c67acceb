"""The TorchScript backend through tritonclient.grpc on a real server (CPU):
every data type, both naming conventions, batching, parameters, errors."""

from __future__ import annotations

import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import torch_models as tm
from inferd.examples.build import (
    TORCH_MLP_D_IN, TORCH_MLP_D_OUT, TORCH_MLP_HIDDEN, TORCH_MLP_SEED, build_repository, ensemble_steps,
    triton_config,
)

# wire type -> (numpy dtype, config type); add_sub works on all of these
NUMERIC = {
    "UINT8": (np.uint8, "TYPE_UINT8"),
    "INT8": (np.int8, "TYPE_INT8"),
    "INT16": (np.int16, "TYPE_INT16"),
    "INT32": (np.int32, "TYPE_INT32"),
    "INT64": (np.int64, "TYPE_INT64"),
    "FP16": (np.float16, "TYPE_FP16"),
    "BF16": (ml_dtypes.bfloat16, "TYPE_BF16"),
    "FP32": (np.float32, "TYPE_FP32"),
    "FP64": (np.float64, "TYPE_FP64"),
}
PT = "pytorch_libtorch"


def _model(repo: Path, name: str, data: bytes, config_text: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.pt").write_bytes(data)
    (repo / name / "config.pbtxt").write_text(config_text)


def _add_sub_config(name: str, ctype: str, dims=(8,), max_batch_size: int = 4, extra: str = "") -> str:  # type: ignore[no-untyped-def]
    return triton_config(
        name,
        [("INPUT__0", ctype, list(dims)), ("INPUT__1", ctype, list(dims))],
        [("OUTPUT__0", ctype, list(dims)), ("OUTPUT__1", ctype, list(dims))],
        max_batch_size=max_batch_size, platform=PT, extra=extra,
    )


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("torch_repo")
    build_repository(repo, only=["torch_add_sub", "torch_mlp"], log=None)
    add_sub, identity = tm.add_sub(), tm.identity()
    for wire, (_, ctype) in NUMERIC.items():
        _model(repo, f"ts_{wire.lower()}", add_sub, _add_sub_config(f"ts_{wire.lower()}", ctype))
    _model(repo, "ts_bool", identity, triton_config(
        "ts_bool", [("INPUT__0", "TYPE_BOOL", [-1])], [("OUTPUT__0", "TYPE_BOOL", [-1])], max_batch_size=4,
        platform=PT))
    # Named by forward's arguments, listed out of order; outputs by config order.
    _model(repo, "ts_named", add_sub, triton_config(
        "ts_named", [("b", "TYPE_FP32", [3]), ("a", "TYPE_FP32", [3])],
        [("sum", "TYPE_FP32", [3]), ("difference", "TYPE_FP32", [3])], max_batch_size=0, platform=PT))
    # Output index convention picks results out of order.
    _model(repo, "ts_swapped", add_sub, triton_config(
        "ts_swapped", [("x__0", "TYPE_INT32", [2]), ("y__1", "TYPE_INT32", [2])],
        [("DIFF__1", "TYPE_INT32", [2]), ("SUM__0", "TYPE_INT32", [2])], max_batch_size=0, platform=PT))
    _model(repo, "ts_params", add_sub, _add_sub_config("ts_params", "TYPE_FP32", extra="""
parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }
parameters { key: "INTER_OP_THREAD_COUNT" value { string_value: "1" } }
parameters { key: "INFERENCE_MODE" value { string_value: "false" } }
parameters { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } }
parameters { key: "ENABLE_NVFUSER" value { string_value: "false" } }
"""))
    # Broken on purpose: each fails to load (or to run) with a clear message.
    _model(repo, "ts_no_io", add_sub, 'name: "ts_no_io"\nplatform: "pytorch_libtorch"\nmax_batch_size: 4\n')
    _model(repo, "ts_bad_name", add_sub, triton_config(
        "ts_bad_name", [("foo", "TYPE_FP32", [2]), ("bar", "TYPE_FP32", [2])],
        [("OUTPUT__0", "TYPE_FP32", [2])], platform=PT))
    _model(repo, "ts_uint16", add_sub, _add_sub_config("ts_uint16", "TYPE_UINT16"))
    _model(repo, "ts_wrong_dtype", add_sub, triton_config(
        "ts_wrong_dtype", [("INPUT__0", "TYPE_INT32", [2]), ("INPUT__1", "TYPE_INT32", [2])],
        [("OUTPUT__0", "TYPE_FP32", [2])], platform=PT))
    _model(repo, "ts_gpu", add_sub, _add_sub_config("ts_gpu", "TYPE_FP32").replace("KIND_CPU", "KIND_GPU"))
    _string_models(repo)
    (repo / "ts_corrupt" / "1").mkdir(parents=True)
    (repo / "ts_corrupt" / "1" / "model.pt").write_bytes(b"not a zip archive")
    (repo / "ts_corrupt" / "config.pbtxt").write_text(_add_sub_config("ts_corrupt", "TYPE_FP32"))
    # Two TorchScript steps on one device (the CPU): the middle tensors pass as torch tensors.
    (repo / "ts_twice" / "1").mkdir(parents=True)
    (repo / "ts_twice" / "config.pbtxt").write_text(triton_config(
        "ts_twice", [("A", "TYPE_FP32", [8]), ("B", "TYPE_FP32", [8])],
        [("TWICE_A", "TYPE_FP32", [8]), ("TWICE_B", "TYPE_FP32", [8])], max_batch_size=4, platform="ensemble",
        instance_count=0, extra=ensemble_steps([
            ("ts_fp32", {"INPUT__0": "A", "INPUT__1": "B"}, {"OUTPUT__0": "sum", "OUTPUT__1": "diff"}),
            ("ts_fp32", {"INPUT__0": "sum", "INPUT__1": "diff"}, {"OUTPUT__0": "TWICE_A", "OUTPUT__1": "TWICE_B"}),
        ])))
    return repo


STR = "TYPE_STRING"
SCALAR = "reshape: { shape: [ ] }"  # one string per batch row: the List[str] is the batch


def _string_models(repo: Path) -> None:
    """Triton's QA string models (libtorch_nobatch_object_object_object and the like, and
    the batching ones with an empty reshape), plus the configs Triton's backend refuses."""
    pair = [("INPUT0", STR, [16]), ("INPUT1", STR, [16])]
    _model(repo, "ts_str", tm.string_add_sub(), triton_config(
        "ts_str", pair, [("OUTPUT__0", STR, [16]), ("OUTPUT__1", STR, [16])], platform=PT))
    _model(repo, "ts_str_mixed", tm.string_to_tensor(), triton_config(
        "ts_str_mixed", pair, [("OUTPUT__0", STR, [16]), ("OUTPUT__1", "TYPE_INT32", [16])], platform=PT))
    _model(repo, "ts_to_str", tm.tensor_to_string(), triton_config(
        "ts_to_str", [("INPUT0", "TYPE_INT32", [4]), ("INPUT1", "TYPE_INT32", [4])],
        [("OUTPUT__0", STR, [4])], platform=PT))
    batched = triton_config(
        "ts_str_batch", [("INPUT0", STR, [1]), ("INPUT1", STR, [1])],
        [("OUTPUT__0", STR, [1]), ("OUTPUT__1", STR, [1])], max_batch_size=8, platform=PT,
        dynamic_batching="max_queue_delay_microseconds: 200000")
    _model(repo, "ts_str_batch", tm.string_add_sub(), batched.replace("dims: [ 1 ]", f"dims: [ 1 ] {SCALAR}"))
    _model(repo, "ts_upper", tm.upper(), triton_config(
        "ts_upper", [("TEXT", STR, [-1])], [("UPPER", STR, [-1])], platform=PT))
    # Refused at load, as Triton's backend refuses them.
    _model(repo, "ts_str_2d", tm.upper(), triton_config(
        "ts_str_2d", [("TEXT", STR, [2, 2])], [("UPPER", STR, [4])], platform=PT))
    _model(repo, "ts_str_no_reshape", tm.upper(), triton_config(
        "ts_str_no_reshape", [("TEXT", STR, [1])], [("UPPER", STR, [1])], max_batch_size=4, platform=PT))
    _model(repo, "ts_str_tensor_arg", tm.add_sub(), triton_config(
        "ts_str_tensor_arg", [("INPUT__0", STR, [2]), ("INPUT__1", STR, [2])], [("OUTPUT__0", STR, [2])],
        platform=PT))


@pytest.fixture(scope="module")
def server(repo):
    with running(repo, no_traceback=False) as server:
        yield server


def _input(name: str, array: np.ndarray, wire: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(array.shape), wire)
    t.set_data_from_numpy(array)
    return t


def _values(dtype, shape, seed: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 50, size=shape).astype(dtype)
    return rng.uniform(-4, 4, size=shape).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("wire", list(NUMERIC))
def test_every_numeric_type(client, wire):
    dtype = NUMERIC[wire][0]
    a, b = _values(dtype, (3, 8), 1), _values(dtype, (3, 8), 2)
    name = f"ts_{wire.lower()}"
    result = client.infer(name, [_input("INPUT__0", a, wire), _input("INPUT__1", b, wire)])
    total, diff = result.as_numpy("OUTPUT__0"), result.as_numpy("OUTPUT__1")
    assert total.dtype == np.dtype(dtype) and total.shape == (3, 8)
    # torch computes in the type itself; compare with torch on the same values
    ta = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16) if wire == "BF16" else torch.from_numpy(a)
    tb = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16) if wire == "BF16" else torch.from_numpy(b)
    want_sum, want_diff = ta + tb, ta - tb
    if wire == "BF16":
        want_sum = want_sum.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        want_diff = want_diff.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    else:
        want_sum, want_diff = want_sum.numpy(), want_diff.numpy()
    assert total.tobytes() == want_sum.tobytes()
    assert diff.tobytes() == want_diff.tobytes()


def test_bool(client):
    x = np.array([[True, False, True], [False, False, True]])
    result = client.infer("ts_bool", [_input("INPUT__0", x, "BOOL")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), x)


def test_example_add_sub_index_convention(client):
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 5, dtype=np.int32)
    result = client.infer("torch_add_sub", [_input("INPUT__0", a, "INT32"), _input("INPUT__1", b, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)
    assert client.get_model_metadata("torch_add_sub").platform == "pytorch_libtorch"


def test_example_mlp_named_argument(client):
    x = np.random.default_rng(3).standard_normal((5, TORCH_MLP_D_IN)).astype(np.float32)
    result = client.infer("torch_mlp", [_input("features", x, "FP32")])
    weights = tm.mlp_weights(TORCH_MLP_D_IN, TORCH_MLP_HIDDEN, TORCH_MLP_D_OUT, TORCH_MLP_SEED)
    logits, probs = tm.mlp_reference(x, weights)
    np.testing.assert_allclose(result.as_numpy("logits"), logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(result.as_numpy("probabilities"), probs, rtol=1e-5, atol=1e-6)
    only = client.infer("torch_mlp", [_input("features", x, "FP32")],
                        outputs=[grpcclient.InferRequestedOutput("probabilities")])
    assert only.as_numpy("logits") is None
    np.testing.assert_allclose(only.as_numpy("probabilities").sum(axis=1), 1, rtol=1e-5)


def test_named_inputs_in_any_order_outputs_in_config_order(client):
    a = np.array([10, 20, 30], dtype=np.float32)
    b = np.array([1, 2, 3], dtype=np.float32)
    result = client.infer("ts_named", [_input("a", a, "FP32"), _input("b", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(result.as_numpy("difference"), a - b)


def test_output_index_convention(client):
    x = np.array([7, 9], dtype=np.int32)
    y = np.array([2, 4], dtype=np.int32)
    result = client.infer("ts_swapped", [_input("x__0", x, "INT32"), _input("y__1", y, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("SUM__0"), x + y)
    np.testing.assert_array_equal(result.as_numpy("DIFF__1"), x - y)


def test_thread_and_mode_parameters(client):
    a, b = _values(np.float32, (2, 8), 4), _values(np.float32, (2, 8), 5)
    result = client.infer("ts_params", [_input("INPUT__0", a, "FP32"), _input("INPUT__1", b, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)


def _concurrently(call, n: int) -> None:  # type: ignore[no-untyped-def]
    """``call(i)`` for i in range(n), each on its own thread at once; re-raises what any raised."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            call(i)
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_requests_batch(client):
    def call(i: int) -> None:
        a = np.full((1, 16), i, dtype=np.int32)
        b = np.arange(16, dtype=np.int32).reshape(1, 16)
        result = client.infer("torch_add_sub", [_input("INPUT__0", a, "INT32"), _input("INPUT__1", b, "INT32")])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)

    _concurrently(call, 24)


def test_load_errors_are_clear(client):
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["torch_add_sub"].state == "READY"
    assert "TorchScript" in index["ts_no_io"].reason and "input" in index["ts_no_io"].reason
    assert "'foo'" in index["ts_bad_name"].reason and "__<index>" in index["ts_bad_name"].reason
    assert "TYPE_UINT16" in index["ts_uint16"].reason
    assert "torch.jit.load" in index["ts_corrupt"].reason
    if not torch.cuda.is_available():
        assert index["ts_gpu"].state == "UNAVAILABLE"
        assert "KIND_GPU" in index["ts_gpu"].reason or "CUDA" in index["ts_gpu"].reason


def test_an_ensemble_of_torchscript_steps_on_one_device_is_right(client):
    a = np.arange(16, dtype=np.float32).reshape(2, 8)
    b = np.full((2, 8), -3, np.float32)
    r = client.infer("ts_twice", [_input("A", a, "FP32"), _input("B", b, "FP32")])
    np.testing.assert_array_equal(r.as_numpy("TWICE_A"), 2 * a)
    np.testing.assert_array_equal(r.as_numpy("TWICE_B"), 2 * b)


def test_output_type_mismatch_is_internal_naming_the_model(client):
    x = np.array([1, 2], dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("ts_wrong_dtype", [_input("INPUT__0", x, "INT32"), _input("INPUT__1", x, "INT32")])
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "ts_wrong_dtype" in info.value.message() and "TYPE_FP32" in info.value.message()


def _text(values) -> np.ndarray:  # type: ignore[no-untyped-def]
    return np.array([str(v).encode() for v in values], dtype=np.object_)


def test_string_inputs_and_outputs_as_list_of_str(client):
    a, b = np.arange(16), np.arange(16)[::-1] * 3
    result = client.infer("ts_str", [_input("INPUT0", _text(a), "BYTES"), _input("INPUT1", _text(b), "BYTES")])
    assert list(result.as_numpy("OUTPUT__0")) == [str(v).encode() for v in a + b]
    assert list(result.as_numpy("OUTPUT__1")) == [str(v).encode() for v in a - b]


def test_string_and_tensor_outputs_mixed(client):
    a, b = np.arange(16), np.full(16, 7)
    result = client.infer("ts_str_mixed", [_input("INPUT0", _text(a), "BYTES"), _input("INPUT1", _text(b), "BYTES")])
    assert list(result.as_numpy("OUTPUT__0")) == [str(v).encode() for v in a + b]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), (a - b).astype(np.int32))
    assert result.as_numpy("OUTPUT__1").dtype == np.int32


def test_forward_returning_one_list_of_str(client):
    x, y = np.array([1, 2, 3, 4], dtype=np.int32), np.array([10, 20, 30, 40], dtype=np.int32)
    result = client.infer("ts_to_str", [_input("INPUT0", x, "INT32"), _input("INPUT1", y, "INT32")])
    assert list(result.as_numpy("OUTPUT__0")) == [b"11", b"22", b"33", b"44"]


def test_utf8_text_round_trips(client):
    text = np.array(["grüße".encode(), "日本".encode(), b""], dtype=np.object_)
    result = client.infer("ts_upper", [_input("TEXT", text, "BYTES")])
    # TorchScript's str.upper() changes ASCII letters only: the multi-byte characters come back intact.
    assert list(result.as_numpy("UPPER")) == ["GRüßE".encode(), "日本".encode(), b""]


def test_bytes_that_are_not_utf8_are_invalid_argument(client):
    text = np.array([b"ok", b"\xff\xfe"], dtype=np.object_)
    with pytest.raises(InferenceServerException) as info:
        client.infer("ts_upper", [_input("TEXT", text, "BYTES")])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == (
        "input 'TEXT' for model 'ts_upper': element 1 is not UTF-8 text (invalid start byte at byte 0); "
        "a TorchScript model takes TYPE_STRING as List[str], which holds UTF-8 text only")


def test_batched_string_requests_share_one_list(client, server):
    """Concurrent one-row requests join into one List[str] and each gets its own row back."""
    def call(i: int) -> None:
        a, b = _text([i * 10]).reshape(1, 1), _text([i]).reshape(1, 1)
        result = client.infer("ts_str_batch", [_input("INPUT0", a, "BYTES"), _input("INPUT1", b, "BYTES")])
        assert result.as_numpy("OUTPUT__0").tolist() == [[str(i * 11).encode()]]
        assert result.as_numpy("OUTPUT__1").tolist() == [[str(i * 9).encode()]]

    _concurrently(call, 8)
    stats = client.get_inference_statistics("ts_str_batch").model_stats[0]
    assert stats.inference_count == 8 and stats.execution_count < 8  # at least two shared an execution


def test_a_bad_request_does_not_fail_its_batch(repo):
    """The backend refuses the non-UTF-8 request alone; the other request of the batch runs."""
    from inferd.backends.base import Device, InstanceSpec
    from inferd.repository.manager import prepare

    prepared = prepare("ts_upper", repo / "ts_upper")
    files = prepared.files[1]
    instance = prepared.backend.create_instance(prepared.spec, InstanceSpec(
        "ts_upper_0", Device("cpu"), repo / "ts_upper", files.parent, 1, files, 1))
    good = {"TEXT": np.array([b"abc"], dtype=np.object_)}
    bad = {"TEXT": np.array([b"\xc3"], dtype=np.object_)}
    result = instance.execute([good, bad, good], ["UPPER"])
    assert list(result.outputs[0]["UPPER"]) == [b"ABC"] and list(result.outputs[2]["UPPER"]) == [b"ABC"]
    assert "element 0 is not UTF-8" in result.outputs[1].message
    instance.close()


def test_string_configs_triton_refuses(client):
    index = {m.name: m.reason for m in client.get_model_repository_index().models}
    assert "model 'ts_str_2d': input 'TEXT' is TYPE_STRING with dims [2, 2]; a TorchScript model takes strings " \
           "as one List[str], so the tensor must be one-dimensional as the model sees it: dims: [n] or [-1]" \
           in index["ts_str_2d"]
    assert "input 'TEXT' is TYPE_STRING with dims [1] and max_batch_size 4" in index["ts_str_no_reshape"]
    assert "dims: [1] with reshape: { shape: [] } (one string per batch row)" in index["ts_str_no_reshape"]
    assert "model 'ts_str_tensor_arg': input 'INPUT__0' is TYPE_STRING, so forward() argument 'a' must be " \
           "List[str]; it is Tensor" in index["ts_str_tensor_arg"]

"""The Python backend through tritonclient.grpc on a real server: Triton's own
model shapes unchanged, auto-complete, request metadata, BLS (sync and async)
into an ONNX model, errors, dynamic batching, load failures, the tokenizer."""

from __future__ import annotations

import importlib.util
import json
import textwrap
import threading
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from inferd.examples.build import TOKENIZER_LENGTH, build_repository, triton_config

# -- model sources --------------------------------------------------------------------

# Triton's python_backend add_sub example, as its README and examples/add_sub show it.
ADD_SUB = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Your Python model must use the same class name. Every Python model
    that is created must have "TritonPythonModel" as the class name.
    """

    def initialize(self, args):
        # You must parse model_config. JSON string is not parsed here
        self.model_config = model_config = json.loads(args["model_config"])

        # Get OUTPUT0 configuration
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")

        # Get OUTPUT1 configuration
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")

        # Convert Triton types to numpy types
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype

        responses = []

        # Every Python backend must iterate over everyone of the requests
        # and create a pb_utils.InferenceResponse for each of them.
        for request in requests:
            # Get INPUT0
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            # Get INPUT1
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")

            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )

            # Create output tensors. You need pb_utils.Tensor
            # objects to create pb_utils.InferenceResponse.
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))

            # Create InferenceResponse. You can set an error here in case
            # there was a problem with handling this inference request.
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)

        # You should return a list of pb_utils.InferenceResponse. Length
        # of this list must match the length of `requests` list.
        return responses

    def finalize(self):
        print("Cleaning up...")
'''

# Triton's identity model (qa/python_models/identity_fp32), positional response.
IDENTITY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:

    def execute(self, requests):
        responses = []
        for request in requests:
            input_tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            out_tensor = pb_utils.Tensor("OUTPUT0", input_tensor.as_numpy())
            responses.append(pb_utils.InferenceResponse([out_tensor]))
        return responses
'''

# No tensors in config.pbtxt: auto_complete_config supplies them, as in
# python_backend's examples/auto_complete/batch_model.py.
AUTO_COMPLETE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [i["name"] for i in config["input"]]
        output_names = [o["name"] for o in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x * 2)]))
        return responses
'''

# Request metadata and initialize's args, returned as JSON.
META = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        pb_utils.Logger.log_info("meta initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            info = {
                "request_id": request.request_id(),
                "requested": request.requested_output_names(),
                "parameters": json.loads(request.parameters()),
                "inputs": [t.name() for t in request.inputs()],
                "writable": bool(request.inputs()[0].as_numpy().flags.writeable),
            }
            out = [
                pb_utils.Tensor("INFO", np.array([json.dumps(info).encode()], dtype=np.object_)),
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], dtype=np.object_)),
                pb_utils.Tensor("MODULE", np.array([__name__.encode()], dtype=np.object_)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=out))
        return responses
'''

# BLS into the ONNX model "onnx_add_sub" (or elsewhere, by the request's "target" parameter).
BLS = '''
import json
import threading

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            params = json.loads(request.parameters())
            target = params.get("target", "onnx_add_sub")
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            bls_request = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            if params.get("thread"):  # from a thread the model starts itself
                box = []
                worker = threading.Thread(target=lambda: box.append(bls_request.exec()))
                worker.start()
                worker.join()
                bls_response = box[0]
            else:
                bls_response = bls_request.exec()
            if bls_response.has_error():
                if params.get("raise"):
                    raise pb_utils.TritonModelException(bls_response.error().message())
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("BLS failed: " + bls_response.error().message())))
                continue
            out_0 = pb_utils.get_output_tensor_by_name(bls_response, "OUTPUT0")
            out_1 = pb_utils.get_output_tensor_by_name(bls_response, "OUTPUT1")
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", out_0.as_numpy()),
                pb_utils.Tensor("DIFF", out_1.as_numpy()),
            ]))
        return responses
'''

# async def execute: two BLS calls in flight at once per request.
BLS_ASYNC = '''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            first = pb_utils.InferenceRequest(
                model_name="onnx_add_sub", requested_output_names=["OUTPUT0"], inputs=[in_0, in_1])
            second = pb_utils.InferenceRequest(
                model_name="onnx_add_sub", requested_output_names=["OUTPUT1"], inputs=[in_0, in_1])
            r0, r1 = await asyncio.gather(first.async_exec(), second.async_exec())
            for r in (r0, r1):
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
            total = (pb_utils.get_output_tensor_by_name(r0, "OUTPUT0").as_numpy()
                     + pb_utils.get_output_tensor_by_name(r1, "OUTPUT1").as_numpy())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", total)]))
        return responses
'''

# x < 0: an error response for that request; x == 999: execute raises.
ERRORS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x == 999).any():
                raise pb_utils.TritonModelException("boom: 999 is not allowed")
            if (x < 0).any():
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("negative input")))
            elif (x == 7).any():
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError("seven is invalid", pb_utils.TritonError.INVALID_ARG)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
'''

# Sleeps so requests queue up; returns how many requests its execute got.
BATCHED = '''
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(0.05)
        n = len(requests)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x),
                pb_utils.Tensor("N", np.full((x.shape[0], 1), n, dtype=np.int32)),
            ]))
        return responses
'''

SAME_NAME = '''
import numpy as np
import triton_python_backend_utils as pb_utils

VALUE = {value}


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([VALUE], dtype=np.int32))])
                for _ in requests]
'''

INIT_FAILS = '''
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot find my weights")

    def execute(self, requests):
        return []
'''

NO_CLASS = '''
class SomethingElse:
    pass
'''

I32_16 = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
O32_16 = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]


def _python_model(repo: Path, name: str, source: str, config_text: str | None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(source).lstrip())
    if config_text is not None:
        (repo / name / "config.pbtxt").write_text(config_text)


def _config(name, inputs, outputs, max_batch_size=0, **kw) -> str:  # type: ignore[no-untyped-def]
    return triton_config(name, inputs, outputs, max_batch_size=max_batch_size, platform=None, backend="python", **kw)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("python_repo")
    fp32_4 = ([("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])],
              [("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])])
    _python_model(repo, "add_sub_py", ADD_SUB, _config("add_sub_py", *fp32_4))
    _python_model(repo, "identity_py", IDENTITY, _config(
        "identity_py", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 8, dynamic_batching=""))
    _python_model(repo, "auto_py", AUTO_COMPLETE, 'name: "auto_py"\nbackend: "python"\n')
    _python_model(repo, "meta_py", META, _config(
        "meta_py", [("X", "TYPE_INT32", [1])],
        [("INFO", "TYPE_STRING", [1]), ("ARGS", "TYPE_STRING", [1]), ("MODULE", "TYPE_STRING", [1])]))
    (repo / "onnx_add_sub" / "1").mkdir(parents=True)
    (repo / "onnx_add_sub" / "1" / "model.onnx").write_bytes(om.serialize(om.add_sub(np.int32, 16, batch=True)))
    (repo / "onnx_add_sub" / "config.pbtxt").write_text(
        triton_config("onnx_add_sub", I32_16, O32_16, max_batch_size=8, dynamic_batching=""))
    bls_out = [("SUM", "TYPE_INT32", [16]), ("DIFF", "TYPE_INT32", [16])]
    _python_model(repo, "bls_py", BLS, _config("bls_py", I32_16, bls_out, 8, dynamic_batching="",
                                                instance_count=2))
    _python_model(repo, "bls_async_py", BLS_ASYNC, _config(
        "bls_async_py", I32_16, [("OUTPUT0", "TYPE_INT32", [16])], 8))
    _python_model(repo, "errors_py", ERRORS, _config(
        "errors_py", [("X", "TYPE_INT32", [1])], [("Y", "TYPE_INT32", [1])], 8,
        dynamic_batching="max_queue_delay_microseconds: 50000"))
    _python_model(repo, "batched_py", BATCHED, _config(
        "batched_py", [("X", "TYPE_FP32", [2])], [("Y", "TYPE_FP32", [2]), ("N", "TYPE_INT32", [1])], 8,
        dynamic_batching="max_queue_delay_microseconds: 20000"))
    for name, value in (("same_a", 1), ("same_b", 2)):
        _python_model(repo, name, SAME_NAME.format(value=value),
                      _config(name, [("X", "TYPE_INT32", [1])], [("Y", "TYPE_INT32", [1])]))
    _python_model(repo, "init_fails_py", INIT_FAILS,
                  _config("init_fails_py", [("X", "TYPE_INT32", [1])], [("Y", "TYPE_INT32", [1])]))
    _python_model(repo, "no_class_py", NO_CLASS,
                  _config("no_class_py", [("X", "TYPE_INT32", [1])], [("Y", "TYPE_INT32", [1])]))
    _python_model(repo, "inline_py", IDENTITY, _config(
        "inline_py", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])],
        extra='parameters { key: "inferd.execution" value { string_value: "inline" } }'))
    build_repository(repo, only=["tokenizer"], log=None)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with running(repo, no_traceback=False) as server:
        yield server


def _input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    dtype = "BYTES" if array.dtype == np.object_ else {
        np.dtype(np.float32): "FP32", np.dtype(np.int32): "INT32", np.dtype(np.int64): "INT64"}[array.dtype]
    t = grpcclient.InferInput(name, list(array.shape), dtype)
    t.set_data_from_numpy(array)
    return t


def _outputs(*names: str) -> list[grpcclient.InferRequestedOutput]:
    return [grpcclient.InferRequestedOutput(n) for n in names]


# -- Triton models unchanged ---------------------------------------------------------------


def test_add_sub_as_triton_documents_it(client):
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 0.5, dtype=np.float32)
    result = client.infer("add_sub_py", [_input("INPUT0", a), _input("INPUT1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert client.get_model_metadata("add_sub_py").platform == "python"


def test_identity_batched(client):
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    result = client.infer("identity_py", [_input("INPUT0", x)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


def test_auto_complete_config(client):
    config = client.get_model_config("auto_py", as_json=True)["config"]
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [("INPUT0", "TYPE_FP32")]
    assert [(t["name"], t["data_type"]) for t in config["output"]] == [("OUTPUT0", "TYPE_FP32")]
    x = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_array_equal(client.infer("auto_py", [_input("INPUT0", x)]).as_numpy("OUTPUT0"), x * 2)


def test_request_metadata_and_initialize_args(client, repo):
    x = np.array([5], dtype=np.int32)
    result = client.infer("meta_py", [_input("X", x)], request_id="req-42",
                          parameters={"color": "blue", "n": 3}, outputs=_outputs("INFO", "ARGS"))
    info = json.loads(result.as_numpy("INFO")[0])
    assert info["request_id"] == "req-42"
    assert info["requested"] == ["INFO", "ARGS"]
    assert info["parameters"]["color"] == "blue" and info["parameters"]["n"] == 3
    assert info["inputs"] == ["X"]
    assert info["writable"] is True  # as_numpy hands out a writable array, as Triton does
    args = json.loads(result.as_numpy("ARGS")[0])
    assert set(args) == {"model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
                         "model_repository", "model_version", "model_name"}
    assert args["model_name"] == "meta_py" and args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == "meta_py_0_0"
    assert Path(args["model_repository"]) == repo / "meta_py"
    model_config = json.loads(args["model_config"])
    assert model_config["name"] == "meta_py" and model_config["backend"] == "python"
    assert model_config["input"][0]["dims"] == [1]  # numbers, as Triton gives them

    everything = client.infer("meta_py", [_input("X", x)])
    assert json.loads(everything.as_numpy("INFO")[0])["requested"] == ["INFO", "ARGS", "MODULE"]


def test_same_module_names_do_not_clash(client):
    x = np.array([0], dtype=np.int32)
    assert client.infer("same_a", [_input("X", x)]).as_numpy("Y")[0] == 1
    assert client.infer("same_b", [_input("X", x)]).as_numpy("Y")[0] == 2
    module = client.infer("meta_py", [_input("X", x)]).as_numpy("MODULE")[0].decode()
    assert module != "model" and "meta_py" in module


# -- BLS ----------------------------------------------------------------------------------


def test_bls_calls_onnx_model(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    result = client.infer("bls_py", [_input("INPUT0", a), _input("INPUT1", b)])
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    stats = client.get_inference_statistics("onnx_add_sub").model_stats[0]
    assert stats.inference_count >= 1  # the BLS call went through inferd's data plane


def test_bls_from_a_thread_the_model_started(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 5, dtype=np.int32)
    result = client.infer("bls_py", [_input("INPUT0", a), _input("INPUT1", b)], parameters={"thread": True})
    np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)


def test_bls_concurrent(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            b = np.full((1, 16), i, dtype=np.int32)
            result = client.infer("bls_py", [_input("INPUT0", a), _input("INPUT1", b)])
            np.testing.assert_array_equal(result.as_numpy("SUM"), a + b)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_bls_error_comes_back_as_response_error(client):
    a = np.zeros((1, 16), dtype=np.int32)
    with pytest.raises(InferenceServerException) as info:
        client.infer("bls_py", [_input("INPUT0", a), _input("INPUT1", a)], parameters={"target": "no_such_model"})
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "bls_py" in info.value.message()
    assert "BLS failed" in info.value.message() and "no_such_model" in info.value.message()


def test_bls_async_execute(client):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 2, dtype=np.int32)
    result = client.infer("bls_async_py", [_input("INPUT0", a), _input("INPUT1", b)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (a + b) + (a - b))


# -- errors ---------------------------------------------------------------------------------


def test_execute_raising_is_internal_naming_the_model(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("errors_py", [_input("X", np.array([[999]], dtype=np.int32))])
    assert info.value.status() == "StatusCode.INTERNAL"
    assert "errors_py" in info.value.message() and "boom: 999 is not allowed" in info.value.message()
    # The instance keeps serving.
    ok = client.infer("errors_py", [_input("X", np.array([[1]], dtype=np.int32))])
    assert ok.as_numpy("Y")[0, 0] == 2


def test_error_response_fails_only_its_request(client):
    values = [1, -1, 2, 3, -5, 4, 7]
    results: dict[int, object] = {}

    def call(i: int, v: int) -> None:
        try:
            results[i] = client.infer("errors_py", [_input("X", np.array([[v]], dtype=np.int32))]).as_numpy("Y")
        except InferenceServerException as exc:
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i, v)) for i, v in enumerate(values)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, v in enumerate(values):
        r = results[i]
        if v < 0:
            assert isinstance(r, InferenceServerException)
            assert r.status() == "StatusCode.INTERNAL"
            assert "errors_py" in r.message() and "negative input" in r.message()
        elif v == 7:
            assert isinstance(r, InferenceServerException)
            assert r.status() == "StatusCode.INVALID_ARGUMENT"  # the TritonError's code
        else:
            assert not isinstance(r, InferenceServerException), r
            assert r[0, 0] == v + 1


def test_load_failures_are_reported(client):
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index["init_fails_py"].state == "UNAVAILABLE"
    assert "cannot find my weights" in index["init_fails_py"].reason
    assert "TritonPythonModel" in index["no_class_py"].reason
    assert "inline" in index["inline_py"].reason
    assert index["add_sub_py"].state == "READY"


# -- dynamic batching -----------------------------------------------------------------------


def test_dynamic_batching_gives_execute_several_requests(client):
    count = 16
    seen: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        try:
            x = np.full((1, 2), i, dtype=np.float32)
            result = client.infer("batched_py", [_input("X", x)])
            np.testing.assert_array_equal(result.as_numpy("Y"), x)
            with lock:
                seen.append(int(result.as_numpy("N")[0, 0]))
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert max(seen) > 1, seen
    stats = client.get_inference_statistics("batched_py").model_stats[0]
    assert stats.inference_count == count
    assert stats.execution_count < stats.inference_count


# -- the example tokenizer ------------------------------------------------------------------


def _tokenizer_module(repo: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("tokenizer_under_test", repo / "tokenizer" / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tokenizer_example(client, repo):
    texts = ["Hello, world!", "This movie is GREAT", "zyzzyva " * 30]
    batch = np.array([[t.encode()] for t in texts], dtype=np.object_)
    result = client.infer("tokenizer", [_input("TEXT", batch)])
    ids, mask = result.as_numpy("INPUT_IDS"), result.as_numpy("ATTENTION_MASK")
    assert ids.shape == (3, TOKENIZER_LENGTH) and ids.dtype == np.int64
    tok = _tokenizer_module(repo)
    for row, text in enumerate(texts):
        want_ids, want_mask = tok.encode(text, TOKENIZER_LENGTH)
        assert ids[row].tolist() == want_ids
        assert mask[row].tolist() == want_mask
    # [CLS] hello , world ! [SEP] [PAD]...
    assert ids[0, :6].tolist() == [tok.CLS, tok.VOCAB.index("hello"), tok.VOCAB.index(","),
                                   tok.VOCAB.index("world"), tok.VOCAB.index("!"), tok.SEP]
    assert ids[0, 6:].tolist() == [tok.PAD] * (TOKENIZER_LENGTH - 6)
    assert ids[2, -1] == tok.SEP and mask[2].all()
    assert ids.max() < 1024


# -- triton_python_backend_utils on its own (no server) --------------------------------------


def test_pb_utils_without_a_server():
    import triton_python_backend_utils as pb_utils

    request = pb_utils.InferenceRequest(model_name="anything", inputs=[], requested_output_names=["Y"])
    response = request.exec()
    assert response.has_error() and response.error().code() == pb_utils.TritonError.UNAVAILABLE
    assert "running inferd server" in response.error().message()

    array = np.array([b"a", b"", "z\u00e9".encode()], dtype=np.object_)
    assert pb_utils.deserialize_bytes_tensor(pb_utils.serialize_byte_tensor(array)).tolist() == array.tolist()
    assert pb_utils.triton_string_to_numpy("TYPE_FP16") is np.float16
    assert pb_utils.triton_to_numpy_type(pb_utils.numpy_to_triton_type(np.int64)) is np.int64
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.Tensor("S", np.array(["text"]))  # np.str_ arrays are refused, as in Triton
    with pytest.raises(pb_utils.TritonModelException):
        pb_utils.InferenceResponse(output_tensors="nope")  # type: ignore[arg-type]


def test_pb_utils_dlpack_round_trip():
    import torch

    import triton_python_backend_utils as pb_utils

    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    t = pb_utils.Tensor("X", x)
    as_torch = torch.utils.dlpack.from_dlpack(t.to_dlpack())
    assert as_torch.data_ptr() == x.ctypes.data  # shared, not copied
    np.testing.assert_array_equal(torch.from_dlpack(t).numpy(), x)
    back = pb_utils.Tensor.from_dlpack("Y", torch.arange(4, dtype=torch.int16) * 3)
    assert back.name() == "Y" and back.as_numpy().tolist() == [0, 3, 6, 9] and back.is_cpu()
    bf = pb_utils.Tensor.from_dlpack("B", torch.tensor([1.5, -2.0], dtype=torch.bfloat16))
    assert bf.as_numpy().dtype == np.dtype(ml_dtypes.bfloat16) and bf.as_numpy().astype(np.float32).tolist() == [1.5, -2.0]
    again = torch.utils.dlpack.from_dlpack(bf.to_dlpack())
    assert again.dtype == torch.bfloat16 and again.tolist() == [1.5, -2.0]
    readonly = np.frombuffer(np.arange(3, dtype=np.int32).tobytes(), dtype=np.int32)
    shared = pb_utils.Tensor._of_request("R", readonly)
    assert torch.from_dlpack(shared).tolist() == [0, 1, 2]  # exported from a copy: the consumer may write


def test_pb_utils_model_config_auto_complete_rules():
    import triton_python_backend_utils as pb_utils

    config = pb_utils.ModelConfig(json.dumps({
        "name": "m", "max_batch_size": 8,
        "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}], "output": []}))
    config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [4]})  # the same: fine
    with pytest.raises(ValueError, match="TYPE_FP32"):
        config.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [4]})
    with pytest.raises(ValueError, match="dims"):
        config.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [5]})
    with pytest.raises(ValueError, match="missing 'dims'"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32"})
    with pytest.raises(ValueError, match="allowed"):
        config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
    with pytest.raises(ValueError, match="max_batch_size 8"):
        config.set_max_batch_size(4)
    config.set_max_batch_size(16)
    config.set_dynamic_batching()
    config.add_output({"name": "B", "data_type": "TYPE_FP32", "dims": [1]})
    d = config.as_dict()
    assert d["max_batch_size"] == 16 and d["dynamic_batching"] == {} and d["output"][0]["name"] == "B"

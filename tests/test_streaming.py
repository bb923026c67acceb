"""ModelStreamInfer and decoupled Python models through tritonclient.grpc on a
real server: many requests in flight on one stream, responses as they are
produced, the final-response flag, errors that leave the stream usable."""

from __future__ import annotations

import json
import queue
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from inferd.examples.build import build_repository, ensemble_steps, triton_config
from repo_builder import add_model, config

WAIT = 30

# Sends one response, then waits for the file "go" in its model folder, then a
# second response and the final flag: the first must reach the client while
# the model is still waiting.
GATED = '''
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.go = os.path.join(args["model_repository"], "go")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
            deadline = time.monotonic() + 30
            while not os.path.exists(self.go) and time.monotonic() < deadline:
                time.sleep(0.01)
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x + 1)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# A response, an error response (which does not end the request), a response, then final.
MIXED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x)]))
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("half way there")))
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            except pb_utils.TritonModelException as exc:
                assert "closed" in str(exc)
        return None
'''

RAISING = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("no responses today")
'''

# Not decoupled: OUT = 1 when the request's parameters hold the stream's final-response flag, else 0.
SEES_FLAG = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            seen = "triton_enable_empty_final_response" in json.loads(request.parameters())
            answers.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([int(seen)], dtype=np.int32))]))
        return answers
'''

IO = ([("IN", "TYPE_INT32", [1])], [("OUT", "TYPE_INT32", [1])])


def _python(repo: Path, name: str, source: str, decoupled: bool = True) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(textwrap.dedent(source))
    extra = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
    (folder / "config.pbtxt").write_text(
        triton_config(name, *IO, max_batch_size=0, platform=None, backend="python", extra=extra))


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("stream_repo")
    build_repository(repo, only=["repeat_decoupled", "simple"], log=None)
    _python(repo, "gated", GATED)
    _python(repo, "mixed", MIXED)
    _python(repo, "raising", RAISING)
    _python(repo, "sees_flag", SEES_FLAG, decoupled=False)
    add_model(repo, "onnx_decoupled", om.add_sub(np.int32, 16), config(
        "onnx_decoupled", [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])],
        [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])], 8,
        extra="model_transaction_policy { decoupled: true }\n"))
    ens = repo / "ens_decoupled"
    (ens / "1").mkdir(parents=True)
    (ens / "config.pbtxt").write_text(triton_config(
        "ens_decoupled", [("IN", "TYPE_INT32", [-1]), ("REPEAT", "TYPE_INT32", [1])], [("OUT", "TYPE_INT32", [-1])],
        max_batch_size=0, platform="ensemble", instance_count=0,
        extra=ensemble_steps([("repeat_decoupled", {"IN": "IN", "REPEAT": "REPEAT"}, {"OUT": "OUT"})])))
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with running(repo, no_traceback=False) as server:
        yield server


class Stream:
    """One client stream; ``get()`` gives (result, error) in arrival order."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.received: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.received.put((result, error)))

    def get(self, timeout: float = WAIT):  # type: ignore[no-untyped-def]
        return self.received.get(timeout=timeout)

    def nothing_more(self, wait: float = 0.3) -> bool:
        try:
            self.received.get(timeout=wait)
        except queue.Empty:
            return True
        return False

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server):
    s = Stream(server.url)
    yield s
    s.close()


def _repeat(values, n: int) -> list[grpcclient.InferInput]:  # type: ignore[no-untyped-def]
    data = np.asarray(values, dtype=np.int32)
    a = grpcclient.InferInput("IN", list(data.shape), "INT32")
    a.set_data_from_numpy(data)
    b = grpcclient.InferInput("REPEAT", [1], "INT32")
    b.set_data_from_numpy(np.array([n], dtype=np.int32))
    return [a, b]


def _in(value: int) -> list[grpcclient.InferInput]:
    a = grpcclient.InferInput("IN", [1], "INT32")
    a.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [a]


def _simple() -> tuple[list[grpcclient.InferInput], np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = grpcclient.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    return inputs, a + a


def _final(result) -> bool | None:  # type: ignore[no-untyped-def]
    params = result.get_response().parameters
    return params["triton_final_response"].bool_param if "triton_final_response" in params else None


# -- decoupled: many responses ------------------------------------------------------------------------


def test_decoupled_streams_n_responses_then_a_final_flag(stream):
    stream.client.async_stream_infer("repeat_decoupled", _repeat([4, 5, 6], 3), request_id="r1",
                                     enable_empty_final_response=True)
    for i in range(3):
        result, error = stream.get()
        assert error is None, error
        assert result.get_response().id == "r1"
        np.testing.assert_array_equal(result.as_numpy("OUT"), [4, 5, 6])
        np.testing.assert_array_equal(result.as_numpy("IDX"), [i])
        assert _final(result) is False
    result, error = stream.get()
    assert error is None
    response = result.get_response()
    assert response.id == "r1" and response.model_name == "repeat_decoupled" and not response.outputs
    assert _final(result) is True
    assert stream.nothing_more()


def test_without_the_flag_no_empty_final_is_sent(stream):
    stream.client.async_stream_infer("repeat_decoupled", _repeat([1], 2), request_id="a")
    got = [stream.get() for _ in range(2)]
    assert all(error is None and result.get_response().id == "a" and _final(result) is None
               for result, error in got)
    assert stream.nothing_more()


def test_zero_responses(stream):
    stream.client.async_stream_infer("repeat_decoupled", _repeat([1], 0), request_id="z",
                                     enable_empty_final_response=True)
    result, error = stream.get()
    assert error is None and result.get_response().id == "z" and _final(result) is True
    assert stream.nothing_more()


def test_many_requests_in_flight_on_one_stream(stream):
    counts = {f"req{n}": n for n in range(1, 7)}
    for rid, n in counts.items():
        stream.client.async_stream_infer("repeat_decoupled", _repeat([n], n), request_id=rid,
                                         enable_empty_final_response=True)
    seen: dict[str, list[int]] = {rid: [] for rid in counts}
    finals: set[str] = set()
    while len(finals) < len(counts):
        result, error = stream.get()
        assert error is None, error
        rid = result.get_response().id
        if _final(result):
            finals.add(rid)
        else:
            assert int(result.as_numpy("OUT")[0]) == counts[rid]
            seen[rid].append(int(result.as_numpy("IDX")[0]))
    assert seen == {rid: list(range(n)) for rid, n in counts.items()}  # each request's responses in order


def test_responses_reach_the_client_as_they_are_produced(stream, repo):
    go = repo / "gated" / "go"
    go.unlink(missing_ok=True)
    stream.client.async_stream_infer("gated", _in(10), request_id="g", enable_empty_final_response=True)
    result, error = stream.get()  # while the model still waits for "go"
    assert error is None and int(result.as_numpy("OUT")[0]) == 10 and _final(result) is False
    go.write_text("")
    result, error = stream.get()
    assert error is None and int(result.as_numpy("OUT")[0]) == 11 and _final(result) is True
    go.unlink()


def test_an_error_response_does_not_end_a_decoupled_request(stream):
    stream.client.async_stream_infer("mixed", _in(3), request_id="m", enable_empty_final_response=True)
    first, second, third, last = (stream.get() for _ in range(4))
    assert first[1] is None and int(first[0].as_numpy("OUT")[0]) == 3
    assert isinstance(second[1], InferenceServerException) and "half way there" in second[1].message()
    assert third[1] is None and int(third[0].as_numpy("OUT")[0]) == 6
    assert last[1] is None and _final(last[0]) is True
    assert stream.nothing_more()


def test_execute_raising_ends_the_request_with_its_error(stream):
    stream.client.async_stream_infer("raising", _in(1), request_id="x")
    result, error = stream.get()
    assert isinstance(error, InferenceServerException)
    assert "raising" in error.message() and "no responses today" in error.message()
    inputs, expected = _simple()
    stream.client.async_stream_infer("simple", inputs, request_id="after")
    result, error = stream.get()
    assert error is None and result.get_response().id == "after"


# -- errors leave the stream usable ---------------------------------------------------------------------


def test_failed_requests_leave_the_stream_usable(stream):
    stream.client.async_stream_infer("no_such_model", _in(1), request_id="e1")
    _, error = stream.get()
    assert isinstance(error, InferenceServerException) and "no_such_model" in error.message()
    stream.client.async_stream_infer("repeat_decoupled", _repeat([1], -2), request_id="e2")
    _, error = stream.get()
    assert isinstance(error, InferenceServerException) and "REPEAT must be >= 0" in error.message()
    stream.client.async_stream_infer("simple", _in(1), request_id="e3")  # wrong inputs for "simple"
    _, error = stream.get()
    assert isinstance(error, InferenceServerException) and "simple" in error.message()
    inputs, expected = _simple()
    stream.client.async_stream_infer("simple", inputs, request_id="ok")
    result, error = stream.get()
    assert error is None and result.get_response().id == "ok"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)


def test_a_plain_model_on_a_stream_is_final_at_once(stream):
    inputs, expected = _simple()
    stream.client.async_stream_infer("simple", inputs, request_id="p", enable_empty_final_response=True)
    result, error = stream.get()
    assert error is None and _final(result) is True
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
    assert stream.nothing_more()


def test_the_final_response_flag_is_the_streams_and_never_reaches_the_model(stream):
    stream.client.async_stream_infer("sees_flag", _in(0), request_id="f", enable_empty_final_response=True)
    result, error = stream.get()
    assert error is None and _final(result) is True
    assert int(result.as_numpy("OUT")[0]) == 0  # the model saw no triton_enable_empty_final_response


# Either kind: answers its input through the sender when its config says decoupled (twice, then the
# final flag), else as a plain model's one response.
FLIPPING = '''
    import json

    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            self.decoupled = pb_utils.using_decoupled_model_transaction_policy(json.loads(args["model_config"]))

        def execute(self, requests):
            answers = []
            for request in requests:
                value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
                response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)])
                if self.decoupled:
                    sender = request.get_response_sender()
                    sender.send(response)
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value + 1)]),
                                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                else:
                    answers.append(response)
            return None if self.decoupled else answers
'''


def test_a_model_reloaded_as_decoupled_keeps_answering_on_an_open_stream(tmp_path, start_server):
    """A stream asks once whether a model is decoupled; a request for a model reloaded as decoupled since
    then (whose unary path refuses it) is asked about again and answered as a decoupled model's, as
    Triton's handler (which asks per request) answers it."""
    _python(tmp_path, "flipping", FLIPPING, decoupled=False)
    server = start_server(tmp_path, ["--model-control-mode", "explicit", "--load-model", "flipping"])
    s = Stream(server.url)
    try:
        s.client.async_stream_infer("flipping", _in(5), request_id="plain")
        result, error = s.get()
        assert error is None and result.as_numpy("OUT").tolist() == [5]
        config = s.client.get_model_config("flipping", as_json=True)["config"]
        config["model_transaction_policy"] = {"decoupled": True}
        s.client.load_model("flipping", config=json.dumps(config))
        s.client.async_stream_infer("flipping", _in(7), request_id="decoupled")
        answers = [s.get() for _ in range(2)]
        assert [e for _, e in answers] == [None, None], answers
        assert [r.as_numpy("OUT").tolist() for r, _ in answers] == [[7], [8]]
        assert s.nothing_more()
    finally:
        s.close()


# -- refusals ------------------------------------------------------------------------------------------


def test_unary_infer_on_a_decoupled_model_is_refused(server):
    c = grpcclient.InferenceServerClient(server.url)
    try:
        with pytest.raises(InferenceServerException) as exc:
            c.infer("repeat_decoupled", _repeat([1], 1))
        assert exc.value.status() == "StatusCode.UNIMPLEMENTED"
        assert exc.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
        assert c.is_model_ready("repeat_decoupled")
        cfg = c.get_model_config("repeat_decoupled").config
        assert cfg.model_transaction_policy.decoupled
    finally:
        c.close()


def test_decoupled_is_refused_for_onnx_models(server):
    c = grpcclient.InferenceServerClient(server.url)
    try:
        index = {m.name: m for m in c.get_model_repository_index().models}
        entry = index["onnx_decoupled"]
        assert entry.state == "UNAVAILABLE"
        assert "model_transaction_policy.decoupled is only supported for Python models" in entry.reason
        assert "onnxruntime" in entry.reason
    finally:
        c.close()


def test_an_ensemble_with_a_decoupled_step_is_refused_at_load(server):
    c = grpcclient.InferenceServerClient(server.url)
    try:
        index = {m.name: m for m in c.get_model_repository_index().models}
        entry = index["ens_decoupled"]
        assert entry.state == "UNAVAILABLE"
        assert "ens_decoupled" in entry.reason and "model 'repeat_decoupled' is decoupled" in entry.reason
    finally:
        c.close()


# -- pb_utils.InferenceResponseSender on its own -------------------------------------------------------


def test_response_sender_rules():
    import triton_python_backend_utils as pb_utils

    delivered: list = []
    sender = pb_utils.InferenceResponseSender(lambda response, final: delivered.append((response, final)))
    response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([1], np.int32))])
    with pytest.raises(pb_utils.TritonModelException, match="needed when the flags is not FINAL"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match="InferenceResponse"):
        sender.send("not a response")  # type: ignore[arg-type]
    sender.send(response)
    sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(pb_utils.TritonModelException, match="Response sender has been closed"):
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    assert delivered == [(response, False), (response, True)]
    assert not sender.is_cancelled()


def test_only_decoupled_requests_have_a_sender():
    import triton_python_backend_utils as pb_utils

    with pytest.raises(pb_utils.TritonModelException, match="decoupled"):
        pb_utils.InferenceRequest(model_name="m").get_response_sender()
    config = pb_utils.ModelConfig({"name": "m"})
    config.set_model_transaction_policy({"decoupled": True})
    assert pb_utils.using_decoupled_model_transaction_policy(config.as_dict())
    with pytest.raises(ValueError, match="already set"):
        config.set_model_transaction_policy({"decoupled": False})

"""Continuous batching (sequence_batching { iterative_sequence: true }) through
tritonclient's streaming gRPC client on a real server: sequences join and leave
between steps, a cancelled stream frees its row, the generator gives every
prompt the same text batched as alone, and a tensor (ONNX) step model with
implicit state works too."""

from __future__ import annotations

import queue
import textwrap
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples.build import build_repository
from repo_builder import add_model, config

WAIT = 60
FINAL = "triton_final_response"

# A step model through pb_utils, as Triton's iterative mode defines it: IN is
# the number of steps; each step sends OUT (steps left), BATCH (how many rows
# the step had) and CORR (the sequence id), keeps the count in implicit state,
# and reschedules itself until the count reaches 0.
ITER_COUNT = '''
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay = float(params.get("step_delay_ms", {}).get("string_value", "0")) / 1000

    def execute(self, requests):
        time.sleep(self.delay)
        for request in requests:
            start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            state = pb_utils.get_input_tensor_by_name(request, "REM_IN")
            source = "IN" if start or state is None else "REM_IN"
            left = pb_utils.get_input_tensor_by_name(request, source).as_numpy() - 1
            outputs = [pb_utils.Tensor("OUT", left), pb_utils.Tensor("REM_OUT", left),
                       pb_utils.Tensor("BATCH", np.array([[len(requests)]], np.int32)),
                       pb_utils.Tensor("CORR", np.array([[request.correlation_id()]], np.uint64))]
            done = int(left.reshape(-1)[0]) <= 0
            if not done:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            request.get_response_sender().send(
                pb_utils.InferenceResponse(output_tensors=outputs),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if done else 0)
        return None
'''

_IO = '''input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "CORR" data_type: TYPE_UINT64 dims: [ 1 ] }
]
'''

_COUNT_STATE = '''state [ {
    input_name: "REM_IN" output_name: "REM_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }
  } ]'''


def iter_count_config(name: str, scheduling: str, delay_ms: int = 3) -> str:
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 4\n{_IO}'
            "model_transaction_policy { decoupled: true }\n"
            f'parameters {{ key: "step_delay_ms" value: {{ string_value: "{delay_ms}" }} }}\n{scheduling}\n')


def countdown_onnx() -> onnx.ModelProto:
    """rem = (START ? N : REM_IN) - 1; OUT = REM_OUT = rem; DONE = rem <= 0."""
    def io(name: str, kind: int) -> Any:
        return helper.make_tensor_value_info(name, kind, [None, 1])

    one = helper.make_tensor("one", TensorProto.INT32, [], [1])
    zero = helper.make_tensor("zero", TensorProto.INT32, [], [0])
    nodes = [
        helper.make_node("Cast", ["START"], ["start"], to=TensorProto.BOOL),
        helper.make_node("Where", ["start", "N", "REM_IN"], ["from"]),
        helper.make_node("Sub", ["from", "one"], ["rem"]),
        helper.make_node("Identity", ["rem"], ["OUT"]),
        helper.make_node("Identity", ["rem"], ["REM_OUT"]),
        helper.make_node("LessOrEqual", ["rem", "zero"], ["DONE"]),
    ]
    graph = helper.make_graph(nodes, "countdown",
                              [io("N", TensorProto.INT32), io("START", TensorProto.INT32), io("REM_IN", TensorProto.INT32)],
                              [io("OUT", TensorProto.INT32), io("REM_OUT", TensorProto.INT32), io("DONE", TensorProto.BOOL)],
                              initializer=[one, zero])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def countdown_config(name: str, decoupled: bool) -> str:
    return config(name, [("N", "TYPE_INT32", [1])], [("OUT", "TYPE_INT32", [1]), ("DONE", "TYPE_BOOL", [1])],
                  max_batch_size=8, extra=textwrap.dedent(f'''
        {"model_transaction_policy { decoupled: true }" if decoupled else ""}
        parameters {{ key: "inferd.iterative_end_output" value: {{ string_value: "DONE" }} }}
        sequence_batching {{
          iterative_sequence: true
          control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
          {_COUNT_STATE}
        }}
        '''))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generative")
    build_repository(root, only=["generator"], log=None)
    for name, scheduling in (
        ("iter_count", f"sequence_batching {{ iterative_sequence: true\n  {_COUNT_STATE} }}"),
        ("iter_count_dynamic", "dynamic_batching { }"),
    ):
        add_model(root, name, ITER_COUNT.encode(), iter_count_config(name, scheduling), filename="model.py")
    add_model(root, "countdown", countdown_onnx(), countdown_config("countdown", decoupled=True))
    add_model(root, "countdown_unary", countdown_onnx(), countdown_config("countdown_unary", decoupled=False))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator:
    with running(repo) as s:
        yield s


class Stream:
    """One tritonclient gRPC stream; its responses, in order, in a queue."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.responses: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.responses.put(error or result))

    def send(self, model: str, inputs: list, **kw: Any) -> None:
        self.client.async_stream_infer(model, inputs, enable_empty_final_response=True, **kw)

    def until_final(self, count: int | None = None) -> list:
        """Responses up to the final one (or ``count`` of them); errors raise."""
        got = []
        while count is None or len(got) < count:
            item = self.responses.get(timeout=WAIT)
            if isinstance(item, InferenceServerException):
                raise item
            if item.get_response().parameters[FINAL].bool_param:
                if item.get_response().outputs:
                    got.append(item)
                return got
            got.append(item)
        return got

    def close(self, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def count_input(n: int) -> list:
    x = grpcclient.InferInput("IN", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[n]], np.int32))
    return [x]


def column(results: list, name: str) -> list[int]:
    return [int(r.as_numpy(name).reshape(-1)[0]) for r in results]


def test_sequences_join_and_leave_between_steps(server):
    a, b = Stream(server.url), Stream(server.url)
    try:
        a.send("iter_count", count_input(300))
        first = a.until_final(count=3)  # a is running alone...
        b.send("iter_count", count_input(5))  # ...when b arrives
        b_results = b.until_final()
        a_results = first + a.until_final()
    finally:
        a.close()
        b.close()
    assert column(b_results, "OUT") == [4, 3, 2, 1, 0]
    assert column(b_results, "BATCH") == [2, 2, 2, 2, 2]  # every step of b had a's row too
    assert column(a_results, "OUT") == list(range(299, -1, -1))  # a's count is untouched by b's
    sizes = column(a_results, "BATCH")
    joined = sizes.index(2)
    assert sizes[:joined] == [1] * joined and joined >= 3  # alone until b joined...
    assert sizes[joined:joined + 5] == [2] * 5  # ...b's five steps...
    assert set(sizes[joined + 5:]) == {1}  # ...and alone again once b left
    assert len(set(column(a_results, "CORR")) | set(column(b_results, "CORR"))) == 2  # two generated ids


def test_a_cancelled_stream_frees_its_row(server):
    a, b = Stream(server.url), Stream(server.url)
    try:
        a.send("iter_count", count_input(100000))
        a.until_final(count=1)
        b.send("iter_count", count_input(400))
        early = b.until_final(count=3)
        assert column(early, "BATCH") == [2, 2, 2]
        a.close(cancel=True)  # the client goes away mid-sequence
        rest = b.until_final()
    finally:
        b.close()
    sizes = column(early + rest, "BATCH")
    assert column(early + rest, "OUT") == list(range(399, -1, -1))
    freed = sizes.index(1)
    assert set(sizes[freed:]) == {1} and freed < 200  # a's row left within a few steps of the cancel
    stats = grpcclient.InferenceServerClient(server.url).get_inference_statistics("iter_count", as_json=True)
    assert int(stats["model_stats"][0]["inference_stats"]["fail"]["count"]) >= 1  # a: cancelled


def prompt_input(text: bytes) -> list:
    x = grpcclient.InferInput("PROMPT", [1, 1], "BYTES")
    x.set_data_from_numpy(np.array([[text]], dtype=np.object_))
    return [x]


PROMPTS = [b"hello", b"continuous batching", b"", b"a", b"inferd generates", b"zzz", b"0123456789", b"GRU"]
LENGTHS = [40, 7, 25, 60, 3, 33, 12, 50]


def generate(server, prompts: list[bytes], lengths: list[int]) -> list[bytes]:
    streams = [Stream(server.url) for _ in prompts]
    try:
        for s, p, n in zip(streams, prompts, lengths):
            s.send("generator", prompt_input(p), parameters={"max_tokens": n})
        texts = []
        for s in streams:
            results = s.until_final()
            tokens = column(results, "TOKEN")
            text = b"".join(r.as_numpy("TEXT").reshape(-1)[0] for r in results)
            assert bytes(tokens) == text
            texts.append(text)
        return texts
    finally:
        for s in streams:
            s.close()


def test_generated_text_batched_equals_each_prompt_alone(server):
    alone = [generate(server, [p], [n])[0] for p, n in zip(PROMPTS, LENGTHS)]
    stats = grpcclient.InferenceServerClient(server.url)
    before = stats.get_inference_statistics("generator", as_json=True)["model_stats"][0].get("batch_stats", [])
    assert {int(b["batch_size"]) for b in before} == {1}
    together = generate(server, PROMPTS, LENGTHS)
    assert together == alone
    assert [len(t) for t in alone] == LENGTHS  # max_tokens ended each (the model's end byte never came)
    after = stats.get_inference_statistics("generator", as_json=True)["model_stats"][0]["batch_stats"]
    assert max(int(b["batch_size"]) for b in after) > 1  # the concurrent run did share steps


def test_rescheduling_without_iterative_sequence_is_an_error(server):
    s = Stream(server.url)
    try:
        s.send("iter_count_dynamic", count_input(3))
        with pytest.raises(InferenceServerException) as exc:
            s.until_final()
    finally:
        s.close()
    assert "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE" in str(exc.value)


def test_a_tensor_step_model_with_implicit_state_streams_each_step(server):
    s = Stream(server.url)
    n = grpcclient.InferInput("N", [1, 1], "INT32")
    n.set_data_from_numpy(np.array([[4]], np.int32))
    try:
        s.send("countdown", [n])
        results = s.until_final()
    finally:
        s.close()
    assert column(results, "OUT") == [3, 2, 1, 0]
    assert [bool(r.as_numpy("DONE").reshape(-1)[0]) for r in results] == [False, False, False, True]


def test_a_tensor_step_model_answers_once_without_decoupled(server):
    client = grpcclient.InferenceServerClient(server.url)
    n = grpcclient.InferInput("N", [1, 1], "INT32")
    n.set_data_from_numpy(np.array([[6]], np.int32))
    out = client.infer("countdown_unary", [n])
    assert int(out.as_numpy("OUT")[0, 0]) == 0
    out = client.infer("countdown_unary", [n], parameters={"max_tokens": 2})
    assert int(out.as_numpy("OUT")[0, 0]) == 4  # two steps, then max_tokens ended it
    with pytest.raises(InferenceServerException) as exc:
        client.infer("countdown_unary", [n], parameters={"max_tokens": 0})
    assert "'max_tokens' must be an integer >= 1, got 0" in str(exc.value)

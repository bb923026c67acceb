"""Stateful sequences through tritonclient.grpc on a real server: the sequence
batcher's strategies, implicit state, control inputs (CORRID included), sync
and streaming clients, string ids, missing START, the idle limit, load errors.

The timing rules (idle release, queue delays, slot assignment) are unit-tested
with a FakeClock in tests/scheduling; here one check waits just past a short
idle limit on the server's real clock.
"""

from __future__ import annotations

import queue
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from conftest import running
from inferd.examples import onnx_models as om
from inferd.examples.build import build_repository
from repo_builder import add_model, config

IDLE_MS = 300  # acc_idle's max_sequence_idle_microseconds, in ms

STATE = """
  state [ {
    input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ]
    initial_state { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }
  } ]"""

ACC_IO = ([("INPUT", "TYPE_INT32", [1])], [("OUTPUT", "TYPE_INT32", [1])])


def _controls_model() -> onnx.ModelProto:
    """Copies of its control inputs START/END/READY (INT32) and CORRID (UINT64)."""
    names = [("START", TensorProto.INT32), ("END", TensorProto.INT32), ("READY", TensorProto.INT32),
             ("CORRID", TensorProto.UINT64), ("INPUT", TensorProto.INT32)]
    vi = [helper.make_tensor_value_info(n, t, ["batch", 1]) for n, t in names]
    out = [helper.make_tensor_value_info(f"{n}_OUT", t, ["batch", 1]) for n, t in names]
    nodes = [helper.make_node("Identity", [n], [f"{n}_OUT"]) for n, _ in names]
    return om._model(helper.make_graph(nodes, "controls", vi, out))


CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]"""

# A Python sequence model: a running sum in implicit state, and what pb_utils says
# about each request (correlation_id(), flags()) and its string CORRID input.
SEQ_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            acc = pb_utils.get_input_tensor_by_name(request, "ACC_IN").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            total = (x + acc).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", total),
                pb_utils.Tensor("ACC_OUT", total),
                pb_utils.Tensor("CORR", np.array([[str(request.correlation_id()).encode()]], dtype=np.object_)),
                pb_utils.Tensor("CORRID_IN", corrid.astype(np.object_)),
                pb_utils.Tensor("FLAGS", np.array([[request.flags()]], dtype=np.int32)),
            ]))
        return responses
'''


def _sequence_batching(body: str) -> str:
    return "sequence_batching {\n" + textwrap.indent(textwrap.dedent(body).strip(), "  ") + "\n}\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("sequence_repo")
    build_repository(repo, only=["simple_sequence"], log=None)
    acc = om.accumulator(np.int32)
    add_model(repo, "acc_direct", acc, config("acc_direct", *ACC_IO, 4, extra=_sequence_batching(
        "direct { }" + STATE)))
    add_model(repo, "acc_oldest", acc, config("acc_oldest", *ACC_IO, 4, extra=_sequence_batching(
        "oldest { max_candidate_sequences: 4 }" + STATE)
        + "instance_group [ { count: 2 kind: KIND_CPU } ]\n"))
    add_model(repo, "acc_nobatch", om.accumulator(np.int32, batch=False), config("acc_nobatch", *ACC_IO, 0,
              extra=_sequence_batching("direct { }" + STATE)))
    add_model(repo, "acc_idle", acc, config("acc_idle", *ACC_IO, 4, extra=_sequence_batching(
        f"max_sequence_idle_microseconds: {IDLE_MS * 1000}\n" + STATE)))
    add_model(repo, "controls", _controls_model(), config(
        "controls", [("INPUT", "TYPE_INT32", [1])],
        [(f"{n}_OUT", t, [1]) for n, t in (("START", "TYPE_INT32"), ("END", "TYPE_INT32"),
                                           ("READY", "TYPE_INT32"), ("CORRID", "TYPE_UINT64"),
                                           ("INPUT", "TYPE_INT32"))],
        4, extra=_sequence_batching("direct { }" + CONTROLS)))
    seq_py = repo / "seq_py"
    (seq_py / "1").mkdir(parents=True)
    (seq_py / "1" / "model.py").write_text(SEQ_PY)
    (seq_py / "config.pbtxt").write_text(config(
        "seq_py", *([("INPUT", "TYPE_INT32", [1])], [("OUTPUT", "TYPE_INT32", [1]), ("CORR", "TYPE_STRING", [1]),
                                                      ("CORRID_IN", "TYPE_STRING", [1]), ("FLAGS", "TYPE_INT32", [1])]),
        4, platform=None, extra='backend: "python"\n' + _sequence_batching(
            'oldest { max_candidate_sequences: 4 }\n'
            'control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]'
            + STATE)))
    # Broken configs: each refused at load with a message naming the problem.
    add_model(repo, "bad_state_name", acc, config("bad_state_name", *ACC_IO, 4, extra=_sequence_batching(
        STATE.replace('input_name: "ACC_IN"', 'input_name: "NOPE"'))))
    add_model(repo, "bad_control", acc, config("bad_control", *ACC_IO, 4, extra=_sequence_batching(
        'control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]'
        + STATE)))
    add_model(repo, "bad_oldest", acc, config("bad_oldest", *ACC_IO, 4, extra=_sequence_batching(
        "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 9 ] }" + STATE)))
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with running(repo, no_traceback=False) as server:
        yield server


def _input(value: int, batch: bool = True, rows: int = 1) -> list[grpcclient.InferInput]:
    shape = [rows, 1] if batch else [1]
    i = grpcclient.InferInput("INPUT", shape, "INT32")
    i.set_data_from_numpy(np.full(shape, value, dtype=np.int32))
    return [i]


def _value(result, name: str = "OUTPUT"):  # type: ignore[no-untyped-def]
    return result.as_numpy(name).reshape(-1)[0]


SEQUENCES = {1001: [1, 2, 3, 4, 5], 1002: [10, 20, 30], 1003: [100, 200, 300, 400]}


def _interleaved() -> list[tuple[int, int, bool, bool]]:
    """(sequence id, value, start, end) round-robin over SEQUENCES."""
    out = []
    longest = max(len(v) for v in SEQUENCES.values())
    for i in range(longest):
        for key, values in SEQUENCES.items():
            if i < len(values):
                out.append((key, values[i], i == 0, i == len(values) - 1))
    return out


EXPECTED = {k: [int(x) for x in np.cumsum(v)] for k, v in SEQUENCES.items()}


# -- running sums ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest", "simple_sequence"])
def test_interleaved_sequences_sync(client, model):
    got: dict[int, list[int]] = {k: [] for k in SEQUENCES}
    for key, value, start, end in _interleaved():
        result = client.infer(model, _input(value), sequence_id=key, sequence_start=start, sequence_end=end)
        got[key].append(int(_value(result)))
    assert got == EXPECTED


def test_a_model_that_does_not_batch(client):
    got = [int(_value(client.infer("acc_nobatch", _input(v, batch=False), sequence_id=5, sequence_start=i == 0)))
           for i, v in enumerate([3, 4, 5])]
    assert got == [3, 7, 12]


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest", "simple_sequence"])
def test_interleaved_sequences_on_a_stream(server, model):
    """Every request is sent at once; each sequence still runs in order."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        sent = _interleaved()
        for n, (key, value, start, end) in enumerate(sent):
            c.async_stream_infer(model, _input(value), request_id=f"{key}:{n}", sequence_id=key,
                                 sequence_start=start, sequence_end=end)
        got: dict[int, list[tuple[int, int]]] = {k: [] for k in SEQUENCES}
        for _ in sent:
            result, error = results.get(timeout=30)
            assert error is None, error
            key, n = result.get_response().id.split(":")
            got[int(key)].append((int(n), int(_value(result))))
    finally:
        c.stop_stream()
        c.close()
    assert {k: [v for _, v in sorted(pairs)] for k, pairs in got.items()} == EXPECTED


def test_concurrent_clients(server):
    """Sequences from several threads at once share batches and keep their sums."""
    import threading

    errors: list[BaseException] = []
    got: dict[int, list[int]] = {}

    def run(key: int, values: list[int]) -> None:
        c = grpcclient.InferenceServerClient(server.url)
        try:
            got[key] = [int(_value(c.infer("acc_oldest", _input(v), sequence_id=key, sequence_start=i == 0,
                                           sequence_end=i == len(values) - 1)))
                        for i, v in enumerate(values)]
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            c.close()

    work = {5000 + k: list(range(1, 11)) for k in range(6)}
    threads = [threading.Thread(target=run, args=item) for item in work.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert got == {k: [int(x) for x in np.cumsum(v)] for k, v in work.items()}


# -- control inputs and ids ------------------------------------------------------------------------


def test_control_inputs_and_corrid_reach_the_model(client):
    big = 2**63 + 5  # a uint64 id above int64's range, sent as tritonclient sends it (int64_param wraps)
    first = client.infer("controls", _input(7), sequence_id=big - 2**64, sequence_start=True)
    last = client.infer("controls", _input(8), sequence_id=big - 2**64, sequence_end=True)
    assert [int(_value(first, n)) for n in ("START_OUT", "END_OUT", "READY_OUT", "INPUT_OUT")] == [1, 0, 1, 7]
    assert [int(_value(last, n)) for n in ("START_OUT", "END_OUT", "READY_OUT", "INPUT_OUT")] == [0, 1, 1, 8]
    assert first.as_numpy("CORRID_OUT").dtype == np.uint64 and int(_value(first, "CORRID_OUT")) == big
    assert int(_value(last, "CORRID_OUT")) == big
    cfg = client.get_model_config("controls").config
    assert cfg.sequence_batching.HasField("direct") and [i.name for i in cfg.input] == ["INPUT"]


def test_string_ids_a_string_corrid_and_pb_utils(client):
    out = [client.infer("seq_py", _input(v), sequence_id="user-42", sequence_start=i == 0, sequence_end=i == 2)
           for i, v in enumerate([5, 6, 7])]
    assert [int(_value(r)) for r in out] == [5, 11, 18]
    assert [_value(r, "CORR") for r in out] == [b"user-42"] * 3
    assert [_value(r, "CORRID_IN") for r in out] == [b"user-42"] * 3
    assert [int(_value(r, "FLAGS")) for r in out] == [1, 0, 2]  # START, -, END as pb_utils flags()
    one = client.infer("seq_py", _input(1), sequence_id=77, sequence_start=True, sequence_end=True)
    assert _value(one, "CORR") == b"77" and int(_value(one, "FLAGS")) == 3


def test_a_string_id_for_an_integer_corrid_is_refused(client):
    with pytest.raises(InferenceServerException) as exc:
        client.infer("controls", _input(1), sequence_id="abc", sequence_start=True)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT" and "CORRID" in exc.value.message()


# -- refusals ---------------------------------------------------------------------------------------


def test_missing_start_is_refused(client):
    with pytest.raises(InferenceServerException) as exc:
        client.infer("acc_direct", _input(1), sequence_id=424242)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert exc.value.message() == ("inference request for sequence 424242 to model 'acc_direct' must specify the "
                                   "START flag on the first request of the sequence")


def test_missing_sequence_id_and_batch_size(client):
    with pytest.raises(InferenceServerException) as exc:
        client.infer("acc_direct", _input(1))
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify a non-zero or non-empty correlation ID" in exc.value.message()
    with pytest.raises(InferenceServerException) as exc:
        client.infer("acc_direct", _input(1, rows=2), sequence_id=9, sequence_start=True)
    assert "must specify batch-size 1 due to requirements of sequence batcher" in exc.value.message()


def test_after_end_the_id_needs_a_new_start(client):
    assert int(_value(client.infer("acc_direct", _input(2), sequence_id=31, sequence_start=True,
                                   sequence_end=True))) == 2
    with pytest.raises(InferenceServerException) as exc:
        client.infer("acc_direct", _input(2), sequence_id=31)
    assert "must specify the START flag" in exc.value.message()
    assert int(_value(client.infer("acc_direct", _input(3), sequence_id=31, sequence_start=True))) == 3


def test_missing_start_on_a_stream_leaves_it_usable(server):
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        c.async_stream_infer("acc_direct", _input(1), request_id="bad", sequence_id=8080)
        _, error = results.get(timeout=30)
        assert isinstance(error, InferenceServerException)
        assert "sequence 8080" in error.message() and "START flag" in error.message()
        c.async_stream_infer("acc_direct", _input(4), request_id="good", sequence_id=8080, sequence_start=True,
                             sequence_end=True)
        result, error = results.get(timeout=30)
        assert error is None and result.get_response().id == "good" and int(_value(result)) == 4
    finally:
        c.stop_stream()
        c.close()


def test_idle_sequence_is_released(client):
    assert int(_value(client.infer("acc_idle", _input(5), sequence_id=66, sequence_start=True))) == 5
    assert int(_value(client.infer("acc_idle", _input(5), sequence_id=66))) == 10
    time.sleep(IDLE_MS / 1000 * 2)
    with pytest.raises(InferenceServerException) as exc:
        client.infer("acc_idle", _input(5), sequence_id=66)
    assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
    message = exc.value.message()
    assert "must specify the START flag" in message and "idle" in message and str(IDLE_MS * 1000) in message
    assert int(_value(client.infer("acc_idle", _input(5), sequence_id=66, sequence_start=True))) == 5


def test_served_config_shows_tritons_defaults(client):
    sb = client.get_model_config("acc_direct").config.sequence_batching
    assert sb.max_sequence_idle_microseconds == 1_000_000 and sb.HasField("direct")
    oldest = client.get_model_config("acc_oldest").config.sequence_batching.oldest
    assert list(oldest.preferred_batch_size) == [4]


@pytest.mark.parametrize("model, words", [
    ("bad_state_name", ["bad_state_name", "state input 'NOPE'", "not in the model file"]),
    ("bad_control", ["bad_control", "CONTROL_SEQUENCE_CORRID", "TYPE_FP32"]),
    ("bad_oldest", ["bad_oldest", "preferred_batch_size 9", "max_batch_size"]),
])
def test_bad_sequence_configs_are_refused_at_load(client, model, words):
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert index[model].state == "UNAVAILABLE"
    for word in words:
        assert word in index[model].reason, index[model].reason

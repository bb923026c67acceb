"""Sequence batching and implicit state as Triton's own QA runs them (issue 25),
through tritonclient.grpc on real servers, on models generated the way Triton's
QA generates its own (tests/qa_sequence_models.py):

1. TorchScript sequence models load: the control inputs (START__1, READY__2,
   END__3, CORRID__4) and implicit state (INPUT_STATE__1 / OUTPUT_STATE__1)
   are forward() arguments and results, by Triton's ``<name>__<index>`` rule;
2. variable-size implicit state (dims [-1]) starts with 1 per variable
   dimension and follows the model's outputs;
3. TYPE_STRING implicit state (ONNX, Python; from a data file too);
4. a gRPC stream answers a model that is not decoupled in arrival order;
5. TRITONSERVER_DELAY_SCHEDULER / TRITONSERVER_BACKLOG_DELAY_SCHEDULER hold
   the sequence batcher so the test decides which requests share a batch;

and, as the issue asks, idle timeouts on 2- and 4-instance models (direct and
oldest), preserve_ordering, string and integer ids in one server, and
initial_state from a data file and as zeros.

Nothing here depends on timing: batches are formed by the delay hooks, an
execution order by the models' own gates, and the idle test waits on
backlogged sequences that can only run once idle ones were released.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import qa_sequence_models as qa
from conftest import running

IDLE_US = 400_000  # the idle-timeout models' max_sequence_idle_microseconds


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("qa_sequence_repo")
    # 1. TorchScript
    qa.add_torch_sequence(repo, "libtorch_sequence_int32", "TYPE_INT32", 8)
    qa.add_torch_sequence(repo, "libtorch_nobatch_sequence_fp32", "TYPE_FP32", 0)
    qa.add_torch_controls(repo, "libtorch_controls")
    qa.add_torch_implicit(repo, "libtorch_implicit_int32", "TYPE_INT32", 8)
    qa.add_torch_implicit(repo, "libtorch_nobatch_implicit_fp32", "TYPE_FP32", 0, initial="zero")
    qa.add_torch_sequence(repo, "libtorch_unindexed_control", "TYPE_INT32", 8)  # START__1 renamed below
    unindexed = repo / "libtorch_unindexed_control" / "config.pbtxt"
    unindexed.write_text(unindexed.read_text().replace('"START__1"', '"START"'))
    # 2. variable-size state
    qa.add_onnx_growing(repo, "onnx_growing_fp32", "TYPE_FP32", 8)
    qa.add_onnx_growing(repo, "onnx_nobatch_growing_int32", "TYPE_INT32", 0, initial="zero")
    qa.add_torch_growing(repo, "libtorch_growing_fp32", 8)
    # 3. string state
    qa.add_onnx_string_pair(repo, "onnx_string_pair")
    qa.add_onnx_string_pair(repo, "onnx_string_pair_file", data_file=qa.string_file(b"init"))
    qa.add_onnx_growing(repo, "onnx_growing_string", "TYPE_STRING", 8)
    qa.add_python_string_state(repo, "python_string_state")
    # 4. stream order
    qa.add_reverse_finisher(repo, "reverse_finisher", repo.parent / (repo.name + "_gate"), group=4, last=19)
    # also: initial state, ids, preserve_ordering, idle timeouts
    qa.add_onnx_implicit(repo, "onnx_implicit_int32", "TYPE_INT32", 8)
    qa.add_onnx_implicit(repo, "onnx_implicit_file", "TYPE_INT32", 8, initial="acc_init",
                         initial_data=qa.int32_file(100))
    qa.add_onnx_implicit(repo, "onnx_implicit_zero_fp32", "TYPE_FP32", 8, initial="zero")
    qa.add_onnx_implicit(repo, "onnx_implicit_ordered", "TYPE_INT32", 4,
                         strategy="oldest { max_candidate_sequences: 4 preserve_ordering: true }")
    qa.add_onnx_sequence(repo, "onnx_direct_2", max_batch=1, idle_us=IDLE_US, instances=2)
    qa.add_onnx_sequence(repo, "onnx_oldest_4", max_batch=2, idle_us=IDLE_US, instances=4,
                         strategy="oldest { max_candidate_sequences: 1 }")
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with running(repo, no_traceback=False) as server:
        yield server


def _input(value, datatype: str = "INT32", batch: bool = True, name: str = "INPUT") -> list[grpcclient.InferInput]:
    dtype = {"INT32": np.int32, "FP32": np.float32, "BYTES": np.object_}[datatype]
    data = np.array(value if isinstance(value, list) else [value], dtype=dtype)
    data = data.reshape((1, -1) if batch else (-1,))
    i = grpcclient.InferInput(name, list(data.shape), datatype)
    i.set_data_from_numpy(data)
    return [i]


def _run(client, model: str, values: list, seq_id, **kw) -> list[np.ndarray]:  # type: ignore[no-untyped-def]
    """One sequence, request by request: each answer's OUTPUT (or OUTPUT__0), flattened."""
    out_name = kw.pop("output", "OUTPUT")
    got = []
    for i, v in enumerate(values):
        r = client.infer(model, _input(v, **kw), sequence_id=seq_id, sequence_start=i == 0,
                         sequence_end=i == len(values) - 1)
        got.append(r.as_numpy(out_name).reshape(-1))
    return got


def _stream(server, sends: list[tuple]) -> list:  # type: ignore[no-untyped-def]
    """Send (model, inputs, request id, sequence kwargs) on one stream; the answers in arrival order."""
    results: queue.Queue = queue.Queue()
    c = grpcclient.InferenceServerClient(server.url)
    c.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for model, inputs, rid, seq in sends:
            c.async_stream_infer(model, inputs, request_id=rid, **seq)
        answers = [results.get(timeout=60) for _ in sends]
    finally:
        c.stop_stream()
        c.close()
    for result, error in answers:
        assert error is None, error
    return [result for result, _ in answers]


# -- 1. TorchScript sequence models -------------------------------------------------------------------


@pytest.mark.parametrize("model, datatype, batch", [("libtorch_sequence_int32", "INT32", True),
                                                    ("libtorch_nobatch_sequence_fp32", "FP32", False)])
def test_torchscript_sequence_models_load_and_take_their_controls(client, model, datatype, batch):
    assert client.is_model_ready(model)
    got = _run(client, model, [5, 6, 7], 11, datatype=datatype, batch=batch, name="INPUT__0", output="OUTPUT__0")
    assert [float(g[0]) for g in got] == [6.0, 6.0, 7.0]  # (INPUT + START) * READY


def test_torchscript_start_end_ready_and_corrid_arguments(client):
    got = [client.infer("libtorch_controls", _input(v, name="INPUT__0"), sequence_id=2**40 + 3,
                        sequence_start=i == 0, sequence_end=i == 2) for i, v in enumerate([1, 2, 3])]
    assert [int(r.as_numpy("OUTPUT__0")[0, 0]) for r in got] == [11, 2, 103]
    assert [int(r.as_numpy("OUTPUT__1")[0, 0]) for r in got] == [2**40 + 3] * 3


@pytest.mark.parametrize("model, datatype, batch", [("libtorch_implicit_int32", "INT32", True),
                                                    ("libtorch_nobatch_implicit_fp32", "FP32", False)])
def test_torchscript_implicit_state(client, model, datatype, batch):
    got = _run(client, model, [1, 2, 3, 4], 21, datatype=datatype, batch=batch, name="INPUT__0",
               output="OUTPUT__0")
    assert [float(g[0]) for g in got] == [1, 3, 6, 10]
    again = _run(client, model, [5, 5], 21, datatype=datatype, batch=batch, name="INPUT__0", output="OUTPUT__0")
    assert [float(g[0]) for g in again] == [5, 10]  # START resets the state


def test_a_control_that_names_no_forward_argument_is_refused_at_load(client):
    entry = {m.name: m for m in client.get_model_repository_index().models}["libtorch_unindexed_control"]
    assert entry.state == "UNAVAILABLE"
    for words in ("control input 'START'", "neither an argument of forward()", "<name>__<index>"):
        assert words in entry.reason, entry.reason


# -- 2. variable-size implicit state ----------------------------------------------------------------------


@pytest.mark.parametrize("model, datatype, batch", [("onnx_growing_fp32", "FP32", True),
                                                    ("onnx_nobatch_growing_int32", "INT32", False),
                                                    ("libtorch_growing_fp32", "FP32", True)])
def test_variable_state_starts_at_one_element_and_follows_the_outputs(client, model, datatype, batch):
    name = "INPUT__0" if model.startswith("libtorch") else "INPUT"
    output = "OUTPUT__0" if model.startswith("libtorch") else "OUTPUT"
    got = _run(client, model, [[1], [2, 3], [4]], 31, datatype=datatype, batch=batch, name=name, output=output)
    assert [g.tolist() for g in got] == [[0, 1], [0, 1, 2, 3], [0, 1, 2, 3, 4]]


@pytest.mark.parametrize("model, name", [("onnx_growing_fp32", "INPUT"), ("libtorch_growing_fp32", "INPUT__0")])
def test_sequences_with_different_state_sizes_on_one_stream(server, model, name):
    """Interleaved sequences whose states differ in length: rows of different state shapes never
    share a batch (they could not be joined), and each sequence keeps its own."""
    plan = {41: [[1], [2, 3], [4, 5, 6]], 42: [[7, 8, 9], [10]], 43: [[11]] * 3}
    sends = []
    for step in range(3):
        for key, values in plan.items():
            if step < len(values):
                sends.append((model, _input(values[step], "FP32", name=name), f"{key}:{step}",
                              dict(sequence_id=key, sequence_start=step == 0, sequence_end=step == len(values) - 1)))
    output = "OUTPUT__0" if name == "INPUT__0" else "OUTPUT"
    answers = {r.get_response().id: r.as_numpy(output).reshape(-1).tolist() for r in _stream(server, sends)}
    assert answers["41:2"] == [0, 1, 2, 3, 4, 5, 6]
    assert answers["42:1"] == [0, 7, 8, 9, 10]
    assert answers["43:2"] == [0, 11, 11, 11]


# -- 3. string implicit state -------------------------------------------------------------------------


def test_string_state_in_onnx(client):
    got = _run(client, "onnx_string_pair", [b"a", b"b", b"c"], "s-1", datatype="BYTES")
    assert [g.tolist() for g in got] == [[b"", b"a"], [b"a", b"b"], [b"b", b"c"]]
    from_file = _run(client, "onnx_string_pair_file", [b"x", b"y"], "s-2", datatype="BYTES")
    assert [g.tolist() for g in from_file] == [[b"init", b"x"], [b"x", b"y"]]
    growing = _run(client, "onnx_growing_string", [b"p", b"q"], "s-3", datatype="BYTES")
    assert [g.tolist() for g in growing] == [[b"", b"p"], [b"", b"p", b"q"]]


def test_string_state_in_python(client):
    got = _run(client, "python_string_state", [b"a", b"bc", b"d"], 51, datatype="BYTES")
    assert [g.tolist() for g in got] == [[b"|a"], [b"|a|bc"], [b"|a|bc|d"]]


# -- 4. stream order -------------------------------------------------------------------------------------


def test_a_stream_answers_a_model_that_is_not_decoupled_in_arrival_order(server):
    """20 requests; within each group of 4 (one per instance) the executions end in reverse order,
    forced by the model's own gates. The answers still come in the order they were sent."""
    sends = [("reverse_finisher", _input(float(i), "FP32", batch=False, name="INPUT0"), str(i), {})
             for i in range(20)]
    answers = _stream(server, sends)
    assert [r.get_response().id for r in answers] == [str(i) for i in range(20)]
    assert [float(r.as_numpy("OUTPUT0")[0]) for r in answers] == [float(i) for i in range(20)]


# -- also: initial state, ids, preserve_ordering ------------------------------------------------------------


def test_initial_state_from_a_data_file_and_as_zeros(client):
    assert [int(g[0]) for g in _run(client, "onnx_implicit_file", [1, 2], 61)] == [101, 103]
    assert [float(g[0]) for g in _run(client, "onnx_implicit_zero_fp32", [1.5, 2], 62, datatype="FP32")] == [1.5, 3.5]


def test_string_and_integer_ids_in_one_server(client):
    """77 and "77" are two sequences (Triton's ids compare by type), on one model and across models."""
    sums: dict[object, list[int]] = {77: [], "77": []}
    for step, (v_int, v_str) in enumerate([(1, 10), (2, 20), (3, 30)]):
        for key, v in ((77, v_int), ("77", v_str)):
            r = client.infer("onnx_implicit_int32", _input(v), sequence_id=key, sequence_start=step == 0,
                             sequence_end=step == 2)
            sums[key].append(int(r.as_numpy("OUTPUT")[0, 0]))
    assert sums == {77: [1, 3, 6], "77": [10, 30, 60]}
    assert [float(g[0]) for g in _run(client, "libtorch_implicit_int32", [4, 4], "77", name="INPUT__0",
                                      output="OUTPUT__0")] == [4, 8]


def test_preserve_ordering_with_sequences(server, client):
    sb = client.get_model_config("onnx_implicit_ordered").config.sequence_batching
    assert sb.oldest.preserve_ordering
    sends = [("onnx_implicit_ordered", _input(v), f"{key}:{step}",
              dict(sequence_id=key, sequence_start=step == 0, sequence_end=step == 3))
             for step in range(4) for key, v in ((71, 1), (72, 10), (73, 100))]
    answers = _stream(server, sends)
    assert [r.get_response().id for r in answers] == [s[2] for s in sends]
    assert [int(r.as_numpy("OUTPUT")[0, 0]) for r in answers] == [v * (step + 1) for step in range(4)
                                                                 for v in (1, 10, 100)]


# -- also: idle timeouts across instances -------------------------------------------------------------------


@pytest.mark.parametrize("model, instances", [("onnx_direct_2", 2), ("onnx_oldest_4", 4)])
def test_idle_sequences_give_their_slots_to_the_backlog(server, client, model, instances):
    """Every slot is held by a started sequence that then goes quiet; as many sequences again wait
    in the backlog. Each backlogged one can only run once an idle one was released, so when all
    have answered, every idle sequence was released and is told so."""
    idle = [900 + 10 * instances + k for k in range(instances)]
    for key in idle:
        assert int(client.infer(model, _input(1), sequence_id=key, sequence_start=True).as_numpy("OUTPUT")[0, 0]) == 2
    answers: queue.Queue = queue.Queue()
    waiting = [800 + 10 * instances + k for k in range(instances)]
    for key in waiting:
        client.async_infer(model, _input(key), lambda result, error: answers.put((result, error)),
                           sequence_id=key, sequence_start=True)
    got = []
    for _ in waiting:
        result, error = answers.get(timeout=60)
        assert error is None, error
        got.append(int(result.as_numpy("OUTPUT")[0, 0]))
    assert sorted(got) == [key + 1 for key in waiting]  # (INPUT + START) * READY
    for key in idle:
        with pytest.raises(InferenceServerException) as exc:
            client.infer(model, _input(1), sequence_id=key)
        assert exc.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert f"sequence {key}" in exc.value.message() and str(IDLE_US) in exc.value.message()


# -- 5. Triton's delay hooks ----------------------------------------------------------------------------------


def _executions(client, model: str) -> tuple[int, int, dict[int, int]]:  # type: ignore[no-untyped-def]
    s = client.get_inference_statistics(model).model_stats[0]
    return s.execution_count, s.inference_count, {b.batch_size: b.compute_infer.count for b in s.batch_stats}


def _delta(before, after) -> tuple[int, int, dict[int, int]]:  # type: ignore[no-untyped-def]
    sizes = {k: v - before[2].get(k, 0) for k, v in after[2].items() if v - before[2].get(k, 0)}
    return after[0] - before[0], after[1] - before[1], sizes


def _sequences_on_a_stream(model: str, keys: list[int], length: int) -> list[tuple]:
    return [(model, _input(key % 100 + step), f"{key}:{step}",
             dict(sequence_id=key, sequence_start=step == 0, sequence_end=step == length - 1))
            for step in range(length) for key in keys]


# Triton's qa/L0_sequence_batcher queue_delay_models (direct with a queue delay), by their
# minimum_slot_utilization; the delay is shorter than Triton's 3 s, which no assertion here needs.
QUEUE_DELAY_MODELS = {"queue_delay_no_min_util": 0, "queue_delay_half_min_util": 0.5,
                      "queue_delay_full_min_util": 1}


@pytest.fixture(scope="module")
def delay_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("qa_delay_repo")
    qa.add_onnx_sequence(repo, "direct_4", max_batch=4)
    qa.add_onnx_sequence(repo, "direct_2x2", max_batch=2, instances=2)
    qa.add_onnx_sequence(repo, "direct_2", max_batch=2)  # the backlog test's: two slots in all
    qa.add_onnx_sequence(repo, "direct_4_variable", max_batch=4, variable=True)  # INPUT dims [-1]
    for name, utilization in QUEUE_DELAY_MODELS.items():
        qa.add_onnx_sequence(repo, name, max_batch=4, strategy=(
            f"direct {{ max_queue_delay_microseconds: 300000 minimum_slot_utilization: {utilization} }}"))
    return repo


@pytest.fixture(scope="module")
def delay_server(delay_repo):
    with running(delay_repo, env={"TRITONSERVER_DELAY_SCHEDULER": "12"}) as server:
        yield server


@pytest.mark.parametrize("model, executions", [("direct_4", 3), ("direct_2x2", 6)])
def test_delay_scheduler_forms_the_batches(delay_server, model, executions):
    """TRITONSERVER_DELAY_SCHEDULER=12: nothing runs until the 12 requests of 4 sequences are
    queued, so each step of the 4 sequences runs as one batch per instance."""
    c = grpcclient.InferenceServerClient(delay_server.url)
    try:
        before = _executions(c, model)
        answers = _stream(delay_server, _sequences_on_a_stream(model, [101, 102, 103, 104], 3))
        after = _executions(c, model)
    finally:
        c.close()
    rows = 12 // executions
    assert _delta(before, after) == (executions, 12, {rows: executions})
    assert [int(r.as_numpy("OUTPUT")[0, 0]) for r in answers] == [
        key % 100 + step + (step == 0) for step in range(3) for key in [101, 102, 103, 104]]


@pytest.fixture(scope="module")
def backlog_server(delay_repo):
    env = {"TRITONSERVER_DELAY_SCHEDULER": "1", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "2"}
    with running(delay_repo, env=env) as server:
        yield server


def test_backlog_delay_scheduler_waits_for_the_backlog(backlog_server):
    """Two slots; sequences A and B hold them, C's two requests wait in the backlog. With
    TRITONSERVER_DELAY_SCHEDULER=1 and TRITONSERVER_BACKLOG_DELAY_SCHEDULER=2 nothing runs before
    C's requests are queued, so A and B run side by side twice, then C alone twice (without the
    backlog hook A's first request would run alone as soon as it arrived)."""
    model = "direct_2"
    c = grpcclient.InferenceServerClient(backlog_server.url)
    try:
        before = _executions(c, model)
        answers = _stream(backlog_server, _sequences_on_a_stream(model, [201, 202], 2)
                          + _sequences_on_a_stream(model, [203], 2))
        after = _executions(c, model)
    finally:
        c.close()
    assert _delta(before, after) == (4, 6, {2: 2, 1: 2})
    assert [int(r.as_numpy("OUTPUT")[0, 0]) for r in answers] == [2, 3, 2, 3, 4, 4]


# -- 5b. the delay-hook tests of Triton's QA whose batches hold filler rows ----------------------------------
#
# Triton's direct batch spans rows 0..the highest slot with a request ready, whatever the rows
# between carry (nothing, or a request shaped otherwise: a filler row, READY false), and its
# statistics count those rows in the batch size (not in the inference count). Each plan below
# is sent on one stream, sequence after sequence, as the QA test's threads send theirs.


def _plan(model: str, plan: list[tuple[int, list[list[int]]]],
          end: bool = True) -> tuple[list[tuple], dict[str, list[int]]]:
    """The requests of each (sequence id, [INPUT values of each request]) in order, END on each
    last one if ``end``; and the answers they must get, (INPUT + START) * READY."""
    sends: list[tuple] = []
    expected: dict[str, list[int]] = {}
    for key, requests in plan:
        for step, values in enumerate(requests):
            rid = f"{key}:{step}"
            flags = dict(sequence_id=key, sequence_start=step == 0, sequence_end=end and step == len(requests) - 1)
            sends.append((model, _input(values), rid, flags))
            expected[rid] = [v + (step == 0) for v in values]
    return sends, expected


def _run_plan(server, model: str, sends: list[tuple], expected: dict) -> tuple:  # type: ignore[no-untyped-def]
    """Send the plan; check every answer; the model's executions, inferences and batch sizes meanwhile."""
    c = grpcclient.InferenceServerClient(server.url)
    try:
        before = _executions(c, model)
        answers = _stream(server, sends)
        after = _executions(c, model)
    finally:
        c.close()
    assert {r.get_response().id: r.as_numpy("OUTPUT").reshape(-1).tolist() for r in answers} == expected
    return _delta(before, after)


@pytest.fixture(scope="module")
def backlog_fill_server(delay_repo):
    env = {"TRITONSERVER_DELAY_SCHEDULER": "10", "TRITONSERVER_BACKLOG_DELAY_SCHEDULER": "3"}
    with running(delay_repo, env=env) as server:
        yield server


def test_backlog_fill_no_end(backlog_fill_server):
    """Four slots; 1001..1004 hold them with 3, 2, 2 and 3 requests, 1005 (START and END in one) and
    1006 (three) wait in the backlog; nothing runs before they are all queued. 1005 and 1006 take
    the slots 1002 and 1003 give up, and 1006, alone in slot 2 at the end, runs twice with two
    filler rows before it: Triton expects 5 executions, {4: 3, 3: 2}."""
    sends, expected = _plan("direct_4", [(1001, [[1], [2], [3]]), (1002, [[11], [13]]), (1003, [[111], [113]]),
                                         (1004, [[1111], [1112], [1113]]), (1005, [[11111]]),
                                         (1006, [[22222], [22223], [22224]])])
    assert _run_plan(backlog_fill_server, "direct_4", sends, expected) == (5, 14, {4: 3, 3: 2})


def test_ragged_batch(delay_server):
    """TRITONSERVER_DELAY_SCHEDULER=12, four slots, four sequences of three requests shaped [2], [2],
    [1] and [3] (INPUT dims [-1], not ragged): requests of different shapes never share a batch,
    and each batch spans the four slots: Triton expects 9 executions of batch size 4."""
    sizes = {1001: 2, 1002: 2, 1003: 1, 1004: 3}
    plan = [(key, [[key % 100 * 10 + step] * n for step in range(3)]) for key, n in sizes.items()]
    sends, expected = _plan("direct_4_variable", plan)
    assert _run_plan(delay_server, "direct_4_variable", sends, expected) == (9, 12, {4: 9})


@pytest.fixture(scope="module")
def queue_delay_server(delay_repo):
    with running(delay_repo, env={"TRITONSERVER_DELAY_SCHEDULER": "2"}) as server:
        yield server


@pytest.mark.parametrize("model", list(QUEUE_DELAY_MODELS))
def test_queue_delay(queue_delay_server, model):
    """TRITONSERVER_DELAY_SCHEDULER=2 and a queue delay, with minimum_slot_utilization 0, 0.5 or 1:
    sequence 1001 sends one request, 1002 two (no END). Whether a batch waits for the delay or
    not, the first holds 1001 and 1002, the second a filler row and 1002's second request: Triton
    expects 2 executions of batch size 2."""
    sends, expected = _plan(model, [(1001, [[1]]), (1002, [[11], [12]])], end=False)
    assert _run_plan(queue_delay_server, model, sends, expected) == (2, 3, {2: 2})

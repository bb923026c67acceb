"""Issue #4: ensembles, end to end through tritonclient against a real ``inferd serve``,
plus unit tests of :class:`EnsembleScheduler` with fake composing models.

Scenarios that need a busy composing model hold it with a gated Python model
(tests/gated_model.py): an execution starts (the gate's ``started.<n>``) and
waits until the test releases it. So nothing depends on how long anything
takes: branches overlap when both started before either was released, a
request is queued when the model's pending count (/metrics) says so, and
orders are read from the executions the gate recorded.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, running
from gated_model import (add_gated_model, executions, release, reset, started_count, wait_pending_async,
                         wait_started_async)
from inferd.clock import FakeClock
from inferd.config import ensemble_config as plain_wiring
from inferd.config import model_spec, parse_config_text
from inferd.ensemble import EnsembleScheduler, build_graph
from inferd.errors import DeadlineExceeded, InvalidArgument, ModelExecutionError, Unavailable
from inferd.examples import build
from inferd.examples import onnx_models as om
from inferd.observability.stats import ModelStats
from inferd.scheduling.base import run_task
from inferd.types import InferenceRequest
from repo_builder import add_model

D = 256
GATED = ("slow_a", "slow_b", "busy", "prio", "head")  # held by the test: tests/gated_model.py
DEADLINE_S = 5  # the client's deadline for a request whose first step the test holds past it


def io(inputs=(("INPUT0", "TYPE_FP32", [D]),), outputs=(("OUTPUT0", "TYPE_FP32", [D]),)) -> str:  # type: ignore[no-untyped-def]
    text = ""
    for kind, items in (("input", inputs), ("output", outputs)):
        text += "".join(f'{kind} {{ name: "{n}" data_type: {t} dims: [ {", ".join(map(str, d))} ] }}\n'
                        for n, t, d in items)
    return text


def onnx_config(name: str, max_batch_size: int, extra: str = "", **kw) -> str:  # type: ignore[no-untyped-def]
    return f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n' + io(**kw) + extra


def steps_text(steps, max_inflight: int = 0) -> str:  # type: ignore[no-untyped-def]
    text = "ensemble_scheduling {\n"
    if max_inflight:
        text += f"  max_inflight_requests: {max_inflight}\n"
    for model, inputs, outputs in steps:
        text += f'  step {{ model_name: "{model}" model_version: -1\n'
        text += "".join(f'    input_map {{ key: "{k}" value: "{v}" }}\n' for k, v in inputs.items())
        text += "".join(f'    output_map {{ key: "{k}" value: "{v}" }}\n' for k, v in outputs.items())
        text += "  }\n"
    return text + "}\n"


def ensemble_config(name: str, max_batch_size: int, steps, extra: str = "", **kw) -> str:  # type: ignore[no-untyped-def]
    return (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n' + io(**kw)
            + extra + steps_text(steps))


def add_ensemble(repo: Path, name: str, text: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)


def chain(*models: str) -> list:
    """Steps INPUT0 -> models[0] -> ... -> OUTPUT0, each model with INPUT0/OUTPUT0."""
    steps, prev = [], "INPUT0"
    for i, m in enumerate(models):
        nxt = "OUTPUT0" if i == len(models) - 1 else f"t{i}"
        steps.append((m, {"INPUT0": prev}, {"OUTPUT0": nxt}))
        prev = nxt
    return steps


def picky_model():  # type: ignore[no-untyped-def]
    """Non-batching FP32 [-1] -> [4]: a Reshape that fails at run time unless the input has 4 elements."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])],
        "picky",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [4])],
        initializer=[numpy_helper.from_array(np.array([4], np.int64), "shape")],
    )
    return om._model(graph)


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ensemble_gates")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, gates: Path) -> Path:
    repo = tmp_path_factory.mktemp("ensemble_repo")
    small = om.serialize(om.mlp(D, 1024, D))
    plain = {
        # the scale -> mlp -> relu chain and its fused counterpart
        "scale": (om.scale(D, 2.0), onnx_config("scale", 64, "dynamic_batching { }\n")),
        "mlp": (small, onnx_config("mlp", 64, "dynamic_batching { }\n")),
        "relu": (om.relu(D), onnx_config("relu", 64, "dynamic_batching { }\n")),
        "fused": (om.fused_scale_mlp_relu(D, 1024, D, factor=2.0), onnx_config("fused", 64, "dynamic_batching { }\n")),
        "add": (om.add_sub(np.float32, D), onnx_config(
            "add", 512, "dynamic_batching { }\n", inputs=(("INPUT0", "TYPE_FP32", [D]), ("INPUT1", "TYPE_FP32", [D])),
            outputs=(("OUTPUT0", "TYPE_FP32", [D]), ("OUTPUT1", "TYPE_FP32", [D])))),
        # batches only in pairs (or after 5 s): shows ensemble and direct traffic sharing one execution
        "pairs": (small, onnx_config("pairs", 2, "dynamic_batching { max_queue_delay_microseconds: 5000000 }\n")),
        "mixed": (small, onnx_config("mixed", 32, "dynamic_batching { max_queue_delay_microseconds: 20000 }\n")),
        "tail": (om.relu(D), onnx_config("tail", 8, "dynamic_batching { }\n")),
        # a step that fails at run time for inputs of the wrong length
        "flat_scale": (om.scale(-1, 2.0, batch=False), onnx_config(
            "flat_scale", 0, inputs=(("INPUT0", "TYPE_FP32", [-1]),), outputs=(("OUTPUT0", "TYPE_FP32", [-1]),))),
        "picky": (picky_model(), onnx_config(
            "picky", 0, inputs=(("INPUT0", "TYPE_FP32", [-1]),), outputs=(("OUTPUT0", "TYPE_FP32", [4]),))),
        # fails to load: its config contradicts the model file
        "broken": (om.relu(D), onnx_config("broken", 64, inputs=(("INPUT0", "TYPE_FP32", [D + 1]),),
                                           outputs=(("OUTPUT0", "TYPE_FP32", [D + 1]),))),
    }
    for name, (model, text) in plain.items():
        add_model(repo, name, model, text)
    gated = {
        # two branches (and a chain of the same two), each held by its own gate
        "slow_a": (8, "dynamic_batching { }"),
        "slow_b": (8, "dynamic_batching { }"),
        # queue policies the ensemble request's priority and timeout must reach
        "busy": (8, "dynamic_batching { default_queue_policy { timeout_action: REJECT "
                    "default_timeout_microseconds: 30000000 allow_timeout_override: true } }"),
        "prio": (1, "dynamic_batching { priority_levels: 2 default_priority_level: 2 }"),  # one request a run
        "head": (8, "dynamic_batching { }"),
    }
    for name, (max_batch_size, batching) in gated.items():
        add_gated_model(repo, name, gates / name, max_batch_size=max_batch_size, dims=(D,), extra=batching + "\n")
    ensembles = {
        "chain": ensemble_config("chain", 64, chain("scale", "mlp", "relu")),
        "nested": ensemble_config("nested", 64, [("chain", {"INPUT0": "INPUT0"}, {"OUTPUT0": "c"}),
                                                 ("scale", {"INPUT0": "c"}, {"OUTPUT0": "OUTPUT0"})]),
        "nested2": ensemble_config("nested2", 64, [("nested", {"INPUT0": "INPUT0"}, {"OUTPUT0": "n"}),
                                                   ("chain", {"INPUT0": "INPUT0"}, {"OUTPUT0": "c"}),
                                                   ("add", {"INPUT0": "n", "INPUT1": "c"}, {"OUTPUT0": "OUTPUT0"})]),
        "fork": ensemble_config("fork", 8, [("slow_a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "a"}),
                                                       ("slow_b", {"INPUT0": "INPUT0"}, {"OUTPUT0": "b"}),
                                                       ("add", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "OUTPUT0"})]),
        "line": ensemble_config("line", 8, chain("slow_a", "slow_b")),
        "pairs_ens": ensemble_config("pairs_ens", 2, chain("pairs")),
        "mixed_ens": ensemble_config("mixed_ens", 32, chain("scale", "mixed")),
        "busy_ens": ensemble_config("busy_ens", 8, chain("relu", "busy")),
        "prio_ens": ensemble_config("prio_ens", 1, chain("prio")),
        "deadline_ens": ensemble_config("deadline_ens", 8, chain("head", "tail")),
        "failing": ensemble_config("failing", 0, chain("flat_scale", "picky"), inputs=(("INPUT0", "TYPE_FP32", [-1]),),
                                   outputs=(("OUTPUT0", "TYPE_FP32", [4]),)),
        # refused at load, each with its reason in RepositoryIndex
        "bad_missing": ensemble_config("bad_missing", 8, chain("scale", "nope")),
        "bad_failed": ensemble_config("bad_failed", 8, chain("scale", "broken")),
        "bad_cycle_a": ensemble_config("bad_cycle_a", 8, chain("scale", "bad_cycle_b")),
        "bad_cycle_b": ensemble_config("bad_cycle_b", 8, chain("bad_cycle_a")),
        "bad_self": ensemble_config("bad_self", 8, chain("bad_self")),
        "bad_user": ensemble_config("bad_user", 8, chain("bad_failed")),
        "bad_dtype": ensemble_config("bad_dtype", 8, chain("scale"), inputs=(("INPUT0", "TYPE_FP16", [D]),)),
        "bad_batch": ensemble_config("bad_batch", 128, chain("scale")),
        "bad_instances": ensemble_config("bad_instances", 8, chain("scale"),
                                         extra="instance_group [ { count: 1 kind: KIND_CPU } ]\n"),
        "bad_unused": ensemble_config("bad_unused", 8, chain("scale"),
                                      inputs=(("INPUT0", "TYPE_FP32", [D]), ("SPARE", "TYPE_FP32", [D]))),
    }
    for name, text in ensembles.items():
        add_ensemble(repo, name, text)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path):
    with running(repo, exit_zero=False, no_traceback=False) as srv:
        yield srv


@pytest.fixture
async def client(server: ServerProcess):
    c = aioclient.InferenceServerClient(server.url)
    yield c
    await c.close()


def inputs(x: np.ndarray, name: str = "INPUT0") -> list[aioclient.InferInput]:
    i = aioclient.InferInput(name, list(x.shape), "FP32")
    i.set_data_from_numpy(x)
    return [i]


def rows(n: int, value: float | None = None) -> np.ndarray:
    if value is not None:
        return np.full((n, D), value, np.float32)
    return np.random.default_rng(n).standard_normal((n, D), dtype=np.float32)


def infer(client, model: str, x: np.ndarray, **kw) -> asyncio.Future:  # type: ignore[no-untyped-def]
    return asyncio.ensure_future(client.infer(model, inputs(x), **kw))


async def stats(client, model: str):  # type: ignore[no-untyped-def]
    return (await client.get_inference_statistics(model)).model_stats[0]


async def until(what: str, ok) -> None:  # type: ignore[no-untyped-def]
    """Until the coroutine function ``ok`` answers true (a bound on a hang, not a timing claim)."""
    deadline = time.monotonic() + 60
    while not await ok():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def failure(call) -> InferenceServerException:  # type: ignore[no-untyped-def]
    with pytest.raises(InferenceServerException) as info:
        await call
    return info.value


# -- results ---------------------------------------------------------------------------


async def test_chain_equals_the_fused_model(client):
    x = rows(5)
    got = (await infer(client, "chain", x)).as_numpy("OUTPUT0")
    want = (await infer(client, "fused", x)).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    reference = np.maximum(om.mlp_reference(2.0 * x, om.mlp_weights(D, 1024, D)), 0)
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)


async def test_nested_ensembles(client):
    x = rows(3)
    fused = (await infer(client, "fused", x)).as_numpy("OUTPUT0")
    nested = (await infer(client, "nested", x)).as_numpy("OUTPUT0")
    np.testing.assert_allclose(nested, 2.0 * fused, rtol=1e-5, atol=1e-5)
    twice = (await infer(client, "nested2", x)).as_numpy("OUTPUT0")
    np.testing.assert_allclose(twice, 3.0 * fused, rtol=1e-5, atol=1e-5)


async def test_metadata_config_and_statistics(client):
    md = await client.get_model_metadata("chain")
    assert md.platform == "ensemble" and md.versions == ["1"]
    assert [(t.name, t.datatype, list(t.shape)) for t in md.inputs] == [("INPUT0", "FP32", [-1, D])]
    config = (await client.get_model_config("chain")).config
    assert config.platform == "ensemble" and not config.instance_group  # no default instance group
    assert [s.model_name for s in config.ensemble_scheduling.step] == ["scale", "mlp", "relu"]
    assert await client.is_model_ready("chain") and await client.is_model_ready("nested2")

    before = {m: await stats(client, m) for m in ("chain", "scale", "mlp", "relu")}
    for n in (1, 2, 3):
        await infer(client, "chain", rows(n))
    after = {m: await stats(client, m) for m in ("chain", "scale", "mlp", "relu")}
    ens, ens0 = after["chain"], before["chain"]
    assert ens.inference_count - ens0.inference_count == 6
    assert ens.execution_count - ens0.execution_count == 3
    assert ens.inference_stats.success.count - ens0.inference_stats.success.count == 3
    assert ens.inference_stats.queue.count - ens0.inference_stats.queue.count == 3  # one zero-length queue stage
    assert ens.inference_stats.queue.ns == 0
    assert ens.inference_stats.compute_infer.count == 0
    for m in ("scale", "mlp", "relu"):  # each composing model counts its step requests as usual
        s, s0 = after[m], before[m]
        assert s.inference_stats.success.count - s0.inference_stats.success.count == 3
        assert s.inference_count - s0.inference_count == 6


# -- concurrency and batching ---------------------------------------------------------------


async def test_parallel_branches_run_concurrently(client, gates):
    """Both branches of the fork start before either is released: they are in flight at once.
    The control: the same two steps as a chain start one after the other."""
    a, b = gates / "slow_a", gates / "slow_b"
    fork = infer(client, "fork", rows(2, 0.5))
    await wait_started_async(a)
    await wait_started_async(b)  # neither gate is released yet: both executions are under way
    assert not fork.done()
    release(a)
    release(b)
    np.testing.assert_allclose((await fork).as_numpy("OUTPUT0"), np.full((2, D), 1.0))  # a + b
    reset(a)
    reset(b)
    line = infer(client, "line", rows(2, 0.5))
    await wait_started_async(a)
    assert started_count(b) == 0  # slow_b needs slow_a's output: it cannot have started
    release(a)
    await wait_started_async(b)
    release(b)
    np.testing.assert_allclose((await line).as_numpy("OUTPUT0"), np.full((2, D), 0.5))
    assert executions(a) == [[0.5]] and executions(b) == [[0.5]]


async def test_ensemble_steps_share_batches_with_direct_traffic(client):
    before = await stats(client, "pairs")
    # "pairs" runs a batch when 2 rows are queued (or after 5 s): one execution for both
    # requests means the ensemble's step and the direct request shared it.
    ens, direct = await asyncio.gather(infer(client, "pairs_ens", rows(1)), infer(client, "pairs", rows(1)))
    after = await stats(client, "pairs")
    assert after.execution_count - before.execution_count == 1
    assert after.inference_count - before.inference_count == 2
    np.testing.assert_allclose(ens.as_numpy("OUTPUT0"), direct.as_numpy("OUTPUT0"))


async def test_mixed_concurrent_traffic_is_batched(client):
    before = await stats(client, "mixed")
    calls = [infer(client, "mixed_ens", rows(1)) for _ in range(12)]
    calls += [infer(client, "mixed", rows(1)) for _ in range(12)]
    await asyncio.gather(*calls)
    after = await stats(client, "mixed")
    inference = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert inference == 24
    assert executions < inference


# -- priority, timeout, deadline --------------------------------------------------------------


async def test_timeout_reaches_the_step_queue_policy(client, gates):
    blocker = infer(client, "busy", rows(1, 0.1))
    await wait_started_async(gates / "busy")  # the one instance is held: the step's request queues
    err = await failure(infer(client, "busy_ens", rows(1), timeout=100_000))  # microseconds
    assert err.status() == "StatusCode.UNAVAILABLE"
    assert err.message().startswith("ensemble 'busy_ens' step 1 (model 'busy'): ")
    assert "timed out in the queue" in err.message() and "100000 us" in err.message()
    assert not blocker.done()  # the step's own 30 s default did not apply
    release(gates / "busy")
    await blocker
    ok = await infer(client, "busy_ens", rows(1), timeout=10_000_000)
    assert ok.as_numpy("OUTPUT0").shape == (1, D)


async def test_priority_reaches_the_step_queue(client, server, gates):
    """Seven direct requests queue at the default level 2 behind one the gate holds; the ensemble's
    request at priority 1 queues after them. Released, its step runs before all seven, which keep their
    order (sent one at a time: the order they queue in is the test's, not the transport's)."""
    lows = [infer(client, "prio", rows(1, 0))]
    await wait_started_async(gates / "prio")
    for i in range(1, 8):
        lows.append(infer(client, "prio", rows(1, i)))
        await wait_pending_async(server.metrics_url, "prio", i)
    high = infer(client, "prio_ens", rows(1, 100), priority=1)
    await wait_pending_async(server.metrics_url, "prio", 8)  # the step's request is in prio's queue
    release(gates / "prio")
    await asyncio.gather(high, *lows)
    assert executions(gates / "prio") == [[0], [100], *([i] for i in range(1, 8))]


async def test_a_passed_deadline_stops_the_next_step(client, gates):
    """The head step is held past the request's deadline: the server ends the ensemble request
    (the call's deadline passes on the server's clock, which cancels it) and, once the head is
    released, no later step runs.

    The server's deadline is the client's plus the header's trip (the server counts the call's
    timeout from its arrival), so the client seeing DEADLINE_EXCEEDED does not mean the server's
    has passed: releasing the head then let a stressed run finish the ensemble with the tail
    step, a success on the server's clock. The head is released only once the server has
    ended the request."""
    before_tail = await stats(client, "tail")
    before_head = await stats(client, "head")
    before_ens = await stats(client, "deadline_ens")
    call = infer(client, "deadline_ens", rows(1, 0.1), client_timeout=DEADLINE_S)
    await wait_started_async(gates / "head")  # the head step executes, held past the deadline
    err = await failure(call)
    assert err.status() == "StatusCode.DEADLINE_EXCEEDED"

    async def ensemble_failed() -> bool:
        return (await stats(client, "deadline_ens")).inference_stats.fail.count > before_ens.inference_stats.fail.count

    async def head_done() -> bool:
        return (await stats(client, "head")).inference_count > before_head.inference_count

    await until("the ensemble request never ended", ensemble_failed)  # while its head step is still held
    release(gates / "head")
    await until("the head step never finished", head_done)
    after_tail, after_ens = await stats(client, "tail"), await stats(client, "deadline_ens")
    assert after_tail.inference_count == before_tail.inference_count  # the tail step never ran
    assert after_ens.inference_stats.success.count == before_ens.inference_stats.success.count


# -- failures ---------------------------------------------------------------------------------


async def test_a_failing_step_fails_only_its_request(client):
    bad = np.arange(3, dtype=np.float32)  # picky needs 4 elements
    good = np.arange(4, dtype=np.float32)
    calls = [infer(client, "failing", bad), infer(client, "failing", good), infer(client, "failing", good)]
    results = await asyncio.gather(*calls, return_exceptions=True)
    err = results[0]
    assert isinstance(err, InferenceServerException), results[0]
    assert err.status() == "StatusCode.INTERNAL"
    assert err.message().startswith("ensemble 'failing' step 1 (model 'picky'): model 'picky' failed to execute")
    for ok in results[1:]:
        np.testing.assert_allclose(ok.as_numpy("OUTPUT0"), 2 * good)
    s = await stats(client, "failing")
    assert s.inference_stats.fail.count >= 1 and s.inference_stats.success.count >= 2


async def test_ensemble_request_errors_name_the_ensemble(client):
    err = await failure(infer(client, "chain", rows(1)[:, :7]))
    assert err.status() == "StatusCode.INVALID_ARGUMENT"
    assert "model 'chain'" in err.message()


def test_refused_ensembles_in_the_repository_index(server):
    with grpcclient.InferenceServerClient(server.url) as c:
        index = {m.name: m for m in c.get_model_repository_index().models}
        for name in ("chain", "nested", "nested2", "fork", "failing"):
            assert index[name].state == "READY", (name, index[name].reason)
        reasons = {name: m.reason for name, m in index.items() if name.startswith("bad_")}
        assert all(index[n].state == "UNAVAILABLE" for n in reasons)
        assert not c.is_model_ready("bad_missing")
    assert reasons["bad_missing"] == (
        "ensemble bad_missing contains models that are not available or ambiguous: nope (ensemble 'bad_missing' "
        "step 1 (model 'nope'): model 'nope' is not in the model repository)")
    assert reasons["bad_failed"].startswith(
        "ensemble 'bad_failed' step 1 (model 'broken'): composing model 'broken' failed to load: model 'broken'")
    assert reasons["bad_cycle_a"] == ("ensembles form a cycle: ensemble 'bad_cycle_a' step 1 -> ensemble "
                                      "'bad_cycle_b' step 0 -> ensemble 'bad_cycle_a'")
    assert reasons["bad_cycle_b"].startswith("ensembles form a cycle: ensemble 'bad_cycle_b' step 0")
    assert reasons["bad_self"] == "ensemble 'bad_self' step 0 names the ensemble itself: a cycle"
    assert reasons["bad_user"].startswith(
        "ensemble 'bad_user' step 0 (model 'bad_failed'): composing model 'bad_failed' failed to load: "
        "ensemble 'bad_failed' step 1 (model 'broken')")
    assert reasons["bad_dtype"] == (
        "ensemble 'bad_dtype': tensor 'INPUT0': data type TYPE_FP32 of step 0 (model 'scale') input 'INPUT0' "
        "does not match TYPE_FP16 of ensemble input 'INPUT0'")
    assert reasons["bad_batch"] == ("ensemble 'bad_batch' step 0 (model 'scale'): the ensemble's max_batch_size "
                                    "128 is larger than model 'scale' allows (max_batch_size 64)")
    assert reasons["bad_instances"].startswith("ensemble 'bad_instances': field 'instance_group' is not allowed")
    assert reasons["bad_unused"] == "ensemble 'bad_unused': ensemble input 'SPARE' is not consumed by any step"


def test_server_log_has_no_traceback(server):
    assert "Traceback" not in server.log()


# -- unload and recovery (in process: the explicit load/unload RPCs come later) -----------------


def _unload(manager, name: str) -> None:  # type: ignore[no-untyped-def]
    """What unloading one model leaves behind (as ModelManager.stop does for every model)."""
    entry = manager._entries[name]
    entry.set_versions({})
    entry.state, entry.reason = "UNAVAILABLE", "unloaded"


async def nested_pipes(repo: Path):  # type: ignore[no-untyped-def]
    """outer -> pipe -> (scale, relu) loaded from ``repo`` by a ModelManager: (manager, data plane)."""
    from inferd.repository import ModelManager
    from inferd.dataplane import DataPlane

    add_model(repo, "scale", om.scale(D, 2.0), onnx_config("scale", 8))
    add_model(repo, "relu", om.relu(D), onnx_config("relu", 8))
    add_ensemble(repo, "pipe", ensemble_config("pipe", 8, chain("scale", "relu")))
    add_ensemble(repo, "outer", ensemble_config("outer", 8, chain("pipe")))
    manager = ModelManager([repo])
    await manager.load_all()
    return manager, DataPlane(manager)


async def test_ensemble_follows_its_composing_models_unload_and_reload(tmp_path: Path):
    manager, dp = await nested_pipes(tmp_path)
    x = rows(2)
    try:
        assert manager.is_ready("outer") and manager.all_ready()
        out = await dp.infer(InferenceRequest("outer", {"INPUT0": x}))
        np.testing.assert_allclose(out.outputs["OUTPUT0"], np.maximum(2 * x, 0))

        _unload(manager, "relu")
        assert not manager.is_ready("pipe") and not manager.is_ready("outer") and not manager.all_ready()
        assert manager.ensemble_problem("pipe") == (
            "ensemble 'pipe' step 1 (model 'relu'): composing model 'relu' is not ready: unloaded")
        index = {e.name: e for e in manager.index()}
        assert index["outer"].state == "UNAVAILABLE"
        assert index["outer"].reason.startswith("ensemble 'outer' step 0 (model 'pipe'): composing ensemble 'pipe'")
        with pytest.raises(Unavailable) as info:
            await dp.infer(InferenceRequest("pipe", {"INPUT0": x}))
        assert info.value.message == "ensemble 'pipe' step 1 (model 'relu'): model 'relu' is not ready: unloaded"
        assert manager.get("scale").stats.inference_count == 2  # nothing ran for the refused request

        await manager.load("relu")
        assert manager.is_ready("outer") and manager.all_ready()
        out = await dp.infer(InferenceRequest("outer", {"INPUT0": x}))
        np.testing.assert_allclose(out.outputs["OUTPUT0"], np.maximum(2 * x, 0))
    finally:
        await manager.stop()


async def test_a_composing_model_reloaded_with_other_tensors_makes_the_ensemble_unavailable(tmp_path: Path):
    manager, dp = await nested_pipes(tmp_path)
    x = rows(2)
    try:
        await dp.infer(InferenceRequest("outer", {"INPUT0": x}))
        # relu now takes and gives D + 1 values: a valid model, but not what scale produces.
        wide = (("INPUT0", "TYPE_FP32", [D + 1]),)
        add_model(tmp_path, "relu", om.relu(D + 1), onnx_config("relu", 8, inputs=wide,
                                                                outputs=(("OUTPUT0", "TYPE_FP32", [D + 1]),)))
        assert await manager.load("relu") is None
        problem = manager.ensemble_problem("pipe")
        assert problem == (
            f"a composing model changed since the ensemble was loaded: ensemble 'pipe': tensor 't0': shape [{D + 1}] "
            f"of step 1 (model 'relu') input 'INPUT0' does not match shape [{D}] of step 0 (model 'scale') output "
            "'OUTPUT0' (without the batch dimension)")
        assert not manager.is_ready("pipe") and not manager.is_ready("outer")
        index = {e.name: e for e in manager.index()}
        assert index["pipe"].state == "UNAVAILABLE" and index["pipe"].reason == problem
        assert "composing ensemble 'pipe' is not ready: a composing model changed" in index["outer"].reason
        for name in ("pipe", "outer"):
            with pytest.raises(Unavailable) as info:
                await dp.infer(InferenceRequest(name, {"INPUT0": x}))
            assert "a composing model changed since the ensemble was loaded" in info.value.message
            assert f"ensemble '{name}'" in info.value.message
        assert manager.get("scale").stats.inference_count == 2  # refused before any step ran

        add_model(tmp_path, "relu", om.relu(D), onnx_config("relu", 8))
        assert await manager.load("relu") is None
        assert manager.is_ready("outer") and manager.all_ready()
        out = await dp.infer(InferenceRequest("outer", {"INPUT0": x}))
        np.testing.assert_allclose(out.outputs["OUTPUT0"], np.maximum(2 * x, 0))
    finally:
        await manager.stop()


# -- EnsembleScheduler with fake composing models ----------------------------------------------


@dataclass
class FakeScheduler:
    fn: object  # async (request) -> outputs
    calls: list = field(default_factory=list)
    cancelled: int = 0
    active: int = 0
    peak: int = 0
    merges: int = 0  # merges_rows(): > 0, the ensemble may group requests through this step

    def submit(self, request, rows, completion, more=False):  # type: ignore[no-untyped-def]
        return run_task(self.work(request), completion)

    def merges_rows(self) -> int:
        return self.merges

    async def work(self, request):  # type: ignore[no-untyped-def]
        self.calls.append(request)
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            return await self.fn(request)  # type: ignore[operator]
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1


@dataclass
class FakeModel:
    spec: object
    scheduler: FakeScheduler
    stats: ModelStats
    version: int = 1
    tensor_device: str | None = None  # a torch device: the model takes and gives DeviceTensors there
    cache: None = None  # no response cache
    decoupled: bool = False


def fake_model(name: str, fn, n_inputs: int = 1) -> FakeModel:  # type: ignore[no-untyped-def]
    ins = tuple((f"INPUT{i}", "TYPE_FP32", [4]) for i in range(n_inputs))
    text = f'name: "{name}" max_batch_size: 8\n' + io(inputs=ins, outputs=(("OUTPUT0", "TYPE_FP32", [4]),))
    return FakeModel(model_spec(parse_config_text(text, model=name)), FakeScheduler(fn), ModelStats(name, 1))


def identity_fn(delay: float = 0.0):  # type: ignore[no-untyped-def]
    async def fn(request):  # type: ignore[no-untyped-def]
        if delay:
            await asyncio.sleep(delay)
        return {"OUTPUT0": request.inputs["INPUT0"]}
    return fn


def make_ensemble(models: dict, steps, max_inflight: int = 0, clock=None, rules=None, problem=None):  # type: ignore[no-untyped-def]
    """An EnsembleScheduler over fake models (``rules``: step rules, as parameters; ``problem``:
    the manager's question whether the ensemble can serve) and its statistics."""
    text = 'name: "ens" platform: "ensemble" max_batch_size: 8\n' + io(
        inputs=(("INPUT0", "TYPE_FP32", [4]),), outputs=(("OUTPUT0", "TYPE_FP32", [4]),))
    config = parse_config_text(text + build.parameters(rules or {}) + steps_text(steps, max_inflight), model="ens")

    def resolve(name: str, version: int):  # type: ignore[no-untyped-def]
        if name not in models:
            raise Unavailable(f"model '{name}' is not ready: unloaded")
        return models[name]

    stats = ModelStats("ens", 1)
    return EnsembleScheduler(model_spec(config), build_graph(plain_wiring(config)), resolve, stats, clock,
                             problem), stats


def request(x: np.ndarray, **kw) -> InferenceRequest:  # type: ignore[no-untyped-def]
    return InferenceRequest("ens", {"INPUT0": x}, **kw)


async def test_intermediate_tensors_are_not_copied():
    a, b = fake_model("a", identity_fn()), fake_model("b", identity_fn())
    sched, stats = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    x = np.ones((2, 4), np.float32)
    out = await sched.infer(request(x), 2)
    assert out["OUTPUT0"] is x
    assert b.scheduler.calls[0].inputs["INPUT0"] is x
    assert stats.inference_count == 2 and stats.execution_count == 1
    assert stats.queue.count == 1 and stats.queue.ns == 0
    assert a.stats.success.count == 1 and b.stats.success.count == 1


def device_fn(device: str):  # type: ignore[no-untyped-def]
    """A model on a torch device: its outputs stay there (as DeviceTensors) when the request asks."""
    import torch

    from inferd.gpu.tensor import DeviceTensor

    async def fn(request):  # type: ignore[no-untyped-def]
        x = np.asarray(request.inputs["INPUT0"]) + 1
        if request.output_device == device:
            return {"OUTPUT0": DeviceTensor.of(torch.from_numpy(x))}
        return {"OUTPUT0": x}
    return fn


async def test_between_steps_on_one_torch_device_the_tensors_stay_there():
    a, b, c = (fake_model(n, device_fn("cuda:0")) for n in "abc")
    for m in (a, b, c):
        m.tensor_device = "cuda:0"
    sched, _ = make_ensemble({"a": a, "b": b, "c": c}, chain("a", "b", "c"))
    out = await sched.infer(request(np.zeros((1, 4), np.float32)), 1)
    assert [m.scheduler.calls[0].output_device for m in (a, b, c)] == ["cuda:0", "cuda:0", None]
    from inferd.gpu.tensor import DeviceTensor

    assert isinstance(b.scheduler.calls[0].inputs["INPUT0"], DeviceTensor)  # a's output, never on the host
    assert isinstance(out["OUTPUT0"], np.ndarray) and out["OUTPUT0"].tolist() == [[3.0] * 4]


async def test_a_step_on_another_device_or_runtime_gets_host_arrays():
    a, b = fake_model("a", device_fn("cuda:0")), fake_model("b", identity_fn())
    a.tensor_device = "cuda:0"  # b: not a torch model (tensor_device None)
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    await sched.infer(request(np.zeros((1, 4), np.float32)), 1)
    assert a.scheduler.calls[0].output_device is None
    b.tensor_device = "cuda:1"
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    await sched.infer(request(np.zeros((1, 4), np.float32)), 1)
    assert a.scheduler.calls[-1].output_device is None and isinstance(b.scheduler.calls[-1].inputs["INPUT0"], np.ndarray)


async def test_a_device_tensor_reaching_a_host_model_is_copied_to_the_host_once():
    import torch

    from inferd.gpu.tensor import DeviceTensor

    b = fake_model("b", identity_fn())  # a host model
    sched, _ = make_ensemble({"b": b}, chain("b"))
    x = DeviceTensor.of(torch.arange(4, dtype=torch.float32).reshape(1, 4))
    out = await sched.infer(request(x), 1)  # a CUDA shared memory input, say
    seen = b.scheduler.calls[0].inputs["INPUT0"]
    assert isinstance(seen, np.ndarray) and seen.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    assert isinstance(out["OUTPUT0"], np.ndarray)


async def test_priority_timeout_deadline_and_id_reach_every_step():
    a, b = fake_model("a", identity_fn()), fake_model("b", identity_fn())
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    deadline = time.monotonic() + 60
    await sched.infer(request(np.ones((1, 4), np.float32), priority=3, timeout_us=1234, deadline=deadline, id="r7"), 1)
    for m in (a, b):
        sub = m.scheduler.calls[0]
        assert (sub.priority, sub.timeout_us, sub.deadline, sub.id) == (3, 1234, deadline, "r7")
        assert sub.model_name == m.spec.name


async def test_deadline_passed_during_a_step_stops_the_next():
    clock = FakeClock()

    async def slow(request):  # type: ignore[no-untyped-def]
        clock.advance(5.0)  # the step takes 5 s of the fake clock
        return {"OUTPUT0": request.inputs["INPUT0"]}

    a, b = fake_model("a", slow), fake_model("b", identity_fn())
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"), clock=clock)
    with pytest.raises(DeadlineExceeded) as info:
        await sched.infer(request(np.ones((1, 4), np.float32), deadline=clock.now() + 1.0), 1)
    assert info.value.message == "ensemble 'ens': the request's deadline passed before step 1 (model 'b') could start"
    assert len(a.scheduler.calls) == 1 and not b.scheduler.calls


async def test_failing_step_names_ensemble_step_and_model_and_cancels_its_siblings():
    async def boom(request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.01)
        raise ModelExecutionError("model 'bad' failed to execute: kaput")

    slow = fake_model("slow", identity_fn(delay=30))
    bad = fake_model("bad", boom)
    join = fake_model("join", identity_fn(), n_inputs=2)
    steps = [("slow", {"INPUT0": "INPUT0"}, {"OUTPUT0": "x"}), ("bad", {"INPUT0": "INPUT0"}, {"OUTPUT0": "y"}),
             ("join", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "OUTPUT0"})]
    sched, stats = make_ensemble({"slow": slow, "bad": bad, "join": join}, steps)
    with pytest.raises(ModelExecutionError) as info:
        await sched.infer(request(np.ones((1, 4), np.float32)), 1)
    assert info.value.message == "ensemble 'ens' step 1 (model 'bad'): model 'bad' failed to execute: kaput"
    assert slow.scheduler.cancelled == 1 and not join.scheduler.calls
    assert bad.stats.fail.count == 1 and slow.stats.fail_reasons == {"CANCELED": 1}
    assert sched.inflight() == 0 and stats.inference_count == 0


async def test_traced_steps_end_with_their_outcome():
    """Each step's span ends with the step: ok, failed (with the wrapped error) or cancelled."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from inferd.observability.tracing import TraceConfig, Tracing

    async def boom(request):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0.01)
        raise ModelExecutionError("model 'bad' failed to execute: kaput")

    exporter = InMemorySpanExporter()
    tracing = Tracing(TraceConfig(level=("TIMESTAMPS",), rate=1), processor=SimpleSpanProcessor(exporter))
    slow, bad = fake_model("slow", identity_fn(delay=30)), fake_model("bad", boom)
    ok, join = fake_model("ok", identity_fn()), fake_model("join", identity_fn(), n_inputs=2)
    steps = [("ok", {"INPUT0": "INPUT0"}, {"OUTPUT0": "w"}), ("slow", {"INPUT0": "w"}, {"OUTPUT0": "x"}),
             ("bad", {"INPUT0": "w"}, {"OUTPUT0": "y"}), ("join", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "OUTPUT0"})]
    sched, _ = make_ensemble({"ok": ok, "slow": slow, "bad": bad, "join": join}, steps)
    trace = tracing.start("ens")
    with pytest.raises(ModelExecutionError):
        await sched.infer(request(np.ones((1, 4), np.float32), trace=trace), 1)
    trace.end()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {"InferRequest", "ensemble step 0 ok", "ensemble step 1 slow", "ensemble step 2 bad"}
    assert spans["ensemble step 0 ok"].status.is_ok
    assert spans["ensemble step 2 bad"].status.description.endswith(
        "ensemble 'ens' step 2 (model 'bad'): model 'bad' failed to execute: kaput")
    assert "CancelledError" in spans["ensemble step 1 slow"].status.description
    root = spans["InferRequest"].context.span_id
    assert all(s.parent.span_id == root for n, s in spans.items() if n != "InferRequest")
    # The step's span went to the composing model's request (its scheduler records queue/compute there).
    assert bad.scheduler.calls[0].trace.span is not None and bad.scheduler.calls[0].trace is not trace
    tracing.shutdown()


async def test_cancelling_the_request_cancels_its_running_steps():
    started = asyncio.Event()

    async def hang(request):  # type: ignore[no-untyped-def]
        started.set()
        await asyncio.sleep(60)

    a, b = fake_model("a", hang), fake_model("b", hang)
    join = fake_model("join", identity_fn(), n_inputs=2)
    steps = [("a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "x"}), ("b", {"INPUT0": "INPUT0"}, {"OUTPUT0": "y"}),
             ("join", {"INPUT0": "x", "INPUT1": "y"}, {"OUTPUT0": "OUTPUT0"})]
    sched, _ = make_ensemble({"a": a, "b": b, "join": join}, steps)
    task = asyncio.ensure_future(sched.infer(request(np.ones((1, 4), np.float32)), 1))
    await started.wait()
    await asyncio.sleep(0)
    assert a.scheduler.active == 1 and b.scheduler.active == 1  # both branches run at once
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancel reaches the ensemble's task, then each step's scheduler's task, a few loop turns later.
    for _ in range(10):
        if sched.inflight() == 0:
            break
        await asyncio.sleep(0)
    assert a.scheduler.cancelled == 1 and b.scheduler.cancelled == 1
    assert sched.inflight() == 0


async def test_request_time_resolution_and_unavailable_model():
    a = fake_model("a", identity_fn())
    sched, _ = make_ensemble({"a": a}, chain("a", "b"))
    with pytest.raises(Unavailable) as info:
        await sched.infer(request(np.ones((1, 4), np.float32)), 1)
    assert info.value.message == "ensemble 'ens' step 1 (model 'b'): model 'b' is not ready: unloaded"
    assert not a.scheduler.calls  # refused before any step ran


async def test_step_input_validation_errors_are_wrapped():
    a = fake_model("a", identity_fn())
    sched, _ = make_ensemble({"a": a}, chain("a"))
    with pytest.raises(InvalidArgument) as info:
        await sched.infer(request(np.ones((1, 5), np.float32)), 1)
    assert info.value.message.startswith("ensemble 'ens' step 0 (model 'a'): unexpected shape for input 'INPUT0'")


async def test_max_inflight_requests_applies_back_pressure():
    gate = asyncio.Event()

    async def held(request):  # type: ignore[no-untyped-def]
        await gate.wait()
        return {"OUTPUT0": request.inputs["INPUT0"]}

    a, b = fake_model("a", held), fake_model("b", identity_fn())
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"), max_inflight=2)
    tasks = [asyncio.ensure_future(sched.infer(request(np.full((1, 4), i, np.float32)), 1)) for i in range(5)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert a.scheduler.active == 2 and sched.inflight() == 5  # three wait for a slot, outside the model
    gate.set()
    results = await asyncio.gather(*tasks)
    assert [r["OUTPUT0"][0, 0] for r in results] == [0, 1, 2, 3, 4]
    assert a.scheduler.peak == 2 and len(a.scheduler.calls) == 5


def held_fn(gate: asyncio.Event):  # type: ignore[no-untyped-def]
    """Identity, once the test sets ``gate``."""
    async def held(request):  # type: ignore[no-untyped-def]
        await gate.wait()
        return {"OUTPUT0": request.inputs["INPUT0"]}
    return held


async def settle() -> None:
    """Let every task the test started run until it waits (fake models only await the test's events)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_past_its_places_a_request_waits_before_its_first_step():
    """A fast step a feeding a held step b, max_inflight_requests 1: one request in b, one past a
    waiting for b's slot with its intermediate tensor, and the other three wait before a, holding
    nothing of a's: the tensors between the steps do not grow with a's rate."""
    gate = asyncio.Event()
    a, b = fake_model("a", identity_fn()), fake_model("b", held_fn(gate))
    sched, stats = make_ensemble({"a": a, "b": b}, chain("a", "b"), max_inflight=1)
    tasks = [asyncio.ensure_future(sched.infer(request(np.full((1, 4), i, np.float32)), 1)) for i in range(5)]
    await settle()
    assert len(a.scheduler.calls) == 2 and b.scheduler.active == 1 and sched.inflight() == 5
    gate.set()
    results = await asyncio.gather(*tasks)
    assert [r["OUTPUT0"][0, 0] for r in results] == [0, 1, 2, 3, 4]
    assert a.scheduler.peak == 1 and b.scheduler.peak == 1 and len(b.scheduler.calls) == 5
    assert stats.queue.count == 5 and sched.inflight() == 0  # the wait before the first step: the queue stage


async def test_waiting_for_a_slot_or_a_place_honours_the_deadline():
    gate = asyncio.Event()
    a, b = fake_model("a", identity_fn()), fake_model("b", held_fn(gate))
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"), max_inflight=1)
    first = asyncio.ensure_future(sched.infer(request(np.ones((1, 4), np.float32)), 1))
    await settle()  # in b
    deadline = time.monotonic() + 0.05
    late = [asyncio.ensure_future(sched.infer(request(np.ones((1, 4), np.float32), deadline=deadline), 1))
            for _ in range(2)]
    errors = await asyncio.gather(*late, return_exceptions=True)
    assert all(isinstance(e, DeadlineExceeded) for e in errors), errors
    assert errors[0].message == ("ensemble 'ens': the request's deadline passed while step 1 (model 'b') waited for "  # type: ignore[union-attr]
                                 "one of its 1 max_inflight_requests slots")
    assert errors[1].message == ("ensemble 'ens': the request's deadline passed while it waited before its first step "  # type: ignore[union-attr]
                                 "for one of the ensemble's 2 places (max_inflight_requests 1 for each of its 2 steps)")
    gate.set()
    await first
    assert len(a.scheduler.calls) == 2 and len(b.scheduler.calls) == 1  # the second never reached b, the third not a
    await sched.infer(request(np.ones((1, 4), np.float32)), 1)  # nothing was left holding a place or a slot
    assert sched.inflight() == 0


async def test_a_request_cancelled_while_it_waits_for_a_place_frees_it():
    gate = asyncio.Event()
    a = fake_model("a", held_fn(gate))
    sched, _ = make_ensemble({"a": a}, chain("a"), max_inflight=1)
    first = asyncio.ensure_future(sched.infer(request(np.zeros((1, 4), np.float32)), 1))
    await settle()
    waiting = asyncio.ensure_future(sched.infer(request(np.ones((1, 4), np.float32)), 1))
    after = asyncio.ensure_future(sched.infer(request(np.full((1, 4), 2, np.float32)), 1))
    await settle()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.set()
    assert (await after)["OUTPUT0"][0, 0] == 2
    await first
    assert [c.inputs["INPUT0"][0, 0] for c in a.scheduler.calls] == [0, 2] and sched.inflight() == 0


async def test_a_reloaded_route_model_is_checked_again_before_the_next_request():
    """The per-request check that the composing models are the ones the wiring was checked against
    covers every model a routed step may run, not only its default."""
    models = {"a": fake_model("a", identity_fn()), "b": fake_model("b", identity_fn())}
    asked: list[str | None] = []
    answer: list[str | None] = [None]

    def problem() -> str | None:
        asked.append(answer[0])
        return answer[0]

    sched, _ = make_ensemble(models, [("a", {"INPUT0": "INPUT0"}, {"OUTPUT0": "OUTPUT0"})], problem=problem,
                             rules={"inferd.step.0.route_by": "parameter:variant", "inferd.step.0.route": "x=a,y=b"})
    x = np.ones((1, 4), np.float32)
    for _ in range(2):
        await sched.infer(request(x, parameters={"variant": "x"}), 1)
    assert len(asked) == 1  # asked once, while the models stay the ones it answered for
    models["b"] = fake_model("b", identity_fn())  # b reloaded (another Model); the default, a, unchanged
    answer[0] = "a composing model changed since the ensemble was loaded: model 'b'"
    with pytest.raises(Unavailable) as info:
        await sched.infer(request(x, parameters={"variant": "x"}), 1)
    assert info.value.message == ("ensemble 'ens' is not ready: a composing model changed since the ensemble was "
                                  "loaded: model 'b'")
    assert len(asked) == 2 and len(models["a"].scheduler.calls) == 2


async def test_stop_waits_for_in_flight_requests_and_refuses_new_ones():
    gate = asyncio.Event()

    async def held(request):  # type: ignore[no-untyped-def]
        await gate.wait()
        return {"OUTPUT0": request.inputs["INPUT0"]}

    sched, _ = make_ensemble({"a": fake_model("a", held)}, chain("a"))
    running = asyncio.ensure_future(sched.infer(request(np.ones((1, 4), np.float32)), 1))
    await asyncio.sleep(0)
    stopping = asyncio.ensure_future(sched.stop())
    await asyncio.sleep(0)
    assert not stopping.done()
    with pytest.raises(Unavailable):
        await sched.infer(request(np.ones((1, 4), np.float32)), 1)
    gate.set()
    await running
    await stopping



# -- grouping (inferd/ensemble/grouping.py): concurrent requests through the steps as one ---------------


def grouped_models(gate: asyncio.Event, merges: int = 8):  # type: ignore[no-untyped-def]
    """a (held until ``gate`` is set, doubling) -> b (adds one): both take joined rows (``merges``).
    One instance each: the ensemble keeps two groups in its steps (its window)."""
    async def held(request):  # type: ignore[no-untyped-def]
        await gate.wait()
        return {"OUTPUT0": request.inputs["INPUT0"] * 2}

    async def plus_one(request):  # type: ignore[no-untyped-def]
        return {"OUTPUT0": request.inputs["INPUT0"] + 1}

    a, b = fake_model("a", held), fake_model("b", plus_one)
    a.scheduler.merges = b.scheduler.merges = merges
    return a, b


def filled(value: float, n: int = 1) -> np.ndarray:
    return np.full((n, 4), value, np.float32)


async def started(sched, *requests):  # type: ignore[no-untyped-def]
    """Each request submitted, in order, in one loop turn (so they may travel as one group): their tasks."""
    tasks = [asyncio.ensure_future(sched.infer(r, r.inputs["INPUT0"].shape[0])) for r in requests]
    for _ in range(5):  # and the tasks they start, up to where they wait
        await asyncio.sleep(0)
    return tasks


async def fill_window(sched):  # type: ignore[no-untyped-def]
    """Requests of 1 and 2, each submitted in a loop turn of its own: a group each, which fills the window
    (two; both held at a until the gate opens). Their tasks."""
    return [*await started(sched, request(filled(1))), *await started(sched, request(filled(2)))]


async def test_requests_arriving_while_the_steps_are_busy_go_through_them_as_one():
    gate = asyncio.Event()
    a, b = grouped_models(gate)
    sched, stats = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    # The two behind the window's, in one turn, gather until one of those ends.
    tasks = [*await fill_window(sched), *await started(sched, request(filled(3, 2)), request(filled(4)))]
    assert [c.inputs["INPUT0"].shape[0] for c in a.scheduler.calls] == [1, 1]
    gate.set()
    outs = await asyncio.gather(*tasks)
    for out, value, n in zip(outs, (1, 2, 3, 4), (1, 1, 2, 1)):
        np.testing.assert_array_equal(out["OUTPUT0"], filled(2 * value + 1, n))
    for m in (a, b):
        assert [(c.inputs["INPUT0"].shape[0], c.members) for c in m.scheduler.calls] == [(1, 1), (1, 1), (3, 2)]
        # Each member counts as a request in the composing model's statistics.
        assert m.stats.success.count == 4
    assert stats.inference_count == 5 and stats.execution_count == 4 and stats.queue.count == 4
    assert stats.steps[(0, "a", "ran")] == 4 and stats.steps[(1, "b", "ran")] == 4
    assert sched.inflight() == 0


async def test_a_lone_request_is_never_held():
    a, b = grouped_models(asyncio.Event())
    a.scheduler.fn = identity_fn()
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    for value in (1, 2):
        out = await sched.infer(request(filled(value)), 1)
        np.testing.assert_array_equal(out["OUTPUT0"], filled(value + 1))
    assert [c.members for c in a.scheduler.calls] == [1, 1]


async def test_requests_arriving_in_one_loop_turn_go_through_the_steps_together():
    """With room in the window, a group's task is created at once and takes every request that joins
    before it first runs: those of one loop turn (one socket read) travel as one."""
    gate = asyncio.Event()
    gate.set()
    a, b = grouped_models(gate)
    sched, stats = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    outs = await asyncio.gather(*await started(sched, *(request(filled(v)) for v in range(4))))
    for out, value in zip(outs, range(4)):
        np.testing.assert_array_equal(out["OUTPUT0"], filled(2 * value + 1))
    # One step request each for a and b, of the four requests' rows (b's doubled by a).
    assert [(c.inputs["INPUT0"][:, 0].tolist(), c.members) for c in a.scheduler.calls] == [([0, 1, 2, 3], 4)]
    assert [(c.inputs["INPUT0"][:, 0].tolist(), c.members) for c in b.scheduler.calls] == [([0, 2, 4, 6], 4)]
    assert stats.execution_count == 4 and sched.inflight() == 0


async def test_only_requests_a_model_would_batch_together_are_grouped():
    gate = asyncio.Event()
    a, b = grouped_models(gate)
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    tasks = await started(sched, request(filled(0)), request(filled(1)), request(filled(2)),
                          request(filled(3), priority=2), request(filled(4), parameters={"k": 1}),
                          request(filled(5), timeout_us=1000), request(filled(6)), request(filled(7)))
    gate.set()
    outs = await asyncio.gather(*tasks)
    for out, value in zip(outs, range(8)):
        np.testing.assert_array_equal(out["OUTPUT0"], filled(2 * value + 1))
    # 0, 1 and 2 (one turn) make the first group; 3 (another priority) cannot join it, and opens the
    # second, which fills the window; 4 (a parameter) cannot join 3's: the third group, which goes at once
    # when 6 (no parameter) cannot join it, window full or not; 5 (a timeout) goes alone, out of any group;
    # 6 and 7 gather the group that starts as the first group ends.
    firsts = sorted(float(c.inputs["INPUT0"][0, 0]) for c in a.scheduler.calls if c.members == 1)
    assert firsts == [3.0, 4.0, 5.0]
    grouped = [c for c in a.scheduler.calls if c.members > 1]
    assert [c.inputs["INPUT0"][:, 0].tolist() for c in grouped] == [[0.0, 1.0, 2.0], [6.0, 7.0]]
    assert all(c.priority == 0 for c in grouped)


async def test_no_grouping_where_a_step_does_not_join_rows():
    gate = asyncio.Event()
    a, b = grouped_models(gate)
    b.scheduler.merges = 0  # b's batches are lists of requests (a Python model), not joined rows
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    tasks = await started(sched, request(filled(1)), request(filled(2)), request(filled(3)))
    gate.set()
    await asyncio.gather(*tasks)
    assert [c.members for c in a.scheduler.calls] == [1, 1, 1]


async def test_a_group_closes_at_the_smallest_max_batch_size_on_its_way():
    gate = asyncio.Event()
    a, b = grouped_models(gate, merges=2)
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    tasks = [*await started(sched, request(filled(1))), *await started(sched, *(request(filled(v)) for v in range(2, 6)))]
    # 1 fills half the window; 2 and 3 fill a group of two rows, the other half; 4 and 5 fill the next,
    # which starts at once, window full or not.
    assert [c.inputs["INPUT0"][:, 0].tolist() for c in a.scheduler.calls] == [[1.0], [2.0, 3.0], [4.0, 5.0]]
    gate.set()
    await asyncio.gather(*tasks)
    assert [c.inputs["INPUT0"][:, 0].tolist() for c in a.scheduler.calls] == [[1.0], [2.0, 3.0], [4.0, 5.0]]


async def test_a_request_cancelled_while_it_gathers_leaves_its_group():
    gate = asyncio.Event()
    a, b = grouped_models(gate)
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    alone = await fill_window(sched)
    third, fourth = await started(sched, request(filled(3)), request(filled(4)))
    third.cancel()
    with pytest.raises(asyncio.CancelledError):
        await third
    gate.set()
    await asyncio.gather(*alone, fourth)
    assert [c.inputs["INPUT0"][:, 0].tolist() for c in a.scheduler.calls] == [[1.0], [2.0], [4.0]]
    assert sched.inflight() == 0


async def test_a_group_whose_members_all_left_stops_running_its_steps():
    gate = asyncio.Event()
    a, b = grouped_models(gate)

    async def groups_hang(request):  # type: ignore[no-untyped-def]
        if request.members > 1:
            await asyncio.sleep(60)
        return {"OUTPUT0": request.inputs["INPUT0"] + 1}

    b.scheduler.fn = groups_hang
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    alone = await fill_window(sched)
    second, third = await started(sched, request(filled(3)), request(filled(4)))
    gate.set()
    await asyncio.gather(*alone)  # the group of the last two starts as one of them ends, and hangs in b
    for _ in range(10):
        if b.scheduler.active:
            break
        await asyncio.sleep(0)
    assert b.scheduler.active == 1
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    for _ in range(5):
        await asyncio.sleep(0)
    assert b.scheduler.active == 1 and not b.scheduler.cancelled  # 3 still wants it
    third.cancel()
    await asyncio.gather(third, return_exceptions=True)
    for _ in range(10):
        if sched.inflight() == 0 and not b.scheduler.active:
            break
        await asyncio.sleep(0)
    assert b.scheduler.cancelled == 1 and sched.inflight() == 0


async def test_a_failing_step_fails_every_member_of_its_group_with_the_steps_error():
    gate = asyncio.Event()
    a, b = grouped_models(gate)

    async def boom(request):  # type: ignore[no-untyped-def]
        if request.members > 1:
            raise RuntimeError("boom")
        return {"OUTPUT0": request.inputs["INPUT0"]}

    b.scheduler.fn = boom
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    tasks = [*await fill_window(sched), *await started(sched, request(filled(3)), request(filled(4)))]
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(results[0], dict) and isinstance(results[1], dict)
    for error in results[2:]:
        assert isinstance(error, ModelExecutionError)
        assert error.message == "ensemble 'ens' step 1 (model 'b'): model 'b' failed: RuntimeError: boom"
    assert b.stats.fail.count == 2 and b.stats.success.count == 2
    assert sched.inflight() == 0


async def test_a_group_whose_outputs_lost_their_rows_is_refused_by_name():
    gate = asyncio.Event()
    a, b = grouped_models(gate)

    async def first_row(request):  # type: ignore[no-untyped-def]
        return {"OUTPUT0": request.inputs["INPUT0"][:1]}

    b.scheduler.fn = first_row
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    tasks = [*await fill_window(sched), *await started(sched, request(filled(3)), request(filled(4)))]
    gate.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for error in results[2:]:
        assert isinstance(error, ModelExecutionError)
        assert error.message.startswith("ensemble 'ens': output 'OUTPUT0' has shape [1, 4], not the 2 rows of the 2 "
                                        "requests whose steps ran together")


async def test_stop_waits_for_the_gathering_group_too():
    gate = asyncio.Event()
    a, b = grouped_models(gate)
    sched, _ = make_ensemble({"a": a, "b": b}, chain("a", "b"))
    tasks = [*await fill_window(sched), *await started(sched, request(filled(3)))]
    stopping = asyncio.ensure_future(sched.stop())
    await asyncio.sleep(0)
    assert not stopping.done()
    gate.set()
    outs = await asyncio.gather(*tasks)
    await stopping
    np.testing.assert_array_equal(outs[2]["OUTPUT0"], filled(7))


async def test_grouped_requests_of_real_onnx_steps_equal_the_fused_model_and_count_each(tmp_path: Path):
    from inferd.dataplane import DataPlane
    from inferd.repository import ModelManager

    names = ("ens_scale", "ens_mlp", "ens_relu", "ensemble_mlp", "mlp_fused")
    build.build_repository(tmp_path, models=[s for s in build.MODELS if s.name in names], log=None)
    plane = DataPlane(ModelManager([tmp_path]))
    await plane.load_models()
    try:
        xs = [np.random.default_rng(i).standard_normal((1 + i % 3, 256), dtype=np.float32) for i in range(16)]
        # Submitted in one loop turn: they go through the steps as one group (31 rows).
        got = await asyncio.gather(*(plane.infer(InferenceRequest("ensemble_mlp", {"INPUT0": x})) for x in xs))
        for x, response in zip(xs, got):
            fused = await plane.infer(InferenceRequest("mlp_fused", {"INPUT0": x}))
            np.testing.assert_allclose(response.outputs["OUTPUT0"], fused.outputs["OUTPUT0"], rtol=1e-5, atol=1e-5)
        manager = plane.manager
        rows_sent = sum(len(x) for x in xs)
        for name in ("ens_scale", "ens_mlp", "ens_relu", "ensemble_mlp"):
            s = manager.get(name, 0).stats
            assert (s.success.count, s.inference_count) == (16, rows_sent), name
        scale = manager.get("ens_scale", 0).stats
        assert scale.queue.count == 16 and scale.compute_infer.count == 16
    finally:
        await plane.close()

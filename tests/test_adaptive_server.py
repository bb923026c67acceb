"""Issue 20 through tritonclient on a real server: adaptive waits, pooled buffers, the response cache,
the rate limiter, latency SLOs.

One server for the module, with ``--cache-config local,size=...`` and ``--rate-limit execution_count``.
"""

from __future__ import annotations

import queue
import textwrap
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from inferd.examples import onnx_models as om
from conftest import ServerProcess, running
from gated_model import add_gated_model, pending, release, reset, wait_started
from repo_builder import add_model, config
from test_metrics import get, scrape

tritonclient_grpc = pytest.importorskip("tritonclient.grpc")

# A Python model that records when each of its executions started and ended, in its log folder.
RECORDING = '''
import json, os, time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        folder = config["parameters"]["log_dir"]["string_value"]
        self.path = os.path.join(folder, config["name"] + ".log")

    def execute(self, requests):
        start = time.monotonic()
        time.sleep(0.03)
        end = time.monotonic()
        with open(self.path, "a") as f:
            f.write(f"{start} {end}\\n")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
'''
LIMITED = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'


def _recording_model(repo: Path, name: str, logs: Path, limiter: str, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(textwrap.dedent(RECORDING).lstrip())
    (repo / name / "config.pbtxt").write_text(
        config(name, [("IN", "TYPE_FP32", [1])], [("OUT", "TYPE_FP32", [1])], platform=None,
               extra=f'backend: "python"\ninstance_group [ {{ kind: KIND_CPU count: 1 {limiter} }} ]\n'
                     f'parameters {{ key: "log_dir" value {{ string_value: "{logs}" }} }}\n' + extra))


SLO_US = 50_000  # each execution of the slo model takes 30 ms or more: a second one queued cannot make it


MLP_IO = ([("INPUT0", "TYPE_FP32", [256])], [("OUTPUT0", "TYPE_FP32", [256])])
# Pooled outputs: 4 KiB per row, so a batch of 16 rows or more is written into a pooled buffer by IOBinding.
WIDE = (64, 64, 1024)
WIDE_IO = ([("INPUT0", "TYPE_FP32", [WIDE[0]])], [("OUTPUT0", "TYPE_FP32", [WIDE[2]])])
WAIT_US = 1_000_000  # a lone request under fixed waits all of it; one that does not wait is dispatched at once


def _wait(mode: str) -> str:
    return f'parameters {{ key: "inferd.batch_wait" value {{ string_value: "{mode}" }} }}\n'


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("executions")


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, logs: Path, gates: Path) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("adaptive_repo")
    add_model(repo, "cached", om.mlp(), config("cached", *MLP_IO, max_batch_size=8,
                                                extra="dynamic_batching { }\nresponse_cache { enable: true }\n"))
    add_model(repo, "uncached", om.mlp(), config("uncached", *MLP_IO, max_batch_size=8, extra="dynamic_batching { }\n"))
    for name in ("limited_a", "limited_b"):
        _recording_model(repo, name, logs, LIMITED)
    for name in ("free_a", "free_b"):  # no rate_limiter block: not limited; held by the test
        add_gated_model(repo, name, gates / name)
    add_gated_model(repo, "slo", gates / "slo", sleep_s=0.03, extra=f'parameters {{ key: '
                    f'"inferd.max_latency_microseconds" value {{ string_value: "{SLO_US}" }} }}\n')
    add_model(repo, "both_ways", om.mlp(), config(
        "both_ways", *MLP_IO, max_batch_size=8,
        extra='instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "G" global: true count: 1 } ] } },'
              ' { kind: KIND_CPU rate_limiter { resources [ { name: "G" count: 1 } ] } } ]\n'))
    for mode in ("adaptive", "fixed"):
        add_model(repo, f"wait_{mode}", om.mlp(), config(
            f"wait_{mode}", *MLP_IO, max_batch_size=8,
            extra=f"dynamic_batching {{ max_queue_delay_microseconds: {WAIT_US} }}\n" + _wait(mode)))
    add_model(repo, "bad_wait", om.mlp(), config("bad_wait", *MLP_IO, max_batch_size=8,
                                                 extra="dynamic_batching { }\n" + _wait("sometimes")))
    # Batches of 32 rows (128 KiB of outputs), each run once it is full (the 60 s delay only bounds
    # a hang): pooled inputs and outputs.
    add_model(repo, "pooled", om.mlp(*WIDE, seed=4), config(
        "pooled", *WIDE_IO, max_batch_size=32,
        extra="dynamic_batching { max_queue_delay_microseconds: 60000000 }\n" + _wait("fixed")))
    # --no-shed: the held and sleeping models keep queues longer than the default queue-delay target, and
    # these tests are about the rate limiter and batch waits, not shedding (tests/test_shedding_server.py).
    with running(repo, extra_args=["--cache-config", "local,size=1048576", "--rate-limit", "execution_count",
                                   "--no-shed"]) as srv:
        yield srv


def _mlp_inputs(seed: int) -> list:
    x = np.random.default_rng(seed).standard_normal((1, 256), dtype=np.float32)
    inp = tritonclient_grpc.InferInput("INPUT0", [1, 256], "FP32")
    inp.set_data_from_numpy(x)
    return [inp]


def _stats(client, model: str) -> dict:  # type: ignore[no-untyped-def]
    return client.get_inference_statistics(model, as_json=True)["model_stats"][0]


# -- adaptive waits ----------------------------------------------------------------------------


def test_a_lone_client_waits_for_company_only_under_fixed(client, server):
    """One request at a time: fixed waits the whole delay each time, adaptive only on its first
    request (a probe: one head in 16 waits, to notice company). Counted from the queue-time
    histogram: a request that waited the delay (1 s) is past its 0.5 s bucket, one dispatched at
    once is far inside it. (The decisions themselves: tests/scheduling/test_adaptive*.py, on a
    FakeClock.)"""
    sent = {"adaptive": 6, "fixed": 3}
    for mode, n in sent.items():
        for seed in range(n):
            client.infer(f"wait_{mode}", _mlp_inputs(seed))
        stats = _stats(client, f"wait_{mode}")["inference_stats"]
        assert int(stats["success"]["count"]) == n
    metrics = scrape(server)

    def waited(mode: str) -> int:
        """How many of the mode's requests queued for longer than half the delay."""
        count = "inferd_inference_queue_duration_seconds_bucket"
        return int(get(metrics, count, f"wait_{mode}", le="+Inf") - get(metrics, count, f"wait_{mode}", le="0.5"))

    # (Not the queue statistic's sum: the wait counts from each request's received stamp, the
    # statistic from the core's enqueue, which comes later by however long the hand-off took.)
    assert waited("fixed") == 3  # each request waited the whole delay
    assert waited("adaptive") == 1  # the first request, a probe; the other five ran at once


def test_a_bad_batch_wait_fails_the_load_naming_the_value(client):
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index["bad_wait"]["state"] == "UNAVAILABLE"
    assert ("model 'bad_wait': parameter 'inferd.batch_wait' must be adaptive or fixed, got 'sometimes'"
            in index["bad_wait"]["reason"])


# -- pooled buffers ----------------------------------------------------------------------------


def test_batches_in_pooled_buffers_answer_every_request_with_its_own_rows(client):
    """96 distinct requests at once: batches of up to 32 follow each other through the instance's
    pooled input and output buffers (one assembled while the one before executes, its responses
    encoded meanwhile); a buffer reused while a response still held a view of it would answer
    some request with another batch's rows."""
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, WIDE[0]), dtype=np.float32) for _ in range(96)]
    done: queue.Queue = queue.Queue()
    for i, x in enumerate(xs):
        inp = tritonclient_grpc.InferInput("INPUT0", [1, WIDE[0]], "FP32")
        inp.set_data_from_numpy(x)
        client.async_infer("pooled", [inp], lambda result, error, i=i: done.put((i, result, error)),
                           client_timeout=60)
    weights = om.mlp_weights(*WIDE, seed=4)
    for _ in xs:
        i, result, error = done.get(timeout=90)
        assert error is None, error
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), om.mlp_reference(xs[i], weights), rtol=1e-4, atol=1e-5)
    s = client.get_inference_statistics("pooled").model_stats[0]
    assert s.inference_count == 96
    assert max(b.batch_size for b in s.batch_stats) >= 16  # at least one batch wrote its outputs into the pool


# -- response cache ----------------------------------------------------------------------------


def test_a_repeated_request_is_a_cache_hit_in_model_statistics_and_metrics(client, server):
    first = client.infer("cached", _mlp_inputs(1)).as_numpy("OUTPUT0")
    second = client.infer("cached", _mlp_inputs(1)).as_numpy("OUTPUT0")
    other = client.infer("cached", _mlp_inputs(2)).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(first, second)
    assert not np.array_equal(first, other)
    s = _stats(client, "cached")
    stats = s["inference_stats"]
    assert int(stats["cache_hit"]["count"]) == 1 and int(stats["cache_hit"]["ns"]) > 0
    assert int(stats["cache_miss"]["count"]) == 2 and int(stats["cache_miss"]["ns"]) > 0
    assert int(stats["success"]["count"]) == 3
    # As in Triton, a hit never reaches the model: two inferences, two executions.
    assert int(s["inference_count"]) == 2 and int(s["execution_count"]) == 2
    metrics = scrape(server)
    assert get(metrics, "nv_cache_num_hits_per_model", "cached") == 1
    assert get(metrics, "nv_cache_num_misses_per_model", "cached") == 2
    assert get(metrics, "nv_cache_hit_duration_per_model", "cached") >= 0
    assert ("nv_cache_num_hits_per_model", (("model", "uncached"), ("version", "1"))) not in metrics  # as Triton


def test_a_model_that_does_not_enable_the_cache_executes_every_request(client):
    for _ in range(2):
        client.infer("uncached", _mlp_inputs(3))
    s = _stats(client, "uncached")
    assert int(s["execution_count"]) == 2
    assert int(s["inference_stats"].get("cache_hit", {}).get("count", 0)) == 0


# -- rate limiter ------------------------------------------------------------------------------


def _intervals(logs: Path, name: str) -> list[tuple[float, float]]:
    return [tuple(map(float, line.split())) for line in (logs / f"{name}.log").read_text().splitlines()]  # type: ignore[misc]


def _overlaps(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


def _hammer(server: ServerProcess, models: tuple[str, ...], per_model: int = 6, tensor: str = "IN") -> list[BaseException]:
    """``per_model`` requests to each model (input ``tensor``), all sent together; the errors they got."""
    errors: list[BaseException] = []

    def call(model: str) -> None:
        c = tritonclient_grpc.InferenceServerClient(server.url)
        try:
            inp = tritonclient_grpc.InferInput(tensor, [1], "FP32")
            inp.set_data_from_numpy(np.ones(1, np.float32))
            c.infer(model, [inp], client_timeout=60)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            c.close()

    threads = [threading.Thread(target=call, args=(m,)) for m in models for _ in range(per_model)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return errors


def test_two_models_sharing_a_rate_limited_resource_never_execute_at_once(server, logs):
    assert not _hammer(server, ("limited_a", "limited_b"))
    a, b = _intervals(logs, "limited_a"), _intervals(logs, "limited_b")
    assert a and b
    assert _overlaps(a, b) == 0


def test_the_same_models_without_a_rate_limiter_do_execute_at_once(server, gates):
    """The control: unlimited, free_a and free_b both start executing before either is released."""
    done: list = []
    try:
        calls = [threading.Thread(target=lambda m=m: done.append(_hammer(server, (m,), per_model=1, tensor="INPUT0")))
                 for m in ("free_a", "free_b")]
        for t in calls:
            t.start()
        wait_started(gates / "free_a")
        wait_started(gates / "free_b")  # neither released: both execute at once
    finally:
        release(gates / "free_a")
        release(gates / "free_b")
    for t in calls:
        t.join(90)
    assert done == [[], []]


def test_a_resource_used_both_globally_and_per_device_fails_the_load(client):
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    entry = index["both_ways"]
    assert entry["state"] == "UNAVAILABLE"
    assert 'Resource "G" is present as both global and device-specific resource' in entry["reason"]


# -- latency SLO -------------------------------------------------------------------------------


def test_a_request_that_cannot_meet_the_slo_is_refused_and_counted(client, server, gates):
    """Every execution of ``slo`` takes at least 30 ms (it sleeps), so the scheduler learns that;
    while the test holds one execution, six requests arrive: with 30 ms each, at most two of them
    (nothing or one queued ahead) could make a 50 ms SLO, the rest are refused at once."""
    gate = gates / "slo"
    inp = tritonclient_grpc.InferInput("INPUT0", [1], "FP32")
    inp.set_data_from_numpy(np.ones(1, np.float32))
    release(gate)
    for _ in range(3):  # the scheduler learns how long an execution takes
        client.infer("slo", [inp])
    reset(gate)
    held = threading.Thread(target=lambda: _hammer(server, ("slo",), per_model=1, tensor="INPUT0"))
    errors: list[BaseException] = []
    held.start()
    try:
        wait_started(gate)
        rest = [threading.Thread(target=lambda: errors.extend(_hammer(server, ("slo",), per_model=1, tensor="INPUT0")))
                for _ in range(6)]
        for t in rest:
            t.start()
        deadline = time.monotonic() + 60  # a bound on a hang: every request refused or queued
        while len(errors) + pending(server.metrics_url, "slo") < 6:
            assert time.monotonic() < deadline, (errors, "six requests never reached the queue")
            time.sleep(0.01)
    finally:
        release(gate)
    held.join(90)
    for t in rest:
        t.join(90)
    assert len(errors) >= 4, errors
    for exc in errors:
        assert exc.status() == "StatusCode.UNAVAILABLE", exc
        message = exc.message()
        assert f"model 'slo': request refused: it cannot meet the latency SLO of {SLO_US} us" in message, message
        assert "estimated" in message and "queued ahead of it" in message, message
    s = _stats(client, "slo")
    assert int(s["inference_stats"]["fail"]["count"]) == len(errors)
    assert int(s["inference_stats"]["success"]["count"]) == 3 + 1 + 6 - len(errors)
    metrics = scrape(server)
    assert get(metrics, "inferd_inference_request_failure_total", "slo", reason="SLO_REFUSED") == len(errors)
    assert get(metrics, "nv_inference_request_failure", "slo", reason="REJECTED") == len(errors)

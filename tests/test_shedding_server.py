"""Shedding on queueing delay, end to end over gRPC in the test's process mode: with a queue-delay
target set, once requests have kept waiting past it for an interval, a request that has already waited
past it is answered UNAVAILABLE with the reason (never CANCELLED); --no-shed turns that off. With the
default options a closed loop of clients, however long its requests queue, is served (issue 42).

The waits are forced by the test, not by timing: a gated Python model (one instance, no batching) holds
one request while two more queue behind it, so those two cannot have waited less than the time the test
held the gate, which is more than the 1 us target; after the release their delays are observed an
execution apart (more than the 1 us interval), and the server sheds. A request sent then has waited
more than 1 us between its frontend receiving it and the core seeing it (decoding alone takes longer).
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gated_model import add_gated_model, release, wait_started
from repo_builder import add_python_model, sleeping_identity
from test_metrics import get, scrape

TINY = ["--queue-delay-target-us", "1", "--queue-delay-interval-us", "1", "--queue-delay-execution-multiple", "0"]


def _infer(url: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    try:
        i = grpcclient.InferInput("INPUT0", [2], "FP32")
        i.set_data_from_numpy(np.ones(2, dtype=np.float32))
        return client.infer("gated", [i], client_timeout=120).as_numpy("OUTPUT0")
    finally:
        client.close()


def _queue_behind_the_gate(server, gate: Path) -> None:
    """One request held in the model, two queued behind it; then released: all three are served."""
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(_infer(server.url)), daemon=True)
               for _ in range(3)]
    threads[0].start()
    try:
        wait_started(gate)
        for t in threads[1:]:
            t.start()
        deadline = time.monotonic() + 60
        while get(scrape(server), "inferd_inference_inflight_request_count", "gated") < 3:
            assert time.monotonic() < deadline, "the queued requests never reached the model"
            time.sleep(0.02)
    finally:
        release(gate)
        for t in threads:
            t.join(60)
    assert len(results) == 3  # admitted before the server shed: served


@pytest.fixture
def repo(tmp_path) -> tuple[Path, Path]:
    repo, gate = tmp_path / "repo", tmp_path / "gate"
    add_gated_model(repo, "gated", gate)
    return repo, gate


def test_a_request_that_waited_past_the_target_under_a_standing_queue_is_shed_unavailable(start_server, repo):
    path, gate = repo
    server = start_server(path, TINY)
    _queue_behind_the_gate(server, gate)
    with pytest.raises(InferenceServerException) as info:
        _infer(server.url)
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    m = info.value.message()
    assert "model 'gated'" in m and "shed" in m and "target of 1 us" in m
    assert "--queue-delay-target-us" in m and "--no-shed" in m


def test_no_shed_lets_the_same_request_wait(start_server, repo):
    path, gate = repo
    server = start_server(path, TINY + ["--no-shed"])
    _queue_behind_the_gate(server, gate)
    np.testing.assert_array_equal(_infer(server.url), np.ones(2, dtype=np.float32))


# -- a closed loop is a load its user chose (issue 42) ------------------------------------------------------

LOOP = 128  # clients, each sending its next request when its last is answered
UNBATCHED_SLOW = """
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture
def slow_repo(tmp_path) -> Path:
    """An unbatched model of one instance taking ~2 ms an execution: 128 clients' requests queue behind
    each other for ~250 ms, five times the 50 ms target that shed them by default before issue 42."""
    add_python_model(tmp_path / "repo", "slow", sleeping_identity(0.002), UNBATCHED_SLOW)
    return tmp_path / "repo"


async def _closed_loop(url: str, clients: int, rounds: int) -> dict[str, int]:
    """``clients`` tritonclient aio callers, each sending ``rounds`` requests one after another; the
    answers counted by status ("OK" or the error's status)."""
    import tritonclient.grpc.aio as aioclient

    client = aioclient.InferenceServerClient(url)
    counts: dict[str, int] = {}
    x = aioclient.InferInput("INPUT0", [2], "FP32")
    x.set_data_from_numpy(np.ones(2, dtype=np.float32))

    async def caller() -> None:
        for _ in range(rounds):
            try:
                await client.infer("slow", [x], client_timeout=300)
                key = "OK"
            except InferenceServerException as exc:
                key = f"{exc.status()}: {exc.message()}"
            counts[key] = counts.get(key, 0) + 1

    try:
        await asyncio.gather(*(caller() for _ in range(clients)))
    finally:
        await client.close()
    return counts


def test_a_closed_loop_of_128_clients_on_an_unbatched_slow_model_is_served_with_the_defaults(start_server, slow_repo):
    server = start_server(slow_repo)
    counts = asyncio.run(_closed_loop(server.url, LOOP, rounds=3))
    assert counts == {"OK": 3 * LOOP}, counts


def test_perf_analyzer_at_concurrency_128_on_an_unbatched_slow_model_completes_with_the_defaults(
        start_server, slow_repo, perf_analyzer):
    server = start_server(slow_repo)
    done = subprocess.run(
        [perf_analyzer, "-m", "slow", "-u", server.url, "-i", "grpc", "--concurrency-range", str(LOOP),
         "--shape", "INPUT0:2", "--measurement-mode", "count_windows", "--measurement-request-count", "256",
         "--max-trials", "3", "--stability-percentage", "100"],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr  # perf_analyzer stops at its first error
    assert "Concurrency: 128" in done.stdout, done.stdout

"""Shedding by default, end to end over gRPC in the test's process mode: once requests have kept
waiting past the queue-delay target for an interval, a request that has already waited past it is
answered UNAVAILABLE with the reason (never CANCELLED); --no-shed turns that off.

The waits are forced by the test, not by timing: a gated Python model (one instance, no batching) holds
one request while two more queue behind it, so those two cannot have waited less than the time the test
held the gate, which is more than the 1 us target; after the release their delays are observed an
execution apart (more than the 1 us interval), and the server sheds. A request sent then has waited
more than 1 us between its frontend receiving it and the core seeing it (decoding alone takes longer).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gated_model import add_gated_model, release, wait_started
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

"""A frontend worker past its memory bound is recycled under load (issue 42, inferd.serve.recycling):
its replacement serves first, it answers every call it took, and no request is lost or failed.

Default process mode only, by nature: one process (--frontend-workers 0) has no frontend worker to
replace, so these tests choose their mode (fixed_mode) and the single-process rerun skips them.
A bound of 1 MiB is past any worker's heap, so every worker is recycled as soon as it is old
enough (6 checks of 0.5 s): the test waits for three recycles, counted from the server's log.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, until
from test_frontend_workers import workers_of

pytestmark = pytest.mark.fixed_mode
RECYCLING = ["--frontend-workers", "2", "--frontend-worker-max-memory-mib", "1",
             "--frontend-worker-memory-check-secs", "0.5"]
CLIENTS = 6
RECYCLED = re.compile(r"past --frontend-worker-max-memory-mib 1: recycled; pid (\d+) serves in its place, "
                      r"pid (\d+) answers")


@pytest.fixture(scope="module")
def simple_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inferd.examples.build import build_repository

    repo = tmp_path_factory.mktemp("recycling") / "repo"
    build_repository(repo, only=["simple"], log=None)
    return repo


def _load(client: grpcclient.InferenceServerClient, stop: threading.Event, results: list) -> None:
    """A closed loop on ``simple`` until ``stop`` (bounded): "ok", or the failure's status and message."""
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(x)
    for _ in range(100_000):
        if stop.is_set():
            return
        try:
            out = client.infer("simple", inputs, client_timeout=60).as_numpy("OUTPUT0")
            results.append("ok" if (out == 2 * x).all() else "wrong answer")
        except InferenceServerException as exc:
            results.append(f"{exc.status()}: {exc.message()}")



def _counted(server: ServerProcess, family: str, model: str) -> float:
    """Counter ``family`` of ``model``, summed over its series (a failure's every reason)."""
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return sum(float(v) for v in re.findall(rf'^{family}{{model="{model}"[^}}]*}} (\S+)$', text, re.M))


def _recycles(server: ServerProcess) -> list[tuple[int, int]]:
    """(replacement pid, recycled pid) for each recycle the server logged."""
    return [(int(a), int(b)) for a, b in RECYCLED.findall(server.log())]


def test_workers_recycled_under_load_lose_and_fail_no_request(simple_repository: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(simple_repository, RECYCLING)
    first = workers_of(server)
    assert len(first) == 2
    stop = threading.Event()
    results: list[list[str]] = [[] for _ in range(CLIENTS)]
    # Each client its own connection (its own subchannel pool), so both workers carry load.
    clients = [grpcclient.InferenceServerClient(server.url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
               for _ in range(CLIENTS)]
    threads = [threading.Thread(target=_load, args=(c, stop, r)) for c, r in zip(clients, results)]
    for t in threads:
        t.start()
    try:
        assert until(lambda: len(_recycles(server)) >= 3, 120), server.log()
        done = [len(r) for r in results]
        # Every client goes on being served after the recycles (its connection moved to a replacement).
        assert until(lambda: all(len(r) >= n + 20 for r, n in zip(results, done)), 60), server.log()
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        for c in clients:
            c.close()
    answers = [a for r in results for a in r]
    assert set(answers) == {"ok"}, [a for a in answers if a != "ok"][:5]
    recycled = _recycles(server)
    assert set(first) <= {old for _, old in recycled}  # both first workers were replaced ...
    assert not set(first) & set(workers_of(server))  # ... and are gone
    # Nothing lost: every request answered was counted by the core once, and none failed there.
    assert _counted(server, "nv_inference_request_success", "simple") == len(answers)
    assert _counted(server, "nv_inference_request_failure", "simple") == 0
    log = server.log()
    assert log.count("recycled; its calls answered, exiting") >= 2, log
    assert "exited with status" not in log  # a recycle, never a death and a restart
    assert server.stop() == 0 and not server.left_behind, server.log()
    assert "Traceback" not in server.log()

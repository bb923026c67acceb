"""inferd.event_loop and ``inferd serve --event-loop``: the choice, its errors, and a server on
each loop in both process modes (gRPC unary and stream, HTTP), its workers on the core's loop."""

from __future__ import annotations

import asyncio
import queue
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import running, until
from inferd import event_loop
from test_frontend_workers import workers_of

pytestmark = pytest.mark.fixed_mode  # every server here says its mode and its loop


def test_auto_is_uvloop_where_installed_and_names_are_checked() -> None:
    pytest.importorskip("uvloop")
    assert event_loop.resolve("auto") == event_loop.resolve("uvloop") == "uvloop"
    assert event_loop.resolve("asyncio") == "asyncio"
    with pytest.raises(ValueError, match="event loop must be one of auto, uvloop, asyncio, got 'trio'"):
        event_loop.resolve("trio")


def test_without_uvloop_auto_falls_back_and_asking_for_it_says_what_to_do(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    assert event_loop.resolve("auto") == "asyncio"
    with pytest.raises(ValueError, match=r"--event-loop uvloop needs the uvloop package .*pip install uvloop"
                                         r".*or choose --event-loop asyncio"):
        event_loop.resolve("uvloop")


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_run_runs_the_coroutine_on_that_loop(kind: str) -> None:
    if kind == "uvloop":
        pytest.importorskip("uvloop")

    async def which() -> str:
        await asyncio.sleep(0)
        return event_loop.running()

    assert event_loop.run(which(), kind) == kind


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    from inferd.examples.build import build_repository

    out = tmp_path_factory.mktemp("loop_repo")
    build_repository(out, only=["identity_fp32", "repeat_decoupled"], log=None)
    return out


@pytest.mark.parametrize("workers", ["0", "2"])
@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_a_server_on_each_loop_answers_every_protocol(repo: Path, kind: str, workers: str) -> None:
    if kind == "uvloop":
        pytest.importorskip("uvloop")
    with running(repo, extra_args=["--event-loop", kind, "--frontend-workers", workers]) as server:
        # the ports are recorded when they listen; the report with the loop's name is printed just after
        assert until(lambda: f"; event loop {kind}" in server.log(), timeout=30), server.log()
        children = workers_of(server)
        assert len(children) == int(workers)
        for pid in children:  # each worker runs the loop its core runs
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            assert args[args.index(b"--event-loop") + 1] == kind.encode()

        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        client = grpcclient.InferenceServerClient(server.url)
        unary = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
        unary.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("identity_fp32", [unary]).as_numpy("OUTPUT0"), data)

        received: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: received.put((result, error)))
        values = grpcclient.InferInput("IN", [2], "INT32")
        values.set_data_from_numpy(np.array([7, 8], dtype=np.int32))
        repeat = grpcclient.InferInput("REPEAT", [1], "INT32")
        repeat.set_data_from_numpy(np.array([3], dtype=np.int32))
        client.async_stream_infer("repeat_decoupled", [values, repeat], request_id="s",
                                  enable_empty_final_response=True)
        answers = []
        while True:
            result, error = received.get(timeout=30)
            assert error is None, error
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
            answers.append((result.as_numpy("OUT").tolist(), int(result.as_numpy("IDX")[0])))
        client.stop_stream()
        client.close()
        assert answers == [([7, 8], 0), ([7, 8], 1), ([7, 8], 2)]  # REPEAT 3: IN three times, then the final flag

        http = httpclient.InferenceServerClient(server.http_url)
        rest = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        rest.set_data_from_numpy(data)
        np.testing.assert_array_equal(http.infer("identity_fp32", [rest]).as_numpy("OUTPUT0"), data)
        http.close()

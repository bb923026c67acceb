"""Issue 16, item 3: SIGTERM at full load. Readiness drops at once, new requests are refused UNAVAILABLE,
every accepted request is answered, calls still arriving while the ports close get UNAVAILABLE (never
CANCELLED: before this issue 52 of 64 client loops got CANCELLED at the final close), and the process
exits 0 within its grace period.

64 gRPC loops and 4 HTTP loops call a model (a Python model taking ~20 ms an execution, two instances)
as fast as it answers; each loop sends its next call as soon as the last one is answered, refused or
fails to connect, until the server has exited. A probe watches readiness meanwhile.
"""

from __future__ import annotations

import asyncio
import collections
import http.client
import json
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from repo_builder import add_model, config, sleeping_identity

WORK = sleeping_identity(0.02)
GRACE = 20  # --exit-timeout-secs


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    add_model(tmp_path, "work", WORK.encode(), config(
        "work", [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], 8, platform=None,
        extra='backend: "python"\ninstance_group [ { kind: KIND_CPU count: 2 } ]\ndynamic_batching { }\n'),
        filename="model.py")
    return tmp_path


async def _grpc_loops(url: str, loops: int, exited: threading.Event, signalled: threading.Event,
                      codes: collections.Counter, details: set[str]) -> None:
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    msg = pb.ModelInferRequest(model_name="work")
    t = msg.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.extend([1, 4])
    msg.raw_input_contents.append(np.ones((1, 4), np.float32).tobytes())
    channels = [grpc.aio.insecure_channel(url) for _ in range(4)]
    stubs = [pbg.GRPCInferenceServiceStub(c) for c in channels]
    stop_at = time.monotonic() + 120  # a bound if the server never exits

    async def loop(i: int) -> None:
        while not exited.is_set() and time.monotonic() < stop_at:
            after = signalled.is_set()
            try:
                await stubs[i % 4].ModelInfer(msg, timeout=60)
                codes["OK after SIGTERM" if after else "OK"] += 1
            except grpc.aio.AioRpcError as exc:
                codes[exc.code().name] += 1
                details.add(exc.details()[:120])
                await asyncio.sleep(0.001 if exc.code() == grpc.StatusCode.UNAVAILABLE else 0)

    await asyncio.gather(*(loop(i) for i in range(loops)))
    for c in channels:
        await c.close()


def _http_loop(port: int, exited: threading.Event, codes: collections.Counter) -> None:
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]})
    conn = None
    stop_at = time.monotonic() + 120
    while not exited.is_set() and time.monotonic() < stop_at:
        try:
            conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v2/models/work/infer", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            text = response.read()
            codes[f"HTTP {response.status}"] += 1
            if response.status not in (200, 503):
                codes[f"HTTP {response.status}: {text[:100]!r}"] += 1
            if response.getheader("connection", "").lower() == "close":
                conn.close()
                conn = None
        except ConnectionRefusedError:
            codes["HTTP refused"] += 1  # the port is closed: the server is gone
            conn = None
            time.sleep(0.005)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError) as exc:
            # The server closed an idle keep-alive connection as the port closed; a request sent on it at
            # that moment never reached the application. Counted to show it is rare; the next one reconnects.
            codes[f"HTTP {type(exc).__name__}"] += 1
            conn = None


def _ready_probe(port: int, signalled: threading.Event, exited: threading.Event, seen: list[str]) -> None:
    while not exited.is_set():
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/v2/health/ready")
            status = conn.getresponse().status
            conn.close()
            if signalled.is_set():
                seen.append(str(status))
        except OSError:
            if signalled.is_set():
                seen.append("closed")
        time.sleep(0.01)


def test_sigterm_at_full_load_answers_every_call_and_exits_zero(start_server, repo: Path) -> None:
    server = start_server(repo, ["--exit-timeout-secs", str(GRACE)])
    exited, signalled = threading.Event(), threading.Event()
    grpc_codes: collections.Counter = collections.Counter()
    http_codes: collections.Counter = collections.Counter()
    details: set[str] = set()
    ready: list[str] = []
    threads = [threading.Thread(target=_http_loop, args=(server.http_port, exited, http_codes)) for _ in range(4)]
    threads.append(threading.Thread(target=_ready_probe, args=(server.http_port, signalled, exited, ready)))
    loader = threading.Thread(target=lambda: asyncio.run(
        _grpc_loops(server.url, 64, exited, signalled, grpc_codes, details)))
    for t in [loader, *threads]:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while grpc_codes["OK"] < 200 and time.monotonic() < deadline:  # full load reached
            time.sleep(0.05)
        assert grpc_codes["OK"] >= 200, (grpc_codes, server.log())
        signalled.set()
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        code = server.proc.wait(timeout=GRACE + 10)
        took = time.monotonic() - sent
    finally:
        exited.set()
        for t in [loader, *threads]:
            t.join(timeout=150)
    log = server.log()
    assert code == 0, log
    assert took < GRACE, f"exited {took:.1f} s after SIGTERM; grace {GRACE} s"
    assert "Traceback" not in log, log
    # Every gRPC call was answered as served or UNAVAILABLE with a reason: none CANCELLED, none lost.
    assert set(grpc_codes) <= {"OK", "OK after SIGTERM", "UNAVAILABLE"}, (grpc_codes, details, log[-3000:])
    assert grpc_codes["UNAVAILABLE"] > 0, grpc_codes  # calls did arrive during the stop
    assert any("shutting down" in d for d in details), details
    # HTTP: served, refused 503 while draining, or the port gone; never an error status.
    assert all(k in ("HTTP 200", "HTTP 503", "HTTP refused") or "Disconnected" in k or "Reset" in k
               or "BrokenPipe" in k for k in http_codes), http_codes
    assert http_codes["HTTP 503"] > 0, http_codes
    # Readiness dropped while the port still answered (before it closed), and never came back.
    assert "400" in ready, ready
    after_drop = ready[ready.index("400"):]
    assert "200" not in after_drop, ready

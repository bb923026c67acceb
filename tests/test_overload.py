"""Issue 16, item 1: load far beyond capacity is shed at once, with UNAVAILABLE / 503 and the reason,
never CANCELLED, and the server recovers when the load stops.

The admission caps themselves (inferd.dataplane.admission) are plain counters, tested here without a
server; the end-to-end tests burst a model that answers ~20 requests/s (a Python model sleeping 50 ms per
execution, one instance) with thousands of calls at once: gRPC core alone, before this issue, cancelled
the calls it held past its 1,000-3,000 pending-call limit.
"""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import numpy as np
import pytest

from inferd.dataplane.admission import Admission, request_bytes
from inferd.errors import Unavailable
from repo_builder import add_model, config, sleeping_identity

SLOW = sleeping_identity(0.05)
CAP = 8  # --max-queued-requests for the server under test


# -- the caps, as plain counters ------------------------------------------------------------------------


def test_requests_cap_refuses_with_the_reason_and_frees_on_release() -> None:
    a = Admission(max_requests=2, max_bytes=0)
    a.admit(10, "m")
    a.admit(10, "m")
    with pytest.raises(Unavailable) as info:
        a.admit(10, "m")
    assert "model 'm'" in info.value.message and "--max-queued-requests 2" in info.value.message
    assert "retry" in info.value.message
    assert (a.requests, a.bytes, a.refused) == (2, 20, 1)
    a.release(10)
    a.admit(10, "m")  # room again
    assert a.requests == 2


def test_bytes_cap_refuses_what_would_pass_it_but_a_lone_request_always_enters() -> None:
    a = Admission(max_requests=0, max_bytes=100)
    a.admit(500, "big")  # alone: admitted (the transport holds it already)
    with pytest.raises(Unavailable) as info:
        a.admit(1, "small")
    assert "--max-queued-bytes" in info.value.message and "500 held" in info.value.message
    a.release(500)
    a.admit(60, "m")
    a.admit(40, "m")
    with pytest.raises(Unavailable):
        a.admit(1, "m")


def test_zero_means_no_cap_and_negative_is_refused() -> None:
    a = Admission(0, 0)
    for _ in range(10_000):
        a.admit(1 << 30, "m")
    assert a.requests == 10_000
    with pytest.raises(ValueError):
        Admission(-1, 0)


async def test_idle_resolves_when_the_last_request_is_answered() -> None:
    a = Admission(4, 0)
    await asyncio.wait_for(a.idle(), 1)  # nothing inside: at once
    a.admit(0, "m")
    a.admit(0, "m")
    waiter = asyncio.ensure_future(a.idle())
    await asyncio.sleep(0)
    a.release(0)
    await asyncio.sleep(0)
    assert not waiter.done()
    a.release(0)
    await asyncio.wait_for(waiter, 1)


def test_request_bytes_counts_tensor_payloads_not_shared_memory() -> None:
    from inferd.types import SharedTensor, ShmRef

    strings = np.array([b"abc", b"de"], dtype=np.object_)
    inputs = {"a": np.zeros((4, 4), np.float32), "s": strings,
              "shm": SharedTensor(ShmRef("r", 0, 64, "w"), None, (16,))}  # type: ignore[arg-type]
    assert request_bytes(inputs) == 64 + strings.nbytes + 5


# -- a burst against a real server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from conftest import ServerProcess

    repo: Path = tmp_path_factory.mktemp("overload")
    add_model(repo, "slow", SLOW.encode(), config(
        "slow", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0, platform=None,
        extra='backend: "python"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n'), filename="model.py")
    # The caps alone (the queue-delay controller would shed the same burst first: tests/test_shedding_server.py).
    s = ServerProcess(repo, ["--max-queued-requests", str(CAP), "--no-shed"])
    yield s
    assert s.stop() == 0, s.log()
    assert "Traceback" not in s.log(), s.log()


def _metric(server, name: str, labels: str = "") -> float:  # type: ignore[no-untyped-def]
    value = server.metric(name, labels)
    assert value is not None, f"{name}{labels} not in /metrics"
    return value


def _wait_metric(server, name: str, least: float, timeout: float = 30) -> bool:  # type: ignore[no-untyped-def]
    """Until the metric is at least ``least`` (a frontend worker's count reaches the core on its next write)."""
    import time

    deadline = time.monotonic() + timeout
    while _metric(server, name) < least and time.monotonic() < deadline:
        time.sleep(0.02)
    return _metric(server, name) >= least


def _request():  # type: ignore[no-untyped-def]
    from tritonclient.grpc import service_pb2 as pb

    msg = pb.ModelInferRequest(model_name="slow")
    t = msg.inputs.add(name="INPUT0", datatype="FP32")
    t.shape.append(4)
    msg.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return msg


async def _burst(url: str, calls: int) -> tuple[collections.Counter, set[str]]:
    """``calls`` ModelInfer calls sent at once over 4 connections; answers by status, refusal texts."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pbg

    channels = [grpc.aio.insecure_channel(url) for _ in range(4)]
    stubs = [pbg.GRPCInferenceServiceStub(c) for c in channels]
    msg = _request()
    codes: collections.Counter = collections.Counter()
    details: set[str] = set()

    async def one(i: int) -> None:
        try:
            await stubs[i % 4].ModelInfer(msg, timeout=120)
            codes["OK"] += 1
        except grpc.aio.AioRpcError as exc:
            codes[exc.code().name] += 1
            details.add(exc.details())

    try:
        await asyncio.gather(*(one(i) for i in range(calls)))
    finally:
        for c in channels:
            await c.close()
    return codes, details


def test_a_grpc_burst_far_beyond_capacity_is_shed_unavailable_never_cancelled(server) -> None:  # type: ignore[no-untyped-def]
    calls = 4000  # past gRPC core's own pending-call limits (1,000 .. 3,000), all at once
    codes, details = asyncio.run(_burst(server.url, calls))
    assert sum(codes.values()) == calls
    assert set(codes) <= {"OK", "UNAVAILABLE"}, (codes, details)
    assert codes["UNAVAILABLE"] > calls // 2, codes  # the model answers ~20/s: most are shed at once
    assert codes["OK"] >= CAP, codes  # what the server could hold was served
    # refused by admission past its cap or, behind the gRPC front, by Envoy past the held calls' bound
    assert all("overloaded" in d and (f"--max-queued-requests {CAP}" in d or "--grpc-max-held-calls" in d)
               and "retry" in d for d in details), details
    # Recovery: nothing left inside, the refusals counted, and a normal request is served.
    assert _metric(server, "inferd_server_queued_requests") == 0
    assert _metric(server, "nv_inference_pending_request_count", '{model="slow",version="1"}') == 0
    # Every refusal is counted, the frontend workers' (past their in-flight cap) with the core's.
    assert _wait_metric(server, "inferd_server_overload_rejected_total", codes["UNAVAILABLE"])
    codes, _ = asyncio.run(_burst(server.url, 1))
    assert codes == {"OK": 1}


def test_an_http_burst_is_shed_503_with_the_reason(server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(server.http_url, concurrency=64, network_timeout=120)
    x = httpclient.InferInput("INPUT0", [4], "FP32")
    x.set_data_from_numpy(np.arange(4, dtype=np.float32))
    pending = [client.async_infer("slow", [x]) for _ in range(200)]
    outcomes: collections.Counter = collections.Counter()
    for p in pending:
        try:
            p.get_result()
            outcomes["OK"] += 1
        except InferenceServerException as exc:
            assert exc.status() == "503" and "overloaded" in exc.message(), (exc.status(), exc.message())
            outcomes["503"] += 1
    client.close()
    assert outcomes["503"] > 0 and outcomes["OK"] >= 1, outcomes
    assert _metric(server, "inferd_server_queued_requests") == 0


@pytest.mark.fixed_mode
def test_a_frontend_workers_own_refusal_is_counted_by_the_cores_metric(tmp_path: Path) -> None:
    """Default process mode: a worker at its in-flight cap refuses by itself, before the core sees
    the request; the server-wide counter the core serves counts it all the same."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pbg

    from conftest import ServerProcess
    from gated_model import add_gated_model, release, wait_started

    gate = tmp_path / "gate"
    add_gated_model(tmp_path / "repo", "gated", gate)
    # A cap of 1: the worker holding one request refuses the next itself, before sending it to the core.
    server = ServerProcess(tmp_path / "repo", ["--frontend-workers", "2", "--max-queued-requests", "1", "--no-shed",
                                               "--grpc-front", "grpcio"])
    channel = grpc.insecure_channel(server.url)  # one connection: one worker serves both calls (grpc.aio's port)
    try:
        stub = pbg.GRPCInferenceServiceStub(channel)
        msg = pb.ModelInferRequest(model_name="gated")
        t = msg.inputs.add(name="INPUT0", datatype="FP32")
        t.shape.append(1)
        msg.raw_input_contents.append(np.ones(1, np.float32).tobytes())
        assert _metric(server, "inferd_server_overload_rejected_total") == 0
        held = stub.ModelInfer.future(msg, timeout=120)
        wait_started(gate)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(msg, timeout=120)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "this frontend worker" in info.value.details(), info.value.details()
        assert _wait_metric(server, "inferd_server_overload_rejected_total", 1)
        assert _metric(server, "inferd_server_queued_requests") == 1  # the core held one: the refusal was the worker's
        release(gate)
        assert held.result(timeout=120) is not None
        assert _metric(server, "inferd_server_overload_rejected_total") == 1
    finally:
        channel.close()
        code = server.stop()
    assert code == 0, server.log()
    assert "Traceback" not in server.log(), server.log()


@pytest.mark.fixed_mode
def test_one_connection_may_carry_the_whole_request_cap_to_one_frontend_worker(tmp_path: Path) -> None:
    """The kernel spreads connections over the workers, not calls: a closed loop of as many clients as
    --max-queued-requests over one connection lands on one worker, which must hold them all (issue 42:
    perf_analyzer at concurrency 1,024 over a few connections was refused at a worker's share, 512)."""
    import tritonclient.grpc.aio as aioclient
    from tritonclient.utils import InferenceServerException

    from conftest import ServerProcess

    cap = 32
    add_model(tmp_path / "repo", "slow", sleeping_identity(0.002).encode(), config(
        "slow", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0, platform=None,
        extra='backend: "python"\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n'), filename="model.py")
    server = ServerProcess(tmp_path / "repo", ["--frontend-workers", "2", "--max-queued-requests", str(cap)])

    async def loop() -> collections.Counter:
        client = aioclient.InferenceServerClient(server.url)  # one channel: one connection, one worker
        x = aioclient.InferInput("INPUT0", [4], "FP32")
        x.set_data_from_numpy(np.ones(4, np.float32))
        codes: collections.Counter = collections.Counter()

        async def caller() -> None:
            for _ in range(3):
                try:
                    await client.infer("slow", [x], client_timeout=300)
                    codes["OK"] += 1
                except InferenceServerException as exc:
                    codes[exc.message()] += 1

        try:
            await asyncio.gather(*(caller() for _ in range(cap)))
        finally:
            await client.close()
        return codes

    try:
        assert asyncio.run(loop()) == {"OK": 3 * cap}
    finally:
        code = server.stop()
    assert code == 0, server.log()

"""Issue 46: the gRPC front (``--grpc-front envoy``). Envoy owns the gRPC port; unary ModelInfer reaches
the serving processes as gRPC over HTTP/1.1 (the bridge sockets), every other call as gRPC. What a client
sees is what it sees without the front: answers, every error's status and message, deadlines, streams,
health, reflection, compression, restricted groups, TLS; and Envoy is started, restarted and stopped with
the server. Each test runs in both process modes (`make test`'s two halves).
"""

from __future__ import annotations

import os
import re
import signal
import socket
from pathlib import Path

import grpc
import numpy as np
import pytest

from certs import Certs, make_certs
from conftest import running, until
from repo_builder import add_model, add_python_model, config, sleeping_identity

FRONT = ["--grpc-front", "envoy"]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from inferd.examples import onnx_models as om

    repo = tmp_path_factory.mktemp("front_repo")
    add_model(repo, "m", om.identity(np.float32, [-1], batch=False), config(
        "m", [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])], 0))
    add_python_model(repo, "slow", sleeping_identity(3.0), """
        name: "slow"
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_CPU count: 2 } ]
    """)
    return repo


@pytest.fixture(scope="module")
def server(repo: Path):  # type: ignore[no-untyped-def]
    with running(repo, extra_args=FRONT) as server:
        yield server


def _admin_socket(server) -> str:  # type: ignore[no-untyped-def]
    found = re.findall(r"gRPC front: Envoy \(pid \d+.*?\) serving .*?; its admin socket (\S+)", server.log())
    assert found, server.log()
    return found[-1]


def _stat(server, name: str) -> int:  # type: ignore[no-untyped-def]
    """One counter of Envoy's, read from its admin socket."""
    from inferd.serve.grpc_front import _admin_get

    text = _admin_get(_admin_socket(server), f"/stats?filter=^{re.escape(name)}$")
    found = re.search(rf"^{re.escape(name)}: (\d+)$", text, re.M)
    return int(found.group(1)) if found else 0


def _infer(client, model: str = "m", values=(1.0, 2.0), **kw):  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("INPUT0", [len(values)], "FP32")
    x.set_data_from_numpy(np.array(values, dtype=np.float32))
    return client.infer(model, [x], **kw).as_numpy("OUTPUT0").tolist()


def test_unary_infer_goes_through_the_bridge_and_the_rest_as_grpc(server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.url)
    bridged = _stat(server, "cluster.inferd_bridge.upstream_rq_completed")
    grpc_calls = _stat(server, "cluster.inferd_grpc.upstream_rq_completed")
    for i in range(5):
        assert _infer(client, values=(float(i), 2.0)) == [float(i), 2.0]
    assert client.is_server_ready() and client.get_model_metadata("m").name == "m"
    until(lambda: _stat(server, "cluster.inferd_bridge.upstream_rq_completed") >= bridged + 5, timeout=10)
    assert _stat(server, "cluster.inferd_bridge.upstream_rq_completed") == bridged + 5
    assert _stat(server, "cluster.inferd_grpc.upstream_rq_completed") >= grpc_calls + 2
    # gzip: its frame is gRPC's to read, so it goes as gRPC
    assert _infer(client, values=(7.0,), compression_algorithm="gzip") == [7.0]
    assert _stat(server, "cluster.inferd_bridge.upstream_rq_completed") == bridged + 5
    client.close()


def test_errors_keep_their_status_and_message(server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as missing:
        _infer(client, model="nope")
    assert missing.value.status() == "StatusCode.NOT_FOUND"
    assert "'nope'" in missing.value.message()
    x = grpcclient.InferInput("INPUT0", [2], "INT32")  # the model takes FP32
    x.set_data_from_numpy(np.array([1, 2], dtype=np.int32))
    with pytest.raises(InferenceServerException) as wrong:
        client.infer("m", [x])
    assert wrong.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "INPUT0" in wrong.value.message() and "INT32" in wrong.value.message()
    client.close()
    # bytes that are no ModelInferRequest: INVALID_ARGUMENT naming the message, as without the front
    channel = grpc.insecure_channel(server.url)
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
    with pytest.raises(grpc.RpcError) as bad:
        call(b"\xff\xff\xff", timeout=10)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "inference.ModelInferRequest" in bad.value.details()
    channel.close()


def test_a_passed_deadline_is_deadline_exceeded_and_the_server_goes_on(server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = grpcclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException) as late:
        _infer(client, model="slow", client_timeout=0.5)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert _infer(client) == [1.0, 2.0]
    client.close()


def test_streams_are_bridged_and_health_and_reflection_pass_through(server) -> None:  # type: ignore[no-untyped-def]
    import queue

    import tritonclient.grpc as grpcclient
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    results: queue.Queue = queue.Queue()
    streams = _stat(server, "cluster.inferd_stream.upstream_rq_completed")
    client = grpcclient.InferenceServerClient(server.url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    x = grpcclient.InferInput("INPUT0", [1], "FP32")
    for v in (1.0, 2.0, 3.0):
        x.set_data_from_numpy(np.array([v], dtype=np.float32))
        client.async_stream_infer("m", [x])
    got = sorted(results.get(timeout=30)[0].as_numpy("OUTPUT0")[0] for _ in range(3))
    assert got == [1.0, 2.0, 3.0]
    client.stop_stream()
    client.close()
    # The stream went through the bridge, as one HTTP/1.1 request whose body and answer carried its messages.
    assert until(lambda: _stat(server, "cluster.inferd_stream.upstream_rq_completed") == streams + 1, timeout=10)
    channel = grpc.insecure_channel(server.url)
    health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = reflection.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                              timeout=10)
    names = {s.name for a in answers for s in a.list_services_response.service}
    assert "inference.GRPCInferenceService" in names
    channel.close()


def test_a_large_message_passes_the_bridge(server) -> None:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.url)
    values = np.arange(3 << 20, dtype=np.float32)  # 12 MiB each way, past Envoy's 1 MiB default buffers
    out = _infer(client, values=values)
    assert len(out) == values.size and out[-1] == float(values[-1])
    client.close()


def test_restricted_inference_is_refused_through_the_bridge(repo: Path) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    with running(repo, extra_args=[*FRONT, "--grpc-restricted-protocol", "inference:infer-key=s3cret"]) as server:
        client = grpcclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException) as refused:
            _infer(client)
        assert refused.value.status() == "StatusCode.PERMISSION_DENIED"
        assert "infer-key" in refused.value.message()
        assert _infer(client, headers={"triton-grpc-protocol-infer-key": "s3cret"}) == [1.0, 2.0]
        assert _stat(server, "cluster.inferd_bridge.upstream_rq_completed") == 2  # both went through the bridge
        client.close()


def test_tls_is_terminated_by_the_front(repo: Path, tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    certs: Certs = make_certs(tmp_path)
    args = [*FRONT, "--grpc-use-ssl-mutual", "true", "--grpc-server-cert", str(certs.server_cert),
            "--grpc-server-key", str(certs.server_key), "--grpc-root-cert", str(certs.ca)]
    with running(repo, extra_args=args) as server:
        client = grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(certs.ca),
                                                  private_key=str(certs.client_key),
                                                  certificate_chain=str(certs.client_cert))
        assert _infer(client) == [1.0, 2.0]
        client.close()
        anonymous = grpcclient.InferenceServerClient(server.url, ssl=True, root_certificates=str(certs.ca))
        with pytest.raises(InferenceServerException):
            anonymous.is_server_live(client_timeout=5)
        anonymous.close()
        plain = grpcclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        plain.close()


def test_with_no_serving_process_a_call_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    """Envoy alone, its serving processes' sockets absent (a server stopping, every worker restarting):
    a bridged ModelInfer and a passed-through call both end UNAVAILABLE, the bridged one saying why."""
    import asyncio

    from inferd.serve.grpc_front import EnvoyFront, Upstream

    async def calls() -> tuple[grpc.RpcError, grpc.RpcError]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        front = EnvoyFront("127.0.0.1", port, [Upstream(str(tmp_path / "grpc-0.sock"), str(tmp_path / "bridge-0.sock"))],
                           tmp_path, threads=1)
        await front.start()
        try:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            errors = []
            for method in ("ModelInfer", "ServerLive"):
                with pytest.raises(grpc.RpcError) as info:
                    await channel.unary_unary(f"/inference.GRPCInferenceService/{method}")(b"", timeout=10)
                errors.append(info.value)
            await channel.close()
            return errors[0], errors[1]
        finally:
            await front.stop()

    bridged, passed = asyncio.run(calls())
    assert bridged.code() == grpc.StatusCode.UNAVAILABLE, bridged
    assert "got no answer from a serving process" in bridged.details() and "retry the call" in bridged.details()
    assert passed.code() == grpc.StatusCode.UNAVAILABLE, passed


def _envoy_pid(server) -> int:  # type: ignore[no-untyped-def]
    pids = re.findall(r"gRPC front: Envoy \(pid (\d+)", server.log())
    assert pids, server.log()
    return int(pids[-1])


def test_envoy_is_restarted_and_stopped_with_the_server(repo: Path) -> None:
    import tritonclient.grpc as grpcclient

    with running(repo, extra_args=FRONT) as server:
        first = _envoy_pid(server)
        os.kill(first, signal.SIGKILL)
        until(lambda: _envoy_pid(server) != first, timeout=30)
        client = grpcclient.InferenceServerClient(server.url)
        until(lambda: _ready(client), timeout=30)
        assert _infer(client) == [1.0, 2.0]
        client.close()
        envoy = _envoy_pid(server)
        assert "starting it again" in server.log()
    # `running` checked that nothing of the server's group outlived it: Envoy included
    with pytest.raises(ProcessLookupError):
        os.kill(envoy, 0)


def _ready(client) -> bool:  # type: ignore[no-untyped-def]
    try:
        return client.is_server_ready(client_timeout=2)
    except Exception:
        return False


def test_a_killed_worker_costs_no_call(server) -> None:  # type: ignore[no-untyped-def]
    """A frontend worker killed: Envoy retries a call whose connection failed on another worker, and the
    worker restarted in its slot takes its sockets over."""
    import tritonclient.grpc as grpcclient

    from conftest import group_members

    workers = [p for p in group_members(server.proc.pid) if "inferd.serve.worker_process" in _cmdline(p)]
    if not workers:
        pytest.skip("the server runs in one process: no frontend worker to kill")
    client = grpcclient.InferenceServerClient(server.url)
    os.kill(workers[0], signal.SIGKILL)
    for i in range(40):
        assert _infer(client, values=(float(i),)) == [float(i)]
    client.close()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_a_drained_front_stops_only_once_calls_have_stopped_coming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load balancer in front may send a call on an open connection until it has seen the server's first
    refusal: the front keeps answering until no call has come for QUIET_S (Envoy's own admin figures, read on
    a fake clock), rather than stopping as soon as nothing is in flight, which reset the call sent meanwhile."""
    import asyncio

    from inferd.clock import FakeClock
    from inferd.serve import grpc_front

    clock = FakeClock()
    polls: list[float] = []
    arrivals = 20  # the balancer's calls go on for the first 20 readings, 10 ms apart, then stop

    def admin(path: str, what: str, timeout: float = 2.0, method: str = "GET") -> str:
        if "drain_listeners" in what:
            return ""
        polls.append(clock.now())
        clock.advance(0.01)
        total = min(len(polls), arrivals)
        return f"http.inferd_grpc.downstream_rq_active: 0\nhttp.inferd_grpc.downstream_rq_total: {total}\n"

    class Running:
        returncode = None

    monkeypatch.setattr(grpc_front, "_admin_get", admin)
    front = grpc_front.EnvoyFront("127.0.0.1", 0, [], tmp_path, 1, clock=clock)
    front.process = Running()  # type: ignore[assignment]
    asyncio.run(front.drain(answers_s=2.0))
    last_call = polls[arrivals - 1]
    assert polls[-1] - last_call >= grpc_front.QUIET_S  # it waited for the calls to stop...
    assert polls[-1] - polls[0] < 1.0  # ...not for the whole of answers_s

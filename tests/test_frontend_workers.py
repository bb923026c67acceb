"""`inferd serve --frontend-workers 2` through tritonclient: each client is pinned to a known
frontend (found through /proc: which worker holds its connection), so requests provably cross
frontends; then faults: a frontend SIGKILLed under load, SIGTERM under load, the core killed."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import ServerProcess, group_members, until
from inferd.cli import default_frontend_workers

# grpc.aio on the port: these tests reach each worker through its own connections (SO_REUSEPORT), which
# the gRPC front (Envoy, tests/test_grpc_front.py) spreads call by call instead.
WORKERS = ["--frontend-workers", "2", "--grpc-front", "grpcio"]
pytestmark = pytest.mark.fixed_mode  # every server here says its mode: the single-process rerun skips them


def workers_of(server: ServerProcess) -> list[int]:
    """The core's children that are frontend workers (its model hosts are children too)."""
    core = server.proc.pid
    return sorted(p for p in group_members(core) if p != core and _ppid(p) == core and _is_worker(p))


def _is_worker(pid: int) -> bool:
    try:
        return b"inferd.serve.worker_process" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _ppid(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(text[text.rindex(")") + 2:].split()[1])


def connections(pid: int, port: int) -> int:
    """Established TCP connections on ``port`` held by process ``pid`` (its fds x /proc/net/tcp)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return 0
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == "01" and fields[9] in inodes:
                count += 1
    return count


def client_on_each_worker(server: ServerProcess, workers: list[int]) -> dict[int, grpcclient.InferenceServerClient]:
    """One gRPC client connected to each worker: open connections until every worker holds one
    (the kernel picks the worker of each new connection; 40 tries are plenty for two)."""
    found: dict[int, grpcclient.InferenceServerClient] = {}
    spare = []
    for _ in range(40):
        before = {w: connections(w, server.port) for w in workers}
        # Its own subchannel pool: gRPC would otherwise share one connection among our clients.
        c = grpcclient.InferenceServerClient(server.url, channel_args=[("grpc.use_local_subchannel_pool", 1)])
        assert c.is_server_live()
        after = {w: connections(w, server.port) for w in workers}
        owner = [w for w in workers if after[w] > before[w]]
        if len(owner) == 1 and owner[0] not in found:
            found[owner[0]] = c
        else:
            spare.append(c)
        if len(found) == len(workers):
            break
    for c in spare:
        c.close()
    assert len(found) == len(workers), f"could not reach every worker: {sorted(found)} of {workers}"
    return found


def _simple(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


@pytest.fixture(scope="module")
def server(example_repository: Path) -> Iterator[ServerProcess]:
    s = ServerProcess(example_repository, [*WORKERS, "--model-control-mode", "explicit", "--load-model", "*",
                                              "--allow-client-shm"])
    yield s
    assert s.stop() == 0, s.log()
    assert not s.left_behind
    assert "Traceback" not in s.log(), s.log()


@pytest.fixture(scope="module")
def pinned(server: ServerProcess) -> Iterator[list[grpcclient.InferenceServerClient]]:
    workers = workers_of(server)
    assert len(workers) == 2
    clients = client_on_each_worker(server, workers)
    yield [clients[w] for w in workers]
    for c in clients.values():
        c.close()


def test_default_worker_count_follows_the_cores() -> None:
    assert [default_frontend_workers(n, "grpcio") for n in (1, 2, 3, 4, 6, 16, 64)] == [0, 2, 2, 2, 3, 8, 16]
    assert [default_frontend_workers(n, "envoy") for n in (1, 2, 3, 4, 6, 16, 64)] == [0, 0, 2, 2, 3, 8, 16]


def test_every_rpc_answers_alike_through_either_frontend(pinned) -> None:  # type: ignore[no-untyped-def]
    a, b = pinned
    assert a.get_model_metadata("simple") == b.get_model_metadata("simple")
    assert a.get_model_config("simple").config == b.get_model_config("simple").config
    assert a.is_server_ready() and b.is_server_ready() and a.is_model_ready("mlp") and b.is_model_ready("mlp")
    assert a.get_server_metadata().name == b.get_server_metadata().name == "triton"  # --server-name's default
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    before = b.get_inference_statistics("simple").model_stats[0].inference_count
    for c in (a, b, a):
        r = c.infer("simple", _simple(x, x))
        assert (r.as_numpy("OUTPUT0") == 2 * x).all() and (r.as_numpy("OUTPUT1") == 0).all()
    # One set of statistics: requests through both frontends counted together.
    assert a.get_inference_statistics("simple").model_stats[0].inference_count == before + 3
    assert [m.name for m in a.get_model_repository_index().models] == [m.name for m in b.get_model_repository_index().models]
    with pytest.raises(InferenceServerException, match="unknown model"):
        b.infer("no_such_model", _simple(x, x))


def test_repository_control_through_one_frontend_is_seen_through_the_other(pinned) -> None:  # type: ignore[no-untyped-def]
    a, b = pinned
    a.unload_model("mlp_nobatch")
    try:
        assert not b.is_model_ready("mlp_nobatch")
        i = grpcclient.InferInput("INPUT0", [1, 256], "FP32")
        i.set_data_from_numpy(np.zeros((1, 256), np.float32))
        with pytest.raises(InferenceServerException, match="mlp_nobatch"):
            b.infer("mlp_nobatch", [i])
    finally:
        b.load_model("mlp_nobatch")
    assert a.is_model_ready("mlp_nobatch")


def test_a_sequence_whose_requests_arrive_through_different_frontends(pinned) -> None:  # type: ignore[no-untyped-def]
    a, b = pinned
    got = []
    for i, (c, value) in enumerate(zip((a, b, a, b), (1, 2, 3, 4))):
        i_ = grpcclient.InferInput("INPUT", [1, 1], "INT32")
        i_.set_data_from_numpy(np.full((1, 1), value, np.int32))
        r = c.infer("simple_sequence", [i_], sequence_id=4242, sequence_start=i == 0, sequence_end=i == 3)
        got.append(int(r.as_numpy("OUTPUT").reshape(-1)[0]))
    assert got == [1, 3, 6, 10]


def test_a_shared_memory_region_registered_through_one_frontend_and_used_through_the_other(pinned) -> None:  # type: ignore[no-untyped-def]
    a, b = pinned
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    y = np.full((1, 16), 5, np.int32)
    n = x.nbytes
    key = f"/inferd_test_{uuid.uuid4().hex[:12]}"
    ip = shm.create_shared_memory_region("xf_in", key + "i", 2 * n)
    op = shm.create_shared_memory_region("xf_out", key + "o", 2 * n)
    try:
        shm.set_shared_memory_region(ip, [x])
        shm.set_shared_memory_region(ip, [y], offset=n)
        a.register_system_shared_memory("xf_in", key + "i", 2 * n)
        a.register_system_shared_memory("xf_out", key + "o", 2 * n)
        assert set(b.get_system_shared_memory_status().regions) == {"xf_in", "xf_out"}
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"), grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_shared_memory("xf_in", n)
        inputs[1].set_shared_memory("xf_in", n, offset=n)
        outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
        outputs[0].set_shared_memory("xf_out", n)
        outputs[1].set_shared_memory("xf_out", n, offset=n)
        b.infer("simple", inputs, outputs=outputs)
        total = shm.get_contents_as_numpy(op, np.int32, [1, 16])
        diff = shm.get_contents_as_numpy(op, np.int32, [1, 16], offset=n)
        assert (total == x + y).all() and (diff == x - y).all()
        b.unregister_system_shared_memory()
        assert not a.get_system_shared_memory_status().regions
    finally:
        a.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(ip)
        shm.destroy_shared_memory_region(op)


def test_decoupled_responses_stream_back_through_a_frontend(pinned) -> None:  # type: ignore[no-untyped-def]
    got: list = []
    done = threading.Event()

    def on(result, error):  # type: ignore[no-untyped-def]
        got.append(error or result)
        if error is not None or len(got) == 3:
            done.set()

    c = pinned[1]
    c.start_stream(callback=on)
    try:
        inputs = [grpcclient.InferInput("IN", [1], "INT32"), grpcclient.InferInput("REPEAT", [1], "INT32")]
        inputs[0].set_data_from_numpy(np.array([7], np.int32))
        inputs[1].set_data_from_numpy(np.array([3], np.int32))
        c.async_stream_infer("repeat_decoupled", inputs, request_id="d1")
        assert done.wait(60)
    finally:
        c.stop_stream()
    assert all(not isinstance(r, InferenceServerException) for r in got), got
    assert [int(r.as_numpy("OUT")[0]) for r in got] == [7, 7, 7]


def test_http_and_one_metrics_endpoint_for_the_whole_server(server, pinned) -> None:  # type: ignore[no-untyped-def]
    import urllib.request

    h = httpclient.InferenceServerClient(server.http_url)
    try:
        assert h.is_server_ready() and h.get_model_metadata("simple")["name"] == "simple"
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(x)
        inputs[1].set_data_from_numpy(x, binary_data=False)
        assert (h.infer("simple", inputs).as_numpy("OUTPUT0") == 2 * x).all()
    finally:
        h.close()
    count = pinned[0].get_inference_statistics("simple").model_stats[0].inference_count
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    line = next(l for l in text.splitlines() if l.startswith("nv_inference_count{") and '"simple"' in l)
    assert float(line.rsplit(" ", 1)[1]) == count


# -- faults -----------------------------------------------------------------------------------


def _load(client: grpcclient.InferenceServerClient, stop: threading.Event, results: list,
          messages: list | None = None, limit: int = 4000) -> None:
    """Infer until ``stop`` (at most ``limit`` requests); record "ok" or the error's status, and in
    ``messages`` (if given) the message of each error of a request that was sent."""
    x = np.arange(16, dtype=np.int32).reshape(1, 16)
    for _ in range(limit):
        if stop.is_set():
            return
        try:
            client.infer("simple", _simple(x, x), client_timeout=30)
            results.append("ok")
        except InferenceServerException as exc:
            # A call made while the channel reconnects fails fast without being sent (gRPC
            # says so in these words): the server never saw it, so it is not one of the
            # frontend's in-flight requests. A reconnect that loses the race with the kill
            # backs off for a second, and a tight loop makes hundreds of those.
            unsent = "failed to connect to all addresses" in (exc.message() or "")
            results.append(f"{exc.status()} (not sent)" if unsent else exc.status())
            if messages is not None and not unsent:
                messages.append(exc.message())
            if unsent:  # as a client would pause: unpaused, a backoff of seconds spent the whole limit
                time.sleep(0.01)



def test_a_frontend_killed_under_load_fails_only_its_requests_and_is_restarted(example_repository: Path,
                                                                               start_server) -> None:  # type: ignore[no-untyped-def]
    server = start_server(example_repository, WORKERS)  # stopped after the test, whatever happens in it
    try:
        workers = workers_of(server)
        clients = client_on_each_worker(server, workers)
        victim, survivor = workers
        stop = threading.Event()
        results: dict[int, list] = {w: [] for w in workers}
        messages: list[str] = []  # the victim's sent requests' errors, for the assertion's report
        threads = [threading.Thread(target=_load, args=(clients[w], stop, results[w], messages if w == victim else None))
                   for w in workers]
        for t in threads:
            t.start()
        assert until(lambda: len(results[victim]) > 20 and len(results[survivor]) > 20)
        os.kill(victim, signal.SIGKILL)
        # The dead one is replaced by a fresh worker, and every connection serves again.
        assert until(lambda: len(workers_of(server)) == 2 and victim not in workers_of(server))
        n = len(results[victim])
        # Until its client is served again (a count of results is no sign: while its channel backs off before
        # reconnecting, each call fails unsent at once, twenty of them in a few milliseconds).
        assert until(lambda: "ok" in results[victim][n:] and len(results[victim]) > n + 20)
        stop.set()
        for t in threads:
            t.join(60)
        assert set(results[survivor]) == {"ok"}, "a request through the other frontend failed"
        failed = [r for r in results[victim] if r != "ok"]
        assert set(failed) <= {"StatusCode.UNAVAILABLE", "StatusCode.UNAVAILABLE (not sent)"}, failed
        # The victim's client fails only while its connection dies with the worker: each request of it that was
        # sent and failed died with that connection (its socket closed or reset under the call, in gRPC's words),
        # all of them before the client was served again (through the replacement or the survivor), and it was.
        # (Its sequential client can put more than its one request in flight on the dying connection before
        # gRPC reads the close: one run here saw three, so their number is not what is asserted.)
        mine = results[victim]
        first = next((i for i, r in enumerate(mine) if r != "ok"), None)
        if first is not None:
            assert "ok" in mine[first:], ("the killed frontend's client was never served again", mine[first:])
            again = mine.index("ok", first)
            assert "StatusCode.UNAVAILABLE" not in mine[again:], (mine[first:], messages)
        gone = ("Stream removed", "Socket closed", "Broken pipe", "Connection reset")
        assert all(any(word in m for word in gone) for m in messages), messages
        fresh = grpcclient.InferenceServerClient(server.url)
        x = np.arange(16, dtype=np.int32).reshape(1, 16)
        assert (fresh.infer("simple", _simple(x, x)).as_numpy("OUTPUT0") == 2 * x).all()
        fresh.close()
        for c in clients.values():
            c.close()
    finally:
        code = server.stop()
    assert code == 0 and not server.left_behind, server.log()
    assert "exited with status -9 (SIGKILL)" in server.log()


def _inflight(server: ServerProcess, model: str) -> float:
    import urllib.request

    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    line = next(l for l in text.splitlines()
                if l.startswith("inferd_inference_inflight_request_count") and f'"{model}"' in l)
    return float(line.rsplit(" ", 1)[1])


def test_sigterm_under_load_answers_every_accepted_request(tmp_path: Path, start_server) -> None:  # type: ignore[no-untyped-def]
    """Requests held in the core (a gated model) through both frontends when SIGTERM comes,
    with load running on both: every held request is answered once released; what the drain
    refuses is refused as UNAVAILABLE; every process exits 0 and none is left."""
    from gated_model import add_gated_model, release, wait_started

    from inferd.examples.build import build_repository

    repo, gate = tmp_path / "repo", tmp_path / "gate"
    build_repository(repo, only=["simple"], log=None)
    add_gated_model(repo, "gated", gate)
    server = start_server(repo, WORKERS)
    clients = client_on_each_worker(server, workers_of(server))
    held: list = []

    def hold(c: grpcclient.InferenceServerClient) -> None:
        i = grpcclient.InferInput("INPUT0", [4], "FP32")
        i.set_data_from_numpy(np.arange(4, dtype=np.float32))
        try:
            r = c.infer("gated", [i], client_timeout=120)
            held.append("ok" if (r.as_numpy("OUTPUT0") == np.arange(4)).all() else "wrong")
        except InferenceServerException as exc:
            held.append(exc.status())

    holders = [threading.Thread(target=hold, args=(c,)) for c in clients.values() for _ in range(2)]
    for t in holders:
        t.start()
    wait_started(gate)
    assert until(lambda: _inflight(server, "gated") == 4)
    stop = threading.Event()
    results: list = []
    loaders = [threading.Thread(target=_load, args=(c, stop, results)) for c in clients.values()]
    for t in loaders:
        t.start()
    assert until(lambda: len(results) > 50)
    server.proc.send_signal(signal.SIGTERM)
    assert until(lambda: "StatusCode.UNAVAILABLE" in results)  # the drain refuses new requests...
    release(gate)  # ...and the accepted ones finish
    code = server.stop()
    stop.set()
    for t in holders + loaders:
        t.join(60)
    for c in clients.values():
        c.close()
    assert held == ["ok"] * 4, held
    assert code == 0 and not server.left_behind, server.log()
    # Answered, or refused as not taken (retryable): never CANCELLED, also for the calls that race a
    # worker's port closing (GrpcPort holds them until none is left unclaimed in gRPC core, issue 16).
    assert set(results) <= {"ok", "StatusCode.UNAVAILABLE", "StatusCode.UNAVAILABLE (not sent)"}, sorted(set(results))
    assert results.count("ok") > 50


def test_the_core_killed_takes_its_frontends_and_frees_the_ports(example_repository: Path,
                                                                  start_server) -> None:  # type: ignore[no-untyped-def]
    import socket

    server = start_server(example_repository, WORKERS)
    workers = workers_of(server)
    assert len(workers) == 2
    server.proc.kill()
    server.proc.wait(30)
    assert until(lambda: not group_members(server.proc.pid), 30), group_members(server.proc.pid)
    for port in (server.port, server.http_port):
        with socket.socket() as s:
            # Free: no listener holds it (SO_REUSEADDR: the closed connections' TIME_WAIT does not count).
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen(1)
    server.stop()

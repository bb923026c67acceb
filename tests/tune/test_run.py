"""inferd tune against real servers: rounds through the twin (and, with -u, through reloads),
figures from /proc, and a short run of the command end to end."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import grpc
import pytest

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd.config import parse_config_file
from inferd.tune.run import Fleet, InferdRounds, ServerSettings, TuneError, link_repository
from inferd.tune.space import current

# The fleet starts its own servers in the server's default mode (or as --frontend-workers says).
pytestmark = [pytest.mark.server, pytest.mark.fixed_mode]


def _ready(url: str) -> set[str]:
    with grpc.insecure_channel(url) as channel:
        index = pb_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(pb.RepositoryIndexRequest(ready=True))
    return {m.name for m in index.models}


def test_rounds_run_through_the_twin_with_figures_from_proc(example_repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "mlp", repo / "mlp")
    base = parse_config_file(repo / "mlp" / "config.pbtxt", model="mlp")
    fleet = Fleet(ServerSettings(repo, "mlp", window_ms=100, levels=(4.0,)))
    rounds = InferdRounds(fleet, base)
    now = current(base)
    other = replace(now, instances=2, delay_us=100)
    try:
        measured = [rounds(c, 4.0) for c in (now, other, other, now)]
        url = fleet.target(None, False).grpc_url
        # both stay loaded: the current config under its own name, the candidate in the twin
        assert {"mlp", "mlp__tune"} <= _ready(url)
        assert len(rounds.sessions) == 2  # one load client each, kept between rounds
    finally:
        rounds.close()
        fleet.stop()
    for r in measured:
        assert not r.error and r.throughput > 0 and 0 < r.p50_us <= r.p99_us
        assert r.server_cpu_us is not None and r.server_cpu_us > 0  # from the server's process tree
        assert r.others_cores is not None and r.others_cores >= 0  # /proc/stat less the server and the client
        assert r.client_cpu_s > 0
    assert fleet.servers == {}


def test_a_candidate_that_does_not_load_is_a_failed_round_not_a_crash(example_repository: Path,
                                                                      tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "mlp", repo / "mlp")
    base = parse_config_file(repo / "mlp" / "config.pbtxt", model="mlp")
    fleet = Fleet(ServerSettings(repo, "mlp", window_ms=100, levels=(2.0,)))
    rounds = InferdRounds(fleet, base)
    try:
        bad = replace(current(base), kind="KIND_GPU")  # no GPU here
        r = rounds(bad, 2.0)
        assert r.error and "mlp__tune" in r.error and not r.ok
        assert rounds(current(base), 2.0).ok
    finally:
        rounds.close()
        fleet.stop()


def test_a_model_named_like_the_twin_is_refused(tmp_path: Path) -> None:
    (tmp_path / "repo" / "m").mkdir(parents=True)
    (tmp_path / "repo" / "m__tune").mkdir()
    with pytest.raises(TuneError, match="already holds a model named 'm__tune'"):
        link_repository(tmp_path / "repo", "m", "m__tune", tmp_path / "links")


def test_a_short_real_run_decides_or_says_why(example_repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "simple", repo / "simple")
    before = (repo / "simple" / "config.pbtxt").read_text()
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", "tune", "-m", "simple", "--model-repository",
                           str(repo), "--time-budget", "20s", "-p", "100", "--concurrency-range", "2",
                           "--out", str(out), "--frontend-workers", "0", "--write"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode in (0, 3), proc.stdout + proc.stderr
    doc = json.loads((out / "tune.json").read_text())
    assert doc["decision"] in ("winner", "current", "none") and doc["reason"]
    assert (proc.returncode == 0) == (doc["decision"] in ("winner", "current"))
    rounds = doc["rounds"]
    assert [r["phase"] for r in rounds[:3]] == ["scan"] * 3
    measured = [r for r in rounds if not r["error"]]
    assert measured and all(r["throughput"] > 0 and r["server_cpu_us"] > 0 for r in measured)
    assert all(r["others_cores"] is not None for r in measured)
    assert doc["measured"] + len(doc["never_reached"]) == doc["distinct"]
    # the repository changes only with a verified winner
    written = (repo / "simple" / "config.pbtxt").read_text() != before
    assert written == (doc["decision"] == "winner")
    if written:
        assert doc["verification"]["passed"] and (out / "verification.txt").exists()
    assert (out / "tune.png").stat().st_size > 0
    last = [line for line in proc.stdout.splitlines() if "decision:" in line][-1]
    assert last.startswith("decision:" if proc.returncode == 0 else "no decision:"), last


def test_the_options_that_do_not_fit_together_are_refused(example_repository: Path, tmp_path: Path) -> None:
    def tune(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "inferd.cli", "tune", "-m", "simple", "--model-repository",
                               str(example_repository), *args], capture_output=True, text=True, timeout=120)

    r = tune("-u", "127.0.0.1:1", "--frontend-workers", "0,2")
    assert r.returncode == 2 and "--frontend-workers needs a server started by tune" in r.stderr
    r = tune("--load-generator", "aiperf", "-u", "127.0.0.1:1")
    assert r.returncode == 2 and "--load-generator aiperf needs a server started by tune" in r.stderr
    r = tune("-u", "127.0.0.1:1", "-i", "http")
    assert r.returncode == 2 and "-u takes the server's gRPC address" in r.stderr
    r = tune("--min-gain", "150%")
    assert r.returncode == 2 and "--min-gain takes a percentage between 0 and 100" in r.stderr


def test_with_a_running_server_each_round_reloads_and_the_config_is_put_back(example_repository: Path,
                                                                              tmp_path: Path) -> None:
    from conftest import ServerProcess

    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "mlp", repo / "mlp")
    base = parse_config_file(repo / "mlp" / "config.pbtxt", model="mlp")
    server = ServerProcess(repo, ["--model-control-mode", "explicit", "--load-model", "mlp"])
    try:
        fleet = Fleet(ServerSettings(repo, "mlp", url=server.url, window_ms=100, levels=(2.0,)))
        rounds = InferdRounds(fleet, base)
        other = replace(current(base), instances=2, delay_us=500)
        try:
            measured = [rounds(c, 2.0) for c in (current(base), other)]
            with grpc.insecure_channel(server.url) as channel:
                stub = pb_grpc.GRPCInferenceServiceStub(channel)
                during = stub.ModelConfig(pb.ModelConfigRequest(name="mlp")).config
        finally:
            rounds.close()
            fleet.stop()
        with grpc.insecure_channel(server.url) as channel:
            after = pb_grpc.GRPCInferenceServiceStub(channel).ModelConfig(pb.ModelConfigRequest(name="mlp")).config
    finally:
        server.stop()
    assert all(r.ok for r in measured) and measured[0].server_cpu_us is None  # -u: no process tree to read
    assert during.dynamic_batching.max_queue_delay_microseconds == 500 and during.instance_group[0].count == 2
    assert after.dynamic_batching.max_queue_delay_microseconds == 0 and after.instance_group[0].count == 1


def test_a_terminated_run_stops_what_it_started(example_repository: Path, tmp_path: Path) -> None:
    import os
    import signal
    import time

    from inferd.observability.procfs import all_stats

    repo = tmp_path / "repo"
    shutil.copytree(example_repository / "simple", repo / "simple")
    proc = subprocess.Popen([sys.executable, "-m", "inferd.cli", "tune", "-m", "simple", "--model-repository", str(repo),
                             "--time-budget", "5m", "-p", "100", "--concurrency-range", "2", "--out", str(tmp_path / "out"),
                             "--write"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        assert proc.stderr is not None
        for _ in range(200):  # its progress lines: the scan has run once the target level is named
            line = proc.stderr.readline()
            if not line or "target level" in line:
                break
        started = [s.pid for s in all_stats() if s.ppid == proc.pid]  # its server and load processes
        assert started
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130 and "interrupted" in err
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in started if os.path.exists(f"/proc/{pid}")]
    assert (repo / "simple" / "config.pbtxt").read_text() == (example_repository / "simple" / "config.pbtxt").read_text()

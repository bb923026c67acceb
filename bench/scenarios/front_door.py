"""The front door against Triton (issue 46): every server up in one run on the same two cores,
perf_analyzer on loopback, identity_fp32 (16 floats) and mlp (256 -> 1024 -> 256), both dynamic_batching {},
over gRPC unary at concurrency 1 and 16, gRPC streaming and HTTP at 16. Servers: inferd with two frontend
workers and in one process, each with grpc.aio on the gRPC port (``--grpc-front grpcio``: the default before
issue 46) and with the gRPC front (``--grpc-front envoy``: Envoy owning the port, unary ModelInfer bridged as
HTTP/1.1); one process behind Envoy is ``inferd serve``'s default on two cores; the bare grpc.aio echo
servicer (bench/echo_server.py, uvloop: gRPC unary only); and the peers of $INFERD_PEERS (a folder holding
the peers' run_triton_peer.sh, run_kserve_peer.sh, run_mlserver_peer.sh, set up by their setup.sh: Triton
2.51 with its python backend, KServe 0.21, MLServer 1.7.1), each skipped, saying so, when absent. Rounds
alternate the servers' order (reversed each round). Per inference: the server tree's CPU per process
(/proc utime+stime, bench/proc_cpu.py) over inferences counted by the server's statistics (the echo's and
KServe's and MLServer's, which keep none, by perf_analyzer's rate over the run), throughput and p50/p99.
FRONT_DOOR_SERVERS and FRONT_DOOR_LOADS (comma-separated labels, ``model:protocol:concurrency``) narrow a
run; FRONT_DOOR_ROUNDS (default 2, 1 with --quick)."""

from __future__ import annotations

import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, NamedTuple

from bench.proc_cpu import CpuMeter, alive, statistics_count

WORKERS, ONE = "inferd 2 workers, grpc.aio", "inferd one process, grpc.aio"
WORKERS_ENVOY, ONE_ENVOY = "inferd 2 workers + Envoy", "inferd one process + Envoy (the default here)"
ECHO, TRITON, KSERVE, MLSERVER = "grpc.aio echo", "Triton 2.51", "KServe 0.21", "MLServer 1.7.1"
INFERD = {WORKERS: ["--frontend-workers", "2", "--grpc-front", "grpcio"],
          ONE: ["--frontend-workers", "0", "--grpc-front", "grpcio"],
          WORKERS_ENVOY: ["--frontend-workers", "2", "--grpc-front", "envoy"],
          ONE_ENVOY: ["--frontend-workers", "0", "--grpc-front", "envoy"]}
PEERS = {TRITON: "run_triton_peer.sh", KSERVE: "run_kserve_peer.sh", MLSERVER: "run_mlserver_peer.sh"}
WITH_STATISTICS = (*INFERD, TRITON)


class Load(NamedTuple):
    model: str
    protocol: str  # grpc, stream, http
    concurrency: int

    @property
    def name(self) -> str:
        return f"{self.model}:{self.protocol}:{self.concurrency}"


LOADS = tuple(Load(m, "grpc", c) for m in ("identity_fp32", "mlp") for c in (1, 16)) + tuple(
    Load(m, p, 16) for p in ("stream", "http") for m in ("identity_fp32", "mlp"))
SHAPES = {"identity_fp32": "INPUT0:16", "mlp": None}


class Server(NamedTuple):
    label: str
    pid: int
    grpc: str
    http: str
    stop: Callable[[], None]


def _inferd(label: str, repo: Path) -> Server:
    from bench.bench import Proc, free_port

    port, http = free_port(), free_port()
    proc = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                 "--http-port", str(http), "--metrics-port", "0", *INFERD[label]], "inferd: ready",
                re.sub(r"[^a-z0-9]+", "_", label.lower()))
    return Server(label, proc.proc.pid, f"127.0.0.1:{port}", f"127.0.0.1:{http}", proc.stop)


def _peer(label: str, script: Path, repo: Path) -> Server:
    from bench.bench import free_port

    port, http, metrics = free_port(), free_port(), free_port()
    args = ["bash", str(script), "-d", str(repo), "-n", "identity_fp32,mlp", "-p", str(port), "-h", str(http)]
    if label == TRITON:
        args += ["-e", str(metrics)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{label} did not start: {r.stderr[-2000:]}")
    pid = int(r.stdout.strip().split()[-1])

    def stop() -> None:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(200):
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.killpg(pid, signal.SIGKILL)

    return Server(label, pid, f"127.0.0.1:{port}", f"127.0.0.1:{http}", stop)


def _echo() -> Server:
    from bench.bench import start_echo

    proc, url = start_echo("uvloop")
    return Server(ECHO, proc.proc.pid, url, "", proc.stop)


def peer_script(label: str) -> Path | None:
    """The peer's start script in $INFERD_PEERS, or None when it is not there."""
    peers = os.environ.get("INFERD_PEERS")
    script = Path(peers) / PEERS[label] if peers else None
    return script if script is not None and script.exists() else None


def start_server(label: str, repo: Path) -> Server:
    """The server ``label`` (one of INFERD's, ECHO or a peer whose script is there) on ``repo``."""
    if label in INFERD:
        return _inferd(label, repo)
    if label == ECHO:
        return _echo()
    script = peer_script(label)
    if script is None:
        raise RuntimeError(f"{label}: set INFERD_PEERS to the peers' folder (its {PEERS[label]})")
    return _peer(label, script, repo)


def _serves(server: Server, load: Load) -> bool:
    if server.label == ECHO:
        return load.protocol == "grpc" and load.model == "identity_fp32"
    return load.protocol != "stream" or server.label not in (KSERVE, MLSERVER)  # neither serves ModelStreamInfer


def _measure(server: Server, load: Load, round_: int) -> dict:
    from bench.bench import run_pa

    counted = server.label in WITH_STATISTICS
    count = statistics_count(server.grpc, model=load.model) if counted else (lambda: 0)
    meter = CpuMeter(server.pid, count)
    before = meter.sample()
    started = time.monotonic()
    url = server.http if load.protocol == "http" else server.grpc
    m = run_pa(server.label, load.model, url, load.concurrency, shape=SHAPES[load.model], window_ms=2000,
               stability=40, trials=6, protocol="http" if load.protocol == "http" else "grpc",
               extra=["--streaming"] if load.protocol == "stream" else [])
    row = {"label": f"{load.name}: {server.label}", "server": server.label, "load": load.name, "round": round_,
           "concurrency": load.concurrency, "batch": 1}
    if not alive(server.pid):  # nothing left to ask for its statistics: a failed measure saying so
        return {**row, "infer_per_s": 0.0, "p50_us": 0.0, "p99_us": 0.0, "cpu_us": 0.0, "cpu_by_process": {},
                "note": f"round {round_}; no figure: the server died during this run" + (f"; {m.note}" if m.note else "")}
    cpu = meter.since(before)
    n = cpu.inferences if counted else m.infer_per_s * (time.monotonic() - started)
    per = {}
    for p in cpu.processes:
        role = re.sub(r"^frontend \d+$", "frontends", p.role)
        per[role] = per.get(role, 0.0) + p.cpu_s / max(n, 1) * 1e6
    total = sum(per.values())
    return {**row, "infer_per_s": m.infer_per_s, "p50_us": m.p50_us,
            "p99_us": m.p99_us, "cpu_us": round(total, 1), "cpu_by_process": {k: round(v, 1) for k, v in per.items()},
            "note": f"round {round_}; CPU per inference {total:.0f} us ("
                    + ", ".join(f"{k} {v:.0f}" for k, v in per.items()) + ")"
                    + ("" if counted else "; inferences from perf_analyzer's rate") + (f"; {m.note}" if m.note else "")}


def repository(into: Path) -> Path:
    """The scenario's models (identity_fp32, mlp) in a Triton-layout repository at ``into``."""
    subprocess.run([sys.executable, "-m", "inferd.examples.build", "--output", str(into), "--model", "identity_fp32",
                    "--model", "mlp"], check=True, capture_output=True)
    return into


def run(quick: bool) -> dict:
    from bench.bench import OUT

    (OUT / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=OUT / "tmp"))  # python -m bench removes OUT/tmp when it ends
    repo = repository(work / "repo")
    wanted = os.environ.get("FRONT_DOOR_SERVERS")
    labels = [s.strip() for s in wanted.split(",")] if wanted else [*INFERD, ECHO, *PEERS]
    loads = [w for w in LOADS if not os.environ.get("FRONT_DOOR_LOADS")
             or w.name in os.environ["FRONT_DOOR_LOADS"].split(",")]
    notes: list[str] = []
    servers: dict[str, Server] = {}
    try:
        for label in labels:
            if label not in (*INFERD, ECHO, *PEERS):
                raise SystemExit(f"front_door: no server '{label}'; servers: {[*INFERD, ECHO, *PEERS]}")
            if label in PEERS and peer_script(label) is None:
                notes.append(f"{label} not measured: set INFERD_PEERS to the peers' folder (its {PEERS[label]})")
                continue
            servers[label] = start_server(label, repo)
        measures = []
        for r in range(int(os.environ.get("FRONT_DOOR_ROUNDS", 1 if quick else 2))):
            for load in loads:
                for label in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                    server = servers[label]
                    if not _serves(server, load):
                        continue
                    measures.append(_measure(server, load, r))
                    if not alive(server.pid):  # it crashed: said, and started again for the runs after
                        notes.append(f"{label} died during {load.name} (round {r}); started again.")
                        server.stop()
                        servers[label] = start_server(label, repo)
    finally:
        for s in servers.values():
            s.stop()
    return {"measures": measures, "notes": " ".join(notes)}


def ratios(result: dict) -> dict:
    """Per load, each server's median throughput, CPU per inference and p50 against Triton's (and
    inferd's best against KServe's and MLServer's)."""
    out: dict[str, str] = {}
    by: dict[tuple[str, str], list[dict]] = {}
    for m in result["measures"]:
        if m["infer_per_s"] > 0:
            by.setdefault((m["load"], m["server"]), []).append(m)

    def med(load: str, server: str, key: str) -> float | None:
        ms = by.get((load, server))
        return statistics.median(x[key] for x in ms) if ms else None

    for load in dict.fromkeys(m["load"] for m in result["measures"]):
        t_thr, t_cpu, t_p50 = (med(load, TRITON, k) for k in ("infer_per_s", "cpu_us", "p50_us"))
        for server in INFERD:
            thr, cpu, p50 = (med(load, server, k) for k in ("infer_per_s", "cpu_us", "p50_us"))
            if thr is None:
                continue
            line = f"{thr:,.0f}/s, {cpu:.0f} us CPU, p50 {p50:.0f} us"
            if t_thr:
                line += (f"; vs Triton: throughput {thr / t_thr:.2f}x, CPU {cpu / t_cpu:.2f}x, "
                         f"p50 {p50 - t_p50:+.0f} us")
            for peer in (KSERVE, MLSERVER):
                p_thr = med(load, peer, "infer_per_s")
                if p_thr:
                    line += f"; {thr / p_thr:.2f}x {peer.split()[0]}"
            out[f"{load}: {server}"] = line
        if t_thr:
            out[f"{load}: {TRITON}"] = f"{t_thr:,.0f}/s, {t_cpu:.0f} us CPU, p50 {t_p50:.0f} us"
        e_thr = med(load, ECHO, "infer_per_s")
        if e_thr:
            out[f"{load}: {ECHO}"] = f"{e_thr:,.0f}/s, {med(load, ECHO, 'cpu_us'):.0f} us CPU"
    return out

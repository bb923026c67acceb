"""The benchmark suite behind ``make bench``; rewrites bench/RESULTS.md.

    python -m bench [--scenario NAME ...] [--quick]

Each scenario starts what it needs (inferd on a generated repository, the
bare echo servicer), drives it with Triton's perf_analyzer over gRPC and
measures the raw runtime ceiling (the same ONNX file called directly in a
loop) in the same run, so the figures that matter are ratios taken under the
same machine load. Results of each scenario are kept in bench/results/*.json,
and RESULTS.md is rendered from all of them, so one scenario can be rerun
alone. The load client and the server share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as _dt
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from bench.compare_clients import PERF_ANALYZER  # found above a worktree too

ROOT = Path(__file__).resolve().parent.parent
PERF = ROOT / "bench"
RESULTS_DIR = PERF / "results"
OUT = PERF / "out"


# -- processes ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, args: list[str], ready: str, name: str, timeout: float = 300) -> None:
        self.log = OUT / f"{name}.log"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.log, "w")
        self.proc = subprocess.Popen(args, stdout=self._fh, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while ready not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._fh.close()


def pinned(cpus: str | None) -> list[str]:
    """The command prefix that runs a process on ``cpus`` only (None: anywhere)."""
    return ["taskset", "-c", cpus] if cpus is not None else []


def can_pin() -> bool:
    """Two cores or more and taskset: the server and the client can each get their own."""
    return (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None


def start_inferd(repo: Path, http_port: int = 0, cpus: str | None = None) -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([*pinned(cpus), sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                 "--http-port", str(http_port), "--metrics-port", "0",
                 "--allow-client-shm"],  # the protocols scenario runs perf_analyzer --shared-memory system
                "inferd: ready", "inferd")
    return proc, f"127.0.0.1:{port}"


def start_echo(loop: str = "asyncio") -> tuple[Proc, str]:
    port = free_port()
    proc = Proc([sys.executable, "-m", "bench.echo_server", "--port", str(port), "--event-loop", loop],
                "echo server on", f"echo-{loop}")
    return proc, f"127.0.0.1:{port}"


# -- measurements ------------------------------------------------------------


@dataclass
class Measure:
    label: str
    concurrency: int
    batch: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    rows_per_s: float = 0.0
    note: str = ""


def perf_analyzer_available() -> bool:
    if not PERF_ANALYZER.exists():
        return False
    try:
        r = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


# A run_pa measure's note when perf_analyzer waited for answers that never came (run_perf_analyzer).
STUCK = "no figure: perf_analyzer waited for answers that never came (killed)"


def run_pa(label: str, model: str, url: str, concurrency: int, *, shape: str | None = None,
           batch: int = 1, window_ms: int = 2000, extra: list[str] | None = None,
           protocol: str = "grpc", cpus: str | None = None, trials: int = 8, stability: int = 15) -> Measure:
    """One perf_analyzer run at one concurrency; medians of its stable windows (at most ``trials``;
    ``stability``: perf_analyzer's percentage; a loaded machine needs a wider one to give a figure at all)."""
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = Path(tmp) / "pa.csv"
        args = [*pinned(cpus), str(PERF_ANALYZER), "-m", model, "-u", url, "-i", protocol,
                "--concurrency-range", str(concurrency), "-b", str(batch), "-p", str(window_ms),
                "--max-trials", str(trials), "-s", str(stability), "-f", str(csv_path)]
        if shape:
            args += ["--shape", shape]
        args += extra or []
        note = ""
        for attempt in range(2):
            r = run_perf_analyzer(args, timeout=60 + 5 * trials * window_ms / 1000)
            if r is None:  # stuck, not slow: a failed measure saying so, and the scenario goes on
                return Measure(label, concurrency, batch, 0.0, 0.0, 0.0, note=STUCK)
            if r.returncode == 0 and csv_path.exists():
                break
            note = "unstable: " + (r.stdout + r.stderr).strip().splitlines()[-1][:120] if (r.stdout + r.stderr).strip() else "failed"
            args[args.index("-s") + 1] = str(max(30, stability))
        else:
            return Measure(label, concurrency, batch, 0.0, 0.0, 0.0, note=note)
        with open(csv_path) as fh:
            row = next(csv.DictReader(fh))
    ips = float(row["Inferences/Second"])
    return Measure(label, concurrency, batch, ips, float(row["p50 latency"]), float(row["p99 latency"]),
                   rows_per_s=ips * batch if batch > 1 else ips, note="")


def run_perf_analyzer(args: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """perf_analyzer's run, or None when it ran past ``timeout`` (then it is killed, with whatever it
    started: ``PERF_ANALYZER`` may be a wrapper). Past its windows a run is stuck, not slow: perf_analyzer
    waits for ever on a request the server will never answer (Triton 2.51 crashed under gRPC streams
    here: bench/RESULTS.md front_door_streams)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if proc.returncode is None:  # past the timeout, or the benchmark interrupted
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def raw_ceiling(model_file: Path, feeds: dict[str, np.ndarray], seconds: float = 3.0, threads: int | None = None) -> float:
    """Executions per second of the ONNX session called directly in a loop."""
    return raw_run(model_file, feeds, seconds, threads)[0]


def raw_run(model_file: Path, feeds: dict[str, np.ndarray], seconds: float = 3.0,
            threads: int | None = None, spinning: bool = True) -> tuple[float, float]:
    """(executions per second, CPU seconds per execution) of the ONNX session called directly in a
    loop; the CPU is this process's (every thread: the runtime's pool too) over the timed loop.
    ``spinning=False``: the pool threads block between runs, as a served session's do
    (inferd/backends/onnxruntime.py), so its CPU is what a served execution costs."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or (os.cpu_count() or 1)
    options.inter_op_num_threads = 1
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(model_file), sess_options=options, providers=["CPUExecutionProvider"])
    for _ in range(3):
        session.run(None, feeds)
    runs, t0, cpu0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        session.run(None, feeds)
        runs += 1
    return runs / (time.perf_counter() - t0), (time.process_time() - cpu0) / runs


# -- repository ---------------------------------------------------------------


def bench_repository(big: bool) -> Path:
    from inferd.examples import build as b
    from inferd.examples import onnx_models as om

    repo = OUT / "repo"
    specs = [s for s in b.MODELS if s.name in ("identity_fp32", "mlp", "mlp_nobatch", "simple", "simple_sequence")]
    if big:
        io = ([("INPUT0", "TYPE_FP32", [2048])], [("OUTPUT0", "TYPE_FP32", [2048])])
        big_file = b.onnx_file(lambda: om.mlp(2048, 8192, 2048, seed=1))
        specs += [
            b.ModelSpec("mlp_big", b.triton_config("mlp_big", *io, max_batch_size=64, dynamic_batching=""),
                        {"1/model.onnx": big_file}),
            b.ModelSpec("mlp_big_nobatch", b.triton_config("mlp_big_nobatch", *io, max_batch_size=64),
                        {"1/model.onnx": big_file}),
        ]
    b.build_repository(repo, models=specs, log=None)
    return repo


# -- scenarios ------------------------------------------------------------------


def scenario_request_path(quick: bool) -> dict:
    """Identity and small MLP: the request path, against a bare echo servicer."""
    repo = bench_repository(big=False)
    levels = [1, 16] if quick else [1, 4, 16, 64]
    out: dict = {"measures": [], "ceilings": {}}
    server, url = start_inferd(repo)
    echo, echo_url = start_echo()
    try:
        for c in levels:
            out["measures"].append(asdict(run_pa("echo servicer (identity)", "identity_fp32", echo_url, c, shape="INPUT0:16")))
            out["measures"].append(asdict(run_pa("inferd identity_fp32", "identity_fp32", url, c, shape="INPUT0:16")))
            out["measures"].append(asdict(run_pa("inferd mlp (batching)", "mlp", url, c)))
            out["measures"].append(asdict(run_pa("inferd mlp_nobatch", "mlp_nobatch", url, c)))
    finally:
        server.stop()
        echo.stop()
    x16 = np.zeros((1, 16), np.float32)
    x256 = np.zeros((1, 256), np.float32)
    out["ceilings"]["identity_fp32 raw onnxruntime, batch 1"] = raw_ceiling(repo / "identity_fp32/1/model.onnx", {"INPUT0": x16})
    out["ceilings"]["mlp raw onnxruntime, batch 1"] = raw_ceiling(repo / "mlp/1/model.onnx", {"INPUT0": x256})
    return out


def scenario_compute_bound(quick: bool) -> dict:
    """FP32 MLP 2048 -> 8192 -> 2048: batching off vs on vs the raw batch-64 ceiling."""
    repo = bench_repository(big=True)
    levels = [1, 16, 128] if quick else [1, 16, 64, 128]
    out: dict = {"measures": [], "ceilings": {}}
    x1 = np.random.default_rng(0).standard_normal((1, 2048), dtype=np.float32)
    x64 = np.random.default_rng(0).standard_normal((64, 2048), dtype=np.float32)
    model = repo / "mlp_big/1/model.onnx"
    out["ceilings"]["raw onnxruntime rows/s, batch 1"] = raw_ceiling(model, {"INPUT0": x1})
    out["ceilings"]["raw onnxruntime rows/s, batch 64"] = 64 * raw_ceiling(model, {"INPUT0": x64})
    server, url = start_inferd(repo)
    try:
        for c in levels:
            out["measures"].append(asdict(run_pa("batching off (mlp_big_nobatch)", "mlp_big_nobatch", url, c, window_ms=4000)))
            out["measures"].append(asdict(run_pa("batching on (mlp_big)", "mlp_big", url, c, window_ms=4000)))
    finally:
        server.stop()
    return out


ENSEMBLE_MODELS = ("ens_scale", "ens_mlp", "ens_relu", "mlp_fused", "ensemble_mlp")
ENSEMBLE_LABEL, FUSED_LABEL = "ensemble_mlp (ensemble)", "mlp_fused (one model)"
SEQUENCE_LABEL = "3 calls one after another by a client"
ENSEMBLE_ROUNDS = 3
# (label suffix, server cores, perf_analyzer cores): the cores shared as in every scenario, then
# the server on core 0 and perf_analyzer on core 1, so the client's work stops stretching the server's.
ENSEMBLE_SETUPS = (("", None, None), (" [pinned]", "0", "1"))


def server_time_us(url: str) -> dict[str, tuple[int, int, int]]:
    """Per model, from ModelStatistics: successful requests, their total in-server
    duration and their total compute-infer duration (the runtime's own call), in us."""
    import grpc

    from inferd._proto import grpc_service_pb2 as pb
    from inferd._proto import grpc_service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(url) as channel:
        reply = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(pb.ModelStatisticsRequest())
    return {m.name: (m.inference_stats.success.count, m.inference_stats.success.ns // 1000,
                     m.inference_stats.compute_infer.ns // 1000) for m in reply.model_stats}


def scenario_ensemble(quick: bool) -> dict:
    """scale -> mlp -> relu (FP32 256 -> 1024 -> 256), three ways: the ensemble_mlp ensemble
    (three batching ONNX models), mlp_fused (the same graph as one ONNX model), and the three
    models called one after another by a client (inferd's own gRPC stubs in Python, each
    output's bytes forwarded as the next input; perf_analyzer cannot chain calls). The client
    figures include a Python client's cost on the shared cores; perf_analyzer's are C++.
    The ensemble and the fused model are measured in alternating rounds (the order flips each
    round) and compared round by round, since one measurement swings by hundreds of us here;
    the in-server time per request of each model (ModelStatistics) is kept for the c=1 rounds.
    Then again with the server pinned to core 0 and perf_analyzer to core 1 (taskset): "[pinned]"."""
    from inferd.examples import build as b
    from bench.sequential_client import run_sequences

    repo = OUT / "repo_ensemble"
    b.build_repository(repo, models=[s for s in b.MODELS if s.name in ENSEMBLE_MODELS], log=None)
    window_ms = 2000 if quick else 3000
    out: dict = {"measures": [], "ceilings": {}, "server_us": {}}
    for suffix, server_cpus, client_cpus in ENSEMBLE_SETUPS if can_pin() else ENSEMBLE_SETUPS[:1]:
        pair = [(ENSEMBLE_LABEL + suffix, "ensemble_mlp"), (FUSED_LABEL + suffix, "mlp_fused")]
        server, url = start_inferd(repo, cpus=server_cpus)
        try:
            for c in (1, 16):
                for r in range(ENSEMBLE_ROUNDS):
                    for label, model in (pair if r % 2 == 0 else pair[::-1]):
                        before = server_time_us(url)
                        m = run_pa(label, model, url, c, window_ms=window_ms, cpus=client_cpus)
                        after = server_time_us(url)
                        m.note = (m.note + "; " if m.note else "") + f"round {r + 1}"
                        out["measures"].append(asdict(m))
                        if c == 1:
                            for name, (n, us, infer_us) in after.items():
                                n0, us0, infer0 = before.get(name, (0, 0, 0))
                                if n > n0:
                                    out["server_us"].setdefault(name + suffix, []).append(
                                        [round((us - us0) / (n - n0)), round((infer_us - infer0) / (n - n0))])
                if not suffix:
                    seq = asyncio.run(run_sequences(url, ["ens_scale", "ens_mlp", "ens_relu"], c,
                                                    seconds=3 * window_ms / 1000))
                    out["measures"].append(asdict(Measure(SEQUENCE_LABEL, c, 1, seq.sequences_per_s, seq.p50_us,
                                                          seq.p99_us, note=f"python client, {seq.count} sequences")))
        finally:
            server.stop()
    x = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)
    out["ceilings"]["mlp_fused raw onnxruntime, batch 1"] = raw_ceiling(repo / "mlp_fused/1/model.onnx", {"INPUT0": x})
    return out


def scenario_protocols(quick: bool) -> dict:
    """mlp over gRPC, HTTP/REST (JSON header + binary data) and gRPC with system shared memory,
    and perf_analyzer -m simple --concurrency-range 1:8 (the README's newcomer check)."""
    repo = bench_repository(big=False)
    http_port = free_port()
    server, url = start_inferd(repo, http_port=http_port)
    http_url = f"127.0.0.1:{http_port}"
    out: dict = {"measures": [], "ceilings": {}}
    try:
        for c in (1, 16):
            out["measures"].append(asdict(run_pa("mlp gRPC", "mlp", url, c)))
            out["measures"].append(asdict(run_pa("mlp HTTP", "mlp", http_url, c, protocol="http")))
            out["measures"].append(asdict(run_pa("mlp gRPC --shared-memory system", "mlp", url, c,
                                                 extra=["--shared-memory", "system"])))
        for c in (1, 8):
            out["measures"].append(asdict(run_pa("simple (add/sub INT32) gRPC", "simple", url, c)))
    finally:
        server.stop()
    return out


def scenario_sequence(quick: bool) -> dict:
    """simple_sequence (the accumulator, implicit state) with --sequence-length 10, unary and --streaming."""
    repo = bench_repository(big=False)
    server, url = start_inferd(repo)
    out: dict = {"measures": [], "ceilings": {}}
    try:
        for c in (1, 4):
            out["measures"].append(asdict(run_pa("simple_sequence unary", "simple_sequence", url, c,
                                                 extra=["--sequence-length", "10"])))
            out["measures"].append(asdict(run_pa("simple_sequence --streaming", "simple_sequence", url, c,
                                                 extra=["--sequence-length", "10", "--streaming"])))
    finally:
        server.stop()
    return out


SCENARIOS = {
    "request_path": scenario_request_path,
    "compute_bound": scenario_compute_bound,
    "ensemble": scenario_ensemble,
    "protocols": scenario_protocols,
    "sequence": scenario_sequence,
}
# Scenarios in their own modules (bench/scenarios/<name>.py): each defines ``run(quick) -> dict``
# (its docstring is the scenario's description) and may define ``ratios(result) -> dict``.
MODULE_SCENARIOS = sorted(p.stem for p in (PERF / "scenarios").glob("*.py") if not p.stem.startswith("_"))


def _scenario_module(name: str):  # type: ignore[no-untyped-def]
    import importlib

    return importlib.import_module(f"bench.scenarios.{name}")


# -- report --------------------------------------------------------------------


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores, {cpu}, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def render() -> str:
    lines = ["# inferd benchmark results", "",
             "Rendered by `make bench` (`python -m bench`) from bench/results/*.json.",
             "perf_analyzer (Triton's, gRPC) and the server share the machine's cores, so every figure",
             "includes the client's own CPU use; the ratios, taken in one run, are what to compare.", ""]
    for path in sorted(RESULTS_DIR.glob("*.json")):
        data = json.loads(path.read_text())
        lines += [f"## {data['scenario']}", "", data["doc"], "",
                  f"- when: {data['when']}", f"- machine: {data['machine']}",
                  f"- command: `{data['command']}`", ""]
        for k, v in data["result"].get("ceilings", {}).items():
            lines.append(f"- {k}: {v:,.0f}/s")
        if data["result"]["measures"]:
            lines += ["", "| what | concurrency | batch | infer/s | p50 us | p99 us | note |",
                      "|---|---:|---:|---:|---:|---:|---|"]
        for m in data["result"]["measures"]:
            lines.append(f"| {m['label']} | {m['concurrency']} | {m['batch']} | {m['infer_per_s']:,.0f} | "
                         f"{m['p50_us']:,.0f} | {m['p99_us']:,.0f} | {m['note']} |")
        for k, v in data["result"].get("ratios", {}).items():
            lines.append(f"\n- **{k}**: {v}")
        extra = data["result"].get("notes")
        if extra:
            lines += ["", extra]
        lines.append("")
    return "\n".join(lines)


def add_ratios(name: str, result: dict) -> None:
    def find(label: str, c: int) -> dict | None:
        for m in result["measures"]:
            if m["label"] == label and m["concurrency"] == c:
                return m
        return None

    ratios = {}
    if name in MODULE_SCENARIOS:
        module = _scenario_module(name)
        if hasattr(module, "ratios"):
            ratios.update(module.ratios(result))
    if name == "request_path":
        for c in sorted({m["concurrency"] for m in result["measures"]}):
            e, i = find("echo servicer (identity)", c), find("inferd identity_fp32", c)
            if e and i and e["infer_per_s"]:
                ratios[f"identity c={c}: inferd / echo throughput"] = (
                    f"{i['infer_per_s'] / e['infer_per_s']:.2f}x (p50 {i['p50_us'] - e['p50_us']:+.0f} us vs echo)")
    if name == "compute_bound":
        ceiling = result["ceilings"]["raw onnxruntime rows/s, batch 64"]
        for c in sorted({m["concurrency"] for m in result["measures"]}):
            off, on = find("batching off (mlp_big_nobatch)", c), find("batching on (mlp_big)", c)
            if off and on and off["infer_per_s"]:
                ratios[f"c={c}: batching on / off"] = f"{on['infer_per_s'] / off['infer_per_s']:.2f}x"
                ratios[f"c={c}: batching on / raw batch-64 ceiling"] = f"{on['infer_per_s'] / ceiling:.2f}x"
    if name == "ensemble":
        def ok(m: dict) -> bool:
            return m["infer_per_s"] > 0 and m["p50_us"] > 0  # not failed or unstable

        def rounds(label: str, c: int) -> list[dict]:
            return [m for m in result["measures"] if m["label"] == label and m["concurrency"] == c]

        def paired(c: int, suffix: str = "") -> list[tuple[dict, dict]]:
            return [(e, f) for e, f in zip(rounds(ENSEMBLE_LABEL + suffix, c), rounds(FUSED_LABEL + suffix, c))
                    if ok(e) and ok(f)]

        na = "n/a (every measurement failed or was unstable)"
        for suffix, _, _ in ENSEMBLE_SETUPS:
            if not rounds(ENSEMBLE_LABEL + suffix, 1):
                continue  # not measured here (no taskset, one core)
            diffs = [e["p50_us"] - f["p50_us"] for e, f in paired(1, suffix)]
            ratios[f"c=1: ensemble p50 - fused p50, median of rounds{suffix}"] = (
                f"{float(np.median(diffs)):+.0f} us (rounds: {', '.join(f'{d:+.0f}' for d in diffs)})" if diffs else na)
            shares = [e["infer_per_s"] / f["infer_per_s"] for e, f in paired(16, suffix)]
            ratios[f"c=16: ensemble / fused throughput, median of rounds{suffix}"] = (
                f"{float(np.median(shares)):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in shares)})" if shares else na)
        seq1, seq16 = find(SEQUENCE_LABEL, 1), find(SEQUENCE_LABEL, 16)
        e1 = [e["p50_us"] for e, _ in paired(1)]
        e16 = [e["infer_per_s"] for e, _ in paired(16)]
        if seq1 and seq1["p50_us"] and e1:
            ratios["c=1: client's 3 calls p50 - ensemble p50"] = f"{seq1['p50_us'] - float(np.median(e1)):+.0f} us"
        if seq16 and seq16["infer_per_s"] and e16:
            ratios["c=16: ensemble / client's 3 calls throughput"] = f"{float(np.median(e16)) / seq16['infer_per_s']:.2f}x"
        for model, values in sorted(result.get("server_us", {}).items()):
            total, infer = (float(np.median([v[i] for v in values])) for i in (0, 1))
            runtime = f", of which the runtime's call {infer:.0f} us" if infer else ""
            ratios[f"c=1: in-server time per request, {model}"] = (
                f"{total:.0f} us{runtime} (median of rounds: {', '.join(str(v[0]) for v in values)})")
    result["ratios"] = ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", action="append", choices=sorted([*SCENARIOS, *MODULE_SCENARIOS]),
                        help="default: all")
    parser.add_argument("--quick", action="store_true", help="fewer load levels")
    parser.add_argument("--render-only", action="store_true", help="rewrite RESULTS.md from bench/results")
    args = parser.parse_args(argv)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    if not args.render_only:
        chosen = args.scenario or [*SCENARIOS, *MODULE_SCENARIOS]
        # A module scenario that drives its own client says so with NEEDS_PERF_ANALYZER = False.
        needs = [n for n in chosen if n in SCENARIOS or getattr(_scenario_module(n), "NEEDS_PERF_ANALYZER", True)]
        if needs and not perf_analyzer_available():
            print("perf_analyzer cannot be installed or run here; nothing measured", file=sys.stderr)
            return 1
        for name in chosen:
            fn = SCENARIOS[name] if name in SCENARIOS else _scenario_module(name).run
            print(f"== {name}", flush=True)
            result = fn(args.quick)
            add_ratios(name, result)
            data = {"scenario": name, "doc": ((fn.__doc__ if name in SCENARIOS else _scenario_module(name).__doc__) or "").strip(), "result": result,
                    "when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    "machine": machine(),
                    "command": "python -m bench --scenario " + name + (" --quick" if args.quick else "")}
            (RESULTS_DIR / f"{name}.json").write_text(json.dumps(data, indent=1))
            for k, v in result.get("ratios", {}).items():
                print(f"  {k}: {v}")
    (PERF / "RESULTS.md").write_text(render())
    print(f"wrote {PERF / 'RESULTS.md'}")
    shutil.rmtree(OUT / "tmp", ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

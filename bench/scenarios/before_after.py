"""A change's cost on the request path, measured in one run: inferd from this tree ("after") against
inferd from another commit ("before": the revision in INFERD_BEFORE, HEAD~1 by default, unpacked with
``git archive`` and run from there with the same interpreter and packages), each in one process
(--frontend-workers 0) and in its default mode (a core and frontend workers), on one repository:
identity_fp32 (16 floats, dynamic_batching {}) over gRPC at concurrency 1 and 16, mlp_fused (FP32
256 -> 1024 -> 256, batching) at 16, and ensemble_mlp (scale -> mlp -> relu, each step a batching
ONNX model) at concurrency 1. Every server is up for the
whole run; the rounds alternate before and after, their order reversed each round. Per inference:
the server tree's CPU (/proc utime+stime, bench/proc_cpu.py; the ensemble's requests counted once,
not its steps), throughput and p50 (perf_analyzer on the same two cores). The ratios are medians over
the rounds of after / before, each round's pair measured back to back. A narrower run, with more rounds:
BEFORE_AFTER_MODES ("one process", "default mode"; comma-separated), BEFORE_AFTER_LOADS ("name:concurrency",
comma-separated) and BEFORE_AFTER_ROUNDS (default 4; 2 with --quick)."""

from __future__ import annotations

import io
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import NamedTuple

from bench.proc_cpu import CpuMeter, statistics_count

ROOT = Path(__file__).resolve().parent.parent.parent
SIDES = ("before", "after")
MODES = {"one process": ["--frontend-workers", "0"], "default mode": []}


class Load(NamedTuple):
    name: str
    model: str
    concurrency: int
    shape: str | None


LOADS = (Load("identity", "identity_fp32", 1, "INPUT0:16"), Load("identity", "identity_fp32", 16, "INPUT0:16"),
         Load("mlp_fused", "mlp_fused", 16, None), Load("ensemble_mlp", "ensemble_mlp", 1, None))


class Server(NamedTuple):
    side: str
    mode: str
    proc: object  # bench.bench.Proc
    url: str


def before_tree(into: Path) -> tuple[Path, str]:
    """The "before" revision's files, unpacked under ``into``, and the commit they are."""
    revision = os.environ.get("INFERD_BEFORE", "HEAD~1")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", revision], check=True,
                            capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit], check=True,
                             capture_output=True).stdout
    tree = into / f"before-{commit}"
    tree.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree, commit


def _start(side: str, tree: Path, mode: str, repo: Path) -> Server:
    from bench.bench import Proc, free_port

    port = free_port()
    # env execs the interpreter in place: the Proc's pid is the server's.
    proc = Proc(["env", f"PYTHONPATH={tree}", sys.executable, "-m", "inferd.cli", "serve", "--model-repository",
                 str(repo), "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                 "--http-port", "0", "--metrics-port", "0", *MODES[mode]], "inferd: ready",
                re.sub(r"[^a-z0-9]+", "_", f"{side} {mode}"))
    return Server(side, mode, proc, f"127.0.0.1:{port}")


def _measure(server: Server, load: Load, round_: int) -> dict:
    from bench.bench import run_pa

    meter = CpuMeter(server.proc.proc.pid, statistics_count(server.url, model=load.model))  # type: ignore[attr-defined]
    before = meter.sample()
    m = run_pa(f"{server.side} {server.mode}", load.model, server.url, load.concurrency, shape=load.shape,
               window_ms=2000, stability=40, trials=6)
    cpu = meter.since(before)
    core = sum(p.per_inference_us for p in cpu.processes if p.role == "core")
    return {"label": f"{server.mode}, {load.name}: {server.side}", "side": server.side, "mode": server.mode,
            "load": load.name, "round": round_, "concurrency": load.concurrency, "batch": 1,
            "infer_per_s": m.infer_per_s, "p50_us": m.p50_us, "p99_us": m.p99_us,
            "cpu_us": round(cpu.per_inference_us(), 1), "core_us": round(core, 1),
            "note": f"round {round_}; server CPU {cpu.per_inference_us():.0f} us per inference"
                    + (f", the core's {core:.0f}" if server.mode == "default mode" else "")}


def run(quick: bool) -> dict:
    from bench.bench import OUT
    from bench.request_counts import repository

    (OUT / "tmp").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=OUT / "tmp"))  # python -m bench removes OUT/tmp when it ends
    repo = repository(work / "repo", ensemble=True)
    tree, commit = before_tree(work)
    trees = {"before": tree, "after": ROOT}
    modes, loads = _chosen()
    servers = [_start(side, trees[side], mode, repo) for mode in modes for side in SIDES]
    measures: list[dict] = []
    try:
        for r in range(int(os.environ.get("BEFORE_AFTER_ROUNDS", 2 if quick else 4))):
            for load in loads:
                for mode in modes:
                    pair = [s for s in servers if s.mode == mode]
                    for server in (pair if r % 2 == 0 else pair[::-1]):
                        measures.append(_measure(server, load, r))
    finally:
        for s in servers:
            s.proc.stop()  # type: ignore[attr-defined]
    after = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True).stdout.strip()
    if subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "inferd"], capture_output=True,
                      text=True).stdout.strip():
        after += " with uncommitted changes"
    return {"measures": measures, "before": commit, "after": after, "notes": f"before: commit {commit}; after: {after}."}


def _chosen() -> tuple[list[str], list[Load]]:
    """The modes and loads this run measures: all, or those the environment names."""
    modes = [m.strip() for m in os.environ.get("BEFORE_AFTER_MODES", ",".join(MODES)).split(",")]
    wanted = os.environ.get("BEFORE_AFTER_LOADS")
    loads = [w for w in LOADS if wanted is None or f"{w.name}:{w.concurrency}" in wanted.split(",")]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not loads:
        raise SystemExit(f"before_after: no such mode {unknown} or no load in {wanted!r}; modes: {list(MODES)}, "
                         f"loads: {[f'{w.name}:{w.concurrency}' for w in LOADS]}")
    return modes, loads


def ratios(result: dict) -> dict:
    out = {}
    measures = result["measures"]
    keys = sorted({(m["mode"], m["load"], m["concurrency"]) for m in measures})
    for mode, load, c in keys:
        rounds: dict[int, dict[str, dict]] = {}
        for m in measures:
            if (m["mode"], m["load"], m["concurrency"]) == (mode, load, c):
                rounds.setdefault(m["round"], {})[m["side"]] = m
        pairs = [(p["before"], p["after"]) for p in rounds.values() if len(p) == 2
                 and p["before"]["infer_per_s"] > 0 and p["after"]["infer_per_s"] > 0]
        if not pairs:
            continue
        cpu = [a["cpu_us"] / b["cpu_us"] for b, a in pairs]
        thr = [a["infer_per_s"] / b["infer_per_s"] for b, a in pairs]
        p50 = [a["p50_us"] - b["p50_us"] for b, a in pairs]
        cb = statistics.median(b["cpu_us"] for b, _ in pairs)
        ca = statistics.median(a["cpu_us"] for _, a in pairs)
        out[f"{mode}, {load} c={c}: CPU per inference after / before"] = (
            f"{statistics.median(cpu):.2f}x ({ca:.0f} vs {cb:.0f} us; rounds: {', '.join(f'{x:.2f}' for x in cpu)})")
        if mode == "default mode":
            kb = statistics.median(b["core_us"] for b, _ in pairs)
            ka = statistics.median(a["core_us"] for _, a in pairs)
            out[f"{mode}, {load} c={c}: the core's CPU per inference after / before"] = (
                f"{ka / kb:.2f}x ({ka:.0f} vs {kb:.0f} us)")
        out[f"{mode}, {load} c={c}: throughput after / before"] = (
            f"{statistics.median(thr):.2f}x (rounds: {', '.join(f'{x:.2f}' for x in thr)}); "
            f"p50 {statistics.median(p50):+.0f} us")
    return out

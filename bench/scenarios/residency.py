"""Load on demand under a memory budget (issue 28): 50 table models (inferd/examples/many_models.py,
2 MB of table each), a Zipf stream over them (s = 1.1, the same seeded stream in every run), one request
at a time from one tritonclient gRPC client. Run 1: ``--model-control-mode on_demand`` with
``--model-memory-budget`` ten models' footprints (measured first by a calibration server: the median
footprint of three models x 10). Run 2: ``--model-control-mode explicit --load-model '*'``, every model
loaded, the cost of the feature's absence. Before each request the client reads the repository index
(not timed), so each request is known warm (its model READY) or cold; with one request at a time this is
exact. Reported: hit rate, cold-start latency p50/p99 (the whole request: its load and its inference),
warm p99 against the every-model-loaded run's p99, CPU per inference (bench/proc_cpu.py, the server's
processes, over the client's count), and the core's RSS after every request (bench/results/residency.png).
The client and the server share the 2 cores, and the machine was shared with other engineers' builds and
tests while this ran."""

from __future__ import annotations

import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from bench.bench import OUT, RESULTS_DIR, Proc, free_port
from bench.proc_cpu import CpuMeter
from inferd.examples.many_models import build_many, expected
from inferd.repository.footprint import rss_bytes

NEEDS_PERF_ANALYZER = False
MODELS = 50
FLOATS = 500_000
RESIDENT = 10  # the budget holds this many models' footprints
MiB = 2**20


def _serve(repo: Path, extra: list[str], name: str) -> tuple[Proc, str, str]:
    grpc_port, metrics_port = free_port(), free_port()
    proc = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", "0",
                 "--metrics-address", "127.0.0.1", "--metrics-port", str(metrics_port), *extra],
                "inferd: ready", name)
    return proc, f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{metrics_port}/metrics"


def _metric(url: str, family: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=30) as r:
        text = r.read().decode()
    return {m.group(1): float(m.group(2))
            for m in re.finditer(rf'^{family}\{{model="([^"]*)"\}} (\S+)$', text, re.MULTILINE)}


def _ask(client, model: str, i: int) -> float:  # type: ignore[no-untyped-def]
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("I", [1], "INT64")
    x.set_data_from_numpy(np.array([i], dtype=np.int64))
    return float(client.infer(model, [x], client_timeout=120).as_numpy("Y")[0])


def _calibrate(repo: Path) -> int:
    """The median footprint of three models, measured by an on_demand server without a budget."""
    import tritonclient.grpc as grpcclient

    proc, url, metrics = _serve(repo, ["--model-control-mode", "on_demand", "--frontend-workers", "0"],
                                "inferd_residency_calibrate")
    try:
        client = grpcclient.InferenceServerClient(url)
        for i in range(4):  # the first pays the runtime's one-time set-up (not counted as its footprint)
            _ask(client, f"m{i:02d}", 0)
        client.close()
        sizes = sorted(_metric(metrics, "inferd_model_footprint_bytes").values())
    finally:
        proc.stop()
    return int(sizes[len(sizes) // 2])


def _stream(n: int) -> np.ndarray:
    rng = np.random.default_rng(1100)
    p = 1.0 / np.arange(1, MODELS + 1) ** 1.1
    return rng.permutation(MODELS)[rng.choice(MODELS, size=n, p=p / p.sum())]  # which model is hot: random


def _run(repo: Path, extra: list[str], label: str, stream: np.ndarray) -> dict:
    import tritonclient.grpc as grpcclient

    proc, url, metrics = _serve(repo, extra, f"inferd_residency_{label.split()[0]}")
    try:
        client = grpcclient.InferenceServerClient(url)
        done = [0]
        meter = CpuMeter(proc.proc.pid, lambda: done[0])
        start_rss = rss_bytes(proc.proc.pid)
        warm: list[float] = []
        cold: list[float] = []
        rss: list[tuple[float, float]] = []
        wrong = 0
        before = meter.sample()
        t0 = time.perf_counter()
        for k, m in enumerate(stream):
            name = f"m{m:02d}"
            ready = {e.name for e in client.get_model_repository_index().models if e.state == "READY"}
            t = time.perf_counter()
            got = _ask(client, name, k % FLOATS)
            (warm if name in ready else cold).append((time.perf_counter() - t) * 1e6)
            wrong += got != expected(int(m), k % FLOATS)
            done[0] += 1
            rss.append((time.perf_counter() - t0, rss_bytes(proc.proc.pid) / MiB))
            if k == 0:  # the runtime is set up now (the first load pays it): the base the budget adds to
                start_rss = rss_bytes(proc.proc.pid)
        cpu = meter.since(before)
        client.close()
        counters = {f: sum(_metric(metrics, f).values()) for f in (
            "inferd_model_loads_total", "inferd_model_evictions_total", "inferd_model_residency_hits_total",
            "inferd_model_residency_misses_total", "inferd_model_cold_start_seconds_total")}
        used = _metric(metrics, "inferd_model_footprint_bytes")
    finally:
        proc.stop()
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else 0.0  # noqa: E731
    return {"label": label, "options": extra, "requests": len(stream), "wrong": wrong,
            "warm": len(warm), "cold": len(cold), "hit_rate": len(warm) / len(stream),
            "warm_p50_us": pct(warm, 50), "warm_p99_us": pct(warm, 99),
            "cold_p50_us": pct(cold, 50), "cold_p99_us": pct(cold, 99),
            "cpu_per_inference_us": cpu.per_inference_us(), "seconds": cpu.seconds,
            "start_rss_mib": start_rss / MiB, "peak_rss_mib": max(r for _, r in rss),
            "rss": rss[:: max(1, len(rss) // 400)], "counters": counters,
            "footprints_mib": sum(used.values()) / MiB}


def _plot(details: list[dict], budget: int, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5))
    for d in details:
        ax.plot([t for t, _ in d["rss"]], [r for _, r in d["rss"]], label=d["label"])
    on_demand = details[0]
    ax.axhline(on_demand["start_rss_mib"] + budget / MiB, color="grey", linestyle="--",
               label="on_demand: RSS after the first load + budget")
    ax.set_xlabel("seconds")
    ax.set_ylabel("core RSS (MiB)")
    ax.set_ylim(0, max(d["peak_rss_mib"] for d in details) * 1.2)
    ax.legend()
    ax.set_title(f"{MODELS} models, Zipf s=1.1, budget {budget / MiB:.0f} MiB ({RESIDENT} models); shared 2-core machine")
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


def run(quick: bool) -> dict:
    repo = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None)) / "repo"
    build_many(repo, MODELS, FLOATS)
    footprint = _calibrate(repo)
    budget = footprint * RESIDENT
    stream = _stream(600 if quick else 2000)
    details = [
        _run(repo, ["--model-control-mode", "on_demand", "--model-memory-budget", str(budget)],
             f"on_demand, budget {budget / MiB:.0f} MiB", stream),
        _run(repo, ["--model-control-mode", "explicit", "--load-model", "*"], "explicit, all 50 loaded", stream),
    ]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _plot(details, budget, RESULTS_DIR / "residency.png")
    measures = [{"label": d["label"] + (" (warm)" if i else ""), "concurrency": 1, "batch": 1,
                 "infer_per_s": d["requests"] / d["seconds"], "p50_us": d["warm_p50_us"], "p99_us": d["warm_p99_us"],
                 "note": (f"hit rate {d['hit_rate']:.1%}; cold p50 {d['cold_p50_us'] / 1e3:.1f} ms, p99 "
                          f"{d['cold_p99_us'] / 1e3:.1f} ms; CPU {d['cpu_per_inference_us']:.0f} us/inference; "
                          f"RSS {d['start_rss_mib']:.0f} -> peak {d['peak_rss_mib']:.0f} MiB; wrong {d['wrong']}")}
                for i, d in enumerate(details)]
    for d in details:
        d.pop("rss")  # in the PNG
    return {"measures": measures, "details": details, "footprint_bytes": footprint, "budget_bytes": budget,
            "notes": "RSS over time: bench/results/residency.png"}


def ratios(result: dict) -> dict:
    demand, loaded = result["details"]
    return {
        "hit rate (on_demand)": f"{demand['hit_rate']:.1%} of {demand['requests']} requests",
        "cold start p50 / p99": f"{demand['cold_p50_us'] / 1e3:.1f} / {demand['cold_p99_us'] / 1e3:.1f} ms",
        "warm p99: on_demand / all loaded": (f"{demand['warm_p99_us'] / 1e3:.2f} / {loaded['warm_p99_us'] / 1e3:.2f} ms"
                                             f" = {demand['warm_p99_us'] / max(loaded['warm_p99_us'], 1):.2f}x"),
        "warm p50: on_demand / all loaded": (f"{demand['warm_p50_us'] / 1e3:.2f} / {loaded['warm_p50_us'] / 1e3:.2f} ms"
                                             f" = {demand['warm_p50_us'] / max(loaded['warm_p50_us'], 1):.2f}x"),
        "CPU per inference: on_demand / all loaded": (
            f"{demand['cpu_per_inference_us']:.0f} / {loaded['cpu_per_inference_us']:.0f} us = "
            f"{demand['cpu_per_inference_us'] / max(loaded['cpu_per_inference_us'], 1):.2f}x"),
        "peak RSS: on_demand / all loaded": f"{demand['peak_rss_mib']:.0f} / {loaded['peak_rss_mib']:.0f} MiB",
    }

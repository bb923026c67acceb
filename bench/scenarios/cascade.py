"""A cascade two ways: the ``cascade`` ensemble (a conditional step: cascade_expensive runs only for
the rows cascade_cheap is unsure of, split and merged by the ensemble scheduler) against
``cascade_bls``, the same logic as BLS in a Python model (two nested requests from the Python
stub). One server, one tritonclient gRPC client sending the same 4-row batch (2 rows unsure) one
request at a time, the two models in alternating rounds; latency percentiles from the client and
CPU per request of the whole server tree (core, frontends, Python stubs) from /proc."""

from __future__ import annotations

import time
from dataclasses import asdict

import numpy as np

MODELS = ("cascade_cheap", "cascade_expensive", "cascade", "cascade_bls")
ROUNDS = 3
NEEDS_PERF_ANALYZER = False  # it drives its own client


def _batch() -> np.ndarray:
    from inferd.examples import build

    x = np.random.default_rng(0).uniform(-1, 0, (4, build.CASCADE_D)).astype(np.float32)
    x[0, 0] = x[2, 3] = 4.0  # rows 0 and 2: the cheap model is sure of them
    return x


def run(quick: bool) -> dict:
    import tritonclient.grpc as grpcclient

    from bench.bench import OUT, Measure, start_inferd
    from bench.proc_cpu import CpuMeter
    from inferd.examples import build

    repo = OUT / "repo_cascade"
    build.build_repository(repo, models=[s for s in build.MODELS if s.name in MODELS], log=None)
    seconds = 1.5 if quick else 4.0
    x = _batch()
    out: dict = {"measures": [], "ceilings": {}, "raw": []}
    server, url = start_inferd(repo)
    try:
        client = grpcclient.InferenceServerClient(url)
        inputs = [grpcclient.InferInput("INPUT0", list(x.shape), "FP32")]
        inputs[0].set_data_from_numpy(x)
        answers = {m: client.infer(m, inputs).as_numpy("OUTPUT0") for m in ("cascade", "cascade_bls")}
        np.testing.assert_allclose(answers["cascade"], answers["cascade_bls"], rtol=1e-5, atol=1e-6)
        done = [0]
        meter = CpuMeter(server.proc.pid, lambda: done[0])
        for r in range(ROUNDS):
            for model in (("cascade", "cascade_bls") if r % 2 == 0 else ("cascade_bls", "cascade")):
                for _ in range(50):  # warm
                    client.infer(model, inputs)
                done[0] = 0
                before = meter.sample()
                latencies = []
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    t0 = time.perf_counter()
                    client.infer(model, inputs)
                    latencies.append((time.perf_counter() - t0) * 1e6)
                    done[0] += 1
                cpu = meter.since(before)
                p50, p99 = np.percentile(latencies, [50, 99])
                ips = len(latencies) / cpu.seconds
                us = cpu.per_inference_us()
                out["measures"].append(asdict(Measure(model, 1, 4, ips, float(p50), float(p99), rows_per_s=4 * ips,
                                                      note=f"round {r + 1}; server CPU {us:.0f} us/request")))
                out["raw"].append({"model": model, "round": r + 1, "p50_us": float(p50), "p99_us": float(p99),
                                   "cpu_us_per_request": us, "requests": len(latencies)})
        client.close()
    finally:
        server.stop()
    return out


def ratios(result: dict) -> dict:
    by: dict[str, list[dict]] = {}
    for r in result.get("raw", []):
        by.setdefault(r["model"], []).append(r)
    if not by.get("cascade") or not by.get("cascade_bls"):
        return {}
    med = {m: {k: float(np.median([r[k] for r in rs])) for k in ("p50_us", "cpu_us_per_request")} for m, rs in by.items()}
    e, b = med["cascade"], med["cascade_bls"]
    return {
        "cascade ensemble vs BLS, p50 latency (median of rounds)": f"{e['p50_us']:.0f} us vs {b['p50_us']:.0f} us "
                                                                     f"({e['p50_us'] / b['p50_us']:.2f}x)",
        "cascade ensemble vs BLS, server CPU per request": f"{e['cpu_us_per_request']:.0f} us vs "
                                                          f"{b['cpu_us_per_request']:.0f} us "
                                                          f"({e['cpu_us_per_request'] / b['cpu_us_per_request']:.2f}x)",
    }

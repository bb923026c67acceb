"""The gRPC door (issue 42): does a bound on the calls the server holds shed a transport-bound overload?
mlp, closed loop: 16 in flight for 5 s (before), then N calls kept in flight (grpc.aio, 4 connections; a
refused call is sent again at once) for 12 s, then, 2 s after, 16 in flight for 5 s (after). With the gRPC
front (issue 46: Envoy on the port, the default) the bound is Envoy's circuit breaker on the bridged calls,
--grpc-max-held-calls 1,088 by default (past what 1,024 clients hold): N = 1,800 (the issue's overload) and
N = 1,024 (a benchmark it must never refuse), in one process (the default on 2 cores) and with 2 frontend
workers; beside it, N = 1,800 on grpc.aio's port with no bound (the default before the front) and with grpc.aio's
own door at 1,088 (it counts the calls waiting in gRPC core's queue). Admitted: answered OK; refused:
UNAVAILABLE (the bound's, or admission's); the admitted calls' p50/p99; throughput after / before. The client
and the server share the 2 cores, and the machine was shared with other engineers' builds and tests while
this ran."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.bench import OUT
from bench.scenarios.shedding import before_during_after

NEEDS_PERF_ANALYZER = False
BOUND = 1088
ENVOY, GRPCIO = ["--grpc-front", "envoy"], ["--grpc-front", "grpcio"]
RUNS = (  # (label, server options, calls in flight)
    (f"one process + Envoy, bound {BOUND} (the default)", ["--frontend-workers", "0", *ENVOY], 1800),
    (f"one process + Envoy, bound {BOUND} (the default)", ["--frontend-workers", "0", *ENVOY], 1024),
    (f"2 frontend workers + Envoy, bound {BOUND}", ["--frontend-workers", "2", *ENVOY], 1800),
    ("one process, grpc.aio, no bound (the default before the front)", ["--frontend-workers", "0", *GRPCIO], 1800),
    (f"one process, grpc.aio, --grpc-max-held-calls {BOUND}",
     ["--frontend-workers", "0", *GRPCIO, "--grpc-max-held-calls", str(BOUND)], 1800),
)


def run(quick: bool) -> dict:
    from inferd.examples.build import build_repository

    repo = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None)) / "repo"
    build_repository(repo, only=["mlp"], log=lambda *_: None)
    details = [before_during_after(repo, label, extra, n, quick) for label, extra, n in RUNS]
    measures = []
    for d in details:
        note = (f"answered {d['answered_per_s']:,.0f}/s, admitted {d['admitted']:,}, refused {d['refused']:,}, "
                f"CANCELLED {d['cancelled']}, other errors {d['other_errors']}; before {d['before_per_s']:,.0f}/s "
                f"(p99 {d['before_p99_us'] / 1e3:,.0f} ms), after {d['after_per_s']:,.0f}/s {d['after_codes']}")
        measures.append({"label": f"mlp, {d['concurrency']:,} in flight, {d['label']}",
                         "concurrency": d["concurrency"], "batch": 1, "infer_per_s": d["admitted_per_s"],
                         "p50_us": d["admitted_p50_us"], "p99_us": d["admitted_p99_us"], "note": note})
    return {"measures": measures, "details": details,
            "notes": "Refusals are UNAVAILABLE with the reason, e.g. "
                     + "; ".join(f"'{x}'" for d in details for x in d["reasons"][:1])}


def ratios(result: dict) -> dict:
    out = {}
    for d in result.get("details", []):
        key = f"{d['label']}, {d['concurrency']:,} in flight"
        out[f"{key}: admitted p99 / unloaded p99 (c=16)"] = (
            f"{d['admitted_p99_us'] / 1e3:,.0f} / {d['before_p99_us'] / 1e3:,.0f} ms = "
            f"{d['admitted_p99_us'] / max(d['before_p99_us'], 1):.1f}x")
        out[f"{key}: throughput after / before"] = (
            f"{d['after_per_s']:,.0f} / {d['before_per_s']:,.0f} per s = "
            f"{d['after_per_s'] / max(d['before_per_s'], 1):.2f}x")
        out[f"{key}: admitted, refused"] = (
            f"{d['admitted_per_s']:,.0f}/s admitted of {d['answered_per_s']:,.0f}/s answered; {d['admitted']:,} "
            f"admitted, {d['refused']:,} refused in {d['seconds']:.0f} s")
    return out

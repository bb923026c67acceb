"""The gRPC door (issue 42): does a bound on the calls the server holds, counting those still in gRPC
core's queue (--grpc-max-held-calls), shed a transport-bound overload? mlp, closed loop: 16 in flight
for 5 s (before), then N calls kept in flight (grpc.aio, 4 connections; a refused call is sent again
at once) for 12 s, then, 2 s after, 16 in flight for 5 s (after). N = 1,800 (the issue's overload)
without a bound (the default) and with the bound 1,088 (past what 1,024 clients hold), and N = 1,024
with that bound (a benchmark it must never refuse); in the default process mode (frontend workers,
half the cores, at least 2) and in one process (--frontend-workers 0). Admitted: answered OK;
refused: UNAVAILABLE (the door's, or admission's); the admitted calls' p50/p99; throughput after /
before. The client and the server share the 2 cores, and the machine was shared with other
engineers' builds and tests while this ran."""

from __future__ import annotations

import tempfile
from pathlib import Path

from bench.bench import OUT
from bench.scenarios.shedding import before_during_after

NEEDS_PERF_ANALYZER = False
BOUND = 1088
RUNS = (  # (label, server options, calls in flight)
    ("2 frontend workers, no bound (default)", ["--frontend-workers", "2"], 1800),
    (f"2 frontend workers, --grpc-max-held-calls {BOUND}", ["--frontend-workers", "2", "--grpc-max-held-calls",
                                                             str(BOUND)], 1800),
    (f"2 frontend workers, --grpc-max-held-calls {BOUND}", ["--frontend-workers", "2", "--grpc-max-held-calls",
                                                             str(BOUND)], 1024),
    ("one process, no bound (default)", ["--frontend-workers", "0"], 1800),
    (f"one process, --grpc-max-held-calls {BOUND}", ["--frontend-workers", "0", "--grpc-max-held-calls", str(BOUND)],
     1800),
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

"""Shedding by default (issue 24, part 6): the issue's overload run with default options. mlp, in the
default process mode (frontend workers, half the cores, at least 2), is measured closed loop at 16 in
flight for 5 s (before), then 1,800 calls are kept in flight (closed loop, grpc.aio, 4 connections) for
12 s, then, 2 s after, 16 in flight again for 5 s (after). Offered: calls answered per second during the
overload (admitted + shed: a shed call is sent again at once); admitted: answered OK; shed: UNAVAILABLE
with the reason (never CANCELLED); the admitted calls' p99; throughput after / before. Once with the
defaults (the queue-delay controller on: --queue-delay-target-us 50000, --queue-delay-interval-us
100000) and once with --no-shed, the server before this part. The client and the server share the 2
cores, and the machine was shared with other engineers' builds and tests while this ran."""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
from pathlib import Path

from bench.bench import OUT, Proc, free_port
from bench.scenarios.overload import _drive, _message, _repository


def before_during_after(repo: Path, label: str, extra: list[str], concurrency: int, quick: bool) -> dict:
    """mlp at 16 in flight (before), at ``concurrency`` (the overload), then at 16 again (after), on a
    fresh ``inferd serve`` with ``extra`` options: each phase's figures and answers, by gRPC code."""
    grpc_port = free_port()
    server = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                   "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port), "--http-port", "0",
                   "--metrics-port", "0", *extra], "inferd: ready",
                  re.sub(r"[^a-z0-9]+", "_", f"inferd {label} {concurrency}".lower()))  # a log per run
    url, pid, msg = f"127.0.0.1:{grpc_port}", server.proc.pid, _message("mlp", 256)
    try:
        asyncio.run(_drive(url, msg, concurrency=16, seconds=2, pid=pid))  # warm-up
        before, before_s, _ = asyncio.run(_drive(url, msg, concurrency=16, seconds=5, pid=pid))
        load, load_s, peak = asyncio.run(_drive(url, msg, concurrency=concurrency, seconds=6 if quick else 12,
                                                pid=pid))
        time.sleep(2)
        after, after_s, _ = asyncio.run(_drive(url, msg, concurrency=16, seconds=5, pid=pid))
    finally:
        server.stop()
    b, r, a = before.summary(before_s), load.summary(load_s), after.summary(after_s)
    codes = r["codes"]
    return {"label": label, "options": extra, "concurrency": concurrency,
            "before_per_s": b["ok_per_s"], "before_p99_us": b["p99_us"],
            "answered_per_s": sum(codes.values()) / load_s, "admitted": codes.get("OK", 0),
            "refused": codes.get("UNAVAILABLE", 0), "cancelled": codes.get("CANCELLED", 0),
            "other_errors": sum(v for k, v in codes.items() if k not in ("OK", "UNAVAILABLE", "CANCELLED")),
            "admitted_per_s": r["ok_per_s"], "admitted_p50_us": r["p50_us"], "admitted_p99_us": r["p99_us"],
            "after_per_s": a["ok_per_s"], "after_p99_us": a["p99_us"], "after_codes": a["codes"],
            "rss_peak_mib": peak, "reasons": r["reasons"], "seconds": load_s}


def _run(repo: Path, extra: list[str], label: str, quick: bool) -> dict:
    d = before_during_after(repo, label, extra, 1800, quick)
    # this scenario's words (and its recorded results' keys): all answered calls were offered; a refusal sheds
    d["offered_per_s"], d["shed"] = d.pop("answered_per_s"), d.pop("refused")
    return d


def run(quick: bool) -> dict:
    repo = _repository(Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None)) / "repo")
    details = [_run(repo, [], "default options", quick), _run(repo, ["--no-shed"], "--no-shed", quick)]
    measures = []
    for d in details:
        note = (f"offered {d['offered_per_s']:,.0f}/s, admitted {d['admitted']:,}, shed {d['shed']:,}, "
                f"CANCELLED {d['cancelled']}, other errors {d['other_errors']}; before {d['before_per_s']:,.0f}/s "
                f"(p99 {d['before_p99_us'] / 1e3:,.0f} ms), after {d['after_per_s']:,.0f}/s {d['after_codes']}")
        measures.append({"label": f"mlp, 1,800 in flight, {d['label']}", "concurrency": 1800, "batch": 1,
                         "infer_per_s": d["admitted_per_s"], "p50_us": d["admitted_p50_us"],
                         "p99_us": d["admitted_p99_us"], "note": note})
    return {"measures": measures, "details": details,
            "notes": "Shed answers are UNAVAILABLE with the reason, e.g. "
                     + "; ".join(f"'{x}'" for d in details for x in d["reasons"][:1])}


def ratios(result: dict) -> dict:
    out = {}
    for d in result.get("details", []):
        out[f"{d['label']}: admitted p99 / unloaded p99 (c=16)"] = (
            f"{d['admitted_p99_us'] / 1e3:,.0f} / {d['before_p99_us'] / 1e3:,.0f} ms = "
            f"{d['admitted_p99_us'] / max(d['before_p99_us'], 1):.1f}x")
        out[f"{d['label']}: throughput after / before"] = (
            f"{d['after_per_s']:,.0f} / {d['before_per_s']:,.0f} per s = {d['after_per_s'] / max(d['before_per_s'], 1):.2f}x")
        out[f"{d['label']}: offered, admitted, shed"] = (
            f"{d['offered_per_s']:,.0f}/s offered; {d['admitted']:,} admitted, {d['shed']:,} shed in {d['seconds']:.0f} s")
    return out

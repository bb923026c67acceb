"""The load client itself: `inferd perf` and perf_analyzer on mlp at concurrency 16 against the
same server, three runs each, alternating (A B B A A B) so both sample the same drift of the
shared machine; the ratio is of the medians (bench/compare_clients.py). Both count the requests
completed inside their windows (inferd perf's count equals the server's ModelStatistics count
over the same windows); windows of 2 s, the first three taken whatever their spread (the
alternation, not a stability gate, is what makes the two comparable on a busy host)."""

from __future__ import annotations

from dataclasses import asdict

from bench.bench import Measure, bench_repository, start_inferd
from bench.compare_clients import compare

LABELS = (("inferd perf (Python, 4 worker processes)", "inferd_perf"), ("perf_analyzer (C++)", "perf_analyzer"))
ROUNDS = 3


def run(quick: bool) -> dict:
    repo = bench_repository(big=False)
    server, url = start_inferd(repo)
    try:
        result = compare(url, model="mlp", concurrency=16, interval_ms=2000, stability=1000.0,
                         rounds=1 if quick else ROUNDS, server_pid=server.proc.pid)
    finally:
        server.stop()
    out: dict = {"measures": [], "ceilings": {}, "runs": {}}
    for label, key in LABELS:
        for i, r in enumerate(result["runs"][key]):
            note = r.get("error", r.get("skipped", "")) or _cpu_note(r)
            out["measures"].append(asdict(Measure(f"{label} run {i + 1}", 16, 1, r.get("throughput", 0.0),
                                                  r.get("p50_us", 0.0), r.get("p99_us", 0.0), note=note)))
        out["runs"][key] = [r.get("throughput", 0.0) for r in result["runs"][key]]
    out["ratio"] = result["ratio_inferd_over_perf_analyzer"]
    return out


def _cpu_note(r: dict) -> str:
    """CPU per inference from /proc and getrusage; the client's over its whole process, start-up
    included (inferd perf's inside its windows too)."""
    parts = [f"client CPU {r['client_cpu_us_per_infer']:.0f} us/infer with start-up"
             if "client_cpu_us_per_infer" in r else "",
             f"{r['client_cpu_us_per_infer_in_windows']:.0f} in the windows"
             if "client_cpu_us_per_infer_in_windows" in r else "",
             f"server CPU {r['server_cpu_us_per_infer']:.0f} us/infer" if "server_cpu_us_per_infer" in r else ""]
    return ", ".join(p for p in parts if p)


def ratios(result: dict) -> dict:
    ratio = result.get("ratio")
    if ratio is None:
        return {}
    medians = {key: sorted(v)[len(v) // 2] for key, v in result.get("runs", {}).items() if v}
    return {"inferd perf / perf_analyzer throughput, mlp c=16 (medians of the alternating runs)": (
        f"{ratio:.3f}x (target: within 0.85-1.15; medians {medians.get('inferd_perf', 0):,.0f} and "
        f"{medians.get('perf_analyzer', 0):,.0f} infer/s; the machine was shared with other engineers' work)")}

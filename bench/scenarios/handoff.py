"""The frontend <-> core hand-off alone (bench/handoff_roundtrip.py): a frontend process writes a
    64-byte FP32 tensor into its input arena and sends an INFER header; a core process views it in
    place, copies it into an output block and answers with a RESPONSE header; output blocks come
    back in FREE messages. No gRPC and no model: round trips/s, each side's CPU per round trip
    (/proc) and the messages each socket write carried, at concurrency 1, 16 and 64."""

from __future__ import annotations

from dataclasses import asdict


def run(quick: bool) -> dict:
    from bench.bench import Measure
    from bench.handoff_roundtrip import measure

    out: dict = {"measures": [], "ceilings": {}}
    for c in (1, 16, 64):
        r = measure(c, seconds=2.0 if quick else 4.0)
        note = (f"CPU per round trip: frontend {r['frontend_cpu_us']:.1f} us, core {r['core_cpu_us']:.1f} us; "
                f"{r['messages_per_write']:.1f} messages per write")
        out["measures"].append(asdict(Measure("hand-off round trip", c, 1, r["round_trips_per_s"], r["p50_us"],
                                              r["p99_us"], note=note)))
        out.setdefault("raw", []).append(r)
    return out


def ratios(result: dict) -> dict:
    return {f"c={r['concurrency']}: CPU per round trip (frontend + core)":
            f"{r['frontend_cpu_us'] + r['core_cpu_us']:.1f} us ({r['round_trips_per_s']:,.0f} round trips/s)"
            for r in result.get("raw", [])}

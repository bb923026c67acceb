"""Warm requests while other models load on demand (issue 28), in one process, no network: the cost a
load puts on the requests of models that stay loaded. 4 pinned table models (inferd/examples/many_models.py,
2 MB each) take one request at a time (1 ms apart) from one client, first alone, then while a second
client cycles through 40 other models under a budget that holds about 12, so nearly every one of its
requests loads a model and evicts another. Loads run on a worker thread and the event loop serves
the warm requests meanwhile; what they lose is the GIL that the loader holds (ONNX Runtime builds a
session without releasing it) and the loop's own part of each load and eviction. Reported: warm
p50/p99 alone and during the loads (same run, the two phases alternated twice), and the loads done
during the loaded phase (more loads in the same number of warm requests: cheaper loads). The
machine is shared: compare the ratios within one run, not the microseconds across runs. The GIL switch
interval is `inferd serve`'s (100 us; INFERD_BENCH_SWITCH_INTERVAL_US sets another): at Python's own 5 ms
the loop waited up to 5 ms behind any Python on the loader thread, which the server does not."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.bench import OUT

NEEDS_PERF_ANALYZER = False
HOT, COLD, FLOATS = 4, 40, 500_000
# As `inferd serve` sets it (--gil-switch-interval-us): at Python's own 5 ms a thread waiting for the GIL
# (the loop, behind a loader running Python) asks for it only after 5 ms, which measured that instead.
SWITCH_INTERVAL = float(os.environ.get("INFERD_BENCH_SWITCH_INTERVAL_US", "100")) * 1e-6


def _request(name: str, k: int):  # type: ignore[no-untyped-def]
    from inferd.types import InferenceRequest

    return InferenceRequest(model_name=name, inputs={"I": np.array([k], dtype=np.int64)})


async def _warm(dp, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for k in range(n):
        t = time.perf_counter()
        await dp.infer(_request(f"m{k % HOT:02d}", k))
        out.append((time.perf_counter() - t) * 1e6)
        await asyncio.sleep(0.001)
    return out


async def _cold(dp, stop: list[bool]) -> int:  # type: ignore[no-untyped-def]
    k = 0
    while not stop[0]:
        await dp.infer(_request(f"m{HOT + k % COLD:02d}", k))
        k += 1
    return k


async def _measure(n: int) -> dict:
    from inferd.dataplane import DataPlane
    from inferd.examples.many_models import build_many
    from inferd.repository import ModelManager

    repo = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None)) / "repo"
    build_many(repo, HOT + COLD, FLOATS)
    dp = DataPlane(ModelManager([repo], mode="on_demand", memory_budget=12 * 4 * 2**20,
                                startup_models=[f"m{i:02d}" for i in range(HOT)]))
    await dp.load_models()
    try:
        await _warm(dp, 50)
        alone: list[float] = []
        during: list[float] = []
        loads = 0
        seconds = 0.0
        for _ in range(2):
            alone += await _warm(dp, n)
            stop = [False]
            cold = asyncio.get_running_loop().create_task(_cold(dp, stop))
            t = time.perf_counter()
            during += await _warm(dp, n)
            stop[0] = True
            loads += await cold
            seconds += time.perf_counter() - t
    finally:
        await dp.close()
    return {"alone": alone, "during": during, "loads": loads, "seconds": seconds}


def run(quick: bool) -> dict:
    n = 200 if quick else 600
    before = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL)
    try:
        got = asyncio.run(_measure(n))
    finally:
        sys.setswitchinterval(before)
    pct = lambda xs, q: float(np.percentile(xs, q))  # noqa: E731
    measures = [
        {"label": "warm, no loads", "concurrency": 1, "batch": 1, "infer_per_s": 0.0,
         "p50_us": pct(got["alone"], 50), "p99_us": pct(got["alone"], 99), "note": f"{len(got['alone'])} requests"},
        {"label": "warm, during loads", "concurrency": 1, "batch": 1, "infer_per_s": 0.0,
         "p50_us": pct(got["during"], 50), "p99_us": pct(got["during"], 99),
         "note": f"{len(got['during'])} requests; {got['loads']} loads in {got['seconds']:.1f} s"},
    ]
    return {"measures": measures, "loads": got["loads"], "loads_per_s": got["loads"] / got["seconds"],
            "notes": NOTES}


NOTES = """Where a load's time goes, for the warm requests (issue 28; `python -m bench.load_gil`, and
`py-spy record --gil` over this scenario). onnxruntime's Python binding holds the GIL for the whole of a
session's build (its `InferenceSession` constructor parses, `initialize_session` optimises and places the
initializers, neither releases it; only `run` does), so the loop waits for each build: about 0.5-2 ms on
this table model, 10-17 ms on the example text encoder at ORT_ENABLE_ALL. Destroying a session joins its
intra-op pool thread, also holding the GIL (0.9 ms median, 6 ms p90 with 2 threads on this shared
machine): an evicted model's session was destroyed on the loop itself, when the eviction dropped the
model's last reference (`OnnxInstance.close` left the bound `run` holding it), 0.39 s of the loop's GIL
time in one profile; it is now freed at close, on the thread that stops the scheduler. A stored optimised
model (the on_demand session cache, ORT format, loaded with optimisation off) cuts the text encoder's
build to 3-5 ms; the table model has nothing to optimise, gains nothing, and is not stored. What is left: each build's
and each destruction's single GIL hold (a request arriving meanwhile waits for it), and the loop's own
part of a load and an eviction. Figures on this 2-core machine, shared with other engineers' tests
while this ran, move by 2x between runs: the ratio below is one run's."""


def ratios(result: dict) -> dict:
    alone, during = result["measures"]
    return {
        "warm p50: during loads / alone": f"{during['p50_us'] / alone['p50_us']:.2f}x",
        "warm p99: during loads / alone": f"{during['p99_us'] / alone['p99_us']:.2f}x",
        "loads per second beside the warm client": f"{result['loads_per_s']:.0f}",
    }

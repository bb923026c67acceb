"""Where an ensemble's extra time goes, measured in one process with no network.

    python -m bench.ensemble_overhead [--rounds 7] [--requests 2000]

Loads ensemble_mlp (scale -> mlp -> relu), its three composing models and
mlp_fused (the same computation as one ONNX model) into a ModelManager, and
measures the event-loop thread's CPU time per request, one request at a time,
for: the fused model's raw onnxruntime session, the three raw sessions called
one after another, mlp_fused through the data plane, the three models through
the data plane one after another, and the ensemble. The differences split the
ensemble's extra cost into the runtime's own calls, each model's request path
(validation, scheduler, statistics) and the ensemble's scheduling. Every
figure is the median over rounds that alternate the cases, since the machine
is shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Awaitable, Callable

import numpy as np

STEPS = ("ens_scale", "ens_mlp", "ens_relu")
MODELS = (*STEPS, "mlp_fused", "ensemble_mlp")


async def measure(repo: Path, rounds: int, requests: int) -> dict[str, float]:
    import onnxruntime as ort

    from inferd.repository import ModelManager
    from inferd.dataplane import DataPlane
    from inferd.types import InferenceRequest

    manager = ModelManager([repo], mode="explicit")
    for name in MODELS:
        await manager.load_model(name)
    plane = DataPlane(manager)
    x = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)

    def raw(name: str):  # type: ignore[no-untyped-def]
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(str(repo / name / "1" / "model.onnx"), options,
                                    providers=["CPUExecutionProvider"]).run

    sessions = {name: raw(name) for name in (*STEPS, "mlp_fused")}

    async def raw_fused() -> None:
        sessions["mlp_fused"](None, {"INPUT0": x})

    async def raw_steps() -> None:
        y = x
        for name in STEPS:
            y = sessions[name](None, {"INPUT0": y})[0]

    async def fused() -> None:
        await plane.infer(InferenceRequest("mlp_fused", {"INPUT0": x}))

    async def steps() -> None:
        y = x
        for name in STEPS:
            y = (await plane.infer(InferenceRequest(name, {"INPUT0": y}))).outputs["OUTPUT0"]

    async def ensemble() -> None:
        await plane.infer(InferenceRequest("ensemble_mlp", {"INPUT0": x}))

    cases: dict[str, Callable[[], Awaitable[None]]] = {
        "raw fused": raw_fused, "raw 3 steps": raw_steps, "fused": fused, "3 steps": steps, "ensemble": ensemble}
    samples: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for _ in range(rounds):
            for name, case in cases.items():
                for _ in range(requests // 10):  # warm
                    await case()
                t0 = time.thread_time_ns()
                for _ in range(requests):
                    await case()
                samples[name].append((time.thread_time_ns() - t0) / requests / 1000)
    finally:
        await manager.stop()
    return {name: statistics.median(values) for name, values in samples.items()}


def report(us: dict[str, float]) -> str:
    lines = [f"{name:12s} {value:7.1f} us loop CPU per request" for name, value in us.items()]
    extra = us["ensemble"] - us["fused"]
    runtime = us["raw 3 steps"] - us["raw fused"]
    path = (us["3 steps"] - us["raw 3 steps"]) / 3
    lines += [
        "",
        f"ensemble - fused:                      {extra:+7.1f} us",
        f"  the runtime's extra calls (raw 3 steps - raw fused): {runtime:+7.1f} us",
        f"  one model's request path ((3 steps - raw 3 steps) / 3): {path:7.1f} us",
        f"  the ensemble's own scheduling (ensemble - 3 steps): {us['ensemble'] - us['3 steps']:+7.1f} us",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ensemble_overhead", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args(argv)
    from inferd.examples import build

    sys.setswitchinterval(100e-6)  # as `inferd serve` sets it
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        build.build_repository(repo, models=[s for s in build.MODELS if s.name in MODELS], log=None)
        print(report(asyncio.run(measure(repo, args.rounds, args.requests))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Is the runtime fed? mlp_xl at 128 requests in flight through the core path, against the raw session.

    python -m bench.runtime_fed [--seconds 4] [--rounds 3] [--threads 1 2]

In one process, with no sockets and no client: mlp_xl (FP32 2048 -> 8192 -> 2048, max_batch_size 64,
dynamic_batching {}) loaded by a real DataPlane, 128 requests of one row kept in flight through
``DataPlane.infer`` (each answered request replaced at once), against the same ONNX file's session
called in a loop at batch 64 with the same intra-op thread count, alternated round by round (the
machine is shared: a ratio within a round is what to read). Reported per round: rows/s of each,
the ratio, the mean batch the scheduler formed (rows / executions from ModelStatistics), the share of
the wall time the runtime was executing (compute_infer over the window), and the CPU of the event
loop's thread against the process's. What the served figure (perf_analyzer over gRPC, the
``adaptive`` scenario) loses beyond this is the wire's CPU on the same cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

XL = (2048, 8192, 2048)
IN_FLIGHT = 128


def repository(folder: Path, threads: int) -> Path:
    from inferd.examples import build as b
    from inferd.examples import onnx_models as om

    io = ([("INPUT0", "TYPE_FP32", [XL[0]])], [("OUTPUT0", "TYPE_FP32", [XL[2]])])
    extra = f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{threads}" }} }}\n'
    b.build_repository(folder, models=[b.ModelSpec("mlp_xl", b.triton_config(
        "mlp_xl", *io, max_batch_size=64, dynamic_batching="", extra=extra),
        {"1/model.onnx": b.onnx_file(lambda: om.mlp(*XL, seed=1))})], log=None)
    return folder


async def fed(repo: Path, seconds: float, rounds: int, threads: int) -> list[dict]:
    from bench.bench import raw_ceiling
    from bench.request_counts import never_shed
    from inferd.dataplane import DataPlane
    from inferd.repository import ModelManager
    from inferd.types import InferenceRequest

    dp = DataPlane(ModelManager([repo]), shedding=never_shed())
    await dp.load_models()
    x = np.random.default_rng(0).standard_normal((1, XL[0]), dtype=np.float32)
    x64 = np.random.default_rng(0).standard_normal((64, XL[0]), dtype=np.float32)
    out = []
    try:
        async def one_round() -> dict:
            stop = time.monotonic() + seconds
            done = [0]

            async def client() -> None:
                while time.monotonic() < stop:
                    await dp.infer(InferenceRequest(model_name="mlp_xl", inputs={"INPUT0": x}))
                    done[0] += 1

            before = (await dp.model_statistics("mlp_xl", 0))[0]
            t0, loop0, cpu0 = time.monotonic(), time.thread_time(), time.process_time()
            await asyncio.gather(*(client() for _ in range(IN_FLIGHT)))
            wall, loop_cpu, cpu = time.monotonic() - t0, time.thread_time() - loop0, time.process_time() - cpu0
            after = (await dp.model_statistics("mlp_xl", 0))[0]
            executions = after.execution_count - before.execution_count
            rows = after.inference_count - before.inference_count
            busy = (after.compute_infer.ns - before.compute_infer.ns) / max(rows, 1) * executions / 1e9
            return {"rows_per_s": done[0] / wall, "mean_batch": rows / max(executions, 1),
                    "runtime_busy": busy / wall, "loop_cpu_share": loop_cpu / max(cpu, 1e-9),
                    "cpu_per_row_us": cpu / max(done[0], 1) * 1e6}

        await one_round()  # warm: the pool's buffers, the estimates
        for _ in range(rounds):
            served = await one_round()
            raw = 64 * raw_ceiling(repo / "mlp_xl/1/model.onnx", {"INPUT0": x64}, seconds=seconds, threads=threads)
            served["raw_rows_per_s"] = raw
            served["ratio"] = served["rows_per_s"] / raw
            out.append({k: round(v, 3) for k, v in served.items()})
    finally:
        await dp.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count() or 1])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for threads in args.threads:
            repo = repository(Path(tmp) / f"repo{threads}", threads)
            results[threads] = asyncio.run(fed(repo, args.seconds, args.rounds, threads))
    if args.json:
        print(json.dumps(results))
        return
    for threads, rounds in results.items():
        for r in rounds:
            print(f"{threads} intra-op threads: fed {r['rows_per_s']:,.0f} rows/s, raw batch-64 {r['raw_rows_per_s']:,.0f} "
                  f"= {r['ratio']:.2f}x; mean batch {r['mean_batch']:.1f}, runtime busy {r['runtime_busy']:.0%} of the "
                  f"wall, loop thread {r['loop_cpu_share']:.0%} of the CPU, {r['cpu_per_row_us']:,.0f} us CPU per row")


if __name__ == "__main__":
    main()

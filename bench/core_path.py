"""Micro-benchmark of the core's per-request Python path, with no sockets and no other process.

    python -m bench.core_path [--per-turn 1 8] [--requests 4000] [--rounds 12]

A real DataPlane (identity_fp32 from the benchmark repository, dynamic_batching {}) behind a
DataPlaneEndpoint whose channel only records what it sends; the input and output arenas are real
(4 GiB sparse memfds, as a server's). Each round hands the endpoint Infer messages,
``--per-turn`` of them in one loop turn (as one socket read would bring them), waits for every
Response and sends their blocks back in a Free. Reported: process CPU per request, the best
round (the machine is shared; the best round is the least disturbed). The figure is the
Python work of decode -> validate -> schedule -> ONNX Runtime -> shape -> encode -> free with
warm caches; a served request costs more (socket reads and writes, loop wake-ups, caches
cooled by the other processes on the cores): bench/RESULTS.md compares the two.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from typing import Any

import numpy as np

from inferd.dataplane import DataPlane
from inferd.handoff.messages import Free, Infer, InputTensor, Response
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.handoff.core.endpoint import DataPlaneEndpoint
from inferd.repository import ModelManager

ARENA_BYTES = 1 << 32


class _Recorder:
    more = False

    def __init__(self) -> None:
        self.sent: list[Any] = []

    def send(self, message: Any, at_once: bool = False) -> None:
        self.sent.append(message)


class _Worker:
    index = 0

    def __init__(self) -> None:
        self.channel = _Recorder()
        self.inputs = Arena.create(ARENA_BYTES)
        self.outputs = ArenaWriter(Arena.create(ARENA_BYTES))


def _infer(rid: int) -> Infer:
    return Infer(rid=rid, model="identity_fp32", version="", id="", parameters=None,
                 inputs=[InputTensor("INPUT0", "FP32", [1, 16], 0, 64, None)], outputs=None, flags=0, deadline=None,
                 trace=None, received=0, openai_prompt_tokens=None, frontend=None)


async def measure(per_turn: int, requests: int, rounds: int) -> float:
    """The best round's process CPU per request, in microseconds."""
    from bench.bench import bench_repository

    dp = DataPlane(ModelManager([bench_repository(big=False)]))
    await dp.load_models()
    link = _Worker()
    link.inputs.write(0, np.zeros(16, np.float32).tobytes())
    endpoint = DataPlaneEndpoint(link, dp, lambda *args: None)  # type: ignore[arg-type]
    sent = link.channel.sent
    best = float("inf")
    try:
        for _ in range(rounds):
            t = time.process_time()
            for turn in range(requests // per_turn):
                for i in range(per_turn):
                    link.channel.more = i < per_turn - 1
                    endpoint.on_message(_infer(turn * per_turn + i))
                while len(sent) < per_turn:
                    await asyncio.sleep(0)
                if any(type(m) is not Response for m in sent):
                    raise RuntimeError(f"the core did not answer with a Response: {sent[0]}")
                blocks = [m.block for m in sent]
                sent.clear()
                endpoint.on_message(Free(blocks))
            best = min(best, (time.process_time() - t) / (requests // per_turn * per_turn) * 1e6)
    finally:
        await dp.close()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-turn", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {n: asyncio.run(measure(n, args.requests, args.rounds)) for n in args.per_turn}
    if args.json:
        print(json.dumps({str(k): round(v, 1) for k, v in out.items()}))
        return
    for n, us in out.items():
        print(f"{n} per turn: {us:.1f} us CPU per request (best of {args.rounds} rounds)")


if __name__ == "__main__":
    main()

"""Micro-benchmark of the frontend <-> core hand-off alone: round trips/s and CPU per message.

    python -m bench.handoff_roundtrip [--concurrency 1 16 64] [--seconds 3] [--bytes 64]

This process plays a frontend: ``--concurrency`` coroutines each write a request's
input tensor into the input arena, send an Infer header and await the answer. A child
process plays the core: it views each input in place (numpy), allocates an output block,
copies the tensor there and answers with a Response header; freed output blocks come back
in Free messages. The messages are the hand-off's own (inferd.handoff.messages) over its
channel, so their encoding and decoding are counted. Nothing else runs (no gRPC, no
model), so the figures are the hand-off's own cost: round trips per second, each side's
CPU per round trip (from /proc), the latency of one round trip, and how many messages
each socket write carried.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np

from inferd.handoff.messages import Free, Infer, InputTensor, OutputTensor, Response, ToCore, ToWorker
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.channel import Channel, socket_pair

ARENA_BYTES = 1 << 28
_DTYPES = {"FP32": np.dtype(np.float32)}


def _cpu_s(pid: int) -> float:
    from bench.proc_cpu import TICK, read_stat

    stat = read_stat(pid)
    return stat.ticks / TICK if stat else 0.0


# -- the core's side (child process) ------------------------------------------


async def _core(sock_fd: int, in_fd: int, out_fd: int) -> None:
    inputs = Arena(in_fd, ARENA_BYTES)
    outputs = ArenaWriter(Arena(out_fd, ARENA_BYTES))
    channel: Channel

    def on_message(msg: ToCore) -> None:
        if type(msg) is Infer:
            (t,) = msg.inputs
            x = inputs.array(_DTYPES[t.datatype], t.offset, t.nbytes // 4).reshape(t.shape)
            block, (at,) = outputs.reserve([x.nbytes])
            outputs.arena.write(at, memoryview(x).cast("B"))
            channel.send(Response(rid=msg.rid, final=True, model=msg.model, version=1, id=msg.id,
                                  outputs=[OutputTensor("OUTPUT0", t.datatype, t.shape, at, x.nbytes)],
                                  parameters=None, block=block))
        elif type(msg) is Free:
            for block in msg.blocks:
                outputs.free(block)

    channel = await Channel.open(socket.socket(fileno=sock_fd), on_message, "core", receives=ToCore)
    await channel.closed  # type: ignore[misc]


# -- the frontend's side (this process) ----------------------------------------


async def _frontend(concurrency: int, seconds: float, nbytes: int, core_pid: int,
                    sock: socket.socket, inputs: ArenaWriter, outputs: Arena) -> dict:
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future] = {}
    freed: list[int] = []
    answering = [False]  # answers were read this turn: the clients they wake send in one write
    channel: Channel

    def on_message(msg: ToWorker) -> None:
        if type(msg) is Response:
            fut = waiting.pop(msg.rid)
            out = msg.outputs[0]
            fut.set_result(outputs.read(out.offset, out.nbytes))
            freed.append(msg.block)
            channel.wake()
            answering[0] = True
            if not channel.more:  # after the wake-ups of this read's answers (as InFlight)
                loop.call_soon(answering.__setitem__, 0, False)

    def send_frees() -> None:
        if freed:
            channel.send(Free(freed[:]))
            freed.clear()

    channel = await Channel.open(sock, on_message, "frontend", receives=ToWorker)
    channel.before_flush(send_frees)
    payload = np.arange(nbytes // 4, dtype=np.float32).tobytes()
    shape = [1, nbytes // 4]
    latencies: list[float] = []
    next_rid = 0
    stop_at = 0.0

    async def client() -> None:
        nonlocal next_rid
        while loop.time() < stop_at:
            rid = next_rid = next_rid + 1
            t0 = time.perf_counter()
            block, (at,) = inputs.put([payload])
            fut = loop.create_future()
            waiting[rid] = fut
            # As a worker's InFlight: the only request in flight is written at once unless answers just
            # woke it, a burst in one write per loop turn.
            channel.send(Infer(rid=rid, model="identity_fp32", version="", id="", parameters=None,
                               inputs=[InputTensor("INPUT0", "FP32", shape, at, nbytes, None)], outputs=None, flags=0,
                               deadline=None, trace=None, received=0, openai_prompt_tokens=None, frontend=None),
                         at_once=len(waiting) == 1 and not answering[0])
            data = await fut
            inputs.free(block)
            latencies.append(time.perf_counter() - t0)
            assert len(data) == nbytes

    stop_at = loop.time() + 0.5  # warm up
    await asyncio.gather(*(client() for _ in range(concurrency)))
    latencies.clear()
    sent0, writes0 = channel.sent, channel.writes
    mine0, core0, t0 = _cpu_s(os.getpid()), _cpu_s(core_pid), time.perf_counter()
    stop_at = loop.time() + seconds
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    mine, core = _cpu_s(os.getpid()) - mine0, _cpu_s(core_pid) - core0
    n = len(latencies)
    lat = np.sort(np.array(latencies)) * 1e6
    channel.close()
    return {"concurrency": concurrency, "round_trips": n, "round_trips_per_s": n / wall,
            "p50_us": float(lat[n // 2]), "p99_us": float(lat[min(n - 1, int(n * 0.99))]),
            "frontend_cpu_us": mine / n * 1e6, "core_cpu_us": core / n * 1e6,
            "messages_per_write": (channel.sent - sent0) / max(channel.writes - writes0, 1)}


def measure(concurrency: int, seconds: float = 3.0, nbytes: int = 64) -> dict:
    """One run at one concurrency, against a fresh core process."""
    core_end, worker_end = socket_pair()
    inputs, outputs = Arena.create(ARENA_BYTES, "bench-in"), Arena.create(ARENA_BYTES, "bench-out")
    child = subprocess.Popen([sys.executable, "-m", "bench.handoff_roundtrip", "--core",
                              str(worker_end.fileno()), str(inputs.fd), str(outputs.fd)],
                             pass_fds=(worker_end.fileno(), inputs.fd, outputs.fd))
    worker_end.close()
    try:
        return asyncio.run(_frontend(concurrency, seconds, nbytes, child.pid, core_end,
                                     ArenaWriter(inputs), outputs))
    finally:
        child.wait(30)
        inputs.close()
        outputs.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.handoff_roundtrip", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--bytes", type=int, default=64, help="input tensor size (FP32, a multiple of 4)")
    parser.add_argument("--core", nargs=3, type=int, metavar=("SOCK_FD", "IN_FD", "OUT_FD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.core:
        asyncio.run(_core(*args.core))
        return 0
    for c in args.concurrency:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v
                          for k, v in measure(c, args.seconds, args.bytes).items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

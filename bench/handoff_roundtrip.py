"""Micro-benchmark of the frontend <-> core hand-off alone: round trips/s and CPU per message.

    python -m bench.handoff_roundtrip [--concurrency 1 16 64] [--seconds 3] [--bytes 64]

This process plays a frontend: ``--concurrency`` coroutines each write a request's
input tensor into the input arena, send an INFER header and await the answer. A child
process plays the core: it views each input in place (numpy), allocates an output block,
copies the tensor there and answers with a RESPONSE header; freed output blocks come back
in FREE messages. Nothing else runs (no gRPC, no model), so the figures are the hand-off's
own cost: round trips per second, each side's CPU per round trip (from /proc), the
latency of one round trip, and how many messages each socket write carried.
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

from inferd.handoff import wire
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

    def on_message(msg: list) -> None:
        kind = msg[0]
        if kind == wire.INFER:
            (name, datatype, shape, offset, nbytes, _), = msg[wire.I_INPUTS]
            count = nbytes // 4
            x = inputs.array(_DTYPES[datatype], offset, count).reshape(shape)
            block, (at,) = outputs.reserve([x.nbytes])
            outputs.arena.write(at, memoryview(x).cast("B"))
            channel.send(wire.response(msg[wire.I_RID], True, msg[wire.I_MODEL], 1, msg[wire.I_ID],
                                       [["OUTPUT0", datatype, shape, at, x.nbytes]], None, block))
        elif kind == wire.FREE:
            for block in msg[1]:
                outputs.free(block)

    channel = await Channel.open(socket.socket(fileno=sock_fd), on_message, "core")
    await channel.closed  # type: ignore[misc]


# -- the frontend's side (this process) ----------------------------------------


async def _frontend(concurrency: int, seconds: float, nbytes: int, core_pid: int,
                    sock: socket.socket, inputs: ArenaWriter, outputs: Arena) -> dict:
    loop = asyncio.get_running_loop()
    waiting: dict[int, asyncio.Future] = {}
    freed: list[int] = []
    answering = [False]  # answers were read this turn: the clients they wake send in one write
    channel: Channel

    def on_message(msg: list) -> None:
        if msg[0] == wire.RESPONSE:
            fut = waiting.pop(msg[wire.R_RID])
            _, _, shape, at, n = msg[wire.R_OUTPUTS][0]
            fut.set_result(outputs.read(at, n))
            freed.append(msg[wire.R_BLOCK])
            channel.wake()
            answering[0] = True
            if not channel.more:  # after the wake-ups of this read's answers (as InFlight)
                loop.call_soon(answering.__setitem__, 0, False)

    def send_frees() -> None:
        if freed:
            channel.send([wire.FREE, freed[:]])
            freed.clear()

    channel = await Channel.open(sock, on_message, "frontend")
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
            channel.send(wire.infer(rid, "identity_fp32", "", "", None,
                                    [["INPUT0", "FP32", shape, at, nbytes, None]], None),
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

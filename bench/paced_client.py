"""An open-loop gRPC client at a paced rate, for bench/scenarios/many_models.py (issue 43).

Request ``k`` of the schedule (a JSON list of model indices: request ``k`` asks model ``m<NN>`` with
``I = [k]``, request id ``k``) starts at ``start + k / rate`` whatever the others are doing, on client
``k % clients`` (each its own tritonclient.grpc.aio channel), so a slow answer never delays the next
request: the server is offered the same load whatever its latency. Each request's latency counts from
its scheduled start. With ``--sample-s`` above 0, a thread samples the server's process tree's summed PSS
(this client left out) every that many seconds: reading smaps walks page tables, done here so that it
costs the server's GIL nothing; it still costs the machine ~2 ms of kernel time per model host and per
100 MiB of the server, which shows in the requests' tail, so the scenario runs its latency rounds
without it (``--sample-s 0``: peak_pss 0) and measures the peak in a pass of its own.
Writes ``{"requests": [[k, model, seconds, ok, error], ...], "peak_pss": bytes}``.

    python -m bench.paced_client --url 127.0.0.1:8001 --server-pid PID --rate 20 --clients 8 \\
        --schedule schedule.json --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
from pathlib import Path

import numpy as np


def smaps_pss(pid: int) -> int:
    """A process's PSS in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def tree_pss(root: int, leave_out: set[int]) -> int:
    """Summed PSS of ``root`` and every process below it but ``leave_out``."""
    from inferd.observability.procfs import all_stats, server_tree

    return sum(smaps_pss(s.pid) for s in server_tree(root, all_stats()) if s.pid not in leave_out)


class PeakSampler:
    """The largest summed PSS of a process tree seen every ``interval`` seconds, on a thread."""

    def __init__(self, root: int, interval: float) -> None:
        self.root = root
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "PeakSampler":
        if self.interval > 0:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        mine = {os.getpid()}
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, tree_pss(self.root, mine))


async def paced(url: str, schedule: list[int], rate: float, clients: int) -> list[list]:
    """Send the schedule open-loop; per request ``[k, model, seconds from its due time, ok, error]``."""
    import tritonclient.grpc.aio as aioclient

    from inferd.examples.many_models import expected

    conns = [aioclient.InferenceServerClient(url) for _ in range(clients)]
    try:
        for c in conns:  # connected before the clock starts
            await c.is_server_live()
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.2
        out: list[list] = []

        async def one(k: int, model: int, due: float) -> None:
            x = aioclient.InferInput("I", [1], "INT64")
            x.set_data_from_numpy(np.array([k], dtype=np.int64))
            try:
                result = await conns[k % clients].infer(f"m{model:02d}", [x], request_id=str(k), client_timeout=120)
                got = float(result.as_numpy("Y")[0])
                out.append([k, model, loop.time() - due, got == expected(model, k), ""])
            except Exception as exc:  # noqa: BLE001  # reported per request, counted by the scenario
                out.append([k, model, loop.time() - due, False, str(exc)[:300]])

        tasks = []
        for k, model in enumerate(schedule):
            due = start + k / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            tasks.append(loop.create_task(one(k, model, due)))
        await asyncio.gather(*tasks)
        return sorted(out)
    finally:
        for c in conns:
            await c.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paced_client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--server-pid", type=int, required=True, help="the server's process (its tree is sampled)")
    parser.add_argument("--rate", type=float, required=True, help="requests per second, all clients together")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--schedule", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sample-s", type=float, default=0.25, help="0: no PSS sampling")
    args = parser.parse_args(argv)
    schedule = json.loads(args.schedule.read_text())
    with PeakSampler(args.server_pid, args.sample_s) as sampler:
        requests = asyncio.run(paced(args.url, schedule, args.rate, args.clients))
    args.out.write_text(json.dumps({"requests": requests, "peak_pss": sampler.peak}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

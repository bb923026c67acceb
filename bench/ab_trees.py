"""Two source trees of inferd, A and B, measured beside each other in one run: throughput and CPU per inference.

    python -m bench.ab_trees --a DIR --b DIR [--rounds 6] [--load identity_fp32:16] [--load mlp:16]
                             [--server-arg ARG ...] [--model-repository DIR] [--pa-arg ARG ...]

For a change whose effect is within a run's noise on a shared machine (a few percent), alternating rounds
of both trees are the measure: each tree's ``inferd serve`` runs from its own folder (PYTHONPATH, so both
use this interpreter and its packages) on the example repository's identity_fp32 and mlp (or on
--model-repository, its models named by --load), both up for the whole run; each round drives each server
with perf_analyzer over gRPC in turn (--pa-arg adds to its arguments; the order reversed every round), and
reads CPU per inference for each of its processes (/proc, bench/proc_cpu.py) over the server's own
inference count. A tree is a checkout or a git worktree, e.g.
``git worktree add /tmp/before HEAD~1``. Prints each round and the medians; needs $PERF_ANALYZER."""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.bench import PERF_ANALYZER, free_port
from bench.proc_cpu import CpuMeter, statistics_count

SHAPES = {"identity_fp32": ["--shape", "INPUT0:16"]}


def _serve(tree: Path, repo: Path, log: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo), "--grpc-address", "127.0.0.1",
         "--grpc-port", str(port), "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0", *extra],
        stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree)))
    deadline = time.monotonic() + 120
    while "inferd: ready" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{tree}: the server did not start; its log: {log}")
        time.sleep(0.2)
    return proc, f"127.0.0.1:{port}"


def _drive(url: str, model: str, concurrency: int, window_ms: int, extra: list[str]) -> None:
    args = [str(PERF_ANALYZER), "-m", model, "-u", url, "-i", "grpc", "--concurrency-range", str(concurrency),
            *SHAPES.get(model, []), "-s", "90", *extra]
    subprocess.run(args + ["-p", "1000", "--max-trials", "2"], capture_output=True, timeout=300)  # warm-up
    subprocess.run(args + ["-p", str(window_ms), "--max-trials", "3"], capture_output=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_trees", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--a", type=Path, required=True)
    parser.add_argument("--b", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--load", action="append", metavar="MODEL:CONCURRENCY",
                        help="default: identity_fp32:16 and mlp:16")
    parser.add_argument("--window-ms", type=int, default=4000)
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG")
    parser.add_argument("--pa-arg", action="append", default=[], metavar="ARG",
                        help="an argument more for perf_analyzer (--pa-arg=--streaming: gRPC streams)")
    parser.add_argument("--model-repository", type=Path, metavar="DIR",
                        help="serve this repository instead of the example one (its models named by --load)")
    args = parser.parse_args(argv)
    loads = [(m, int(c)) for m, _, c in (x.partition(":") for x in args.load or ["identity_fp32:16", "mlp:16"])]
    work = Path(tempfile.mkdtemp(prefix="ab-trees-"))
    repo = args.model_repository.resolve() if args.model_repository else work / "repo"
    if args.model_repository is None:
        subprocess.run([sys.executable, "-m", "inferd.examples.build", "--output", str(repo), "--model", "identity_fp32",
                        "--model", "mlp"], check=True, capture_output=True)
    servers = {}
    try:
        for name, tree in (("A", args.a), ("B", args.b)):
            servers[name] = _serve(tree.resolve(), repo, work / f"{name}.log", args.server_arg)
        rows: dict[tuple[str, int, str], list[tuple[float, float]]] = {}
        for r in range(args.rounds):
            order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
            for model, concurrency in loads:
                for name in order:
                    proc, url = servers[name]
                    meter = CpuMeter(proc.pid, statistics_count(url, model=model))
                    before, started = meter.sample(), time.monotonic()
                    _drive(url, model, concurrency, args.window_ms, args.pa_arg)
                    report = meter.since(before)
                    rate = report.inferences / (time.monotonic() - started)
                    per = {p.role: p.cpu_s / max(report.inferences, 1) * 1e6 for p in report.processes}
                    rows.setdefault((model, concurrency, name), []).append((rate, sum(per.values())))
                    print(f"round {r} {model}:{concurrency} {name}: {rate:,.0f}/s, CPU {sum(per.values()):.0f} us ("
                          + ", ".join(f"{k} {v:.0f}" for k, v in per.items()) + ")", flush=True)
        for model, concurrency in loads:
            a, b = rows[(model, concurrency, "A")], rows[(model, concurrency, "B")]
            ta, tb = (statistics.median(x[0] for x in v) for v in (a, b))
            ca, cb = (statistics.median(x[1] for x in v) for v in (a, b))
            print(f"{model}:{concurrency}: A {ta:,.0f}/s {ca:.0f} us, B {tb:,.0f}/s {cb:.0f} us; B/A throughput {tb / ta:.2f}x, "
                  f"CPU {cb / ca:.2f}x (medians of {args.rounds} rounds)")
    finally:
        for proc, _ in servers.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc, _ in servers.values():
            proc.wait(timeout=60)
    return 0


if __name__ == "__main__":
    sys.exit(main())

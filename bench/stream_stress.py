"""perf_analyzer --streaming runs back to back against one server, each bounded: does every run end?

    python -m bench.stream_stress [--seconds 1500] [--server inferd|triton] [--window-ms 500]

Not part of ``make test``. One server (inferd's default mode, or Triton 2.51 from $INFERD_PEERS'
run_triton_peer.sh) on front_door's repository (identity_fp32, mlp); runs go in turn over mlp and
identity_fp32 at concurrency 16, 64 and 1, front_door's perf_analyzer settings but ``--window-ms``
windows, until ``--seconds`` have passed. A run still going past its bound (60 s + 5 x 6 windows) is
stuck: perf_analyzer waits for an answer that never comes (a lost stream message, or a server that
died). Each failed run is printed, with whether the server still runs; a server that died ends the
stress. Exit status 1 if any run was stuck. bench/RESULTS.md front_door_streams has what it found.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from bench.bench import PERF_ANALYZER, run_perf_analyzer
from bench.proc_cpu import alive
from bench.scenarios.front_door import ONE_ENVOY, PEERS, SHAPES, TRITON, _inferd, _peer, _repository

LOADS = tuple((model, c) for model in ("mlp", "identity_fp32") for c in (16, 64, 1))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_stress", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1500)
    parser.add_argument("--server", choices=("inferd", "triton"), default="inferd")
    parser.add_argument("--window-ms", type=int, default=500)
    args = parser.parse_args()
    trials = 6
    with tempfile.TemporaryDirectory() as tmp:
        repo = _repository(Path(tmp) / "repo")
        if args.server == "triton":
            peers = os.environ.get("INFERD_PEERS")
            if not peers:
                raise SystemExit("stream_stress: set INFERD_PEERS to the peers' folder (its run_triton_peer.sh)")
            server = _peer(TRITON, Path(peers) / PEERS[TRITON], repo)
        else:
            server = _inferd(ONE_ENVOY, repo)
        runs = stuck = unstable = 0
        end = time.monotonic() + args.seconds
        try:
            while time.monotonic() < end and alive(server.pid):
                for model, concurrency in LOADS:
                    shape = ["--shape", SHAPES[model]] if SHAPES[model] else []
                    r = run_perf_analyzer([str(PERF_ANALYZER), "-m", model, "-u", server.grpc, "-i", "grpc", *shape,
                                        "--concurrency-range", str(concurrency), "-b", "1", "-p", str(args.window_ms),
                                        "--max-trials", str(trials), "-s", "40", "--streaming"],
                                       timeout=60 + 5 * trials * args.window_ms / 1000)
                    runs += 1
                    if r is None:
                        stuck += 1
                        state = "still runs" if alive(server.pid) else "died"
                        print(f"{time.strftime('%H:%M:%S')} run {runs}: {model} c={concurrency} stuck; the server "
                              f"{state}", flush=True)
                    elif r.returncode != 0:
                        unstable += 1
                    if not alive(server.pid):
                        print(f"{time.strftime('%H:%M:%S')}: the server died; stopping", flush=True)
                        break
        finally:
            server.stop()
    print(f"{server.label}: {runs} runs, {stuck} stuck, {unstable} ended without a stable figure")
    return 1 if stuck else 0


if __name__ == "__main__":
    sys.exit(main())

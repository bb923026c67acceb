"""perf_analyzer --streaming runs back to back against one server, each bounded: does every run end?

    python -m bench.stream_stress [--seconds 1500] [--server inferd|triton] [--window-ms 500]

Not part of ``make test``. One server (inferd's default mode, or Triton 2.51 from $INFERD_PEERS'
run_triton_peer.sh) on front_door's repository (identity_fp32, mlp); runs go in turn over mlp and
identity_fp32 at concurrency 16, 64 and 1, front_door's perf_analyzer settings but ``--window-ms``
windows (bench.bench.run_pa: an unstable run is tried once more), until ``--seconds`` have passed. A
run still going past run_pa's bound (60 s + 5 x 6 windows) is stuck: perf_analyzer waits for an answer
that never comes (a lost stream message, or a server that died). Each stuck run is printed, with
whether the server still runs; a server that died ends the stress. Exit status 1 if any run was
stuck. bench/RESULTS.md front_door_streams has what it found.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.bench import STUCK, run_pa
from bench.proc_cpu import alive
from bench.scenarios.front_door import ONE_ENVOY, SHAPES, TRITON, repository, start_server

LOADS = tuple((model, c) for model in ("mlp", "identity_fp32") for c in (16, 64, 1))


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_stress", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1500)
    parser.add_argument("--server", choices=("inferd", "triton"), default="inferd")
    parser.add_argument("--window-ms", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            server = start_server(TRITON if args.server == "triton" else ONE_ENVOY, repository(Path(tmp) / "repo"))
        except RuntimeError as exc:
            raise SystemExit(f"stream_stress: {exc}") from None
        runs = stuck = unstable = 0
        end = time.monotonic() + args.seconds
        try:
            while time.monotonic() < end and alive(server.pid):
                for model, concurrency in LOADS:
                    m = run_pa(server.label, model, server.grpc, concurrency, shape=SHAPES[model],
                               window_ms=args.window_ms, stability=40, trials=6, extra=["--streaming"])
                    runs += 1
                    if m.note == STUCK:
                        stuck += 1
                        state = "still runs" if alive(server.pid) else "died"
                        print(f"{time.strftime('%H:%M:%S')} run {runs}: {model} c={concurrency} stuck; the server "
                              f"{state}", flush=True)
                    elif m.note:
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

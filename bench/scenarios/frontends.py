"""Frontend workers (issue 12): perf_analyzer over gRPC against the bare echo servicer (one
    process), inferd --frontend-workers 0 (one process), 1 and 2 (a core and two workers: this
    machine's default), in one run: identity_fp32 (16 floats) and mlp (256 -> 1024 -> 256), both with
    dynamic_batching {}, at concurrency 16, and identity at concurrency 1. Next to each figure, the
    CPU per inference of each server process (bench/proc_cpu.py: /proc utime+stime over the
    perf_analyzer run, divided by the server's ModelStatistics inference count) and the load average
    as it ended. All four servers stay up and each load runs on them one after the other. perf_analyzer
    runs on the same two cores, and the machine was shared with other engineers' builds and tests."""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import asdict
from typing import Iterator

ECHO = "echo servicer (one process)"
MODES = (("inferd --frontend-workers 0", 0), ("inferd --frontend-workers 1", 1), ("inferd --frontend-workers 2", 2))
# perf_analyzer's stability percentage: wider than the suite's 15, since with the machine shared
# (load averages of 15-20 on 2 cores) windows never agreed within 15%; CPU per inference, from
# /proc over the whole run, does not depend on it.
STABILITY = 40
LOADS = (("identity_fp32", 16, "INPUT0:16"), ("mlp", 16, None), ("identity_fp32", 1, "INPUT0:16"))


def _start(repo, workers: int):  # type: ignore[no-untyped-def]
    from bench.bench import Proc, free_port

    port = free_port()
    proc = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                 "--http-port", "0", "--metrics-port", "0", "--frontend-workers", str(workers)],
                "inferd: ready", f"inferd-w{workers}")
    return proc, f"127.0.0.1:{port}"


def _measure(label: str, proc, url: str, model: str, c: int, shape: str | None) -> dict:  # type: ignore[no-untyped-def]
    from bench.bench import run_pa
    from bench.proc_cpu import CpuMeter, statistics_count

    meter = CpuMeter(proc.proc.pid, statistics_count(url))
    before = meter.sample()
    m = run_pa(label, model, url, c, shape=shape, window_ms=3000, stability=STABILITY)
    cpu = meter.since(before)
    core = cpu.per_inference_us("core")
    frontends = cpu.per_inference_us("frontend")
    m.note = (m.note + "; " if m.note else "") + (f"CPU/inference: {'core' if frontends else 'process'} {core:.0f} us"
              + (f", frontends {frontends:.0f} us" if frontends else "") + f", all {cpu.per_inference_us():.0f} us"
              + f"; load {os.getloadavg()[0]:.1f}")
    out = asdict(m)
    out["model"] = model
    out["cpu"] = cpu.as_dict()
    out["core_us"], out["frontends_us"], out["all_us"] = core, frontends, cpu.per_inference_us()
    return out


ANALYSIS = """Targets (issue 12) missed here: see the ratios. What changed on the core's side since the first
run (branch corepath): a one-response INFER takes a callback path (DataPlane.submit -> submit_model -> Scheduler.submit,
no task or coroutine per request; the INFERs of one socket read share a batch), what a read's handlers send is written
as the read ends (one loop iteration less per wake-up), an idle worker no longer wakes the core to free output blocks,
and freed arena blocks are reused without the buddy allocator splitting and merging ~26 levels each time (alloc+free
5.0 -> 0.44 us, on both sides). Counted, not timed: the core's syscalls per inference (strace -c, 2 workers, identity
c=16) 4.6 -> 3.2, its voluntary context switches per inference (/proc) 0.93-1.0 -> 0.2-0.3 at c=16 and 1.75 -> 1.0 at
c=1. The core's Python per request with warm caches (python -m bench.core_path, no sockets) went 43.6 -> 29.4 us with
one request per loop turn and 26.5 -> 23.8 us with eight. Served, the core still costs 115-130 us per inference at
c=16 (the first run: 139): the same ~30 us of Python, run on two cores shared by perf_analyzer, two workers, the core
and other engineers' suites (load averages 4 to 15 during these runs), each wake-up starting on caches the others
have cooled. Where the core's time goes (py-spy, 2 workers, identity c=16, busy samples only): handling socket reads
45% (decoding INFER headers into requests 10%, the model path up to the queue (validation, lane, admission) 22%);
running batches 50% (the instance call 26%, of it ONNX Runtime and its wrapper 12%; completing each request
(shaping, statistics, trace) 17%; encoding the RESPONSE into the output arena 9-12%); socket writes 3%. Requests come
~2.4 to a batch at c=16. Reaching 60 us would need the Python per request roughly halved again and fewer wake-ups per
request, i.e. the workers delivering more requests per write; neither was reached. The workers cost 1.4-1.9x the echo,
and inferd's own code is a small part of it: in a worker's profile our Python (the INFER header, the arena write, the
pending table, the response) is ~10% of the samples, grpc.aio's Cython callbacks ~40% and its poller thread ~17%. The
echo answers inside its handler with no await; a worker's handler suspends until the core answers, so each request
costs grpc.aio a resumed RPC and the loop more wake-ups. On two cores throughput is bounded by the total CPU per
inference (server processes plus perf_analyzer): 2 workers + core spend ~2.5x the echo's CPU per inference, so they
cannot reach 1.0x the echo's throughput here; that needs spare cores (the 16-core check, not available to this work).
The p50 at concurrency 1 (+450-550 us over the echo) is two more process hops, each a scheduler wake-up on cores
shared with perf_analyzer and other engineers' test suites. perf_analyzer opens one gRPC connection per 6 contexts
(3 at concurrency 16) and the kernel hashes connections to workers, so the split between workers is luck."""


def run(quick: bool) -> dict:
    from bench.bench import bench_repository, start_echo

    repo = bench_repository(big=False)
    out: dict = {"measures": [], "ceilings": {}}
    load = [os.getloadavg()[0]]
    # Every server is up for the whole run and each load is measured on all of them one after
    # the other, so a ratio compares figures taken within a minute of each other: on this shared
    # machine the load average moved from 4 to 15 within one run (one after the other, the echo's
    # figures came minutes before the last mode's).
    servers = [(ECHO, 0, *start_echo())]
    try:
        for label, workers in MODES:
            servers.append((label, workers, *_start(repo, workers)))
        for model, c, shape in LOADS:
            for label, workers, proc, url in servers:
                if label == ECHO and model != "identity_fp32":
                    continue
                name = label if label == ECHO else f"{label} {model}"
                out["measures"].append(_measure(name, proc, url, model, c, shape))
        with _connections_per_context():
            for label, workers, proc, url in servers:
                if label == ECHO or workers > 1:
                    name = ECHO + SPREAD if label == ECHO else f"{label} identity_fp32{SPREAD}"
                    out["measures"].append(_measure(name, proc, url, "identity_fp32", 16, "INPUT0:16"))
    finally:
        for _, _, proc, _ in servers:
            proc.stop()
    load.append(os.getloadavg()[0])
    out["notes"] = (f"Load average (1 min) {load[0]:.1f} before the run and {load[1]:.1f} after it, on 2 cores: "
                    "other engineers' test suites ran meanwhile. No GPU machine was available to this work, so the "
                    "1/2/4/8-frontend scaling at concurrency 64 on 16 cores was not measured.\n\n" + ANALYSIS)
    return out


SPREAD = ", a connection per context"


@contextlib.contextmanager
def _connections_per_context() -> Iterator[None]:
    """perf_analyzer with one gRPC connection per context instead of one per 6 (its default), so the
    kernel has 16 connections to spread over the workers."""
    os.environ["TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"] = "1"
    try:
        yield
    finally:
        del os.environ["TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"]


def _find(result: dict, label: str, c: int) -> dict | None:
    for m in result["measures"]:
        if m["label"] == label and m["concurrency"] == c:
            return m
    return None


def ratios(result: dict) -> dict:
    r: dict = {}
    echo16, echo1 = _find(result, ECHO, 16), _find(result, ECHO, 1)
    for label, workers in MODES:
        ident16 = _find(result, f"{label} identity_fp32", 16)
        mlp16 = _find(result, f"{label} mlp", 16)
        ident1 = _find(result, f"{label} identity_fp32", 1)
        if not (ident16 and echo16 and echo16["infer_per_s"] and echo16["all_us"]):
            continue
        tag = f"{workers} workers"
        if workers:
            r[f"{tag}: core CPU per inference, identity c=16 (target <= 60 us)"] = (
                f"{ident16['core_us']:.0f} us (mlp: {mlp16['core_us']:.0f} us)" if mlp16 else f"{ident16['core_us']:.0f} us")
            r[f"{tag}: frontend CPU per inference / echo's, identity c=16 (target <= 1.15x)"] = (
                f"{ident16['frontends_us'] / echo16['all_us']:.2f}x ({ident16['frontends_us']:.0f} vs "
                f"{echo16['all_us']:.0f} us)")
        else:
            r[f"{tag}: process CPU per inference / echo's, identity c=16"] = (
                f"{ident16['all_us'] / echo16['all_us']:.2f}x ({ident16['all_us']:.0f} vs {echo16['all_us']:.0f} us)")
        r[f"{tag}: throughput / echo's, identity c=16 (target >= 1.0x)"] = (
            f"{ident16['infer_per_s'] / echo16['infer_per_s']:.2f}x ({ident16['infer_per_s']:,.0f} vs "
            f"{echo16['infer_per_s']:,.0f}/s; mlp {mlp16['infer_per_s']:,.0f}/s)" if mlp16 else "")
        spread, echo_spread = _find(result, f"{label} identity_fp32{SPREAD}", 16), _find(result, ECHO + SPREAD, 16)
        if spread and echo_spread and echo_spread["infer_per_s"]:
            r[f"{tag}: throughput / echo's, identity c=16{SPREAD}"] = (
                f"{spread['infer_per_s'] / echo_spread['infer_per_s']:.2f}x ({spread['infer_per_s']:,.0f} vs "
                f"{echo_spread['infer_per_s']:,.0f}/s)")
        if ident1 and echo1 and echo1["p50_us"]:
            r[f"{tag}: p50 - echo's p50, identity c=1 (target <= 150 us)"] = (
                f"{ident1['p50_us'] - echo1['p50_us']:+.0f} us ({ident1['p50_us']:.0f} vs {echo1['p50_us']:.0f} us)")
    return r

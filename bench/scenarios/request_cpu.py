"""The request path's CPU, counted (issue 32): perf_analyzer over gRPC on loopback against the bare
grpc.aio echo servicer (bench/echo_server.py), inferd in one process (--frontend-workers 0), inferd
in its default mode (a core and frontend workers), each of the three also on the other event loop
(the echo on uvloop, inferd on asyncio's: --event-loop, inferd/event_loop.py), and Triton when a
tritonserver is on PATH (skipped otherwise), identity_fp32 (16 floats, dynamic_batching {}) at concurrency 1 and 16, every
server up for the whole run. Then the rest of the issue's table on one process, the default mode and
Triton: mlp (256 -> 1024 -> 256) over gRPC and identity over HTTP and gRPC streaming at concurrency 16,
and mlp_xl (2048 -> 8192 -> 2048, max_batch_size 64) at 128 against its ONNX session called in a loop
at batch 64 with the same intra-op thread count, before and after the served runs (rows/s with
onnxruntime's defaults: the ceiling; CPU per row with the pool blocking between runs, as a served
session's: what the runtime spends of a served row's CPU). Per inference and per process: CPU (/proc utime+stime,
bench/proc_cpu.py), perf_analyzer's own CPU (getrusage of the children waited for), voluntary context switches (/proc/PID/task/*/status) and, in a separate shorter
run under ``strace -c -f`` (which slows the process it traces several times, so no throughput is
kept from it), syscalls. A flame graph of each process under the c=16 load (py-spy, 5 s, idle
samples left out) is written to bench/results/request_cpu/. Then the deterministic counts of the
one-process path with no sockets (python -m bench.request_counts: Python calls, C calls, loop
turns, container objects, blocks kept past the request; the echo driven the same way), the HTTP
infer route's cost through Starlette against a bare ASGI path (python -m bench.http_counts), and, when
valgrind is installed, instructions per request under callgrind (two runs of N and 2N requests,
subtracted, so start-up and loading cancel out). perf_analyzer runs on the same two cores, and the
machine was shared with other engineers' builds and tests."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import NamedTuple

from bench.proc_cpu import PROC, CpuMeter, all_stats, children_cpu_s, role, server_tree, statistics_count

ECHO = "echo servicer"
ECHO_UV = "echo servicer on uvloop"
ONE = "inferd one process"
DEFAULT = "inferd default mode"
ONE_ASYNCIO = "inferd one process on asyncio's loop"
DEFAULT_ASYNCIO = "inferd default mode on asyncio's loop"
# Measured for the loop's share only: no strace run or flame graph of their own.
LOOP_VARIANTS = (ECHO_UV, ONE_ASYNCIO, DEFAULT_ASYNCIO)
TRITON = "Triton"
MODEL, SHAPE = "identity_fp32", "INPUT0:16"
LEVELS = (1, 16)


class Workload(NamedTuple):
    name: str  # as the issue's table names its row
    model: str
    concurrency: int
    shape: str | None = None
    protocol: str = "grpc"
    extra: tuple[str, ...] = ()
    window_ms: int = 2000


IDENTITY = "identity"
XL, XL_MODEL = "mlp_xl", "mlp_big"  # FP32 2048 -> 8192 -> 2048, max_batch_size 64, dynamic_batching {}
# The rest of the issue's table, on the servers it compares (the default event loop; Triton when here).
TABLE = (
    Workload("mlp", "mlp", 16),
    Workload("HTTP identity", MODEL, 16, SHAPE, protocol="http"),
    Workload("gRPC streaming identity", MODEL, 16, SHAPE, extra=("--streaming",)),
    Workload(XL, XL_MODEL, 128, window_ms=5000),
)
TABLE_SERVERS = (ONE, DEFAULT, TRITON)
STABILITY = 40  # perf_analyzer's percentage: the machine is shared; CPU per inference does not depend on it
FLAMES = Path(__file__).resolve().parent.parent / "results" / "request_cpu"


class Server(NamedTuple):
    label: str
    proc: object  # bench.bench.Proc
    url: str  # gRPC
    http: str = ""  # HTTP, for the servers the rest of the issue's table measures


def _inferd(repo: Path, label: str, extra: list[str]) -> Server:
    from bench.bench import Proc, free_port

    port, http = free_port(), free_port()
    proc = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                 "--http-port", str(http), "--metrics-port", "0", *extra], "inferd: ready",
                re.sub(r"[^a-z0-9]+", "_", label.lower()))
    return Server(label, proc, f"127.0.0.1:{port}", f"127.0.0.1:{http}")


def _triton(repo: Path) -> Server:
    from bench.bench import Proc, free_port

    port, http = free_port(), free_port()
    proc = Proc([str(shutil.which("tritonserver")), "--model-repository", str(repo), "--grpc-port", str(port),
                 "--http-port", str(http), "--allow-metrics", "false"], "Started GRPCInferenceService", "triton")
    return Server(TRITON, proc, f"127.0.0.1:{port}", f"127.0.0.1:{http}")


def _servers(repo: Path) -> list[Server]:
    from bench.bench import start_echo

    servers = [Server(ECHO, *start_echo()), Server(ECHO_UV, *start_echo("uvloop"))]
    servers.append(_inferd(repo, ONE, ["--frontend-workers", "0"]))
    servers.append(_inferd(repo, DEFAULT, []))
    servers.append(_inferd(repo, ONE_ASYNCIO, ["--frontend-workers", "0", "--event-loop", "asyncio"]))
    servers.append(_inferd(repo, DEFAULT_ASYNCIO, ["--event-loop", "asyncio"]))
    if shutil.which("tritonserver"):
        servers.append(_triton(repo))
    return servers


def _switches(root: int) -> dict[int, int]:
    """Voluntary context switches of every thread of each process of the server, by pid."""
    out = {}
    for s in server_tree(root, all_stats()):
        total = 0
        for status in (PROC / str(s.pid) / "task").glob("*/status"):
            try:
                text = status.read_text()
            except OSError:
                continue
            m = re.search(r"^voluntary_ctxt_switches:\s+(\d+)", text, re.M)
            total += int(m.group(1)) if m else 0
        out[s.pid] = total
    return out


def _label(server: Server, w: Workload) -> str:
    return server.label if w.name == IDENTITY else f"{server.label}: {w.name}"


def _measure(server: Server, w: Workload) -> dict:
    """One perf_analyzer run of ``w`` against ``server``, with per inference: each server process's CPU
    and voluntary switches, and perf_analyzer's own CPU (it shares the cores), from getrusage of the
    children this process has waited for."""
    from bench.bench import run_pa

    pid = server.proc.proc.pid  # type: ignore[attr-defined]
    meter = CpuMeter(pid, statistics_count(server.url))
    executions = _executions(server, w)
    before, switches = meter.sample(), _switches(pid)
    client0 = children_cpu_s()
    m = run_pa(_label(server, w), w.model, server.http if w.protocol == "http" else server.url, w.concurrency,
               shape=w.shape, window_ms=w.window_ms, stability=STABILITY, trials=6, protocol=w.protocol,
               extra=list(w.extra))
    client = children_cpu_s() - client0
    cpu = meter.since(before)
    after = _switches(pid)
    n = max(cpu.inferences, 1)
    processes = []
    for p in cpu.processes:
        processes.append({"role": p.role, "pid": p.pid, "cpu_us": round(p.per_inference_us, 1),
                          "switches": round((after.get(p.pid, 0) - switches.get(p.pid, 0)) / n, 2)})
    out = asdict(m)
    out["workload"] = w.name
    out["processes"], out["cpu_us"] = processes, round(cpu.per_inference_us(), 1)
    out["client_cpu_us"] = round(client / n * 1e6, 1)
    parts = [f"{p['role']}: {p['cpu_us']:.0f} us CPU, {p['switches']:.2f} voluntary switches" for p in processes]
    parts.append(f"perf_analyzer: {out['client_cpu_us']:.0f} us CPU")
    if executions is not None:
        out["avg_batch"] = round(cpu.inferences / max(_executions(server, w) - executions, 1), 2)  # type: ignore[operator]
        parts.append(f"mean batch {out['avg_batch']:.1f}")
    out["note"] = (m.note + "; " if m.note else "") + "; ".join(parts)
    return out


def _executions(server: Server, w: Workload) -> int | None:
    """The model's execution count (for the mean batch), for the mlp_xl row only."""
    if w.name != XL:
        return None
    from bench.scenarios.adaptive import model_counts

    return model_counts(server.url, w.model)[1]


def _strace(label: str, proc, url: str) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Syscalls per inference of each process at c=16, counted by strace -c -f over one short load."""
    from bench.bench import run_pa

    if not shutil.which("strace"):
        return {}
    count = statistics_count(url)
    tracers = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in server_tree(proc.proc.pid, all_stats()):
            out = Path(tmp) / f"{s.pid}.txt"
            tracers.append((role(s.pid, proc.proc.pid), out, subprocess.Popen(
                ["strace", "-c", "-f", "-q", "-o", str(out), "-p", str(s.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
        time.sleep(1.0)  # attached to every thread
        n0 = count()
        run_pa(label, MODEL, url, 16, shape=SHAPE, window_ms=1000, stability=90, trials=3)
        n = max(count() - n0, 1)
        result = {}
        for name, out, tracer in tracers:
            tracer.terminate()
            tracer.wait(30)
            # The totals line: "100.00  seconds  usecs/call  calls  [errors]  total".
            text = out.read_text() if out.exists() else ""
            totals = [ln.split() for ln in text.splitlines() if ln.strip().endswith(" total")]
            calls = int(totals[-1][3]) if totals and len(totals[-1]) >= 5 else 0
            result[name] = round(calls / n, 2)
    return result


def _flames(label: str, proc, url: str) -> list[str]:  # type: ignore[no-untyped-def]
    """py-spy flame graphs (SVG) of each process of the server under the c=16 load."""
    from bench.bench import run_pa

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists() or label == TRITON:
        return []
    FLAMES.mkdir(parents=True, exist_ok=True)
    recorders, written = [], []
    slug = label.replace("inferd ", "").replace(" ", "_")
    for s in server_tree(proc.proc.pid, all_stats()):
        name = role(s.pid, proc.proc.pid).replace(" ", "")
        out = FLAMES / f"{slug}-{name}.svg"
        recorders.append((out, subprocess.Popen(
            [spy, "record", "-p", str(s.pid), "-d", "5", "-r", "200", "-o", str(out), "-f", "flamegraph"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    time.sleep(0.5)
    run_pa(label, MODEL, url, 16, shape=SHAPE, window_ms=1500, stability=90, trials=4)
    for out, recorder in recorders:
        try:
            recorder.wait(30)
        except subprocess.TimeoutExpired:
            recorder.kill()
        if out.exists():
            # py-spy titles the graph with its command line: this machine's paths, not the repository's.
            root = str(FLAMES.parent.parent.parent) + "/"
            out.write_text(out.read_text().replace(spy, "py-spy").replace(root, ""))
            written.append(str(out.relative_to(FLAMES.parent.parent.parent)))
    return written


def _counts() -> dict:
    """bench.request_counts in a fresh process (and its instructions under callgrind when valgrind is here)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "bench.request_counts", "--json"], capture_output=True, text=True,
                         env=env, timeout=600)
    if run.returncode:
        raise RuntimeError(f"bench.request_counts failed:\n{run.stderr[-2000:]}")
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    http = subprocess.run([sys.executable, "-m", "bench.http_counts", "--json"], capture_output=True, text=True,
                          env=env, timeout=600)
    if http.returncode:
        raise RuntimeError(f"bench.http_counts failed:\n{http.stderr[-2000:]}")
    counts["http"] = json.loads(http.stdout.strip().splitlines()[-1])
    if shutil.which("valgrind"):
        for name in ("inferd", "echo"):
            counts[name]["c=16"]["instructions"] = _instructions(name, env)
    return counts


def _instructions(name: str, env: dict[str, str], n: int = 800) -> float:
    """Instructions per request through ``name``'s servicer at c=16: callgrind runs of n and 2n, subtracted.
    Start-up (imports, building and loading the model) is ~3 G instructions and varies by a fraction of
    a percent from run to run, so n is large and hashing is seeded (PYTHONHASHSEED) to keep that
    variation well below a request's count."""
    env = dict(env, PYTHONHASHSEED="0")
    totals = []
    with tempfile.TemporaryDirectory() as tmp:
        for requests in (n, 2 * n):
            out = Path(tmp) / f"cg.{requests}"
            subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, "-m",
                            "bench.request_counts", "--only", name, "--instructions", "--requests", str(requests),
                            "--concurrency", "16", "--json"],
                           capture_output=True, text=True, env=env, timeout=900, check=True)
            totals.append(_summary(out.read_text()))
    return round((totals[1] - totals[0]) / n)


def _summary(text: str) -> int:
    m = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.M)
    if m is None:
        raise RuntimeError("no summary line in the callgrind output")
    return int(m.group(1))


ANALYSIS = """Before issue 32's cuts (the first run of this scenario, on commit 170d87d's inferd code, the same machine an
hour earlier): one process 675 / 572 us CPU per inference at c=1 / c=16 against the echo's 464 / 368 (1.46x / 1.55x);
inferd's own Python calls per request 87 / 85 (bench.request_counts on commit 170d87d's code), 62 / 67.4 on
commit 492c231's, 51 / 55.4 after the second round of cuts (admission, lookup and shedding in one step, settled
queue delays not fed, frontend trace stamps only while tracing is on, shallower coroutines).
The HTTP infer route through Starlette cost ~40 us and 55 Python calls per request more than a bare ASGI path;
InferRoute now answers it (python -m bench.http_counts: the served app within 5 calls of the bare path).
Target one process <= 1.3x the echo: missed (1.39x-1.58x in the runs here; served ratios move by +-0.1 between runs
on this shared machine). Where the rest goes, counted: with no sockets inferd spends ~270k instructions per request
at c=16 against the echo's ~100k (the subtraction of two runs carries tens of thousands of start-up noise per
request: 170d87d's code gave 216k in a run after this one, so these counts do not resolve the cuts; the Python call
counts do), spread over the interpreter (its eval loop alone a third), frames, dict lookups
and allocation: no single C function dominates, and ONNX Runtime's call for identity is a small part; what is left
is the count of Python steps a request takes (decode, admission, lookup, shedding, validation, the background lane,
the batcher's future, assemble/execute/split, shaping, statistics, encode: ~51-55 calls of inferd's). Voluntary
switches per inference (~9.5) are the same for the echo and one process: grpc.aio's own threads.
--gil-switch-interval-us 5000 against the default 100 changed nothing (one process 422 vs 427 us at c=16, one run).

The event loop (inferd/event_loop.py: uvloop by default, commit 4bc45f6) and a worker's FREE written ahead of its
request (commit 202fb17), measured on a machine about 2x slower than the runs above (a pure-Python loop of 10^7
adds took 1.7 s), so only the ratios within one run mean anything. On uvloop the default mode spends 0.75x / 0.80x
of its CPU per inference on asyncio's loop at c=1 / c=16 (1,245 vs 1,655 and 730 vs 909 us) and serves 1.21x as
much at c=16 (2,150 vs 1,779/s); in the run before the FREE change 0.78x / 0.72x and 1.59x. One process moves within
this machine's noise (0.77x / 1.08x in this run, 1.01x / 0.99x in the one before). The echo itself spends 0.77x /
0.91x on uvloop. Before the FREE change every lone request reached the core with Channel.more set, because
the FREE for the last answer's block followed it in the same write, so the core's batcher made it wait a loop
turn for company (7,276 of 7,301 requests at c=1 took the pumped path); now 94% take the idle fast path, and
the core's CPU per inference at c=1 went from 419 to 332 us between the two runs.
Targets in this run: one process against the echo on asyncio's loop (the issue's floor, bare grpc.aio) 0.91x /
1.26x, met (the run before 1.06x / 1.20x; against the echo on uvloop, the same loop, 1.18x / 1.38x); default mode
against one process 1.05x at c=16, met (1.07x before), and 1.42x at c=1, missed (1.44x); a lone client's p50 +341 us
over one process, missed (+350 us). Where a lone client's extra goes: its worker alone spends what the whole
one-process server does (906 vs 878 us, 10.9 voluntary switches against 9.5), since it does grpc.aio's work and
its loop sleeps and wakes once more per request, for the core's answer; the core sleeps and wakes once per request
(1.0 switches, 332 us: the loop's wake-up, the msgpack read, the request built, the model, the answer written).
Taking those wake-ups out means a process spinning while the other works, which on two cores takes the CPU from
the one working: not done. At c=16 the wake-ups are shared by a read's requests (0.25 switches per inference in
the core) and the hop costs 5%.

The run above these notes (2026-12-03 12:09) was on a quieter, faster machine (load 0.1 as it started; the echo
spent 391 / 175 us per inference at c=1 / c=16 against 966 / 554 in the paragraph above), with the rest of the
issue's table measured beside the identity rows. Targets: default mode against one process 1.04x at c=1, met
(1.42x on the slower machine), and 1.27x at c=16, missed (1.05x there); a lone client's p50 -23 us against one
process, met (+341 us there); one process against the echo 1.50x / 1.69x, missed (0.91x / 1.26x there); mlp_xl at
128 in flight 0.43x (one process) and 0.46x (default mode) of the raw session's rows/s, missed; no tritonserver on
PATH, so the targets against Triton are not measured. The machine moved these ratios more than the code did: between
the two machines the echo (grpc.aio's C transport) got 2.5x cheaper and inferd's own Python (the same ~56 calls per
request at c=16) about 1.7x, so the floor's ratio rose and the hop's share fell.
Where mlp_xl's time goes: the two cores are busy (server and perf_analyzer CPU per row times rows/s: 1.9 of the 2 cores), so
the rate is the cores over what a row costs all of them: the runtime ~476 us (the raw loop's CPU per row with its
pool blocking, as served), the request path the rest of the server's, ~407 us (default mode) to ~463 us (one
process), and perf_analyzer ~130 us. The target rate leaves ~739 us a row for all three, so the request path would
have to carry an 8 KiB-in, 8 KiB-out row in ~130 us, under what grpc.aio's unary call alone costs here (the echo's
175 us for 64 bytes). The request path costs more per row than identity's (296-375 us) because the runtime's two
pool threads hold both cores for ~15 ms per batch and the loop runs beside them on cold caches: with one intra-op
thread it measured ~250 us a row (an ad hoc run: one process, 1,958 rows/s, 698 us of server CPU a row, against
447 us for the one-thread raw loop), but one thread halves the runtime's ceiling (2,237 rows/s). Without sockets
(python -m bench.runtime_fed) the model path feeds the runtime 0.88-0.89x of the raw rate with two threads and
0.98-1.00x with one: batching and assembly keep up; the wire's CPU on the same two cores is what is missing.
The rest of the table: HTTP (105 us, 9,482/s in one process) and gRPC streaming (123 us, 9,014/s) cost well under
half of unary gRPC per inference (296 us, 3,919/s): grpc.aio's unary call is the expensive part, not inferd's path.
Two workers serve the MLP 1.50x what one process does (3,077 vs 2,045/s: the transport runs beside the model's
compute) and unary identity 1.08x; one process serves identity over HTTP 1.29x and over streams 1.79x what two
workers do, since their transport work per request is small and the hop's is not. The default on two cores stays
workers (cli.default_frontend_workers): a model that computes is what a server is for, and there the gain is
largest; for a cheap model over HTTP or streams on two cores, --frontend-workers 0 is the better choice (README)."""


def run(quick: bool) -> dict:
    from bench.bench import bench_repository

    repo = bench_repository(big=True)
    out: dict = {"measures": [], "ceilings": {}, "syscalls": {}, "flames": {}}
    load = [os.getloadavg()[0]]
    servers = _servers(repo)
    try:
        for c in LEVELS:
            for server in servers:
                out["measures"].append(_measure(server, Workload(IDENTITY, MODEL, c, SHAPE)))
        for w in TABLE:
            if w.name == XL:
                _raw(repo, "before the served runs", out)
            for server in servers:
                if server.label in TABLE_SERVERS:
                    out["measures"].append(_measure(server, w))
        _raw(repo, "after them", out)
        for label, proc, url, _ in servers:
            if label in LOOP_VARIANTS:
                continue
            out["syscalls"][label] = _strace(label, proc, url)
            out["flames"][label] = _flames(label, proc, url)
    finally:
        for server in servers:
            server.proc.stop()  # type: ignore[attr-defined]
    out["counts"] = _counts()
    load.append(os.getloadavg()[0])
    out["notes"] = _table(out) + (
        f"\n\nLoad average (1 min) {load[0]:.1f} before the run and {load[1]:.1f} after it, on 2 cores. "
        "Flame graphs: " + ", ".join(f for fs in out["flames"].values() for f in fs) + ".\n\n" + ANALYSIS)
    return out


def _raw(repo: Path, when: str, out: dict) -> None:
    """mlp_xl's ONNX session called in a loop at batch 64 with the served instance's intra-op thread
    count (one instance: every CPU this process may use): rows/s with onnxruntime's defaults, the
    issue's ceiling, into ``out["ceilings"]``; and the runtime's CPU per row with its pool blocking
    between runs as a served session's does into ``out["raw_cpu_us_per_row"]``, which the served
    rows' CPU is set against to find what the request path spends."""
    import numpy as np

    from bench.bench import raw_run
    from inferd.host import cpu_budget

    x64 = np.random.default_rng(0).standard_normal((64, 2048), dtype=np.float32)
    threads, model = cpu_budget(), repo / XL_MODEL / "1" / "model.onnx"
    rate, _ = raw_run(model, {"INPUT0": x64}, threads=threads)
    out["ceilings"][f"{XL} raw onnxruntime rows/s, batch 64, {threads} intra-op threads, {when}"] = 64 * rate
    _, cpu = raw_run(model, {"INPUT0": x64}, threads=threads, spinning=False)
    out.setdefault("raw_cpu_us_per_row", {})[when] = round(cpu / 64 * 1e6, 1)


def _issue_table(out: dict) -> list[str]:
    """The issue's table: each workload's throughput and CPU per inference (the server's processes
    together, then perf_analyzer's) on each server measured, from this run."""
    by = {(m.get("workload", IDENTITY), m["label"], m["concurrency"]): m for m in out["measures"]}
    servers = [label for label in (ECHO, ONE, DEFAULT, TRITON) if any(k[1] == label for k in by)]
    rows = [(IDENTITY, 16), *((w.name, w.concurrency) for w in TABLE)]
    lines = ["The issue's table, this run (per inference: the server's CPU, all its processes, + perf_analyzer's):", "",
             "| | " + " | ".join(servers) + " |", "|---|" + "---:|" * len(servers)]

    def cell(name: str, label: str, c: int, what: str) -> str:
        m = by.get((name, label if name == IDENTITY else f"{label}: {name}", c))
        if m is None:
            return "-"
        if what == "p50":
            return f"{m['p50_us']:,.0f} us"
        if what == "rate":
            return f"{m['infer_per_s']:,.0f}/s"
        return f"{m['cpu_us']:,.0f} + {m.get('client_cpu_us', 0):,.0f} us"

    for name, c in rows:
        lines.append(f"| {name} c={c}, infer/s | " + " | ".join(cell(name, s, c, "rate") for s in servers) + " |")
        lines.append(f"| {name} c={c}, CPU per inference | " + " | ".join(cell(name, s, c, "cpu") for s in servers) + " |")
    lines.append(f"| {IDENTITY} p50 at c=1 | " + " | ".join(cell(IDENTITY, s, 1, "p50") for s in servers) + " |")
    return lines + [""]


def _table(out: dict) -> str:
    """The issue's table, the per-process table (CPU, switches, syscalls per inference), then the
    in-process counts."""
    lines = [*_issue_table(out), "Per inference, per process (c=1 / c=16; syscalls at c=16 under strace):", "",
             "| server | process | CPU us | voluntary switches | syscalls |", "|---|---|---:|---:|---:|"]
    by = {(m["label"], m["concurrency"]): m for m in out["measures"] if m.get("workload", IDENTITY) == IDENTITY}
    for label in dict.fromkeys(m["label"] for m in out["measures"] if m.get("workload", IDENTITY) == IDENTITY):
        one, many = by.get((label, 1)), by.get((label, 16))
        roles = [p["role"] for p in (many or one or {}).get("processes", [])]
        for r in roles:
            def get(m: dict | None, key: str) -> str:
                for p in (m or {}).get("processes", []):
                    if p["role"] == r:
                        return f"{p[key]:,.2f}" if key == "switches" else f"{p[key]:,.0f}"
                return "-"
            sc = out["syscalls"].get(label, {}).get(r)
            lines.append(f"| {label} | {r} | {get(one, 'cpu_us')} / {get(many, 'cpu_us')} | "
                         f"{get(one, 'switches')} / {get(many, 'switches')} | {'-' if sc is None else f'{sc:,.1f}'} |")
    lines += ["", "In one process with no sockets, per request (python -m bench.request_counts):", "",
              "| path | concurrency | Python calls | of them inferd's | C calls | loop turns | container objects | blocks kept | instructions |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, levels in out.get("counts", {}).items():
        if name == "http":
            continue
        for level, k in levels.items():
            ins = k.get("instructions")
            lines.append(f"| {name} | {level[2:]} | {k['python_calls']:,.1f} | {k.get('inferd_calls', 0):,.1f} | {k['c_calls']:,.1f} | "
                         f"{k['loop_turns']:.2f} | {k['gc_objects']:,.1f} | {k['kept_blocks']:,.2f} | "
                         f"{'-' if ins is None else f'{ins:,.0f}'} |")
    http = out.get("counts", {}).get("http")
    if http:
        lines += ["", "HTTP /v2/models/identity_fp32/infer in one process with no sockets, per request, one at a time "
                  "(python -m bench.http_counts; CPU: best of 5 rounds):", "",
                  "| app | CPU us | Python calls |", "|---|---:|---:|"]
        lines += [f"| {name} | {k['cpu_us']:.1f} | {k['python_calls']:.0f} |" for name, k in http.items()]
    return "\n".join(lines)


def ratios(result: dict) -> dict:
    by = {(m["label"], m["concurrency"]): m for m in result["measures"]}
    out = _table_ratios(result, by)
    for c in LEVELS:
        echo, one, default = by.get((ECHO, c)), by.get((ONE, c)), by.get((DEFAULT, c))
        if echo and one and echo["cpu_us"]:
            out[f"identity c={c}: one process CPU per inference / echo's (target <= 1.3x)"] = (
                f"{one['cpu_us'] / echo['cpu_us']:.2f}x ({one['cpu_us']:.0f} vs {echo['cpu_us']:.0f} us)")
        echo_uv = by.get((ECHO_UV, c))
        if echo_uv and one and echo_uv["cpu_us"]:
            out[f"identity c={c}: one process CPU per inference / the echo's on uvloop, the same loop"] = (
                f"{one['cpu_us'] / echo_uv['cpu_us']:.2f}x ({one['cpu_us']:.0f} vs {echo_uv['cpu_us']:.0f} us)")
        if one and default and one["cpu_us"]:
            out[f"identity c={c}: default mode CPU per inference / one process (target <= 1.1x)"] = (
                f"{default['cpu_us'] / one['cpu_us']:.2f}x ({default['cpu_us']:.0f} vs {one['cpu_us']:.0f} us)")
        for label, plain in ((ONE, ONE_ASYNCIO), (DEFAULT, DEFAULT_ASYNCIO)):
            uv, std = by.get((label, c)), by.get((plain, c))
            if uv and std and std["cpu_us"]:
                out[f"identity c={c}: {label} CPU per inference, uvloop / asyncio's loop"] = (
                    f"{uv['cpu_us'] / std['cpu_us']:.2f}x ({uv['cpu_us']:.0f} vs {std['cpu_us']:.0f} us; "
                    f"{uv['infer_per_s']:.0f} vs {std['infer_per_s']:.0f} infer/s)")
        if c == 1 and one and default:
            out["identity c=1: default mode p50 - one process p50 (target <= 100 us)"] = (
                f"{default['p50_us'] - one['p50_us']:+.0f} us ({default['p50_us']:.0f} vs {one['p50_us']:.0f} us)")
    counts = result.get("counts", {})
    for level in ("c=1", "c=16"):
        i, e = counts.get("inferd", {}).get(level), counts.get("echo", {}).get(level)
        if i and e:
            out[f"no sockets, {level}: Python calls per request, inferd / echo"] = (
                f"{i['python_calls']:.0f} / {e['python_calls']:.0f}")
            if "instructions" in i and "instructions" in e:
                out[f"no sockets, {level}: instructions per request, inferd / echo"] = (
                    f"{i['instructions']:,.0f} / {e['instructions']:,.0f} = {i['instructions'] / e['instructions']:.2f}x")
    return out


def _table_ratios(result: dict, by: dict) -> dict:
    """The rest of the issue's targets: mlp_xl against the raw session (>= 0.66x) with where its CPU
    goes per row, and each workload against Triton (>= 0.6x its throughput) when Triton was measured."""
    from inferd.host import cpu_budget

    out = {}
    raws = [v for k, v in result.get("ceilings", {}).items() if k.startswith(f"{XL} raw")]
    raw, runtime = (sum(raws) / len(raws) if raws else 0.0), result.get("raw_cpu_us_per_row", {})
    runtime_us = sum(runtime.values()) / len(runtime) if runtime else 0.0
    cores = cpu_budget()
    for label in (ONE, DEFAULT, TRITON):
        m = by.get((f"{label}: {XL}", 128))
        if m and raw and m["infer_per_s"]:
            out[f"{XL} c=128: {label} rows/s / raw batch-64 (target >= 0.66x)"] = (
                f"{m['infer_per_s'] / raw:.2f}x ({m['infer_per_s']:,.0f} vs {raw:,.0f} rows/s; mean batch "
                f"{m.get('avg_batch', 0):.1f})")
            if label != TRITON and runtime_us:
                out[f"{XL} c=128: {label}, CPU per row"] = (
                    f"server {m['cpu_us']:,.0f} us (the runtime's ~{runtime_us:,.0f} as the raw loop spends it, "
                    f"the request path the other ~{m['cpu_us'] - runtime_us:,.0f}), perf_analyzer "
                    f"{m.get('client_cpu_us', 0):,.0f} us; the {cores} cores give "
                    f"{cores * 1e6 / m['infer_per_s']:,.0f} us per row at this rate, and the target rate "
                    f"{0.66 * raw:,.0f}/s leaves {cores * 1e6 / (0.66 * raw):,.0f}")
    for name, c in ((IDENTITY, 16), *((w.name, w.concurrency) for w in TABLE if w.name != XL)):
        triton = by.get((TRITON if name == IDENTITY else f"{TRITON}: {name}", c))
        for label in (ONE, DEFAULT):
            m = by.get((label if name == IDENTITY else f"{label}: {name}", c))
            if m and triton and triton["infer_per_s"]:
                out[f"{name} c={c}: {label} / Triton throughput (target >= 0.6x)"] = (
                    f"{m['infer_per_s'] / triton['infer_per_s']:.2f}x")
    return out

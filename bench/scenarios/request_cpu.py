"""The request path's CPU, counted (issue 32): perf_analyzer over gRPC on loopback against the bare
grpc.aio echo servicer (bench/echo_server.py), inferd in one process (--frontend-workers 0), inferd
in its default mode (a core and frontend workers), each of the three also on the other event loop
(the echo on uvloop, inferd on asyncio's: --event-loop, inferd/event_loop.py), and Triton when a
tritonserver is on PATH (skipped otherwise), identity_fp32 (16 floats, dynamic_batching {}) at concurrency 1 and 16, every
server up for the whole run. Per inference and per process: CPU (/proc utime+stime,
bench/proc_cpu.py), voluntary context switches (/proc/PID/task/*/status) and, in a separate shorter
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

from bench.proc_cpu import PROC, CpuMeter, all_stats, role, server_tree, statistics_count

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
STABILITY = 40  # perf_analyzer's percentage: the machine is shared; CPU per inference does not depend on it
FLAMES = Path(__file__).resolve().parent.parent / "results" / "request_cpu"


def _inferd(repo: Path, label: str, extra: list[str]):  # type: ignore[no-untyped-def]
    from bench.bench import Proc, free_port

    port = free_port()
    proc = Proc([sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo),
                 "--grpc-address", "127.0.0.1", "--grpc-port", str(port), "--http-address", "127.0.0.1",
                 "--http-port", "0", "--metrics-port", "0", *extra], "inferd: ready",
                re.sub(r"[^a-z0-9]+", "_", label.lower()))
    return proc, f"127.0.0.1:{port}"


def _triton(repo: Path):  # type: ignore[no-untyped-def]
    from bench.bench import Proc, free_port

    port = free_port()
    proc = Proc([str(shutil.which("tritonserver")), "--model-repository", str(repo), "--grpc-port", str(port),
                 "--allow-http", "false", "--allow-metrics", "false"], "Started GRPCInferenceService", "triton")
    return proc, f"127.0.0.1:{port}"


def _servers(repo: Path) -> list[tuple[str, object, str]]:
    from bench.bench import start_echo

    servers: list[tuple[str, object, str]] = [(ECHO, *start_echo()), (ECHO_UV, *start_echo("uvloop"))]
    servers.append((ONE, *_inferd(repo, ONE, ["--frontend-workers", "0"])))
    servers.append((DEFAULT, *_inferd(repo, DEFAULT, [])))
    servers.append((ONE_ASYNCIO, *_inferd(repo, ONE_ASYNCIO, ["--frontend-workers", "0", "--event-loop", "asyncio"])))
    servers.append((DEFAULT_ASYNCIO, *_inferd(repo, DEFAULT_ASYNCIO, ["--event-loop", "asyncio"])))
    if shutil.which("tritonserver"):
        servers.append((TRITON, *_triton(repo)))
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


def _measure(label: str, proc, url: str, c: int) -> dict:  # type: ignore[no-untyped-def]
    from bench.bench import run_pa

    pid = proc.proc.pid
    meter = CpuMeter(pid, statistics_count(url))
    before, switches = meter.sample(), _switches(pid)
    m = run_pa(label, MODEL, url, c, shape=SHAPE, window_ms=2000, stability=STABILITY, trials=6)
    cpu = meter.since(before)
    after = _switches(pid)
    n = max(cpu.inferences, 1)
    processes = []
    for p in cpu.processes:
        processes.append({"role": p.role, "pid": p.pid, "cpu_us": round(p.per_inference_us, 1),
                          "switches": round((after.get(p.pid, 0) - switches.get(p.pid, 0)) / n, 2)})
    out = asdict(m)
    out["processes"], out["cpu_us"] = processes, round(cpu.per_inference_us(), 1)
    out["note"] = (m.note + "; " if m.note else "") + "; ".join(
        f"{p['role']}: {p['cpu_us']:.0f} us CPU, {p['switches']:.2f} voluntary switches" for p in processes)
    return out


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
the core) and the hop costs 5%."""


def run(quick: bool) -> dict:
    from bench.bench import bench_repository

    repo = bench_repository(big=False)
    out: dict = {"measures": [], "ceilings": {}, "syscalls": {}, "flames": {}}
    load = [os.getloadavg()[0]]
    servers = _servers(repo)
    try:
        for c in LEVELS:
            for label, proc, url in servers:
                out["measures"].append(_measure(label, proc, url, c))
        for label, proc, url in servers:
            if label in LOOP_VARIANTS:
                continue
            out["syscalls"][label] = _strace(label, proc, url)
            out["flames"][label] = _flames(label, proc, url)
    finally:
        for _, proc, _ in servers:
            proc.stop()  # type: ignore[attr-defined]
    out["counts"] = _counts()
    load.append(os.getloadavg()[0])
    out["notes"] = _table(out) + (
        f"\n\nLoad average (1 min) {load[0]:.1f} before the run and {load[1]:.1f} after it, on 2 cores. "
        "Flame graphs: " + ", ".join(f for fs in out["flames"].values() for f in fs) + ".\n\n" + ANALYSIS)
    return out


def _table(out: dict) -> str:
    """The per-process table: CPU, switches, syscalls per inference, then the in-process counts."""
    lines = ["Per inference, per process (c=1 / c=16; syscalls at c=16 under strace):", "",
             "| server | process | CPU us | voluntary switches | syscalls |", "|---|---|---:|---:|---:|"]
    by = {(m["label"], m["concurrency"]): m for m in out["measures"]}
    for label in dict.fromkeys(m["label"] for m in out["measures"]):
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
    out = {}
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

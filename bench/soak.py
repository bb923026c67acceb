"""The soak run: a million requests against one server, mixed, while its health is sampled.

    python -m bench.soak [--requests 1000000] [--rate 450] [--window 10]

Not part of ``make test`` (it runs for most of an hour). It starts ``inferd serve`` on the
example repository plus ``mlp_prio`` (mlp with two priority levels, a REJECT queue policy
with a 100 ms default timeout that requests may shorten, and a 256-request queue cap), and
offers an open-loop gRPC load at ``--rate`` requests/s until ``--requests`` were sent:

- 35% mlp_prio at priority 1 or 2; 20% mlp; 15% simple; 10% identity_fp32; 5% add_sub;
  5% simple_string (BYTES);
- 5% cancelled by the client 0-3 ms after they were sent (``--no-client-cancels``: sent as the
  rest, to tell what the cancels cost from what the rest does; write that run elsewhere with ``--out``);
- 5% with a queue timeout of 1-200 us (``timeout`` parameter; REJECT, UNAVAILABLE when it passes),
  and a client deadline of 2-20 ms on one request in three of those (DEADLINE_EXCEEDED).

The server runs in its default process mode (on 2 cores: one process behind the gRPC front, Envoy;
until issue 46, the core and 2 frontend workers with grpc.aio on the port). Every
``--window`` seconds it records the server's RSS and CPU time (/proc, over its process group), the requests
answered, the p50/p99 latency of successful ones and the answers by status; at the end it
writes bench/results/soak.json (RESULTS.md's "soak" section, rendered by bench.bench) and
bench/results/soak.png (RSS, p99 and errors over time). The client and the server share the
machine's cores (and, here, the machine with other engineers' work).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime as _dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
RESULTS = PERF / "results"

PRIO_CONFIG = """name: "mlp_prio"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching {
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000
                         allow_timeout_override: true max_queue_size: 256 }
}
"""


def build_repository(out: Path) -> None:
    from inferd.examples.build import build_repository as build

    build(out, log=lambda *_: None)
    prio = out / "mlp_prio"
    (prio / "1").mkdir(parents=True)
    shutil.copy(out / "mlp" / "1" / "model.onnx", prio / "1" / "model.onnx")
    (prio / "config.pbtxt").write_text(PRIO_CONFIG)


def requests_by_kind():  # type: ignore[no-untyped-def]
    """Pre-built ModelInferRequest messages, one per model."""
    from tritonclient.grpc import service_pb2 as pb

    def message(model: str, tensors: list[tuple[str, str, list[int], bytes]]):  # type: ignore[no-untyped-def]
        m = pb.ModelInferRequest(model_name=model)
        for name, dtype, shape, raw in tensors:
            t = m.inputs.add(name=name, datatype=dtype)
            t.shape.extend(shape)
            m.raw_input_contents.append(raw)
        return m

    rng = np.random.default_rng(0)
    f256 = rng.standard_normal((1, 256), dtype=np.float32).tobytes()
    i16 = np.arange(16, dtype=np.int32).reshape(1, 16).tobytes()
    strings = b"".join(len(s).to_bytes(4, "little") + s for s in [b"soak-%d" % i for i in range(16)])
    return {
        "mlp_prio": message("mlp_prio", [("INPUT0", "FP32", [1, 256], f256)]),
        "mlp": message("mlp", [("INPUT0", "FP32", [1, 256], f256)]),
        "simple": message("simple", [("INPUT0", "INT32", [1, 16], i16), ("INPUT1", "INT32", [1, 16], i16)]),
        "identity_fp32": message("identity_fp32", [("INPUT0", "FP32", [1, 256], f256)]),
        "add_sub": message("add_sub", [("INPUT0", "INT32", [16], i16), ("INPUT1", "INT32", [16], i16)]),
        "simple_string": message("simple_string", [("INPUT0", "BYTES", [1, 16], strings)]),
    }


MIX = [("mlp_prio", 35), ("mlp", 20), ("simple", 15), ("identity_fp32", 10), ("add_sub", 5), ("simple_string", 5)]


class Window:
    def __init__(self) -> None:
        self.codes: collections.Counter = collections.Counter()
        self.latencies: list[float] = []


def server_buckets(metrics_url: str) -> dict[float, float]:
    """The in-server request duration histogram, summed over models: upper bound (s) -> cumulative count."""
    import urllib.request

    out: dict[float, float] = collections.defaultdict(float)
    text = urllib.request.urlopen(metrics_url, timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith("inferd_inference_request_duration_seconds_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float("inf") if le == "+Inf" else float(le)] += float(line.rsplit(" ", 1)[1])
    return dict(out)


def bucket_quantile(now: dict[float, float], before: dict[float, float], q: float) -> float:
    """The ``q`` quantile (s) of the observations between two scrapes, as the bucket bound that holds it."""
    bounds = sorted(now)
    counts = [now[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return 0.0
    for bound, cumulative in zip(bounds, counts):
        if cumulative >= q * total:
            return bound
    return bounds[-1]


def proc_sample(pgid: int) -> tuple[float, float, dict[str, float]]:
    """(RSS MiB, CPU seconds, RSS MiB by process) of the server: every process of its process group
    (the core, which leads the group, its frontend workers and model hosts) and the core's children outside
    it (Envoy, the gRPC front, leads a group of its own)."""
    rss_pages, ticks = 0, 0
    page = os.sysconf("SC_PAGE_SIZE") / 2**20
    by_process: dict[str, float] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        # fields[1] is the parent, fields[2] the process group (the 4th and 5th fields of stat)
        if int(fields[2]) == pgid or int(fields[1]) == pgid:
            ticks += int(fields[11]) + int(fields[12])
            rss_pages += int(fields[21])
            pid = int(stat.parent.name)
            name = "core" if pid == pgid else f"worker {pid}" if int(fields[2]) == pgid else f"envoy {pid}"
            by_process[name] = round(int(fields[21]) * page, 1)
    return rss_pages * page, ticks / os.sysconf("SC_CLK_TCK"), by_process


def rss_slopes(rows: list[dict], warm_up_s: float) -> dict[str, float]:
    """MiB per minute, by least squares over the windows after ``warm_up_s``, for the whole server and
    for each of its processes (the issue's bound: below 0.05 MiB/min after warm-up)."""
    after = [r for r in rows if r["t"] >= warm_up_s]
    if len(after) < 3:
        return {}
    t = np.array([r["t"] / 60 for r in after])
    series = {"server": [r["rss_mib"] for r in after]}
    for name in after[0].get("rss_by_process", {}):
        if all(name in r.get("rss_by_process", {}) for r in after):
            series[name] = [r["rss_by_process"][name] for r in after]
    return {name: round(float(np.polyfit(t, np.array(v), 1)[0]), 4) for name, v in series.items()}


async def drive(url: str, metrics_url: str, pid: int, total: int, rate: float, window_s: float,
                seed: int, cancels: bool = True) -> list[dict]:
    import grpc
    from tritonclient.grpc import service_pb2_grpc as pbg

    rng = random.Random(seed)
    base = requests_by_kind()
    # Four TCP connections: grpc shares one subchannel (one connection) among channels with the same
    # target and options unless each keeps its own pool, and the kernel spreads connections, not
    # requests, over the frontend workers (SO_REUSEPORT): with one connection one worker got all.
    channels = [grpc.aio.insecure_channel(url, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)]
    stubs = [pbg.GRPCInferenceServiceStub(c) for c in channels]
    names = [n for n, _ in MIX]
    weights = [w for _, w in MIX]
    current = Window()
    rows: list[dict] = []
    sent = 0
    inflight: set[asyncio.Task] = set()
    start = time.monotonic()
    last_cpu = proc_sample(pid)[1]
    last_buckets = server_buckets(metrics_url)
    own_cpu = time.process_time()

    async def one(i: int) -> None:
        stub = stubs[i % len(stubs)]
        model = rng.choices(names, weights)[0]
        roll = rng.random()
        msg = base[model]
        timeout = 30.0
        if model == "mlp_prio" or roll >= 0.90:
            msg = type(msg)()
            msg.CopyFrom(base[model])
            if model == "mlp_prio":
                msg.parameters["priority"].int64_param = rng.choice((1, 2))
            if roll >= 0.95:  # a short queue timeout (REJECT when it passes)
                msg.parameters["timeout"].int64_param = rng.randint(1, 200)
                if rng.random() < 1 / 3:
                    timeout = rng.uniform(0.002, 0.02)
        t0 = time.monotonic()
        call = stub.ModelInfer(msg, timeout=timeout)
        try:
            if cancels and 0.90 <= roll < 0.95:  # cancelled by the client
                await asyncio.sleep(rng.uniform(0, 0.003))
                call.cancel()
            await call
            current.codes["OK"] += 1
            current.latencies.append(time.monotonic() - t0)
        except asyncio.CancelledError:
            current.codes["CANCELLED (client)"] += 1
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
            current.codes["CANCELLED (client)" if code == "CANCELLED" and call.cancelled() else code] += 1

    def close_window(now: float) -> None:
        nonlocal current, last_cpu, last_buckets, own_cpu
        rss, cpu, by_process = proc_sample(pid)
        buckets = server_buckets(metrics_url)
        server_p99 = bucket_quantile(buckets, last_buckets, 0.99)
        last_buckets = buckets
        client_cpu, own_cpu = time.process_time() - own_cpu, time.process_time()
        lat = sorted(current.latencies)
        rows.append({
            "t": round(now - start, 1), "sent": sent, "answered": sum(current.codes.values()),
            "rss_mib": round(rss, 1), "rss_by_process": by_process, "cpu_s": round(cpu - last_cpu, 2),
            "p50_ms": round(lat[len(lat) // 2] * 1e3, 2) if lat else 0.0,
            "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, 2) if lat else 0.0,
            "server_p99_ms": round(server_p99 * 1e3, 3), "client_cpu_s": round(client_cpu, 2),
            "loadavg": round(os.getloadavg()[0], 2),
            "codes": dict(current.codes),
        })
        last_cpu = cpu
        current = Window()
        r = rows[-1]
        print(f"t={r['t']:7.1f}s sent={sent:8d} rss={rss:7.1f}MiB p99={r['p99_ms']:7.2f}ms "
              f"in-server p99<={r['server_p99_ms']:g}ms "
              f"cpu={r['cpu_s']:.2f}s {by_process} {r['codes']}", flush=True)

    next_window = start + window_s
    tick = 0.01
    due = start
    while sent < total:
        now = time.monotonic()
        if now >= next_window:
            close_window(now)
            next_window += window_s
        # Open loop: launch what the rate owes since the last tick (never more than 2,000 in flight).
        owed = int((now - start) * rate) - sent
        for _ in range(min(owed, total - sent, max(0, 2000 - len(inflight)))):
            task = asyncio.ensure_future(one(sent))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            sent += 1
        due += tick
        await asyncio.sleep(max(0.0, due - time.monotonic()))
    if inflight:
        await asyncio.wait(inflight, timeout=60)
    close_window(time.monotonic())
    for c in channels:
        await c.close()
    return rows


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] / 60 for r in rows]
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True)
    axes[0].plot(t, [r["rss_mib"] for r in rows])
    axes[0].set_ylabel("server RSS (MiB)")
    axes[0].set_ylim(0, max(r["rss_mib"] for r in rows) * 1.25)
    axes[1].plot(t, [r["p99_ms"] for r in rows], label="p99")
    axes[1].plot(t, [r["p50_ms"] for r in rows], label="p50")
    axes[1].plot(t, [r["server_p99_ms"] for r in rows], label="p99 in the server (bucket bound)")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("latency of OK (ms)")
    if all("loadavg" in r for r in rows):  # the machine's run queue: what the latency mostly follows here
        load = axes[1].twinx()
        load.plot(t, [r["loadavg"] for r in rows], color="grey", alpha=0.4, linewidth=1)
        load.set_ylabel("machine load average (2 cores)", color="grey")
    axes[1].legend()
    codes = sorted({c for r in rows for c in r["codes"] if c != "OK"})
    for c in codes:
        axes[2].plot(t, [r["codes"].get(c, 0) for r in rows], label=c)
    axes[2].set_ylabel("answers per window")
    axes[2].set_xlabel("minutes")
    axes[2].legend(fontsize=8)
    fig.suptitle("inferd soak: %d requests (shared 2-core machine)" % rows[-1]["sent"])
    fig.tight_layout()
    fig.savefig(out, dpi=80)


WARM_UP_S = 300.0  # the first five minutes: the allocator's arenas, grpc's pools and the caches fill


def summarize(rows: list[dict], total: int, rate: float, elapsed: float, window_s: float, name: str = "soak") -> dict:
    quarter = max(1, len(rows) // 4)
    first, last = rows[:quarter], rows[-quarter - 1:-1] or rows[-quarter:]

    def mean(values: list[float]) -> float:
        return float(np.mean(values)) if values else 0.0

    codes: collections.Counter = collections.Counter()
    for r in rows:
        codes.update(r["codes"])
    measures = []
    for label, part in (("first quarter", first), ("last quarter", last)):
        measures.append({
            "label": f"soak, {label}", "concurrency": 0, "batch": 1,
            "infer_per_s": sum(r["codes"].get("OK", 0) for r in part) / max(1e-9, window_s * len(part)),
            "p50_us": mean([r["p50_ms"] for r in part]) * 1e3, "p99_us": mean([r["p99_ms"] for r in part]) * 1e3,
            "note": f"client-seen latency (mean of windows); in the server p99 <= "
                    f"{max(r['server_p99_ms'] for r in part):g} ms; RSS {mean([r['rss_mib'] for r in part]):.0f} MiB, "
                    f"server CPU {mean([r['cpu_s'] for r in part]) / window_s:.2f} cores, client CPU "
                    f"{mean([r['client_cpu_s'] for r in part]) / window_s:.2f} cores",
        })
    notes = (
        f"{total:,} requests offered open-loop at {rate:.0f}/s over {elapsed / 60:.1f} min (gRPC, 4 channels); "
        f"answers: {', '.join(f'{k} {v:,}' for k, v in codes.most_common())}. "
        f"RSS {rows[0]['rss_mib']:.0f} MiB at the first window, {max(r['rss_mib'] for r in rows):.0f} MiB at most, "
        f"{rows[-1]['rss_mib']:.0f} MiB at the end. RSS slope after the first {WARM_UP_S / 60:.0f} minutes "
        f"(least squares over the windows, MiB/min): "
        f"{', '.join(f'{k} {v:+.3f}' for k, v in rss_slopes(rows, WARM_UP_S).items())}. Errors are the ones the mix asks for (client cancels, "
        "queue timeouts, short deadlines); anything else would be a defect. The client and the server share "
        "the 2 cores, and the machine was shared with other engineers' builds and tests.\n\n"
        f"![soak: RSS, latency and errors over time](results/{name}.png)")
    return {"measures": measures, "notes": notes, "windows": rows, "answers": dict(codes),
            "rss_slope_mib_per_min": rss_slopes(rows, WARM_UP_S)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--rate", type=float, default=450.0, help="requests/s offered")
    parser.add_argument("--window", type=float, default=10.0, help="seconds per sample")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--name", default="soak", help="the run's name: <out>/<name>.json and its RESULTS.md section")
    parser.add_argument("--no-client-cancels", action="store_true",
                        help="send the mix's 5%% of client cancels as ordinary requests")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for inferd serve (repeatable), e.g. "
                             "--server-arg=--frontend-worker-max-memory-mib=160 to see workers recycled")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="inferd-soak-"))
    repo = work / "repo"
    build_repository(repo)
    port_file = work / "ports.json"
    log = open(work / "server.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(repo), "--grpc-address", "127.0.0.1",
         "--grpc-port", "0", "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
         "--port-file", str(port_file), *args.server_arg], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not (port_file.exists() and port_file.read_text()):
            if server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: {(work / 'server.log').read_text()[-2000:]}")
            time.sleep(0.2)
        ports = json.loads(port_file.read_text())
        url = f"127.0.0.1:{ports['grpc']}"
        metrics_url = f"http://127.0.0.1:{ports['metrics']}/metrics"
        began = time.monotonic()
        rows = asyncio.run(drive(url, metrics_url, server.pid, args.requests, args.rate, args.window, args.seed,
                                 cancels=not args.no_client_cancels))
        elapsed = time.monotonic() - began
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        code = server.wait(60)
        log.close()
    args.out.mkdir(parents=True, exist_ok=True)
    plot(rows, args.out / f"{args.name}.png")
    result = summarize(rows, args.requests, args.rate, elapsed, args.window, args.name)
    result["server_exit_status"] = code
    server_log = (work / "server.log").read_text(errors="replace")
    # grpc.aio logs (with a traceback) a response it could not send because the client had already ended
    # the call (grpc/grpc#32551): the client cancels and short deadlines of the mix. Counted apart.
    unsent = server_log.count("ExecuteBatchError raised in core by servicer method")
    tracebacks = server_log.count("Traceback") - unsent
    if tracebacks or unsent:  # kept next to the results: what went wrong must be readable after the run
        (args.out / f"{args.name}-server.log").write_text(_without_machine_paths(server_log, work))
    result["notes"] += (f"\n\nServer exit status after SIGTERM: {code}; tracebacks in its log: {tracebacks}, "
                        f"besides {unsent} of gRPC's own logs of an answer to a call the client had already "
                        "cancelled or timed out (ExecuteBatchError, logged by grpc.aio since grpc/grpc#32551).")
    data = {"scenario": args.name, "doc": (__doc__ or "").strip(), "result": result,
            "when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": _machine(), "command": "python -m bench.soak " + " ".join(argv or sys.argv[1:])}
    (args.out / f"{args.name}.json").write_text(json.dumps(data, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    print(result["notes"])
    return 0 if code == 0 and not tracebacks else 1


def _without_machine_paths(text: str, work: Path) -> str:
    """The log as kept in the repository: this checkout's, this Python's and the run's folders named,
    not spelled out (tracebacks carry absolute paths)."""
    for path, name in ((str(work), "<soak folder>"), (str(ROOT) + "/", ""), (sys.base_prefix, "<python>"),
                       (sys.prefix, "<venv>")):
        text = text.replace(path, name)
    return text


def _machine() -> str:
    from bench.bench import machine

    return machine()


if __name__ == "__main__":
    sys.exit(main())

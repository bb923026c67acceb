"""``inferd perf`` next to Triton's perf_analyzer against the same server, in one run.

    python -m bench.compare_clients [-m mlp] [-c 16] [--url HOST:PORT] [-p 5000] [--rounds 3] [--workers N]

Without ``--url`` it builds the example model in a temporary repository, starts
``inferd serve`` on a free port and stops it afterwards. The two clients run one after the
other (never together) with the same concurrency, measurement window and stability rule,
``--rounds`` times each, alternating (A B B A A B ...), so both sample the same drift of a
shared machine; their ratio is the ratio of the medians. For each run it prints the
throughput, the latency percentiles, the client's CPU time (getrusage of the child) and,
per inference, the client's and the server's CPU (the server's from /proc, divided by the
server's own ModelStatistics count over the run). perf_analyzer is skipped, with a message,
when it cannot be installed or run.

From the benchmark suite: ``compare(url, model, concurrency, ...)`` returns the same
numbers as a dict.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.proc_cpu import children_cpu_s

ROOT = Path(__file__).resolve().parent.parent
def find_perf_analyzer() -> Path:
    """Triton's perf_analyzer: $PERF_ANALYZER (or $INFERD_PERF_ANALYZER, which the GPU machine's
    script sets to its wheel's), else ``perf_analyzer`` on PATH (PyPI's perf-analyzer installs it)."""
    for var in ("PERF_ANALYZER", "INFERD_PERF_ANALYZER"):
        if os.environ.get(var):
            return Path(os.environ[var])
    return Path(shutil.which("perf_analyzer") or "perf_analyzer")


PERF_ANALYZER = find_perf_analyzer()


def _run(args: list[str], timeout: float) -> tuple[int, str, float, float]:
    """(exit status, output, wall seconds, CPU seconds of the process and its children)."""
    cpu0, t0 = children_cpu_s(), time.monotonic()
    try:
        proc = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, cwd=ROOT)
        code, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        output = exc.stdout or ""
        code, out = 124, output.decode(errors="replace") if isinstance(output, bytes) else output
    except OSError as exc:
        code, out = 127, str(exc)
    return code, out, time.monotonic() - t0, children_cpu_s() - cpu0


def _csv_row(path: Path) -> dict[str, str] | None:
    if not path.exists() or not path.read_text().strip():
        return None
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return rows[-1] if rows else None


def _summary(row: dict[str, str]) -> dict[str, float]:
    return {
        "throughput": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
        "server_queue_us": float(row["Server Queue"]),
        "server_compute_infer_us": float(row["Server Compute Infer"]),
    }


def run_inferd_perf(url: str, model: str, concurrency: int, interval_ms: int, stability: float,
                    workers: int | None, out_dir: Path, timeout: float = 600) -> dict:
    csv_path, json_path = out_dir / "inferd_perf.csv", out_dir / "inferd_perf.json"
    csv_path.unlink(missing_ok=True)
    args = [sys.executable, "-m", "inferd.cli", "perf", "-m", model, "-u", url,
            "--concurrency-range", str(concurrency), "-p", str(interval_ms), "-s", str(stability),
            *(["--workers", str(workers)] if workers else []), "-f", str(csv_path), "--json", str(json_path)]
    code, out, wall, cpu = _run(args, timeout)
    result: dict = {"command": " ".join(args[1:]).replace("-m inferd.cli", "inferd", 1), "exit": code,
                    "wall_s": wall, "client_cpu_s": cpu}
    row = _csv_row(csv_path)
    if code != 0 or row is None:
        result["error"] = out.strip().splitlines()[-1] if out.strip() else f"exit status {code}"
        return result
    result.update(_summary(row))
    level = json.loads(json_path.read_text())["levels"][0]
    result["stable"] = level["stable"]
    result["windows"] = level["windows"]
    result["measured_s"] = level["duration_s"]
    if level.get("requests"):  # the workers' CPU inside the windows only: no start-up
        result["client_cpu_us_per_infer_in_windows"] = 1e6 * level["client_cpu_s"] / level["requests"]
    return result


def run_perf_analyzer(url: str, model: str, concurrency: int, interval_ms: int, stability: float,
                      out_dir: Path, binary: Path = PERF_ANALYZER, timeout: float = 900) -> dict:
    if not Path(binary).exists() and shutil.which(str(binary)) is None:
        return {"skipped": f"{binary} not found"}
    csv_path = out_dir / "perf_analyzer.csv"
    csv_path.unlink(missing_ok=True)
    args = [str(binary), "-m", model, "-u", url, "-i", "grpc", "--concurrency-range", str(concurrency),
            "-p", str(interval_ms), "-s", str(stability), "-f", str(csv_path)]
    code, out, wall, cpu = _run(args, timeout)
    result: dict = {"command": " ".join(args), "exit": code, "wall_s": wall, "client_cpu_s": cpu}
    row = _csv_row(csv_path)
    if row is None:
        last = out.strip().splitlines()[-1] if out.strip() else f"exit status {code}"
        if "Perf Analyzer Version" in out or "Request concurrency" in out or "Failed to obtain stable" in out:
            result["error"] = last  # it ran, but produced no CSV (e.g. not stable)
        else:
            result["skipped"] = f"perf_analyzer could not be installed or run: {last}"
        return result
    result.update(_summary(row))
    result["stable"] = True  # perf_analyzer writes no CSV for a level it could not stabilize
    return result


def _server_counters(url: str, model: str, pid: int | None) -> tuple[int, float | None]:
    """(the model's successful requests so far, the server process's CPU seconds or None)."""
    import grpc

    from inferd._proto import grpc_service_pb2 as pb
    from inferd._proto import grpc_service_pb2_grpc as pb_grpc

    with grpc.insecure_channel(url) as channel:
        stats = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(pb.ModelStatisticsRequest(name=model),
                                                                         timeout=30)
    count = sum(s.inference_stats.success.count for s in stats.model_stats)
    cpu = None
    if pid is not None:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError, ValueError):
            cpu = None
    return count, cpu


def _measured(run, url: str, model: str, server_pid: int | None) -> dict:  # type: ignore[no-untyped-def]
    """One client run with the server's count and CPU around it: CPU per inference of both."""
    n0, s0 = _server_counters(url, model, server_pid)
    result = run()
    n1, s1 = _server_counters(url, model, server_pid)
    served = n1 - n0
    if served > 0:
        result["client_cpu_us_per_infer"] = 1e6 * result["client_cpu_s"] / served
        if s0 is not None and s1 is not None:
            result["server_cpu_us_per_infer"] = 1e6 * (s1 - s0) / served
    return result


def _median(runs: list[dict], key: str) -> float | None:
    values = sorted(r[key] for r in runs if key in r)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def compare(url: str, model: str = "mlp", concurrency: int = 16, interval_ms: int = 5000,
            stability: float = 10.0, workers: int | None = None, out_dir: Path | None = None,
            perf_analyzer: Path = PERF_ANALYZER, rounds: int = 1, server_pid: int | None = None) -> dict:
    """Run both clients against ``url``, ``rounds`` times each, alternating who goes first in
    each round (ABBA...); per-run numbers, their medians and the ratio of the medians."""
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="compare_clients-")
        out_dir = Path(tmp.name)
    runs: dict[str, list[dict]] = {"inferd_perf": [], "perf_analyzer": []}
    clients = {
        "inferd_perf": lambda: run_inferd_perf(url, model, concurrency, interval_ms, stability, workers, out_dir),
        "perf_analyzer": lambda: run_perf_analyzer(url, model, concurrency, interval_ms, stability, out_dir,
                                                   perf_analyzer),
    }
    try:
        for r in range(rounds):
            order = ("inferd_perf", "perf_analyzer") if r % 2 == 0 else ("perf_analyzer", "inferd_perf")
            for name in order:
                result = _measured(clients[name], url, model, server_pid)
                runs[name].append(result)
                if "skipped" in result:  # not installed: no point in more rounds of it
                    clients[name] = lambda result=result: dict(result)
    finally:
        if tmp is not None:
            tmp.cleanup()
    summary: dict = {"model": model, "url": url, "concurrency": concurrency, "interval_ms": interval_ms,
                     "rounds": rounds, "runs": runs}
    for name, results in runs.items():
        merged = dict(results[-1])
        for key in ("throughput", "p50_us", "p99_us", "client_cpu_us_per_infer", "server_cpu_us_per_infer"):
            value = _median(results, key)
            if value is not None:
                merged[key] = value
        summary[name] = merged
    ours, theirs = summary["inferd_perf"].get("throughput"), summary["perf_analyzer"].get("throughput")
    summary["ratio_inferd_over_perf_analyzer"] = ours / theirs if ours and theirs else None
    return summary


# --------------------------------------------------------------------------- own server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, model: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    import grpc

    from inferd._proto import grpc_service_pb2 as pb
    from inferd._proto import grpc_service_pb2_grpc as pb_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"inferd serve exited with {proc.returncode}")
            try:
                if stub.ModelReady(pb.ModelReadyRequest(name=model), timeout=2).ready:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise RuntimeError(f"inferd serve was not ready within {timeout:g}s")


def _print(result: dict) -> None:
    print(f"\nmodel {result['model']} at {result['url']}, concurrency {result['concurrency']}, "
          f"{result['interval_ms']} ms windows")
    for name in ("inferd_perf", "perf_analyzer"):
        for i, run in enumerate(result["runs"][name]):
            if "throughput" in run:
                cpu = "".join(f"  {who} CPU {run[k]:.0f} us/infer" for who, k in (
                    ("client", "client_cpu_us_per_infer"), ("server", "server_cpu_us_per_infer")) if k in run)
                print(f"  {name.replace('_', ' '):14s} run {i + 1}: {run['throughput']:10.1f} infer/s{cpu}")
        r = result[name]
        label = name.replace("_", " ") + (" (median)" if result["rounds"] > 1 else "")
        if "throughput" in r:
            print(f"  {label:14s} {r['throughput']:10.1f} infer/s  p50 {r['p50_us']:8.0f} us  "
                  f"p99 {r['p99_us']:8.0f} us  {'stable' if r.get('stable') else 'NOT stable'}  "
                  f"client CPU {r['client_cpu_s']:6.2f} s over {r['wall_s']:.1f} s "
                  f"({100 * r['client_cpu_s'] / max(r['wall_s'], 1e-9):.0f}% of a core, startup included)")
        else:
            print(f"  {label:14s} {'skipped' if 'skipped' in r else 'failed'}: {r.get('skipped') or r.get('error')}")
    if result["ratio_inferd_over_perf_analyzer"] is not None:
        print(f"  ratio inferd perf / perf_analyzer throughput: {result['ratio_inferd_over_perf_analyzer']:.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.compare_clients", description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", default="mlp")
    parser.add_argument("-c", "--concurrency", type=int, default=16)
    parser.add_argument("-u", "--url", default=None, help="an already running server (default: start one)")
    parser.add_argument("-p", "--measurement-interval", type=int, default=5000, metavar="MS")
    parser.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=None, help="inferd perf --workers (default: its own)")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each client, alternating (default 1)")
    parser.add_argument("--perf-analyzer", type=Path, default=PERF_ANALYZER,
                        help=f"perf_analyzer to run (default {PERF_ANALYZER}; its first run installs it)")
    parser.add_argument("--json", default=None, help="also write the numbers here")
    args = parser.parse_args(argv)

    server = None
    tmp = None
    log = None
    url = args.url
    try:
        if url is None:
            from inferd.examples.build import build_repository

            tmp = tempfile.TemporaryDirectory(prefix="compare_clients-repo-")
            build_repository(tmp.name, only=[args.model], log=None)
            port = _free_port()
            url = f"127.0.0.1:{port}"
            inferd = Path(sys.executable).with_name("inferd")
            cmd = [str(inferd) if inferd.exists() else sys.executable, *([] if inferd.exists() else ["-m", "inferd.cli"]),
                   "serve", "--model-repository", tmp.name, "--grpc-port", str(port),
                   "--http-port", "0", "--metrics-port", "0"]
            print("server:", " ".join(cmd), flush=True)
            log = open(os.path.join(tmp.name, "server.log"), "wb")
            server = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
            _wait_ready(url, args.model, server)
        result = compare(url, args.model, args.concurrency, args.measurement_interval,
                         args.stability_percentage, args.workers, perf_analyzer=args.perf_analyzer,
                         rounds=args.rounds, server_pid=server.pid if server is not None else None)
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if log is not None:
            log.close()
        if tmp is not None:
            tmp.cleanup()
    _print(result)
    for name in ("inferd_perf", "perf_analyzer"):
        if "command" in result[name]:
            print(f"  {name}: {result[name]['command']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0 if "throughput" in result["inferd_perf"] else 1


if __name__ == "__main__":
    sys.exit(main())

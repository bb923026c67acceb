"""A stream flooded by its model (issue 24): a decoupled Python model sends up to 10^7 small
    responses (16 FP32 each) as fast as it can to a gRPC client that reads one every 10 ms; after
    10 s the client cancels. One server, default process mode (core + 2 frontend workers), default
    stream limits. Sampled every 0.5 s: the RSS of the core and of the workers, the latency of
    /v2/health/live and of /metrics, the responses the model has sent and the client has read.
    Then: how long after the cancel the model saw ``is_cancelled()``, and how long SIGTERM took to
    end the process tree. The client and the server share the machine's 2 cores."""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent.parent / "tests"
NEEDS_PERF_ANALYZER = False
FLOATS = 16
COUNT = 10_000_000


def _timed_get(url: str) -> float:
    t0 = time.perf_counter()
    urllib.request.urlopen(url, timeout=30).read()
    return (time.perf_counter() - t0) * 1e3


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run(quick: bool) -> dict:
    sys.path.insert(0, str(TESTS))
    from conftest import ServerProcess, group_members
    from test_stream_trust import SlowStream, _progress, _python, _request, flood_source

    from bench.proc_cpu import TICK, all_stats, read_stat, server_tree

    seconds = 4.0 if quick else 10.0
    repo = Path(tempfile.mkdtemp(prefix="inferd-flood-"))
    _python(repo, "flood", flood_source(FLOATS), [FLOATS])
    server = ServerProcess(repo)
    samples: list[dict] = []
    read = 0
    try:
        base = f"http://{server.http_url}"
        stream = SlowStream(server.url, _request("flood", COUNT))
        stop = threading.Event()

        def reader() -> None:
            nonlocal read
            while not stop.is_set():
                try:
                    stream.read()
                except Exception:
                    return
                read += 1
                time.sleep(0.01)

        thread = threading.Thread(target=reader, daemon=True)
        thread.start()
        t0 = time.monotonic()
        core_before = read_stat(server.proc.pid)
        while time.monotonic() - t0 < seconds:
            procs = [st.pid for st in server_tree(server.proc.pid, all_stats())]
            samples.append({
                "t": round(time.monotonic() - t0, 2),
                "core_rss_mib": round(_rss_mib(server.proc.pid), 1),
                "workers_rss_mib": round(sum(_rss_mib(p) for p in procs if p != server.proc.pid), 1),
                "live_ms": round(_timed_get(f"{base}/v2/health/live"), 2),
                "metrics_ms": round(_timed_get(server.metrics_url), 2),
                "sent": _progress(repo, "flood"),
                "read": read,
            })
            time.sleep(0.5)
        core_after = read_stat(server.proc.pid)
        cancel_at = time.monotonic()
        core_cpu = ((core_after.ticks - core_before.ticks) / TICK / (cancel_at - t0)
                    if core_before and core_after else float("nan"))
        stop.set()
        stream.cancel()
        seen = None
        while time.monotonic() - cancel_at < 30:
            if any((repo / "flood").glob("cancelled.*")):
                seen = time.monotonic() - cancel_at
                break
            time.sleep(0.01)
        after_rss = _rss_mib(server.proc.pid)
        t1 = time.monotonic()
        code = server.stop()
        stop_s = time.monotonic() - t1
        left = group_members(server.proc.pid)
    finally:
        if server.proc.poll() is None:
            server.stop()
    live = sorted(s["live_ms"] for s in samples)
    metrics = sorted(s["metrics_ms"] for s in samples)
    sent = max(s["sent"] for s in samples)
    out = {
        "measures": [],
        "samples": samples,
        "facts": {
            "responses the model sent while the client read": f"{sent:,} sent, {read:,} read, in {seconds:g} s",
            "core RSS, first and last sample, MiB": f"{samples[0]['core_rss_mib']} -> {samples[-1]['core_rss_mib']} "
                                                    f"(after the cancel {after_rss:.1f})",
            "workers' RSS, first and last sample, MiB": f"{samples[0]['workers_rss_mib']} -> "
                                                        f"{samples[-1]['workers_rss_mib']}",
            "core CPU while flooded": f"{core_cpu:.0%} of one core",
            "/v2/health/live latency, median / max": f"{live[len(live) // 2]:.1f} / {live[-1]:.1f} ms",
            "/metrics latency, median / max": f"{metrics[len(metrics) // 2]:.1f} / {metrics[-1]:.1f} ms",
            "the model saw is_cancelled() after the client's cancel": (
                f"{seen * 1e3:.0f} ms" if seen is not None else "not within 30 s"),
            "SIGTERM to the whole process tree gone": f"{stop_s:.2f} s, exit code {code}, {len(left)} processes left",
        },
    }
    return out


def ratios(result: dict) -> dict:
    return dict(result.get("facts", {}))

"""Results out: the terminal table, perf_analyzer's CSV, JSON and a plot (matplotlib, imported lazily)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import TextIO

from .windows import PERCENTILES
from .results import LevelResult, RunResult

# perf_analyzer 2.60's `-f` header, checked against the real tool (time-windows, server stats on,
# response cache off). The first column is "Request Rate" in the open-loop mode; --verbose-csv
# appends the three VERBOSE_COLUMNS.
CSV_COLUMNS = [
    "Inferences/Second", "Client Send", "Network+Server Send/Recv", "Server Queue",
    "Server Compute Input", "Server Compute Infer", "Server Compute Output", "Client Recv",
] + [f"p{p} latency" for p in PERCENTILES]
VERBOSE_COLUMNS = ["Avg latency", "request/response", "response wait"]


def csv_header(mode: str, verbose: bool) -> list[str]:
    first = "Concurrency" if mode == "concurrency" else "Request Rate"
    return [first] + CSV_COLUMNS + (VERBOSE_COLUMNS if verbose else [])


def _level_text(level: LevelResult) -> str:
    return str(int(level.level)) if level.mode == "concurrency" else f"{level.level:g}"


def csv_row(level: LevelResult, verbose: bool) -> list[str]:
    c, s = level.client, level.server
    lat = c.latency_us
    # Requests are serialized once and responses are not parsed, so the client's per-request
    # marshalling time (perf_analyzer's "Client Send"/"Client Recv") is 0 by construction.
    send_us = recv_us = 0
    row = [
        _level_text(level),
        f"{level.throughput:.6g}",
        str(send_us),
        str(int(level.network_us)),
        str(int(s["queue_avg_us"])),
        str(int(s["compute_input_avg_us"])),
        str(int(s["compute_infer_avg_us"])),
        str(int(s["compute_output_avg_us"])),
        str(recv_us),
    ] + [str(int(lat.get(f"p{p}", 0))) for p in PERCENTILES]
    if verbose:
        avg = int(lat.get("avg", 0))
        row += [str(avg), str(send_us + recv_us), str(avg - send_us - recv_us)]
    return row


def write_csv(result: RunResult, path: str | Path) -> None:
    verbose = result.options.verbose_csv
    lines = [",".join(csv_header(result.options.mode, verbose))]
    lines += [",".join(csv_row(level, verbose)) for level in result.levels]
    Path(path).write_text("\n".join(lines) + "\n")


def to_dict(result: RunResult) -> dict:
    o = result.options
    levels = []
    for lv in result.levels:
        levels.append({
            o.mode: lv.level,
            "throughput_infer_per_s": lv.throughput,
            "throughput_requests_per_s": lv.client.throughput_rps,
            "requests": lv.client.success,
            "completed": lv.client.completed,
            "errors": lv.client.errors,
            "error_messages": lv.error_samples,
            "duration_s": lv.client.duration_s,
            "latency_us": lv.client.latency_us,
            "server": lv.server,
            "network_server_send_recv_us": lv.network_us,
            "stable": lv.stable,
            "windows": lv.windows,
            "window_history": lv.window_history,
            "send_rate": lv.send_rate,
            "delayed_pct": lv.delayed_pct,
            "sent_fraction": lv.sent_fraction,
            "rate_kept": lv.rate_kept,
            "client_cpu_s": lv.client_cpu_s,
            "wall_s": lv.wall_s,
        })
    options = dataclasses.asdict(o)
    options["shapes"] = {k: list(v) for k, v in o.shapes.items()}
    options["headers"] = [[name, "(set)"] for name, _ in o.headers]  # values may be credentials
    return {
        "tool": "inferd perf",
        "model": {
            "name": result.model.name, "version": o.version, "versions": result.model.versions,
            "platform": result.model.platform, "max_batch_size": result.model.max_batch_size,
            "inputs": [{"name": i.name, "datatype": i.datatype, "dims": list(i.dims)} for i in result.model.inputs],
        },
        "options": options,
        "request_bytes": result.payload_bytes,
        "levels": levels,
        "client": {
            "wall_s": result.wall_s,
            "cpu_user_s": result.client_cpu_user_s,
            "cpu_sys_s": result.client_cpu_sys_s,
            "cpu_s": result.client_cpu_s,
            "workers": o.workers,
        },
    }


def write_json(result: RunResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_dict(result), indent=2) + "\n")


def print_table(result: RunResult, out: TextIO | None = None) -> None:
    out = out or sys.stdout  # looked up now: a default bound at import would keep a replaced stream
    o = result.options
    first = "Concurrency" if o.mode == "concurrency" else "Rate/s"
    how = (f"{o.request_count} requests per level" if o.request_count
           else f"windows of {o.interval_ms} ms, stable within {o.stability_pct:g}% over 3 (max {o.max_trials})")
    version = f" version {o.version}" if o.version else ""
    print(f"\ninferd perf: model '{o.model}'{version} at {o.url} ({o.protocol}), batch {o.batch_size}, "
          f"{o.workers} worker{'s' if o.workers > 1 else ''}, {how}", file=out)
    cols = [first, "Infer/s", "Avg us", "p50 us", "p90 us", "p95 us", "p99 us", "Errors",
            "Queue", "CmpIn", "CmpInf", "CmpOut", "Net+Srv", "CPU%"]
    rows = []
    notes = []
    for lv in result.levels:
        c, s, lat = lv.client, lv.server, lv.client.latency_us
        mark = ""
        if lv.stable is False:
            mark += "~"
        if lv.rate_kept is False:
            mark += "!"
        rows.append([
            _level_text(lv) + mark, f"{lv.throughput:.1f}", f"{lat.get('avg', 0):.0f}",
            *[f"{lat.get(f'p{p}', 0):.0f}" for p in PERCENTILES],
            str(sum(c.errors.values())),
            f"{s['queue_avg_us']:.0f}", f"{s['compute_input_avg_us']:.0f}", f"{s['compute_infer_avg_us']:.0f}",
            f"{s['compute_output_avg_us']:.0f}", f"{lv.network_us:.0f}",
            f"{100 * lv.client_cpu_s / lv.wall_s:.0f}" if lv.wall_s else "-",
        ])
        if c.errors:
            notes.append(f"{_level_text(lv)}: errors " + ", ".join(f"{k} x{v}" for k, v in c.errors.items()))
        if lv.send_rate is not None:
            notes.append(f"{_level_text(lv)} req/s: sent {lv.send_rate:.1f} req/s ({100 * (lv.sent_fraction or 0):.1f}% "
                         f"of the schedule), {lv.delayed_pct:.1f}% of sends >2 ms late"
                         + ("" if lv.rate_kept is not False else "; rate NOT kept"))
    widths = [max(len(col), *(len(r[i]) for r in rows)) if rows else len(col) for i, col in enumerate(cols)]
    print("  ".join(col.rjust(w) for col, w in zip(cols, widths)), file=out)
    for r in rows:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths)), file=out)
    print("Server columns: average per request from ModelStatistics deltas (queue, compute input/infer/output); "
          "Net+Srv: client average minus them. CPU%: client CPU (all processes) per wall second.", file=out)
    if any(lv.stable is False for lv in result.levels):
        print("~ not stable within --max-trials windows", file=out)
    if any(lv.rate_kept is False for lv in result.levels):
        print("! the client could not keep the request rate", file=out)
    for note in notes:
        print(note, file=out)
    print(f"Client CPU: {result.client_cpu_s:.2f} s (user {result.client_cpu_user_s:.2f}, "
          f"sys {result.client_cpu_sys_s:.2f}; self + {o.workers} worker process{'es' if o.workers > 1 else ''}) "
          f"over {result.wall_s:.2f} s wall = {100 * result.client_cpu_s / max(result.wall_s, 1e-9):.0f}% of one core",
          file=out)


def write_plot(result: RunResult, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    o = result.options
    levels = result.levels
    labels = [_level_text(lv) for lv in levels]
    thr = [lv.throughput for lv in levels]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    for key, style in (("p50", "o-"), ("p99", "s--")):
        ax1.plot(thr, [lv.client.latency_us.get(key, 0) / 1e3 for lv in levels], style, label=key)
    for x, y, text in zip(thr, [lv.client.latency_us.get("p50", 0) / 1e3 for lv in levels], labels):
        ax1.annotate(text, (x, y), textcoords="offset points", xytext=(4, -12), fontsize=8)
    ax1.set_xlabel("throughput (infer/s)")
    ax1.set_ylabel("latency (ms)")
    ax1.set_title("throughput vs latency" + (" (labels: concurrency)" if o.mode == "concurrency" else " (labels: req/s)"))
    ax1.grid(True, alpha=0.3)
    ax1.legend()
    xs = range(len(levels))
    for key, style in (("p50", "o-"), ("p90", "^-"), ("p95", "v-"), ("p99", "s-"), ("avg", "x:")):
        ax2.plot(xs, [lv.client.latency_us.get(key, 0) / 1e3 for lv in levels], style, label=key)
    ax2.set_xticks(list(xs), labels)
    ax2.set_xlabel("concurrency" if o.mode == "concurrency" else "request rate (req/s)")
    ax2.set_ylabel("latency (ms)")
    ax2.set_title("latency percentiles per load level")
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    fig.suptitle(f"inferd perf: {o.model} at {o.url}, batch {o.batch_size}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

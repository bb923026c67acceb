"""``inferd tune``'s output: the table of every measurement, the Pareto front as a PNG, the chosen
configuration as a config.pbtxt diff (and, with --write, written), and the figures as JSON."""

from __future__ import annotations

import difflib
import json
import time
from pathlib import Path
from typing import Any

from inferd._proto import model_config_pb2 as mc
from inferd.config import config_to_text
from inferd.tune.search import Measurement, SearchResult, SearchSettings


def table(measurements: list[Measurement]) -> str:
    head = f"{'candidate':58} {'level':>6} {'infer/s':>9} {'p50 us':>9} {'p99 us':>9} {'cpu/inf us':>10} {'RSS MiB':>8}"
    rows = [head, "-" * len(head)]
    for m in measurements:
        label = m.candidate.label() + (" (repeat)" if m.repeat else "")
        if m.error:
            rows.append(f"{label:58} {m.level:>6g} failed: {m.error[:80]}")
            continue
        cpu = f"{m.server_cpu_us:,.0f}" if m.server_cpu_us else "-"
        rss = f"{m.rss_mib:,.0f}" if m.rss_mib else "-"
        rows.append(f"{label:58} {m.level:>6g} {m.throughput:>9,.1f} {m.p50_us:>9,.0f} {m.p99_us:>9,.0f} {cpu:>10} {rss:>8}")
    return "\n".join(rows)


def pareto(measurements: list[Measurement]) -> list[Measurement]:
    """The measurements no other beats on both throughput (higher) and p99 (lower), by throughput."""
    ok = [m for m in measurements if not m.error and m.throughput > 0]
    front = [m for m in ok if not any(o.throughput >= m.throughput and o.p99_us <= m.p99_us
                                      and (o.throughput > m.throughput or o.p99_us < m.p99_us) for o in ok)]
    return sorted(front, key=lambda m: m.throughput)


def plot(result: SearchResult, settings: SearchSettings, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [m for m in result.measurements if not m.error and m.throughput > 0]
    fig, ax = plt.subplots(figsize=(9, 6))
    ax.scatter([m.throughput for m in ok], [m.p99_us / 1e3 for m in ok], s=14, color="grey", alpha=0.6,
               label="measured")
    front = pareto(ok)
    ax.plot([m.throughput for m in front], [m.p99_us / 1e3 for m in front], "o-", color="tab:blue",
            label="Pareto front")
    if result.recommended is not None:
        chosen = [m for m in ok if m.candidate == result.recommended]
        ax.scatter([m.throughput for m in chosen], [m.p99_us / 1e3 for m in chosen], s=80, marker="*",
                   color="tab:red", label="chosen: " + result.recommended.label(), zorder=3)
    ax.axhline(settings.latency_budget_us / 1e3, color="tab:orange", linestyle="--", label="latency budget")
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"inferd tune: {len(result.measurements)} measurements, objective {settings.objective}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def config_diff(base: mc.ModelConfig, chosen: mc.ModelConfig, name: str) -> str:
    return "".join(difflib.unified_diff(config_to_text(base).splitlines(keepends=True),
                                        config_to_text(chosen).splitlines(keepends=True),
                                        f"{name}/config.pbtxt (now)", f"{name}/config.pbtxt (tuned)"))


def write_config(model_dir: Path, chosen: mc.ModelConfig) -> Path:
    """Write the tuned config.pbtxt, keeping the old one beside it; returns where the old one went."""
    target = model_dir / "config.pbtxt"
    kept = model_dir / f"config.pbtxt.before-tune-{time.strftime('%Y%m%d-%H%M%S')}"
    if target.exists():
        target.replace(kept)
    target.write_text(config_to_text(chosen))
    return kept


def to_json(result: SearchResult, settings: SearchSettings, extra: dict[str, Any]) -> str:
    doc = {
        "settings": {"levels": list(settings.levels), "objective": settings.objective,
                     "latency_budget_us": settings.latency_budget_us, "time_budget_s": settings.time_budget_s,
                     "seed": settings.seed, "noise": settings.noise},
        "space": result.space, "sampled": result.sampled, "measured": len(result.measurements),
        "elapsed_s": result.elapsed_s, "stopped_by_budget": result.stopped_by_budget,
        "recommended": result.recommended.to_dict() if result.recommended else None,
        "best": result.best.to_dict() if result.best else None,
        "runner_up": result.runner_up.to_dict() if result.runner_up else None,
        "deciding_level": result.deciding_level, "spread": result.spread, "margin": result.margin,
        "reason": result.reason, "pruned": result.pruned,
        "measurements": [m.to_dict() for m in result.measurements], **extra,
    }
    return json.dumps(doc, indent=1)

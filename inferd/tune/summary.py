"""``inferd tune``'s output: what was measured, pruned and never reached, the verification table,
the chosen configuration as a config.pbtxt diff (and, with --write, written), the figures as JSON
and, where matplotlib is installed (``pip install 'inferd[perf]'``), a plot. Plain text always."""

from __future__ import annotations

import difflib
import json
import time
from pathlib import Path
from typing import Any

from inferd._proto import model_config_pb2 as mc
from inferd.config import config_to_text
from inferd.tune.rounds import Estimate, Pair
from inferd.tune.search import CandidateReport, SearchResult, SearchSettings, Verification
from inferd.tune.stats import median

FATE_ORDER = {"verified": 0, "pruned": 1}


def _ms(us: float | None) -> str:
    return f"{us / 1e3:,.1f}" if us is not None else "-"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _interval(est: Estimate | None) -> str:
    if est is None:
        return "-"
    if not est.score.bounded:
        return "(n<5)"
    return f"{est.low:.2f}-{est.high:.2f}"


def baseline(result: SearchResult) -> str:
    """One line on the current configuration at the target level, and the host's load meanwhile."""
    if result.target_level is None:
        return ""
    rounds = [r for r in result.ledger.rounds if r.ok and r.level == result.target_level
              and r.candidate == _base(result)]
    if not rounds:
        return ""
    cpu = [r.server_cpu_us for r in rounds if r.server_cpu_us]
    others = [r.others_cores for r in rounds if r.others_cores is not None]
    line = (f"current config at {result.target_level:g}: {median([r.throughput for r in rounds]):,.0f} infer/s, "
            f"p99 {_ms(median([r.p99_us for r in rounds]))} ms"
            + (f", {median(cpu):,.0f} us server CPU per inference" if cpu else "")
            + f" (medians of {len(rounds)} rounds)")
    if others:
        line += (f"; other processes used {median(others):.2f} of the host's cores meanwhile (from /proc, "
                 f"{min(others):.2f}-{max(others):.2f} a round)")
    return line


def _base(result: SearchResult) -> Any:
    scans = [r for r in result.ledger.rounds if r.phase == "scan"]
    return scans[0].candidate if scans else None


def scan_table(result: SearchResult) -> str:
    rows = [f"{'level':>7} {'rounds':>6} {'infer/s':>9} {'p99 ms':>8} {'cpu/inf us':>10}"]
    for e in result.scan:
        thr = f"{e.throughput:,.0f}" if e.throughput is not None else "-"
        cpu = f"{e.cpu_us:,.0f}" if e.cpu_us is not None else "-"
        rows.append(f"{e.level:>7g} {e.rounds:>6} {thr:>9} {_ms(e.p99_us):>8} {cpu:>10}"
                    + ("   <- target" if e.level == result.target_level else ""))
    return "\n".join(rows)


def candidate_table(result: SearchResult) -> str:
    """Every candidate measured: its ratio to the current config by the objective over all its
    pairs with the interval, its throughput, CPU-per-inference and p99 ratios, its p99, and what
    became of it."""
    head = (f"{'candidate':52} {'pairs':>5} {'ratio':>6} {'90% int':>10} {'infer/s':>7} {'cpu/inf':>7} "
            f"{'p99':>6} {'p99 ms':>7}  fate")
    rows = [head, "-" * len(head)]
    reports = sorted(result.reports, key=lambda r: (FATE_ORDER.get(r.fate, 2), -r.rung,
                                                    -(r.estimate.ratio if r.estimate else 0)))
    for rep in reports:
        est = rep.estimate
        fate = "verified" if rep.fate == "verified" else f"pruned: {rep.reason}"
        rows.append(f"{rep.candidate.label()[:52]:52} {est.pairs if est else 0:>5} "
                    f"{_x(est.ratio if est else None):>6} {_interval(est):>10} "
                    f"{_x(est.throughput_ratio if est else None):>7} {_x(est.cpu_ratio if est else None):>7} "
                    f"{_x(est.p99_ratio if est else None):>6} {_ms(est.p99_us if est else None):>7}  {fate}")
    return "\n".join(rows)


def pair_table(pairs: list[Pair]) -> str:
    """Pair by pair: the order, both rounds' throughput and their ratio, p99, CPU per inference
    (from /proc) and the cores other processes used during each round."""
    head = (f"{'#':>3} {'order':9} {'current/s':>9} {'cand/s':>9} {'ratio':>6} {'p99 cur':>8} {'p99 cand':>8} "
            f"{'cpu cur':>7} {'cpu cand':>8} {'others':>11}")
    rows = [head]
    for i, p in enumerate(pairs, 1):
        a, b = p.base, p.other
        ratio = b.throughput / a.throughput if a.ok and b.ok else None
        others = (f"{a.others_cores:.2f}/{b.others_cores:.2f}" if a.others_cores is not None
                  and b.others_cores is not None else "-")
        cpu_a = f"{a.server_cpu_us:,.0f}" if a.server_cpu_us else "-"
        cpu_b = f"{b.server_cpu_us:,.0f}" if b.server_cpu_us else "-"
        rows.append(f"{i:>3} {'cur,cand' if p.base_first else 'cand,cur':9} {a.throughput:>9,.0f} {b.throughput:>9,.0f} "
                    f"{_x(ratio):>6} {_ms(a.p99_us):>8} {_ms(b.p99_us):>8} {cpu_a:>7} {cpu_b:>8} {others:>11}")
    return "\n".join(rows)


def verification_text(v: Verification) -> str:
    verdict = {"winner": "WINS", "current": "does not win: the current config stays",
               "none": "is not decided"}[v.decision]
    return (f"verification at {v.level:g}: {v.candidate.label()} against the current config, {len(v.pairs)} fresh "
            f"pairs in alternating order (p99 in ms; CPU per inference in us, from /proc; others: cores used by "
            f"other processes during each round)\n{pair_table(v.pairs)}\n"
            f"{v.candidate.label()} {verdict}: {v.reason}")


def counts(result: SearchResult) -> str:
    pruned = [r for r in result.reports if r.fate == "pruned"]
    return (f"candidates: the model allows {result.space}; {result.distinct} behave differently at "
            f"{result.target_level:g}; {result.measured} measured ({len(result.reports) - len(pruned)} verified, "
            f"{len(pruned)} pruned), {len(result.never_reached)} never reached; "
            f"{len(result.ledger.rounds)} rounds in {result.elapsed_s:.0f} s"
            + (" (stopped by the time budget)" if result.stopped_by_budget else ""))


def report(result: SearchResult) -> str:
    """The whole text report, as printed."""
    parts = [scan_table(result)]
    if result.target_level is not None:
        parts += [baseline(result), candidate_table(result), counts(result)]
    if result.verification is not None:
        parts.append(verification_text(result.verification))
    parts += result.notes
    return "\n\n".join(p for p in parts if p)


def decision_line(result: SearchResult) -> str:
    if result.decision == "winner":
        return f"decision: {result.recommended.label()} ({result.reason})"  # type: ignore[union-attr]
    if result.decision == "current":
        return f"decision: the current config is best ({result.reason})"
    return f"no decision: {result.reason}"


def plot(result: SearchResult, settings: SearchSettings, path: Path) -> None:
    """Each candidate measured: its ratio to the current config (with the interval) against its
    p99; and the final's and the verification's pairs, round by round."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 5.5))
    shown = [r for r in result.reports if r.estimate is not None and r.estimate.p99_us is not None]
    for rep in shown:
        est = rep.estimate
        assert est is not None
        low = est.low if est.score.bounded else est.ratio
        high = est.high if est.score.bounded else est.ratio
        color = "tab:red" if rep.candidate == result.recommended else ("tab:blue" if rep.fate == "verified" else "grey")
        ax.errorbar([est.ratio], [est.p99_us / 1e3], xerr=[[est.ratio - low], [high - est.ratio]], fmt="o",
                    color=color, ms=4, alpha=0.8)
    ax.axvline(1.0, color="black", lw=0.8)
    ax.axvline(1.0 + settings.min_gain, color="tab:green", ls=":", label=f"+{settings.min_gain:.0%}")
    if settings.objective != "latency":
        ax.axhline(settings.latency_budget_us / 1e3, color="tab:orange", ls="--", label="p99 budget")
    ax.set_xlabel(f"{settings.objective} ratio to the current config (bars: 90% interval over its pairs)")
    ax.set_ylabel("p99 (ms, estimated)")
    level = f"at {result.target_level:g}" if result.target_level is not None else "(no level could be measured)"
    ax.set_title(f"{result.measured} candidates {level}: grey pruned, blue verified, red chosen")
    ax.legend(fontsize=8)
    pairs = result.verification.pairs if result.verification else []
    ratios = [p.other.throughput / p.base.throughput for p in pairs if p.base.ok and p.other.ok]
    if ratios:
        bx.plot(range(1, len(ratios) + 1), ratios, "o-", color="tab:red", ms=3, label="verification pairs")
    bx.axhline(1.0, color="black", lw=0.8)
    bx.set_xlabel("verification pair")
    bx.set_ylabel("throughput ratio, candidate / current")
    bx.legend(fontsize=8)
    fig.suptitle(decision_line(result)[:150], fontsize=9)
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


def _report_dict(rep: CandidateReport) -> dict[str, Any]:
    return {"candidate": rep.candidate.to_dict(), "label": rep.candidate.label(), "fate": rep.fate,
            "reason": rep.reason, "rung": rep.rung, "estimate": rep.estimate.to_dict() if rep.estimate else None}


def _pair_dict(p: Pair) -> dict[str, Any]:
    return {"base_first": p.base_first, "current": p.base.to_dict(), "candidate": p.other.to_dict()}


def to_json(result: SearchResult, settings: SearchSettings, extra: dict[str, Any]) -> str:
    doc = {
        "settings": {"levels": list(settings.levels), "objective": settings.objective,
                     "latency_budget_us": settings.latency_budget_us, "time_budget_s": settings.time_budget_s,
                     "seed": settings.seed, "min_gain": settings.min_gain, "confidence": settings.confidence,
                     "win_confidence": settings.win_confidence},
        "decision": result.decision, "reason": result.reason,
        "recommended": result.recommended.to_dict() if result.recommended else None,
        "target_level": result.target_level,
        "scan": [e.__dict__ for e in result.scan],
        "space": result.space, "distinct": result.distinct, "measured": result.measured,
        "pruned": {r.candidate.label(): r.reason for r in result.reports if r.fate == "pruned"},
        "never_reached": [c.label() for c in result.never_reached],
        "candidates": [_report_dict(r) for r in result.reports],
        "verified": result.final.to_dict() if result.final else None,
        "verification": None if result.verification is None else {
            "candidate": result.verification.candidate.to_dict(), "level": result.verification.level,
            "decision": result.verification.decision, "passed": result.verification.passed,
            "reason": result.verification.reason,
            "estimate": result.verification.estimate.to_dict() if result.verification.estimate else None,
            "win_estimate": result.verification.win.to_dict() if result.verification.win else None,
            "pairs": [_pair_dict(p) for p in result.verification.pairs]},
        "elapsed_s": result.elapsed_s, "stopped_by_budget": result.stopped_by_budget, "notes": result.notes,
        "rounds": [r.to_dict() for r in result.ledger.rounds], **extra,
    }
    return json.dumps(doc, indent=1)


"""inferd tune decides (issue 44): the README's command, five times in a row on mlp and five times on
the text encoder, each run on a fresh copy of the example repository, one run at a time. What
counts is how many runs end with a decision (a verified config written, or "the current config is
best" with its interval) rather than "cannot tell", and that every written config won its
verification. A row per run: the target level tune chose, the current config's median throughput
and latency there over the run, and the outcome. The client, the server and tune share the 2 cores,
and the machine was shared with other engineers' work (test suites) while this ran."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.bench import OUT

RUNS = 5
MODELS = ("mlp", "text_encoder")
# The README's command; the text encoder takes token ids of any length, so it is told their shape.
COMMAND = ["--time-budget", "3m", "--latency-budget", "20ms", "--concurrency-range", "2:16:7", "--write"]
EXTRA = {"mlp": [], "text_encoder": ["--shape", "INPUT_IDS:16", "--shape", "ATTENTION_MASK:16", "--input-data", "zero"]}
NEEDS_PERF_ANALYZER = False  # the load is inferd perf's, as tune's own
KEPT = OUT / "tune_runs"


def command(model: str, repo: str = "REPO") -> list[str]:
    return ["inferd", "tune", "-m", model, "--model-repository", repo, *COMMAND, *EXTRA[model]]


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def outcome(doc: dict) -> str:
    """A run's outcome in a line: the decision and the figures it rests on."""
    est = (doc.get("verification") or {}).get("estimate")
    head = {"winner": "WROTE (verified)", "current": "current config best", "none": "no decision"}[doc["decision"]]
    counts = (f"{doc['measured']} measured, {len(doc['pruned'])} pruned, {len(doc['never_reached'])} never reached, "
              f"{len(doc['rounds'])} rounds in {doc['elapsed_s']:.0f} s")
    if not est:
        return f"{head}: {doc['reason'][:160]}; {counts}"
    high = f"{est['high']:.2f}" if est.get("high") else "inf"
    win = (doc.get("verification") or {}).get("win_estimate") or {}
    bound = f"; 98% lower end {win['low']:.2f}" if win else ""
    return (f"{head}: {_label(doc['verified'])} {est['ratio']:.2f}x (90% interval {est['low']:.2f}-{high}{bound}) "
            f"over {est['pairs']} fresh pairs; {counts}")


def _label(candidate: dict) -> str:
    from inferd.tune.space import Candidate

    return Candidate.from_dict(candidate).label()


def _one(model: str, source: Path, root: Path, n: int) -> tuple[dict, int]:
    repo = root / f"{model}-{n}" / "repo"
    shutil.copytree(source / model, repo / model, symlinks=True)
    out = root / f"{model}-{n}" / "out"
    argv = command(model, str(repo))
    proc = subprocess.run([sys.executable, "-m", "inferd.cli", *argv[1:], "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    doc = json.loads((out / "tune.json").read_text())
    written = (repo / model / "config.pbtxt").read_text() != (source / model / "config.pbtxt").read_text()
    doc["written"] = written
    keep = KEPT / f"{model}-{n}"  # what the run printed and drew, for the README's example
    keep.mkdir(parents=True, exist_ok=True)
    (keep / "stdout.txt").write_text(proc.stdout + proc.stderr)
    for name in ("tune.png", "verification.txt"):
        if (out / name).exists():
            shutil.copy(out / name, keep / name)
    return doc, proc.returncode


def run(quick: bool) -> dict:
    root = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None))
    source = root / "examples"
    subprocess.run([sys.executable, "-m", "inferd.examples.build", "--output", str(source),
                    *sum((["--model", m] for m in MODELS), [])], check=True, capture_output=True, timeout=600)
    measures, details, ratios = [], [], {}
    for model in MODELS:
        docs = []
        for n in range(1, (2 if quick else RUNS) + 1):
            doc, code = _one(model, source, root, n)
            docs.append(doc)
            base = [r for r in doc["rounds"] if r["phase"] != "scan" and r["level"] == doc["target_level"]
                    and r["label"] == doc["rounds"][0]["label"] and not r["error"]]
            measures.append({"label": f"{model}: run {n}", "concurrency": int(doc["target_level"] or 0), "batch": 1,
                             "infer_per_s": _median([r["throughput"] for r in base]) if base else 0.0,
                             "p50_us": _median([r["p50_us"] for r in base]) if base else 0.0,
                             "p99_us": _median([r["p99_us"] for r in base]) if base else 0.0,
                             "note": outcome(doc)})
            details.append({"model": model, "run": n, "exit": code, "written": doc["written"],
                            **{k: doc[k] for k in ("decision", "reason", "target_level", "measured", "elapsed_s",
                                                   "recommended", "verified")},
                            "verification": {k: v for k, v in (doc["verification"] or {}).items() if k != "pairs"}})
        decided = [d for d in docs if d["decision"] in ("winner", "current")]
        written = [d for d in docs if d["written"]]
        ratios[f"{model}: runs that end with a decision"] = (
            f"{len(decided)} of {len(docs)} ({sum(d['decision'] == 'current' for d in docs)} current config best, "
            f"{sum(d['decision'] == 'winner' for d in docs)} verified and written)")
        ratios[f"{model}: written configs that won their verification"] = (
            f"{sum(1 for d in written if (d['verification'] or {}).get('passed'))} of {len(written)}")
    shutil.rmtree(root, ignore_errors=True)
    notes = ("Commands, one at a time, each on a fresh copy of the example model (REPO): `"
             + "`; `".join(" ".join(command(m)) for m in MODELS) + "`. Each row's infer/s, p50 and p99 are the "
             "current config's medians at the target level over that run's rounds; the note is the decision, the "
             "verified candidate's ratio to the current config with its 90% interval (what 'current config best' "
             "reads: below 1.10) and the lower end of its 98% interval (what a written config must keep above 1), "
             "over the verification's fresh pairs.")
    return {"measures": measures, "details": details, "ratios_text": ratios, "notes": notes}


def ratios(result: dict) -> dict:
    return dict(result.get("ratios_text", {}))

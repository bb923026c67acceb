"""inferd tune (issue 31): on mlp and the text encoder, the configuration ``inferd tune`` chose within its
time budget (10 minutes each, 3 with --quick) against the repository's hand-written configuration and
against Triton's default (no dynamic batching), each then measured in one run on one server: throughput
under the 20 ms p99 budget at the tune's load levels (the best level whose p99 kept it). When tune
recommends nothing (its verification did not prove a gain), that is reported and the candidate it
verified is measured instead, marked so. The client and the server share the 2
cores, and the machine was shared with other engineers' work while this ran."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from inferd.config import parse_config_file
from inferd.tune.run import Fleet, InferdRounds, ServerSettings
from inferd.tune.space import Candidate, current

from bench.bench import OUT

MODELS = ("mlp", "text_encoder")
# The text encoder takes token ids of any length: 16 of them, zeros (valid ids), as inferd perf is told.
PERF_ARGS = {"mlp": (), "text_encoder": ("--shape", "INPUT_IDS:16", "--shape", "ATTENTION_MASK:16",
                                         "--input-data", "zero")}
LEVELS = (1, 4, 16)
NEEDS_PERF_ANALYZER = False  # the load is inferd perf's (inferd.perf.measure), as tune's own
BUDGET_US = 20_000


def _repository(root: Path) -> Path:
    subprocess.run([sys.executable, "-m", "inferd.examples.build", "--output", str(root), *sum(
        (["--model", m] for m in MODELS), [])], check=True, capture_output=True, timeout=600)
    return root


def _tune(repo: Path, model: str, budget: str, out: Path) -> dict:
    subprocess.run([sys.executable, "-m", "inferd.cli", "tune", "-m", model, "--model-repository", str(repo),
                    "--time-budget", budget, "--concurrency-range", "1:16:15",
                    "--out", str(out), *PERF_ARGS[model]], capture_output=True, text=True, timeout=3600)
    return json.loads((out / "tune.json").read_text())


def _best_within_budget(measure: InferdRounds, candidate: Candidate) -> tuple[float, float, float, float]:
    """(throughput, its p50, its p99, level) at the best load level whose p99 kept the budget (0s if none did)."""
    best = (0.0, 0.0, 0.0, 0.0)
    for level in LEVELS:
        m = measure(candidate, float(level))
        if not m.error and m.p99_us <= BUDGET_US and m.throughput > best[0]:
            best = (m.throughput, m.p50_us, m.p99_us, float(level))
    return best


def run(quick: bool) -> dict:
    root = Path(tempfile.mkdtemp(dir=OUT if OUT.exists() else None))
    repo = _repository(root / "repo")
    measures, details = [], []
    for model in MODELS:
        doc = _tune(repo, model, "3m" if quick else "10m", root / f"tune-{model}")
        base = parse_config_file(repo / model / "config.pbtxt", model=model)
        chosen = doc["recommended"] or doc["verified"]  # verified: the candidate tune measured last
        rows = [("repository's config", current(base)), ("Triton's default (no batching)", Candidate(batching=False)),
                ("inferd tune's choice" if doc["recommended"] else "inferd tune's best (not recommended)",
                 Candidate.from_dict(chosen) if chosen else current(base))]
        fleet = Fleet(ServerSettings(repo, model, window_ms=1000, levels=tuple(float(v) for v in LEVELS),
                                     perf_args=PERF_ARGS[model]))
        measure = InferdRounds(fleet, base)
        try:
            results = [(label, c, _best_within_budget(measure, c)) for label, c in rows]
        finally:
            measure.close()
            fleet.stop()
        for label, c, (throughput, p50, p99, level) in results:
            measures.append({"label": f"{model}: {label}", "concurrency": int(level), "batch": 1,
                             "infer_per_s": throughput, "p50_us": p50, "p99_us": p99,
                             "note": c.label() + ("" if throughput else "; no level kept p99 within 20 ms")})
        details.append({"model": model, "tune": {k: doc[k] for k in ("space", "distinct", "measured", "elapsed_s",
                                                                       "decision", "reason", "recommended", "verified")}})
    shutil.rmtree(root, ignore_errors=True)
    notes = "; ".join(f"{d['model']}: tune measured {d['tune']['measured']} of {d['tune']['space']} candidates in "
                      f"{d['tune']['elapsed_s']:.0f} s: {d['tune']['reason']}" for d in details)
    return {"measures": measures, "details": details, "notes": notes}

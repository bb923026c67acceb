"""The test suite under load: ``make test`` several times in a row, each with CPU-bound processes beside it.

    python -m bench.suite_stress [--runs 3] [--busy 1]

A suite that passes only on a quiet machine fails in CI on a shared one. Each run starts ``--busy``
processes that spin in a Python loop (each keeps one core busy, as ``stress-ng --cpu 1`` would), runs
``make test`` in this checkout (both halves: frontend workers, then one process), stops them, and
records each half's pytest summary (passed, failed, skipped), the tests that failed, and the wall time.
Writes bench/results/suite_stress.json (RESULTS.md's "suite_stress" section); exits 1 if any run failed.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
HALVES = ("frontend workers", "one process")
SUMMARY = re.compile(r"^=*\s*(\d+ (passed|failed).*) in ([\d.]+)s")


def halves(output: str) -> list[dict]:
    """Each half's summary line and failed tests, from ``make test``'s output."""
    parts = re.split(r"^== make test [12]/2: .*$", output, flags=re.M)[1:]
    found = []
    for name, part in zip(HALVES, parts):
        summary = [m for m in (SUMMARY.match(line) for line in part.splitlines()) if m]
        found.append({"half": name, "summary": summary[-1].group(1) if summary else "no summary (did it run?)",
                      "seconds": float(summary[-1].group(3)) if summary else 0.0,
                      "failed": sorted(set(re.findall(r"^FAILED (\S+)", part, flags=re.M)))})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.suite_stress", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--busy", type=int, default=1, help="processes spinning beside each run (one core each)")
    args = parser.parse_args(argv)
    runs = []
    for i in range(args.runs):
        spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
        started = time.monotonic()
        try:
            done = subprocess.run(["make", "test"], cwd=ROOT, capture_output=True, text=True)
        finally:
            for spinner in spinners:
                spinner.kill()
                spinner.wait()
        run = {"run": i + 1, "exit": done.returncode, "wall_s": round(time.monotonic() - started),
               "halves": halves(done.stdout + done.stderr)}
        runs.append(run)
        print(json.dumps(run), flush=True)
    rows = ["| run | make test exit | wall | frontend workers half | one-process half | failed |", "|---|---:|---:|---|---|---|"]
    for run in runs:
        cells = [f"{h['summary']}" for h in run["halves"]] + [""] * (2 - len(run["halves"]))
        failed = ", ".join(f for h in run["halves"] for f in h["failed"]) or "none"
        rows.append(f"| {run['run']} | {run['exit']} | {run['wall_s']} s | {cells[0]} | {cells[1]} | {failed} |")
    green = sum(run["exit"] == 0 for run in runs)
    notes = (f"{green} of {len(runs)} runs green, each with {args.busy} core(s) kept busy by a spinning process.\n\n"
             + "\n".join(rows))
    data = {"scenario": "suite_stress", "doc": (__doc__ or "").strip(),
            "result": {"measures": [], "notes": notes, "runs": runs},
            "when": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": _machine(),
            "command": "python -m bench.suite_stress " + " ".join(argv if argv is not None else sys.argv[1:])}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "suite_stress.json").write_text(json.dumps(data, indent=1))
    print(notes)
    return 0 if green == len(runs) else 1


def _machine() -> str:
    from bench.bench import machine

    return machine()


if __name__ == "__main__":
    sys.exit(main())

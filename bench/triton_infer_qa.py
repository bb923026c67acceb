"""Triton's own qa/L0_infer against inferd, unmodified.

Runs ``qa/L0_infer/test.sh`` from a checkout of Triton's server repository as Triton's CI runs it,
with inferd in place of ``tritonserver`` (the stand-in of :mod:`bench.triton_sequence_qa`), for the
python backend by default (test.sh makes each python model from its onnx twin, with Triton's
``qa/python_models`` code), no ensembles (their repositories need Triton's other generators). The
QA models come from Triton's ``gen_qa_models.py --onnx``. ``--backends "onnx python"`` adds the
onnx models: their first run passes, but the bf16 ones do not load in ONNX Runtime's CPU provider
(no bf16 Add kernel), so on test.sh's second run the server is never ready and test.sh stops there.

    python -m bench.triton_infer_qa --triton PATH_TO_TRITON_SERVER_REPO

test.sh runs infer_test.py twice (its model repository as generated, then with KIND_GPU instance
groups, which the stand-in turns into KIND_CPU) and checks each run's count against its
EXPECTED_NUM_TESTS, 46, which is the count with every backend of Triton's CI (libtorch, plan,
openvino and python_dlpack too); with fewer backends infer_test.py defines fewer tests, so this
runner reports unittest's own result of each run (tests run, errors, failures) and not that check.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from bench.triton_sequence_qa import ROOT, VERSION, export_qa, write_server


def generate_models(qa: Path, data: Path) -> None:
    out = data / "qa_model_repository"
    if out.exists():
        return
    print("generating qa_model_repository (gen_qa_models.py --onnx)", flush=True)
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run([sys.executable, "gen_qa_models.py", "--onnx", f"--models_dir={tmp}"], cwd=qa / "common",
                   check=True, stdout=subprocess.DEVNULL)
    tmp.rename(out)


def runs(log: str) -> list[tuple[int, int, int]]:
    """(tests run, errors, failures) of each infer_test.py run in test.sh's output."""
    out = []
    for m in re.finditer(r"^Ran (\d+) tests? in [\d.]+s\n\n(OK|FAILED \(([^)]*)\))", log, flags=re.M):
        counts = dict(re.findall(r"(errors|failures)=(\d+)", m.group(3) or ""))
        out.append((int(m.group(1)), int(counts.get("errors", 0)), int(counts.get("failures", 0))))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--triton", type=Path, required=True,
                   help="Triton's server repository: a bare git directory (the fetch tool's) or a checkout")
    p.add_argument("--work", type=Path, default=Path("/tmp/inferd-triton-infer-qa"))
    p.add_argument("--backends", default="python", help="test.sh's BACKENDS")
    p.add_argument("--no-netns", dest="netns", action="store_false",
                   help="run on this host's loopback (ports 8000-8002 must be free)")
    args = p.parse_args(argv)

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    qa = export_qa(args.triton, work)
    generate_models(qa, work / "data" / VERSION)
    triton_dir = write_server(work, [])
    env = dict(os.environ)
    env.update({
        "DATADIR": str(work / "data" / VERSION), "TRITON_DIR": str(triton_dir),
        "PATH": f"{work / 'bin'}:{env.get('PATH', '')}", "PYTHONPATH": f"{ROOT}:{env.get('PYTHONPATH', '')}",
        "TRITONSERVER_IPADDR": "127.0.0.1", "BACKENDS": args.backends, "ENSEMBLES": "0", "SERVER_TIMEOUT": "300",
    })
    command = ["bash", "test.sh", VERSION]
    if args.netns and shutil.which("unshare"):
        command = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    log_path = work / "test_sh.log"
    with open(log_path, "wb") as out:
        code = subprocess.run(command, cwd=qa / "L0_infer", env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    found = runs(log_path.read_text(errors="replace"))
    for i, (ran, errors, failures) in enumerate(found, 1):
        print(f"infer_test.py run {i}: {ran} tests, {errors} errors, {failures} failures")
    ok = bool(found) and all(errors == failures == 0 for _, errors, failures in found)
    print(f"L0_infer ({args.backends}): {'passed' if ok else 'FAILED'} (test.sh exit {code}, its output: {log_path})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

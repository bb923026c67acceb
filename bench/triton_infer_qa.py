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

import re
from pathlib import Path

from bench.triton_sequence_qa import VERSION, arguments, export_qa, generate_models, run_script, write_server


# What test.sh reads: qa/common/gen_qa_model_repository's onnx models.
GENERATORS = [("gen_qa_models.py", ["--onnx"], "qa_model_repository")]


def runs(log: str) -> list[tuple[int, int, int]]:
    """(tests run, errors, failures) of each infer_test.py run in test.sh's output."""
    out = []
    for m in re.finditer(r"^Ran (\d+) tests? in [\d.]+s\n\n(OK|FAILED \(([^)]*)\))", log, flags=re.M):
        counts = dict(re.findall(r"(errors|failures)=(\d+)", m.group(3) or ""))
        out.append((int(m.group(1)), int(counts.get("errors", 0)), int(counts.get("failures", 0))))
    return out


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__, Path("/tmp/inferd-triton-infer-qa"))
    p.add_argument("--backends", default="python", help="test.sh's BACKENDS")
    args = p.parse_args(argv)

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    qa = export_qa(args.triton, work)
    generate_models(qa, work / "data" / VERSION, GENERATORS)
    log_path = work / "test_sh.log"
    env = {"BACKENDS": args.backends, "ENSEMBLES": "0", "SERVER_TIMEOUT": "300"}
    code = run_script(qa / "L0_infer", work, write_server(work, []), env, log_path, args.netns)
    found = runs(log_path.read_text(errors="replace"))
    for i, (ran, errors, failures) in enumerate(found, 1):
        print(f"infer_test.py run {i}: {ran} tests, {errors} errors, {failures} failures")
    ok = bool(found) and all(errors == failures == 0 for _, errors, failures in found)
    print(f"L0_infer ({args.backends}): {'passed' if ok else 'FAILED'} (test.sh exit {code}, its output: {log_path})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

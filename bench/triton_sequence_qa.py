"""Triton's own sequence-batcher QA against inferd, unmodified.

Runs ``qa/L0_sequence_batcher/test.sh`` from a checkout of Triton's server repository
(github:triton-inference-server/server) as Triton's CI runs it, with inferd in place of
``tritonserver``, and counts the tests that pass. ``--implicit 1`` is the second half of
``qa/L0_implicit_state/test.sh`` (the same script with IMPLICIT_STATE=1, no ensembles, the
libtorch and onnx backends); its first half needs Triton's C++ ``implicit_state`` backend.

    python -m bench.triton_sequence_qa --triton PATH_TO_TRITON_SERVER_REPO --implicit 0 1

What it does, all offline once the repository is here:

1. exports ``qa/`` from the repository (a bare git directory, as the fetch tool leaves it,
   or a checkout) into ``--work``;
2. generates the QA model repositories with Triton's own generators
   (``gen_qa_sequence_models.py``, ``gen_qa_implicit_models.py``; onnx and libtorch, the
   ensembles) into ``--work/data/<version>`` (kept between runs);
3. writes a ``tritonserver`` that starts ``inferd serve`` on 127.0.0.1:8000/8001 with the
   repository test.sh hands it. This host has no GPU, so before starting it turns KIND_GPU
   instance groups into KIND_CPU (with their counts), and, inferd having no ``identity``
   backend, its models (the ensembles' ``nop_*``, the request-timeout test's) become Python
   models that do what it does;
4. runs test.sh (``MODEL_TRIALS`` and the three test lists choose what runs) in a network
   namespace of its own when it can (``unshare -rn``), so the fixed ports never clash;
5. reads test.sh's client log: one result per test and model repository, as test.sh reports
   them, and prints them with the count passed (also written to ``--work/results-*.json``).

What does not run: the ``custom`` trials and test_ragged_batch_allowed (Triton's C++
``custom_sequence_int32`` backend; ``custom`` is left out of BACKENDS, as ``plan``: no TensorRT),
L0_implicit_state's own implicit_state.py (its C++ ``implicit_state`` backend), and by default
the ensemble trials (``--ensembles 1`` turns them on; inferd refuses models0's nobatch ensembles,
whose ``nop`` step batches, and test.sh stops when a server is not ready).

test.sh needs bash, curl and jq; the generators need onnx and torch (inferd's dev environment).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VERSION = "inferd"  # test.sh's REPO_VERSION: only names the data directory

NO_DELAY_TESTS = ("test_simple_sequence test_length1_sequence test_batch_size test_no_sequence_start "
                  "test_no_sequence_start2 test_no_sequence_end test_no_correlation_id")
DELAY_TESTS = ("test_backlog_fill test_backlog_fill_no_end test_backlog_same_correlation_id "
               "test_backlog_same_correlation_id_no_end test_backlog_sequence_timeout test_half_batch "
               "test_skip_batch test_full_batch test_ragged_batch test_backlog")
QUEUE_DELAY_TESTS = "test_queue_delay_no_min_util test_queue_delay_half_min_util test_queue_delay_full_min_util"

# (generator, flags, data directory) as qa/common/gen_qa_model_repository builds them.
GENERATORS = [
    ("gen_qa_sequence_models.py", ["--onnx", "--libtorch"], "qa_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--onnx", "--libtorch", "--variable"], "qa_variable_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--ensemble"], "qa_ensemble_model_repository/qa_sequence_model_repository"),
    ("gen_qa_sequence_models.py", ["--ensemble", "--variable"],
     "qa_ensemble_model_repository/qa_variable_sequence_model_repository"),
    ("gen_qa_implicit_models.py", ["--onnx", "--libtorch"], "qa_sequence_implicit_model_repository"),
    ("gen_qa_implicit_models.py", ["--onnx", "--libtorch", "--variable"],
     "qa_variable_sequence_implicit_model_repository"),
]

# The stand-in for `tritonserver`: test.sh's arguments in, `inferd serve` out (exec'd, so
# test.sh's SERVER_PID is inferd's and its `kill` stops it).
SERVER_SCRIPT = '''#!{python}
"""tritonserver for Triton's QA scripts: inferd serve on the repository they name."""
import os, re, sys
from pathlib import Path

NOP = """import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    # Triton's identity backend: output k is input k; execute_delay_ms waits in each execute.

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.pairs = [(i["name"], o["name"]) for i, o in zip(config["input"], config["output"])]
        delay = config.get("parameters", {{}}).get("execute_delay_ms", {{}}).get("string_value", "0")
        self.delay_s = int(delay) / 1000.0

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor(o, pb_utils.get_input_tensor_by_name(r, i).as_numpy()) for i, o in self.pairs])
            for r in requests]
"""


def adapt(repo):
    for config in Path(repo).glob("*/config.pbtxt"):
        text = config.read_text()
        new = text.replace("KIND_GPU", "KIND_CPU")  # no GPU on this host
        if re.search(r'backend:\\s*"identity"', new):  # the ensembles' nop models, the timeout test's
            new = re.sub(r'backend:\\s*"identity"', 'backend: "python"', new)
            version = config.parent / "1"
            version.mkdir(exist_ok=True)
            (version / "model.py").write_text(NOP)
        if new != text:
            config.write_text(new)


args = ["--grpc-address", "127.0.0.1", "--grpc-port", "8001", "--http-address", "127.0.0.1",
        "--http-port", "8000", "--metrics-port", "8002"] + {extra!r}
for arg in sys.argv[1:]:
    if arg.startswith("--model-repository="):
        repo = arg.split("=", 1)[1]
        adapt(repo)
        args += ["--model-repository", repo]
    else:
        sys.stderr.write("tritonserver (inferd): ignoring %s\\n" % arg)
os.execv(sys.executable, [sys.executable, "-m", "inferd.cli", "serve"] + args)
'''


def export_qa(triton: Path, work: Path) -> Path:
    """``qa/`` of Triton's server repository (bare git directory or checkout) under ``work``."""
    qa = work / "qa"
    if qa.exists():
        shutil.rmtree(qa)
    if (triton / "qa").is_dir():
        shutil.copytree(triton / "qa", qa, symlinks=True)
        return qa
    archive = subprocess.run(["git", "--git-dir", str(triton), "archive", "HEAD", "qa"],
                             check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(work, filter="tar")
    return qa


def generate_models(qa: Path, data: Path, generators: list[tuple[str, list[str], str]] = GENERATORS) -> None:
    """Each (generator, flags, data directory) not yet in ``data``, run from Triton's qa/common."""
    for script, flags, target in generators:
        out = data / target
        if out.exists():
            continue
        print(f"generating {target} ({script} {' '.join(flags)})", flush=True)
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([sys.executable, script, *flags, f"--models_dir={tmp}"], cwd=qa / "common", check=True,
                       stdout=subprocess.DEVNULL)
        tmp.rename(out)


def write_server(work: Path, extra: list[str]) -> Path:
    triton_dir = work / "tritonserver"
    (triton_dir / "bin").mkdir(parents=True, exist_ok=True)
    (triton_dir / "backends").mkdir(exist_ok=True)
    server = triton_dir / "bin" / "tritonserver"
    server.unlink(missing_ok=True)
    server.write_text(SERVER_SCRIPT.format(python=sys.executable, extra=extra))
    server.chmod(0o755)
    bin_dir = work / "bin"  # test.sh calls `python3`: this interpreter, with tritonclient
    bin_dir.mkdir(exist_ok=True)
    python3 = bin_dir / "python3"  # a script, not a link: the interpreter must see its venv
    python3.unlink(missing_ok=True)  # never write through an old link
    python3.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    gdb = bin_dir / "gdb"  # util.sh core-dumps a server that is not ready in time: report it instead
    gdb.unlink(missing_ok=True)
    gdb.write_text("#!/bin/sh\necho 'gdb (triton_sequence_qa): not attaching' >&2\n")
    gdb.chmod(0o755)
    return triton_dir


def run_script(folder: Path, work: Path, triton_dir: Path, env: dict[str, str], log: Path,
               netns: bool) -> int:
    """Run a QA folder's test.sh with inferd's stand-in on PATH and ``env`` (its own variables) added;
    its output into ``log``; its exit status."""
    full = dict(os.environ)
    full.update({
        "DATADIR": str(work / "data" / VERSION), "TRITON_DIR": str(triton_dir),
        "PATH": f"{work / 'bin'}:{full.get('PATH', '')}", "PYTHONPATH": f"{ROOT}:{full.get('PYTHONPATH', '')}",
        "TRITONSERVER_IPADDR": "127.0.0.1", **env,
    })
    command = ["bash", "test.sh", VERSION]
    if netns and shutil.which("unshare"):
        # A loopback of its own: test.sh's fixed ports 8000-8002 never meet another server's.
        command = ["unshare", "-rn", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    with open(log, "wb") as out:
        return subprocess.run(command, cwd=folder, env=full, stdout=out, stderr=subprocess.STDOUT).returncode


def run_test_sh(qa: Path, work: Path, triton_dir: Path, implicit: bool, args: argparse.Namespace) -> int:
    env = {
        "MODEL_TRIALS": args.trials, "SERVER_TIMEOUT": str(args.server_timeout),
        "NO_DELAY_TESTS": args.no_delay_tests or " ", "DELAY_TESTS": args.delay_tests or " ",
        "QUEUE_DELAY_TESTS": args.queue_delay_tests or " ",
        "IMPLICIT_STATE": "1" if implicit else "0", "ENSEMBLES": "0" if implicit else args.ensembles,
        "BACKENDS": "libtorch onnx" if implicit else args.backends,
    }
    log = work / f"test_sh-{'implicit' if implicit else 'explicit'}.log"
    return run_script(qa / "L0_sequence_batcher", work, triton_dir, env, log, args.netns)


def results(client_log: Path) -> list[tuple[str, str, bool]]:
    """(test, model repository, passed) for each test test.sh ran, from its client log."""
    out: list[tuple[str, str, bool]] = []
    blocks = re.split(r"^Test: ", client_log.read_text(errors="replace"), flags=re.M)[1:]
    for block in blocks:
        head = re.match(r"(\S+), repository (\S+)", block)
        if head is None:
            continue
        failed = re.search(r"\*\*\* Test \S+ Failed|Test Result Verification Failed", block) is not None
        out.append((head.group(1), head.group(2), not failed))
    return out


def arguments(doc: str, work: Path) -> argparse.ArgumentParser:
    """The options every runner of Triton's QA takes: where Triton's repository is, the work folder, the
    network namespace."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--triton", type=Path, required=True,
                   help="Triton's server repository: a bare git directory (the fetch tool's) or a checkout")
    p.add_argument("--work", type=Path, default=work)
    p.add_argument("--no-netns", dest="netns", action="store_false",
                   help="run on this host's loopback (ports 8000-8002 must be free)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__, Path("/tmp/inferd-triton-sequence-qa"))
    p.add_argument("--implicit", nargs="+", type=int, choices=(0, 1), default=[0, 1],
                   help="0: L0_sequence_batcher; 1: its implicit-state run from L0_implicit_state")
    p.add_argument("--trials", default="0 1 2 4 v", help="test.sh's MODEL_TRIALS")
    p.add_argument("--no-delay-tests", default=NO_DELAY_TESTS)
    p.add_argument("--delay-tests", default=DELAY_TESTS)
    p.add_argument("--queue-delay-tests", default=QUEUE_DELAY_TESTS)
    p.add_argument("--backends", default="onnx libtorch python", help="BACKENDS of the explicit-state run")
    p.add_argument("--ensembles", default="0", choices=("0", "1"),
                   help="ENSEMBLES of the explicit-state run (default 0: inferd refuses the nobatch ensembles of "
                        "models0, whose nop step batches, so that server is never ready and test.sh stops there)")
    p.add_argument("--server-timeout", type=int, default=600,
                   help="seconds test.sh waits for a server to be ready (its own default, 120, is short for "
                        "the 4-instance repositories on a busy two-core host)")
    p.add_argument("--frontend-workers", default=None, help="inferd's --frontend-workers (default: its own)")
    args = p.parse_args(argv)

    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    qa = export_qa(args.triton, work)
    generate_models(qa, work / "data" / VERSION)
    extra = ["--frontend-workers", args.frontend_workers] if args.frontend_workers is not None else []
    triton_dir = write_server(work, extra)
    total = passed = 0
    for implicit in args.implicit:
        name = "implicit" if implicit else "explicit"
        client_log = qa / "L0_sequence_batcher" / "client.log"
        client_log.unlink(missing_ok=True)
        code = run_test_sh(qa, work, triton_dir, bool(implicit), args)
        found = results(client_log) if client_log.exists() else []
        (work / f"results-{name}.json").write_text(json.dumps(found, indent=1))
        for test, repo, ok in found:
            print(f"{name:8} {repo:28} {test:45} {'pass' if ok else 'FAIL'}")
        ok_count = sum(ok for *_, ok in found)
        if client_log.exists():  # the next run of test.sh deletes it
            shutil.copy(client_log, work / f"client-{name}.log")
        print(f"{name}: {ok_count} of {len(found)} passed (test.sh exit {code}; its output: "
              f"{work / ('test_sh-' + name + '.log')}, the tests': {work / ('client-' + name + '.log')})", flush=True)
        total += len(found)
        passed += ok_count
    print(f"passed {passed} of {total}")
    return 0 if passed == total else 1


if __name__ == "__main__":
    raise SystemExit(main())

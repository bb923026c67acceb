"""The release check: README's install lines run as written in a fresh venv (build inferd's and
inferd-client's wheels and sdists, then install them extra by extra), the metadata checked, and models
served and called at each step with nothing from the checkout on the path.

    python3 .ci/install_check.py [--python python3] [--keep DIR] [--skip-gpu]

Run by .ci/run on a clean clone (after `make install models`, whose .venv builds the wheels and the
ONNX and TorchScript test models). The venv grows in steps, so each install is checked where a
user would meet it:

README's "Install" block is read, and each of its lines is run by bash from the checkout's root with the
fresh venv first on PATH, in the block's order:

1. base (`pip install inferd-*.whl inferd_client-*.whl`): `inferd --version` answers VERSION; a
   Python model serves and answers through the client; an ONNX model fails to load naming
   `inferd[onnx]`, and a TorchScript model naming `inferd[torch]`;
2. `inferd[onnx]`: the ONNX model answers;
3. `onnxruntime-gpu` beside it: the ONNX model is refused, naming both packages;
4. `inferd[onnx-gpu]` alone (no GPU here): the CUDA provider imports and the model still answers on
   the CPU;
5. `inferd[torch]` (torch==2.13.0 first, as the README says and the Makefile pins it): the TorchScript model
   answers;
6. `inferd[gpu]`, `inferd[otlp]`, `inferd[perf]`, `inferd[batch]`: what each brings imports, and the OTLP trace
   mode is accepted.

--skip-gpu leaves out steps 3 and 4 (onnxruntime-gpu is a 250 MB download).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKOUT_PY = ROOT / ".venv" / "bin" / "python"
TORCH_PIN = "torch==2.13.0"  # the Makefile's pin: the CPU build
VERSION = (ROOT / "VERSION").read_text().strip()

PYTHON_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
        return out
'''
PYTHON_CONFIG = '''name: "double"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''

# Runs in the fresh venv, from a folder outside the checkout: calls every model the server has READY.
CALL = textwrap.dedent('''
    import json, sys
    import numpy as np
    import inferd_client
    from inferd_client import Client

    url, names = sys.argv[1], sys.argv[2].split(",")
    assert "site-packages" in inferd_client.__file__, inferd_client.__file__
    answers = {}
    with Client(url) as client:
        for name in names:
            if name == "double":
                x = np.arange(4, dtype=np.float32).reshape(1, 4)
                answers[name] = client.infer(name, {"IN": x})["OUT"].tolist() == (x * 2).tolist()
            else:  # simple / torch_add_sub: sum and difference of 16 int32 (TorchScript names: INPUT__0 ...)
                sep = "__" if name.startswith("torch") else ""
                a = np.arange(16, dtype=np.int32).reshape(1, 16)
                b = np.full((1, 16), 3, dtype=np.int32)
                result = client.infer(name, {f"INPUT{sep}0": a, f"INPUT{sep}1": b})
                answers[name] = (result[f"OUTPUT{sep}0"].tolist() == (a + b).tolist()
                                 and result[f"OUTPUT{sep}1"].tolist() == (a - b).tolist())
    print(json.dumps(answers))
''')


class Failure(Exception):
    pass


def readme_install_lines(readme: Path = ROOT / "README.md") -> dict[str, str]:
    """README's "## Install" block, a line each, keyed by what it installs: "build", "base", or the extra."""
    text = readme.read_text()
    section = text[text.index("## Install"):]
    block = section[section.index("```\n") + 4:]
    block = block[:block.index("```")]
    lines: dict[str, str] = {}
    for line in block.splitlines():
        command = line.split("   #")[0].strip()
        if not command:
            continue
        if "python -m build" in command:
            lines["build"] = command
        elif "[" in command:
            lines[command[command.index("[") + 1:command.index("]")]] = command
        else:
            lines["base"] = command
    return lines


def run(args: list[str], env: dict[str, str] | None = None, cwd: Path | None = None,
        timeout: float = 900) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(str(a) for a in args), flush=True)
    proc = subprocess.run([str(a) for a in args], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=timeout)
    if proc.returncode != 0:
        raise Failure(f"{args[0]} exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


class Venv:
    """A venv outside the checkout, run with a clean environment from a folder outside it too."""

    def __init__(self, python: str, path: Path, work: Path) -> None:
        self.path, self.work = path, work
        run([python, "-m", "venv", path])
        self.env = {"PATH": f"{path / 'bin'}:/usr/local/bin:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"),
                    "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LANG": "C.UTF-8"}

    def pip(self, *args: str | Path) -> None:
        run([self.path / "bin" / "python", "-m", "pip", "install", "-q", *args], env=self.env, cwd=self.work)

    def uninstall(self, *names: str) -> None:
        run([self.path / "bin" / "python", "-m", "pip", "uninstall", "-y", "-q", *names], env=self.env, cwd=self.work)

    def shell(self, command: str) -> None:
        """A README line as written, by bash, from the checkout's root, this venv first on PATH."""
        run(["bash", "-c", command], env=self.env, cwd=ROOT, timeout=1200)

    def python(self, *args: str | Path) -> str:
        return run([self.path / "bin" / "python", *args], env=self.env, cwd=self.work).stdout

    def check(self, repo: Path) -> dict[str, str]:
        """``inferd check``: model name -> its line (READY, or why it did not load)."""
        proc = subprocess.run([self.path / "bin" / "inferd", "check", repo], capture_output=True, text=True,
                              env=self.env, cwd=self.work, timeout=300)
        states = {}
        for line in proc.stdout.splitlines():
            name, sep, rest = line.partition(": ")
            if sep and name in ("double", "simple", "torch_add_sub"):
                states[name] = rest
        if not states:
            raise Failure(f"inferd check printed no model:\n{proc.stdout}\n{proc.stderr}")
        return states

    def serve_and_call(self, repo: Path, names: list[str]) -> dict[str, bool]:
        port_file = self.work / "ports.json"
        port_file.unlink(missing_ok=True)
        log = open(self.work / "serve.log", "wb")
        server = subprocess.Popen([self.path / "bin" / "inferd", "serve", "--model-repository", repo,
                                   "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-address", "127.0.0.1",
                                   "--http-port", "0", "--metrics-port", "0", "--port-file", port_file],
                                  stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.work,
                                  start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while not (port_file.exists() and port_file.read_text().strip()):
                if server.poll() is not None or time.monotonic() > deadline:
                    raise Failure("inferd serve did not start:\n" + (self.work / "serve.log").read_text())
                time.sleep(0.1)
            grpc = json.loads(port_file.read_text())["grpc"]
            out = self.python("-c", CALL, f"127.0.0.1:{grpc}", ",".join(names))
            return json.loads(out.strip().splitlines()[-1])
        finally:
            server.terminate()
            try:
                code = server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, 9)
                raise Failure("inferd serve did not exit within 60 s of SIGTERM") from None
            log.close()
            if code != 0:
                raise Failure(f"inferd serve exited {code}:\n" + (self.work / "serve.log").read_text())


def expect(what: str, condition: bool, detail: object = "") -> None:
    if not condition:
        raise Failure(f"{what}: {detail}")
    print(f"ok: {what}", flush=True)


def check_dist(dist: Path) -> tuple[Path, Path]:
    run([CHECKOUT_PY, "-m", "twine", "check", "--strict", *sorted(dist.glob(f"*{VERSION}*"))])
    names = sorted(p.name for p in dist.glob(f"*{VERSION}*"))
    expect("wheels and sdists of both packages at VERSION", names == sorted([
        f"inferd-{VERSION}-py3-none-any.whl", f"inferd-{VERSION}.tar.gz",
        f"inferd_client-{VERSION}-py3-none-any.whl", f"inferd_client-{VERSION}.tar.gz"]), names)
    return dist / f"inferd-{VERSION}-py3-none-any.whl", dist / f"inferd_client-{VERSION}-py3-none-any.whl"


def models(repo: Path) -> None:
    """The test models, built by the checkout's venv (data only: nothing of it is on the venv's path)."""
    run([CHECKOUT_PY, "-m", "inferd.examples.build", "--output", repo, "--model", "simple", "--model", "torch_add_sub"])
    (repo / "double" / "1").mkdir(parents=True)
    (repo / "double" / "1" / "model.py").write_text(PYTHON_MODEL)
    (repo / "double" / "config.pbtxt").write_text(PYTHON_CONFIG)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=shutil.which("python3") or sys.executable,
                        help="the interpreter the fresh venv is made from (default: python3 on PATH)")
    parser.add_argument("--keep", type=Path, help="work in this folder and keep it (default: a temporary one)")
    parser.add_argument("--skip-gpu", action="store_true", help="leave out the onnxruntime-gpu steps")
    args = parser.parse_args(argv)
    top = args.keep or Path(tempfile.mkdtemp(prefix="inferd-install-"))
    top.mkdir(parents=True, exist_ok=True)
    try:
        lines = readme_install_lines()
        expect("README's install block names this VERSION's wheels",
               all(VERSION in line for key, line in lines.items() if key != "build"), lines)
        repo = top / "models"
        models(repo)
        work = top / "work"
        work.mkdir()
        venv = Venv(args.python, top / "venv", work)
        dist = ROOT / "dist"
        for old in dist.glob("*"):  # the README builds into the checkout's dist/ (git-ignored)
            old.unlink()
        venv.shell(lines["build"])
        check_dist(dist)

        venv.shell(lines["base"])
        out = run([venv.path / "bin" / "inferd", "--version"], env=venv.env, cwd=work).stdout.strip()
        expect("base: inferd --version reads VERSION", out == f"inferd {VERSION}", out)
        located = venv.python("-c", "import inferd, inferd_client; print(inferd.__file__, inferd_client.__file__)")
        expect("base: inferd and inferd_client come from the venv, not the checkout",
               str(ROOT) not in located and located.count("site-packages") == 2, located)
        states = venv.check(repo)
        expect("base: the Python model loads", states["double"].startswith("READY"), states)
        expect("base: the ONNX model names inferd[onnx]", "pip install 'inferd[onnx]'" in states["simple"], states)
        expect("base: the TorchScript model names inferd[torch]",
               "pip install 'inferd[torch]'" in states["torch_add_sub"], states)
        answers = venv.serve_and_call(repo, ["double"])
        expect("base: the Python model answers through inferd-client", answers == {"double": True}, answers)

        venv.shell(lines["onnx"])
        answers = venv.serve_and_call(repo, ["double", "simple"])
        expect("inferd[onnx]: the ONNX model answers", answers == {"double": True, "simple": True}, answers)

        if not args.skip_gpu:
            venv.pip("onnxruntime-gpu")
            states = venv.check(repo)
            expect("onnxruntime and onnxruntime-gpu together: the ONNX model is refused naming both",
                   "both onnxruntime" in states["simple"] and "onnxruntime-gpu" in states["simple"], states)
            venv.uninstall("onnxruntime", "onnxruntime-gpu")
            venv.shell(lines["onnx-gpu"])
            providers = venv.python("-c", "import onnxruntime; print(onnxruntime.get_available_providers())")
            expect("inferd[onnx-gpu]: ONNX Runtime imports with its CUDA provider", "CUDAExecutionProvider" in providers,
                   providers)
            answers = venv.serve_and_call(repo, ["simple"])
            expect("inferd[onnx-gpu] on a host without a GPU: the ONNX model answers on the CPU",
                   answers == {"simple": True}, answers)
            venv.uninstall("onnxruntime-gpu")
            venv.shell(lines["onnx"])

        venv.pip(TORCH_PIN)  # "install torch first": the CPU build, as the Makefile pins it
        venv.shell(lines["torch"])
        answers = venv.serve_and_call(repo, ["double", "simple", "torch_add_sub"])
        expect("inferd[torch]: the TorchScript model answers",
               answers == {"double": True, "simple": True, "torch_add_sub": True}, answers)

        for extra, code in (("gpu", "import pynvml, cuda.bindings"),
                            ("otlp", "from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter"),
                            ("perf", "import matplotlib, perf_analyzer"),
                            ("batch", "import pyarrow.parquet")):
            venv.shell(lines[extra])
            venv.python("-c", code)
            expect(f"inferd[{extra}]: what it brings imports", True)
        traced = venv.python("-c", "from inferd.observability.tracing import TraceConfig, Tracing; "
                                   "Tracing(TraceConfig.parse(['mode=opentelemetry', 'level=TIMESTAMPS'])); print('ok')")
        expect("inferd[otlp]: the OpenTelemetry trace mode is accepted", traced.strip() == "ok", traced)
    except Failure as exc:
        print(f"install check FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(top, ignore_errors=True)
    print("install check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

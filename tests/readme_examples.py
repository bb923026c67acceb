"""Run every example in README.md as written, against real servers.

    python tests/readme_examples.py --example-repository model_repository

Which blocks run: those fenced as ``sh`` or ``python``; plain fences are synopses.
- a ``python`` block whose first line is ``# file: PATH`` is saved to PATH instead;
- an ``sh`` line ``inferd serve ...`` starts that server in the background (stopping the
  one before), on free loopback ports; every ``localhost:800x`` / ``127.0.0.1:800x`` in
  later blocks is pointed at the current server's ports;
- the comment ``<!-- readme: serve the example repository -->`` starts a server on the
  example repository (what ``make serve`` serves);
- an ``output`` block right after a runnable one is what it must print.

Everything runs in a scratch folder with the interpreter's ``bin`` first on PATH, each
block bounded in time; every server started is stopped. Needs only what ``make serve``
installs (CI runs it before the test extras are installed) and is also run by
tests/test_readme.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
_SERVE_EXAMPLES = "<!-- readme: serve the example repository -->"
_ADDRESS = re.compile(r"\b(localhost|127\.0\.0\.1):(8000|8001|8002)\b")
BLOCK_TIMEOUT_S = 120
START_TIMEOUT_S = 180


@dataclass
class Block:
    lang: str  # "sh", "python", "output", or "" (a synopsis), or "serve-examples"
    text: str
    line: int  # where it starts in README.md
    expected_output: str | None = None


def blocks(readme: str) -> list[Block]:
    """The README's blocks in order, the serve-examples marker as a block of its own."""
    found: list[tuple[int, Block]] = []
    for m in _FENCE.finditer(readme):
        found.append((m.start(), Block(m.group(1), m.group(2), readme.count("\n", 0, m.start()) + 1)))
    for m in re.finditer(re.escape(_SERVE_EXAMPLES), readme):
        found.append((m.start(), Block("serve-examples", "", readme.count("\n", 0, m.start()) + 1)))
    ordered = [b for _, b in sorted(found, key=lambda item: item[0])]
    out: list[Block] = []
    for b in ordered:
        if b.lang == "output":
            if not out or out[-1].lang not in ("sh", "python"):
                raise ValueError(f"README.md:{b.line}: an output block must follow an sh or python block")
            out[-1].expected_output = b.text
        else:
            out.append(b)
    return out


class Server:
    """``inferd serve`` in its own process group, on free loopback ports."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str]) -> None:
        self.port_file = cwd / f".readme-server-{time.monotonic_ns()}.json"
        self.log_path = self.port_file.with_suffix(".log")
        self._log = open(self.log_path, "wb")
        cmd = [args[0], *args[1:], "--grpc-address", "127.0.0.1", "--grpc-port", "0", "--http-address",
               "127.0.0.1", "--http-port", "0", "--metrics-port", "0", "--port-file", str(self.port_file)]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.port_file.exists() and self.port_file.read_text()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{shlex.join(args)} did not start:\n{self.log_path.read_text()}")
            time.sleep(0.05)
        self.ports: dict[str, int] = json.loads(self.port_file.read_text())

    def address(self, match: re.Match[str]) -> str:
        kind = {"8000": "http", "8001": "grpc", "8002": "metrics"}[match.group(2)]
        return f"127.0.0.1:{self.ports[kind]}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def _run(cmd: list[str], block: Block, cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    if proc.returncode != 0:
        raise RuntimeError(f"README.md:{block.line}: exit status {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def run_readme(readme: Path, example_repository: Path, log=print) -> int:  # type: ignore[no-untyped-def]
    """Run every runnable block; returns how many ran. Raises on the first failure."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    server: Server | None = None
    ran = 0
    with tempfile.TemporaryDirectory(prefix="inferd-readme-") as tmp:
        cwd = Path(tmp)
        try:
            for block in blocks(readme.read_text()):
                text = _ADDRESS.sub(server.address, block.text) if server is not None else block.text
                if block.lang == "serve-examples":
                    if server is not None:
                        server.stop()
                    server = Server(["inferd", "serve", "--model-repository", str(example_repository)], cwd, env)
                    continue
                if block.lang == "python" and text.startswith("# file: "):
                    path = cwd / text.splitlines()[0][len("# file: "):].strip()
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text)
                    continue
                if block.lang == "python":
                    out = _run([sys.executable, "-c", text], block, cwd, env)
                elif block.lang == "sh":
                    lines = [line for line in text.splitlines() if line.strip()]
                    serve = [line for line in lines if line.startswith("inferd serve ")]
                    if serve:
                        if len(lines) != 1:
                            raise ValueError(f"README.md:{block.line}: `inferd serve` must be alone in its block")
                        if server is not None:
                            server.stop()
                        server = Server(shlex.split(serve[0]), cwd, env)
                        log(f"README.md:{block.line}: started {serve[0]}")
                        continue
                    out = _run(["bash", "-euo", "pipefail", "-c", text], block, cwd, env)
                else:
                    continue
                ran += 1
                if block.expected_output is not None and out.strip() != block.expected_output.strip():
                    raise RuntimeError(f"README.md:{block.line}: printed\n{out}\ninstead of\n{block.expected_output}")
                log(f"README.md:{block.line}: {block.lang} block ok")
        finally:
            if server is not None:
                server.stop()
    return ran


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=ROOT / "README.md")
    parser.add_argument("--example-repository", type=Path, default=ROOT / "model_repository")
    args = parser.parse_args(argv)
    try:
        ran = run_readme(args.readme, args.example_repository.resolve())
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"readme examples: {exc}", file=sys.stderr)
        return 1
    print(f"readme examples: {ran} blocks ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())

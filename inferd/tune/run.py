"""``inferd tune``'s real rounds: servers, the configurations loaded on them, and the load client.

**Two copies, no reloads.** A server started here serves a repository of links to the user's
models plus one more link, ``<model>__tune``, to the same folder: the current configuration is
the model itself (its config.pbtxt, loaded as is), each candidate is loaded into the twin with
RepositoryModelLoad's ``config`` override. Both stay loaded, so a pair of rounds switches the
load from one name to the other without a reload or a cold instance in between; only moving to
the next candidate reloads the twin. With ``-u`` (a running server in explicit model-control
mode) there is no twin: every round loads its configuration into the model itself.

**Rounds.** Each loaded name has its own load-client session, kept for the whole run: the
processes of :mod:`inferd.perf` (spawned once, not per round) and its runner, driven one level at
a time: three measured windows (``-p`` each), after a warm-up window when the configuration was
just loaded (its instances are cold; with ``-u``, every round). Where the runner snapshots the
server's statistics at the measured windows' start and end, /proc is read too
(:mod:`inferd.tune.host`), so the server's CPU per inference and the other processes' load cover
exactly the measured windows.
With ``--frontend-workers`` each worker count is a server of its own, all kept running.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd._proto import model_config_pb2 as mc
from inferd.tune.host import Mark, mark, usage
from inferd.tune.rounds import Round
from inferd.tune.space import Candidate, current

WARMUP_WINDOWS = 1
MEASURED_WINDOWS = 3  # what the runner reports of a level


class TuneError(Exception):
    """Something the user has to fix (a model that does not load, a server that does not start)."""


@dataclass
class ServerSettings:
    repository: Path
    model: str
    url: str | None = None  # a running server (explicit model control); None: start one here
    protocol: str = "grpc"
    window_ms: int = 250
    mode: str = "concurrency"  # or "request_rate"
    levels: tuple[float, ...] = (16.0,)  # the load levels (the load client is sized for the highest)
    extra_args: tuple[str, ...] = ()  # more `inferd serve` options for a server started here
    perf_args: tuple[str, ...] = ()  # more `inferd perf` options (--shape, --input-data, ...)

    @property
    def twin(self) -> str:
        return f"{self.model}__tune"


def link_repository(repository: Path, model: str, twin: str, into: Path) -> Path:
    """A repository of links to every model of ``repository``, plus ``twin`` linking to
    ``model``'s folder (so ensembles and Python models that call others still find them)."""
    if (repository / twin).exists():
        raise TuneError(f"the repository already holds a model named '{twin}', the name inferd tune loads "
                        f"candidates of '{model}' under; rename it or use -u with a server of your own")
    into.mkdir(parents=True, exist_ok=True)
    for entry in repository.iterdir():
        if entry.is_dir():
            (into / entry.name).symlink_to(entry.resolve(), target_is_directory=True)
    (into / twin).symlink_to((repository / model).resolve(), target_is_directory=True)
    return into


class Server:
    """``inferd serve`` in explicit mode on free loopback ports over ``repository``."""

    def __init__(self, repository: Path, workers: int | None, extra_args: tuple[str, ...], workdir: Path) -> None:
        self.repository, self.workers, self.extra_args, self.dir = repository, workers, extra_args, workdir
        self.proc: subprocess.Popen | None = None
        self.ports: dict[str, int] = {}

    def start(self) -> None:
        port_file = self.dir / f"ports-{self.workers}.json"
        port_file.unlink(missing_ok=True)
        args = [sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(self.repository),
                "--model-control-mode", "explicit", "--grpc-address", "127.0.0.1", "--grpc-port", "0",
                "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
                "--port-file", str(port_file), *self.extra_args]
        if self.workers is not None:
            args += ["--frontend-workers", str(self.workers)]
        log = self.dir / f"server-{self.workers}.log"
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise TuneError("inferd serve did not start: " + log.read_text()[-2000:])
            time.sleep(0.05)
        self.ports = json.loads(port_file.read_text())

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports['http' if protocol == 'http' else 'grpc']}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def load(url: str, model: str, config: mc.ModelConfig | None, timeout: float = 300) -> None:
    """RepositoryModelLoad of ``model``, with ``config`` (as JSON) instead of its config.pbtxt when given."""
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.RepositoryModelLoadRequest(model_name=model)
        if config is not None:
            named = mc.ModelConfig()
            named.CopyFrom(config)
            named.name = model
            request.parameters["config"].string_param = json_format.MessageToJson(named)
        try:
            stub.RepositoryModelLoad(request, timeout=timeout)
        except grpc.RpcError as exc:
            what = "its config.pbtxt" if config is None else config_summary(config)
            raise TuneError(f"model '{model}' did not load with {what}: {exc.details()}") from None


def config_summary(config: mc.ModelConfig) -> str:
    return f"max_batch_size {config.max_batch_size}, {len(config.instance_group)} instance group(s)"


@dataclass
class Target:
    """Where a configuration is measured: a server (None: the -u one), its gRPC and load URLs, a model name."""

    workers: int | None
    grpc_url: str
    load_url: str
    name: str
    pid: int | None
    loaded_now: bool = False  # the configuration was (re)loaded for this round: its instances are cold


class Fleet:
    """The servers a run uses: one per frontend-worker count, started on first use (or the -u one)."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.dir = Path(tempfile.mkdtemp(prefix="inferd-tune-"))
        self.servers: dict[int | None, Server] = {}
        self.repository = (None if settings.url else
                           link_repository(settings.repository, settings.model, settings.twin, self.dir / "repo"))

    @property
    def twins(self) -> bool:
        return self.settings.url is None

    def target(self, workers: int | None, twin: bool) -> Target:
        s = self.settings
        name = s.twin if twin and self.twins else s.model
        if s.url:
            return Target(None, s.url, s.url, name, None)
        server = self.servers.get(workers)
        if server is None or server.pid is None:
            assert self.repository is not None
            server = Server(self.repository, workers, s.extra_args, self.dir)
            server.start()
            self.servers[workers] = server
        return Target(workers, server.url("grpc"), server.url(s.protocol), name, server.pid)

    def stop(self) -> None:
        """Stops the servers and removes the working directory (a failed start's error already
        carries the end of its server's log)."""
        for server in self.servers.values():
            server.stop()
        self.servers.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


class _Sampling:
    """The load client's statistics calls, with a /proc mark where the measured windows start and
    end: the runner asks for ModelStatistics at the start of a level (call 0) and at the end of
    every window (call k ends window k). Reading the server's process tree costs ~15 ms on a busy
    host, so only those two calls read it."""

    def __init__(self, client: Any, pid: int | None) -> None:
        self.client, self.pid = client, pid
        self.marks: list[Mark] = []
        self.calls = 0
        self.at: tuple[int, ...] = ()

    def expect(self, warmup: int) -> None:
        self.marks, self.calls, self.at = [], 0, (warmup, warmup + MEASURED_WINDOWS)

    def statistics(self, name: str, version: str) -> dict[str, int]:
        if self.calls in self.at:
            self.marks.append(mark(self.pid))
        self.calls += 1
        return self.client.statistics(name, version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


class _Quiet:
    """The runner's progress, unprinted: tune prints its own."""

    def __call__(self, text: str) -> None:
        pass

    def status(self, text: str) -> None:
        pass


class Session:
    """The load client against one loaded name: its worker processes and runner, kept between rounds."""

    def __init__(self, target: Target, settings: ServerSettings) -> None:
        from inferd.perf import parse_options
        from inferd.perf.inputs import ServerClient, build_inputs
        from inferd.perf.runner import Runner, WorkerPool
        from inferd.perf.worker import WorkerConfig

        flag = "--concurrency-range" if settings.mode == "concurrency" else "--request-rate-range"
        top = max(settings.levels)
        # A stability bar no window meets: the runner measures exactly -r windows and reports the last three.
        self.options = parse_options(["-m", target.name, "-u", target.load_url, "-i", settings.protocol, flag, f"{top:g}",
                                      "-p", str(settings.window_ms), "-r", str(MEASURED_WINDOWS),
                                      "-s", "0.001", "-q", *settings.perf_args])
        o = self.options
        if o.protocol == "http":
            from inferd.perf import http as http_protocol

            client: Any = http_protocol.HttpServerClient(o.url, o.connect_timeout, o.tls, o.headers)
        else:
            client = ServerClient(o.url, o.connect_timeout, o.tls, o.headers)
        self.client = _Sampling(client, target.pid)
        try:
            model = client.model_info(o.model, o.version)
            steps = build_inputs(model, o)
            if o.protocol == "http":
                payloads: list = http_protocol.serialize_requests(model, steps, o)
                infer_path = http_protocol.model_path(o.model, o.version) + "/infer"
            else:
                from inferd.perf.inputs import serialize_requests

                payloads, infer_path = serialize_requests(model, steps, o), ""
            config = WorkerConfig(o.url, payloads, connect_timeout=o.connect_timeout, protocol=o.protocol,
                                  infer_path=infer_path, tls=o.tls, headers=o.headers, workers=o.workers, seed=o.seed)
            self.pool = WorkerPool(o.workers, config)
        except BaseException:
            client.close()
            raise
        # Two runners over the same processes: three measured windows, or a warm-up window first
        # (after the configuration was loaded for this round, or with -u, where every round loads).
        warm = dataclasses.replace(o, max_trials=WARMUP_WINDOWS + MEASURED_WINDOWS)
        self.runners = {0: Runner(o, self.client, model, self.pool, _Quiet()),
                        WARMUP_WINDOWS: Runner(warm, self.client, model, self.pool, _Quiet())}

    def close(self) -> None:
        self.pool.close()
        self.client.close()


class Loader:
    """Puts each configuration where it is measured and loads it there when it is not already."""

    def __init__(self, fleet: Fleet, base: mc.ModelConfig) -> None:
        self.fleet, self.base, self.settings = fleet, base, fleet.settings
        self.current = current(base)
        self.loaded: dict[tuple[int | None, str], tuple[Candidate, int | None]] = {}

    def place(self, candidate: Candidate) -> Target | str:
        """Where ``candidate`` runs, loaded; or why it could not load (the round's error). The
        current configuration (at any frontend-worker count) is the model itself, loaded from its
        config.pbtxt; every other candidate goes into the twin (with -u: into the model)."""
        twin = candidate != dataclasses.replace(self.current, frontend_workers=candidate.frontend_workers)
        t = self.fleet.target(candidate.frontend_workers, twin)
        key = (t.workers, t.name)
        if self.loaded.get(key) != (candidate, t.pid):
            config = candidate.apply(self.base) if twin else (None if self.fleet.twins else self.base)
            try:
                load(t.grpc_url, t.name, config)
            except TuneError as exc:
                if not twin:
                    raise
                return str(exc)
            self.loaded[key] = (candidate, t.pid)
            t.loaded_now = True
        return t

    def restore(self) -> None:
        """With -u, leave the user's server serving the model as its config.pbtxt says."""
        if self.fleet.twins:
            return
        key = (None, self.settings.model)
        if key in self.loaded and self.loaded[key][0] != self.current:
            load(self.settings.url or "", self.settings.model, self.base)
            self.loaded[key] = (self.current, None)


class InferdRounds:
    """The search's ``measure``: one round of ``candidate`` at ``level`` with ``inferd perf``'s
    load client (:data:`inferd.tune.search.Measure`)."""

    def __init__(self, fleet: Fleet, base: mc.ModelConfig) -> None:
        self.loader = Loader(fleet, base)
        self.settings, self.current = fleet.settings, self.loader.current
        self.sessions: dict[tuple[int | None, str], Session] = {}

    def _session(self, t: Target) -> Session:
        from inferd.perf import PerfError

        key = (t.workers, t.name)
        session = self.sessions.get(key)
        if session is None:
            try:
                session = Session(t, self.settings)
            except PerfError as exc:
                raise TuneError(f"the load client cannot measure model '{self.settings.model}': {exc}") from None
            self.sessions[key] = session
        return session

    def __call__(self, candidate: Candidate, level: float) -> Round:
        from inferd.perf import PerfError

        t = self.loader.place(candidate)
        if isinstance(t, str):
            return Round(candidate, level, 0.0, 0.0, 0.0, error=t)
        session = self._session(t)
        warmup = WARMUP_WINDOWS if t.loaded_now or not self.loader.fleet.twins else 0
        session.client.expect(warmup)
        t0 = time.monotonic()
        try:
            lv = session.runners[warmup].run_level(level)
        except PerfError as exc:
            self._drop(t)
            if candidate == self.current:
                raise TuneError(f"the load client cannot measure model '{self.settings.model}': {exc}") from None
            return Round(candidate, level, 0.0, 0.0, 0.0, error=str(exc), wall_s=time.monotonic() - t0)
        return self._round(candidate, level, lv, session.client.marks, time.monotonic() - t0)

    def _round(self, candidate: Candidate, level: float, lv: Any, marks: list[Mark], wall: float) -> Round:
        lat = lv.client.latency_us
        cpu_us = others = rss = None
        if len(marks) == 2:
            first, last = marks
            span = last.t - first.t
            client = lv.client_cpu_s * span / lv.wall_s if lv.wall_s else 0.0
            u = usage(first, last, client)
            inferences = lv.server.get("inference_count", 0)
            if u.server_s is not None and inferences:
                cpu_us = u.server_s / inferences * 1e6
            others, rss = u.others_cores, u.rss_mib
        error = "" if lv.client.success else "no request succeeded"
        return Round(candidate, level, lv.throughput, lat.get("p50", 0.0), lat.get("p99", 0.0), cpu_us, others,
                     lv.client_cpu_s, wall, rss, error)

    def _drop(self, t: Target) -> None:
        session = self.sessions.pop((t.workers, t.name), None)
        if session is not None:
            session.close()

    def close(self) -> None:
        for session in self.sessions.values():
            session.close()
        self.sessions.clear()
        self.loader.restore()

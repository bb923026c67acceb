"""``inferd tune``'s real measurements: a server (started here, or ``-u`` a running one in explicit
model-control mode), each candidate loaded with RepositoryModelLoad's ``config`` override, and the
load client (:func:`inferd.perf.measure`) with its stabilisation at each level.

On a server started here the server's CPU per inference and memory come from /proc over its
process tree (the core and its frontend workers: ``inferd.observability.procfs``); the client's own CPU is reported next to them,
because here the load client and the server share the machine's cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from google.protobuf import json_format

from inferd._proto import grpc_service_pb2 as pb
from inferd._proto import grpc_service_pb2_grpc as pb_grpc
from inferd._proto import model_config_pb2 as mc
from inferd.observability.procfs import tree_usage
from inferd.tune.search import Measurement
from inferd.tune.space import Candidate


class TuneError(Exception):
    """Something the user has to fix (a model that does not load, a server that does not start)."""


@dataclass
class ServerSettings:
    repository: Path
    model: str
    url: str | None = None  # a running server (explicit model control); None: start one here
    protocol: str = "grpc"
    measurement_interval_ms: int = 2000
    stability_percentage: float = 10.0
    max_trials: int = 6
    mode: str = "concurrency"  # or "request_rate"
    extra_args: tuple[str, ...] = ()  # more `inferd serve` options for a server started here
    perf_args: tuple[str, ...] = ()  # more `inferd perf` options (--shape, --input-data, ...)


class Server:
    """``inferd serve`` in explicit mode on free loopback ports, restarted when the frontend workers change."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.proc: subprocess.Popen | None = None
        self.workers: int | None = None
        self.url = settings.url
        self._dir = Path(tempfile.mkdtemp(prefix="inferd-tune-"))

    def ensure(self, workers: int | None) -> str:
        if self.settings.url:
            return self.settings.url
        if self.proc is not None and self.proc.poll() is None and workers == self.workers:
            assert self.url
            return self.url
        self.stop()
        port_file = self._dir / "ports.json"
        port_file.unlink(missing_ok=True)
        args = [sys.executable, "-m", "inferd.cli", "serve", "--model-repository", str(self.settings.repository),
                "--model-control-mode", "explicit", "--grpc-address", "127.0.0.1", "--grpc-port", "0",
                "--http-address", "127.0.0.1", "--http-port", "0", "--metrics-port", "0",
                "--port-file", str(port_file), *self.settings.extra_args]
        if workers is not None:
            args += ["--frontend-workers", str(workers)]
        self._log = open(self._dir / "server.log", "ab")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise TuneError("inferd serve did not start: " + (self._dir / "server.log").read_text()[-2000:])
            time.sleep(0.05)
        ports = json.loads(port_file.read_text())
        self.workers = workers
        self.url = f"127.0.0.1:{ports['http' if self.settings.protocol == 'http' else 'grpc']}"
        self._grpc_url = f"127.0.0.1:{ports['grpc']}"
        return self.url

    @property
    def grpc_url(self) -> str:
        return self.settings.url if self.settings.url else self._grpc_url

    def usage(self) -> tuple[float, float] | None:
        return tree_usage(self.proc.pid) if self.proc is not None and self.proc.poll() is None else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None


def load(url: str, model: str, config: mc.ModelConfig, timeout: float = 300) -> None:
    """RepositoryModelLoad with the candidate's config (JSON): the server loads it instead of config.pbtxt."""
    with grpc.insecure_channel(url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.RepositoryModelLoadRequest(model_name=model)
        request.parameters["config"].string_param = json_format.MessageToJson(config)
        try:
            stub.RepositoryModelLoad(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise TuneError(f"model '{model}' did not load with {config_summary(config)}: {exc.details()}") from None


def config_summary(config: mc.ModelConfig) -> str:
    return f"max_batch_size {config.max_batch_size}, {len(config.instance_group)} instance group(s)"


class Measurer:
    """The :data:`inferd.tune.search.Measure` function over a real server."""

    def __init__(self, server: Server, base: mc.ModelConfig, settings: ServerSettings) -> None:
        self.server, self.base, self.settings = server, base, settings
        self.loaded: tuple[Candidate, object] | None = None  # (candidate, the server process it is loaded on)

    def __call__(self, candidate: Candidate, level: float) -> Measurement:
        from inferd.perf import PerfError, measure, parse_options

        url = self.server.ensure(candidate.frontend_workers)
        if self.loaded != (candidate, self.server.proc):  # a restarted server loads it again too
            try:
                load(self.server.grpc_url, self.settings.model, candidate.apply(self.base))
            except TuneError as exc:
                return Measurement(candidate, level, 0.0, 0.0, 0.0, 0.0, error=str(exc))
            self.loaded = (candidate, self.server.proc)
        flag = "--concurrency-range" if self.settings.mode == "concurrency" else "--request-rate-range"
        argv = ["-m", self.settings.model, "-u", url, "-i", self.settings.protocol, flag, f"{level:g}",
                "-p", str(self.settings.measurement_interval_ms), "-s", str(self.settings.stability_percentage),
                "-r", str(self.settings.max_trials), "-q"]
        before = self.server.usage()
        t0 = time.monotonic()
        try:
            result = measure(parse_options([*argv, *self.settings.perf_args]))
        except PerfError as exc:  # the load itself is wrong (a shape to give, ...): every candidate would fail
            raise TuneError(f"the load client cannot measure model '{self.settings.model}': {exc}") from None
        wall = time.monotonic() - t0
        after = self.server.usage()
        lv = result.levels[-1]
        lat = lv.client.latency_us
        cpu_us = rss = None
        if before and after:
            inferences = lv.throughput * wall  # the level's rate over the whole run: warm-up windows included
            cpu_us = (after[0] - before[0]) / inferences * 1e6 if inferences else None
            rss = after[1]
        return Measurement(candidate, level, lv.throughput, lat.get("p50", 0.0), lat.get("p95", 0.0),
                           lat.get("p99", 0.0), cpu_us, rss, result.client_cpu_s, wall)

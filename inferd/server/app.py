"""Wiring: build the manager, data plane and frontends; run until a signal.

Start-up checks the repository paths (a missing one stops it before any port
opens; an empty one is warned about), opens the ports (gRPC with health and
reflection, HTTP/REST, metrics; each can be turned off), then loads every model
(a broken one is reported, not fatal, unless ``exit_on_error``): the server is
live but not ready while models load. When loading ends it prints one table of
the models and a line saying whether it is ready and, if not, why. SIGINT/SIGTERM start a graceful stop: readiness turns
false and gRPC health NOT_SERVING at once, new inference requests are refused
while the ports stay open, accepted ones finish (up to ``grace`` seconds in
all), then the ports close and the models are released; metrics answer until
the end.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from inferd.dataplane import SERVER_NAME, DataPlane
from inferd.dataplane.batches import default_batch_dir
from inferd.errors import InferdError
from inferd.model.cache import ResponseCache
from inferd.observability.log_settings import LogSettings
from inferd.observability.metrics import ServerMetrics
from inferd.observability.tracing import Tracing
from inferd.repository import ModelManager
from inferd.repository.control import RepositoryPoller
from inferd.repository.layout import check_repositories
from inferd.repository.report import format_table, model_rows, readiness
from inferd.scheduling.rate_limiter import RateLimiter
from inferd.server.asgi import AsgiServer
from inferd.server.grpc_service import InferenceServicer, add_to_server
from inferd.server.health import Health, enable_reflection
from inferd.server.http_service import HttpFrontend

log = logging.getLogger("inferd")


@dataclass
class ServerOptions:
    model_repositories: list[Path]
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    address: str = "0.0.0.0"  # gRPC
    http_address: str | None = None  # None: as ``address``
    metrics_address: str | None = None  # None: as the HTTP address
    allow_grpc: bool = True
    allow_http: bool = True
    allow_metrics: bool = True
    max_message_bytes: int = 2**31 - 1
    grace_seconds: float = 30.0
    exit_on_error: bool = False
    grpc_options: list[tuple[str, object]] = field(default_factory=list)
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: list[str] = field(default_factory=list)  # explicit mode, at start-up ("*": all)
    repository_poll_secs: float = 15.0
    tracing: Tracing | None = None  # None: off
    log_settings: LogSettings | None = None
    strict_model_config: bool = False  # True: every model brings a complete config.pbtxt (no auto-complete)
    cache_bytes: int | None = None  # --cache-config local,size=BYTES: the response cache's size (None: no cache)
    rate_limit: str = "off"  # --rate-limit off | execution_count
    rate_limit_resources: list[tuple[str, int, int]] = field(default_factory=list)  # --rate-limit-resource
    server_name: str = SERVER_NAME  # ServerMetadata's name
    batch_dir: Path | None = None  # batch jobs' state; None: next to the first repository


class InferenceServer:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        cache = ResponseCache(options.cache_bytes) if options.cache_bytes else None
        limiter = RateLimiter(options.rate_limit_resources) if options.rate_limit == "execution_count" else None
        self.manager = ModelManager(options.model_repositories, mode=options.model_control_mode,
                                    startup_models=options.load_models,
                                    auto_complete=not options.strict_model_config, cache=cache, limiter=limiter)
        self.dataplane = DataPlane(self.manager, tracing=options.tracing, logs=options.log_settings,
                                   server_name=options.server_name,
                                   batch_dir=options.batch_dir or default_batch_dir(options.model_repositories[0]))
        self.poller = (RepositoryPoller(self.manager, options.repository_poll_secs)
                       if options.model_control_mode == "poll" else None)
        self._grpc: grpc.aio.Server | None = None
        self.grpc_port: int = 0
        self.health: Health | None = None
        self.metrics: ServerMetrics | None = None
        self._http: AsgiServer | None = None
        self._metrics_server: AsgiServer | None = None
        self._stopping = asyncio.Event()

    @property
    def http_address(self) -> str:
        return self.options.http_address or self.options.address

    @property
    def metrics_address(self) -> str:
        return self.options.metrics_address or self.http_address

    @property
    def http_port(self) -> int:
        return self._http.port if self._http is not None else 0

    @property
    def metrics_port(self) -> int:
        return self._metrics_server.port if self._metrics_server is not None else 0

    def ports(self) -> dict[str, int | None]:
        """The bound ports, None for a frontend that is off (the --port-file contents)."""
        o = self.options
        return {
            "grpc": self.grpc_port if o.allow_grpc else None,
            "http": self.http_port if o.allow_http else None,
            "metrics": self.metrics_port if o.allow_metrics else None,
        }

    async def start(self) -> None:
        o = self.options
        try:  # before any port opens: a wrong path is one line, not a half-started server
            empty = check_repositories(o.model_repositories)
        except InferdError as exc:
            raise SystemExit(exc.message) from None
        for repo in empty:
            log.warning("model repository '%s' holds no model folder (a model is %s/<name>/1/model.onnx, "
                        "model.py or model.pt, with an optional %s/<name>/config.pbtxt)", repo, repo, repo)
        self.dataplane.loading = True  # live, not ready, until the models are in
        try:
            await self._open_ports()
        except BaseException:
            await self.stop()
            raise
        try:
            await self.dataplane.load_models()
        except InferdError as exc:  # a --load-model that names no model
            await self.stop()  # the ports close on the loop that opened them
            raise SystemExit(exc.message) from None
        if self.poller is not None:
            self.poller.start()
        if self.health is not None:
            await self.health.refresh()
        if o.exit_on_error and not await self.dataplane.server_ready():
            broken = [e for e in await self.dataplane.repository_index() if e.state != "READY"]
            await self.stop()
            raise SystemExit(
                "exit-on-error: models failed to load: "
                + "; ".join(f"{e.name}: {e.reason}" for e in broken)
            )

    async def _open_ports(self) -> None:
        o = self.options
        if o.allow_metrics:
            await self._start_metrics()
        if o.allow_grpc:
            await self._start_grpc()
        if o.allow_http:
            self._http = AsgiServer(HttpFrontend(self.dataplane).app(), self.http_address, o.http_port, "HTTP")
            await self._http.start()
            log.info("serving HTTP on %s:%d", self.http_address, self.http_port)

    async def _start_metrics(self) -> None:
        o = self.options
        self.metrics = ServerMetrics(self.dataplane)  # before loading: histograms attach as models build
        self._metrics_server = AsgiServer(self.metrics.asgi_app(), self.metrics_address, o.metrics_port, "metrics")
        await self._metrics_server.start()
        log.info("serving metrics on %s:%d/metrics", self.metrics_address, self.metrics_port)

    async def _start_grpc(self) -> None:
        size = self.options.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                *self.options.grpc_options,
            ]
        )
        add_to_server(InferenceServicer(self.dataplane), server)
        self.health = Health(self.dataplane)
        self.health.add_to_server(server)
        enable_reflection(server)
        address = f"{self.options.address}:{self.options.grpc_port}"
        self.grpc_port = server.add_insecure_port(address)
        if self.grpc_port == 0:
            raise SystemExit(f"cannot listen for gRPC on {address}")
        await server.start()
        self._grpc = server
        await self.health.start()
        log.info("serving gRPC on %s:%d", self.options.address, self.grpc_port)

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop: not ready at once, refuse new work, let accepted requests finish (for ``grace``
        seconds, the options' by default), release models."""
        self.dataplane.drain()
        await self.dataplane.stop_batches()  # their unfinished lines run at the next start
        if self.poller is not None:
            await self.poller.stop()
        if self.health is not None:
            self.health.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.options.grace_seconds if grace is None else grace)
        # The ports stay open meanwhile: health, readiness and metadata answer, inference is refused.
        while self.dataplane.inflight() and loop.time() < deadline:
            await asyncio.sleep(0.005)
        grace = max(deadline - loop.time(), 0.0)
        closing = []
        if self._grpc is not None:
            self.health.close()  # type: ignore[union-attr]
            closing.append(self._grpc.stop(grace))
        if self._http is not None:
            closing.append(self._http.stop(grace))
        await asyncio.gather(*closing)
        await self.dataplane.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop(1.0)
        if self.metrics is not None:
            self.metrics.close()
        log.info("stopped")

    async def startup_report(self, where: str) -> str:
        """The models table, then ``inferd: ready, N of N models ready; <where>`` or, when some
        model is not ready, ``inferd: NOT ready, ...`` naming them."""
        rows = model_rows(self.manager)
        ready = await self.dataplane.server_ready()
        status = "ready" if ready else "NOT ready"
        table = format_table(rows) or "no models"
        return f"{table}\ninferd: {status}, {readiness(rows, ready)}; serving {where}"

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        o = self.options
        where = [f"gRPC on {o.address}:{self.grpc_port}" if o.allow_grpc else "",
                 f"HTTP on {self.http_address}:{self.http_port}" if o.allow_http else "",
                 f"metrics on {self.metrics_address}:{self.metrics_port}/metrics" if o.allow_metrics else ""]
        print(await self.startup_report(", ".join(w for w in where if w)), flush=True)
        await self._stopping.wait()
        log.info("stopping: finishing in-flight requests")
        await self.stop()

"""Wiring: build the manager, data plane and frontends; run until a signal.

Start-up checks the repository paths (a missing one stops it before any port
opens; an empty one is warned about), opens the ports (gRPC with health and
reflection, HTTP/REST, metrics; each can be turned off), then loads every model
(a broken one is reported, not fatal, unless ``exit_on_error``): the server is
live but not ready while models load. When loading ends it prints one table of
the models and a line saying whether it is ready and, if not, why.
SIGINT/SIGTERM start a graceful stop: readiness turns false and gRPC health
NOT_SERVING at once, new inference requests are refused (UNAVAILABLE / 503)
while the ports stay open, accepted ones finish (up to ``grace`` seconds in
all), then the ports close, the gRPC one answering what arrives meanwhile
UNAVAILABLE, never CANCELLED (:class:`GrpcPort`), and the models are released;
metrics answer until the end.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from inferd import event_loop
from inferd.dataplane import SERVER_NAME, DataPlane
from inferd.dataplane.admission import DEFAULT_MAX_BYTES, DEFAULT_MAX_REQUESTS, Admission
from inferd.dataplane.shedding import DEFAULT_EXECUTION_MULTIPLE, DEFAULT_INTERVAL_US, DEFAULT_TARGET_US, QueueDelay
from inferd.dataplane.batches import default_batch_dir
from inferd.errors import InferdError
from inferd.hosts.registry import DEFAULT_FINALIZE_GRACE, Hosts
from inferd.model.cache import ResponseCache
from inferd.observability import collector
from inferd.observability.log_settings import LogSettings
from inferd.dataplane.metrics import ServerMetrics
from inferd.observability.tracing import Tracing
from inferd.repository import ModelManager
from inferd.repository.control import RepositoryPoller
from inferd.repository.layout import check_repositories
from inferd.repository.table import format_table, model_rows, readiness
from inferd.scheduling.rate_limiter import RateLimiter
from inferd.frontends.asgi import AsgiServer, bind
from inferd.frontends.door import DEFAULT_MAX_HELD_CALLS, Door, DoorPolicy
from inferd.frontends.grpc_port import FrontSockets, GrpcPort, GrpcPortOptions
from inferd.frontends.grpc_service import InferenceServicer
from inferd.frontends.grpc_health import Health
from inferd.frontends.http_limits import chunk_limited_protocol
from inferd.frontends.http_service import DEFAULT_MAX_INPUT_BYTES, HttpFrontend
from inferd.frontends.openai import BatchLines, OpenAIOptions
from inferd.frontends.parameters import header_forward
from inferd.frontends.restrictions import Restrictions
from inferd.frontends.tls import TlsFiles
from inferd.serve.grpc_front import EnvoyFront, RunFolder, Upstream
from inferd.streaming import StreamLimits

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
    max_message_bytes: int = 2**31 - 1  # gRPC
    http_max_input_bytes: int = DEFAULT_MAX_INPUT_BYTES
    grpc_tls: TlsFiles | None = None
    http_tls: TlsFiles | None = None
    grpc_restrictions: Restrictions = field(default_factory=lambda: Restrictions(protocol="protocol"))
    http_restrictions: Restrictions = field(default_factory=Restrictions)
    openai: OpenAIOptions = field(default_factory=OpenAIOptions)  # /v1: its API keys
    max_queued_requests: int = DEFAULT_MAX_REQUESTS  # server-wide admission caps (0: none)
    max_queued_bytes: int = DEFAULT_MAX_BYTES
    grpc_max_held_calls: int = DEFAULT_MAX_HELD_CALLS  # the gRPC door: calls the server holds (0: no bound)
    stream_limits: StreamLimits = field(default_factory=StreamLimits)  # how far a stream's client may lag
    queue_delay_target_us: int = DEFAULT_TARGET_US  # the server-wide queueing-delay bound (0: off, --no-shed)
    queue_delay_interval_us: int = DEFAULT_INTERVAL_US
    queue_delay_execution_multiple: float = DEFAULT_EXECUTION_MULTIPLE
    grace_seconds: float = 30.0
    exit_on_error: bool = False
    grpc_options: list[tuple[str, object]] = field(default_factory=list)
    model_control_mode: str = "none"  # none | explicit | poll
    load_models: list[str] = field(default_factory=list)  # explicit mode, at start-up ("*": all)
    repository_poll_secs: float = 15.0
    model_memory_budget: int | None = None  # on_demand: host bytes the loaded models may hold (None: no limit)
    # on_demand: GPU index -> bytes the loaded models may hold there (a GPU not named: no limit)
    model_gpu_memory_budget: dict[int, int] = field(default_factory=dict)
    model_warmup_on_demand: bool = True  # on_demand: a demand load runs model_warmup before its requests
    tracing: Tracing | None = None  # None: off
    log_settings: LogSettings | None = None
    strict_model_config: bool = False  # True: every model brings a complete config.pbtxt (no auto-complete)
    cache_bytes: int | None = None  # --cache-config local,size=BYTES: the response cache's size (None: no cache)
    rate_limit: str = "off"  # --rate-limit off | execution_count
    rate_limit_resources: list[tuple[str, int, int]] = field(default_factory=list)  # --rate-limit-resource
    server_name: str = SERVER_NAME  # ServerMetadata's name
    batch_dir: Path | None = None  # batch jobs' state; None: next to the first repository
    model_host: str = "auto"  # --model-host: which models' instances run in host processes (inferd/hosts/)
    allow_client_shm: bool = False  # --allow-client-shm: clients may register shared memory regions
    histogram_latencies: bool = False  # --metrics-config histogram_latencies=true: Triton's first-response histogram
    grpc_header_forward_pattern: str = ""  # metadata that becomes request parameters ("": none)
    grpc_front: str = "grpcio"  # --grpc-front: grpcio (each serving process's grpc.aio) or envoy (serve/grpc_front.py)
    grpc_front_threads: int = 1  # --grpc-front-threads: Envoy's worker threads
    http_header_forward_pattern: str = ""  # headers that become an infer request's parameters ("": none)

    @property
    def behind_front(self) -> bool:
        """gRPC is served behind the gRPC front (Envoy)."""
        return self.allow_grpc and self.grpc_front == "envoy"

    @property
    def grpc_door_bound(self) -> int:
        """The bound grpc.aio's door keeps: none behind the front, where Envoy keeps --grpc-max-held-calls."""
        return 0 if self.behind_front else self.grpc_max_held_calls


# Of the exit timeout, the part kept for closing the ports and releasing the models (model hosts
# finalizing) once in-flight requests have had the rest: a quarter, at most this many seconds.
STOP_RESERVE = 2.0
# Past the exit timeout, how long the orderly stop may still take before the watchdog kills the process
# tree: the stop is planned to end by the exit timeout (model hosts killed at it), but closing ports and
# ending processes under load can take a while longer when the timeout is short (tests use 0.2 s).
WATCHDOG_MARGIN = 3.0


class InferenceServer:
    def __init__(self, options: ServerOptions) -> None:
        batch_dir = options.batch_dir or default_batch_dir(options.model_repositories[0])
        self.options = options
        cache = ResponseCache(options.cache_bytes) if options.cache_bytes else None
        limiter = RateLimiter(options.rate_limit_resources) if options.rate_limit == "execution_count" else None
        self.hosts = Hosts(options.model_host, finalize_grace=min(DEFAULT_FINALIZE_GRACE, options.grace_seconds),
                           budgeted=options.model_memory_budget is not None)
        self.manager = ModelManager(options.model_repositories, mode=options.model_control_mode,
                                    startup_models=options.load_models,
                                    auto_complete=not options.strict_model_config, cache=cache, limiter=limiter,
                                    memory_budget=options.model_memory_budget,
                                    gpu_memory_budget=options.model_gpu_memory_budget,
                                    demand_warmup=options.model_warmup_on_demand, hosts=self.hosts)
        self.dataplane = DataPlane(self.manager, tracing=options.tracing, logs=options.log_settings,
                                   server_name=options.server_name,
                                   admission=Admission(options.max_queued_requests, options.max_queued_bytes),
                                   stream_limits=options.stream_limits,
                                   shedding=QueueDelay(options.queue_delay_target_us,
                                                       options.queue_delay_interval_us,
                                                       options.queue_delay_execution_multiple),
                                   batch_dir=batch_dir, openai_lines=BatchLines,
                                   allow_client_shm=options.allow_client_shm)
        # /v1's Batch API is the core's, beside the /v2 batch jobs; every frontend (a worker too) is told its
        # folder, where it writes an upload for the core to take.
        openai_dir = str(self.dataplane.batches.openai.root)  # type: ignore[union-attr]  # a batch_dir: both on
        self.options = options = replace(options, openai=replace(options.openai, batch_dir=openai_dir))
        self.poller = (RepositoryPoller(self.manager, options.repository_poll_secs)
                       if options.model_control_mode == "poll" else None)
        self._grpc: GrpcPort | None = None
        self.metrics: ServerMetrics | None = None
        self._http: AsgiServer | None = None
        self._http_frontend: HttpFrontend | None = None
        self._metrics_server: AsgiServer | None = None
        self.front: EnvoyFront | None = None  # --grpc-front envoy
        self._front_folder: RunFolder | None = None
        self._front_port: socket.socket | None = None  # the gRPC port, reserved for Envoy
        self._stopping = asyncio.Event()
        self._watchdog: threading.Timer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def http_address(self) -> str:
        return self.options.http_address or self.options.address

    @property
    def metrics_address(self) -> str:
        return self.options.metrics_address or self.http_address

    @property
    def grpc_port(self) -> int:
        if self._front_port is not None:
            return self._front_port.getsockname()[1]
        return self._grpc.port if self._grpc is not None else 0

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
        collector.freeze()  # before any model: what start-up made, out of full collections
        try:
            await self.dataplane.load_models()
        except InferdError as exc:  # a --load-model that names no model
            await self.stop()  # the ports close on the loop that opened them
            raise SystemExit(exc.message) from None
        if self.poller is not None:
            self.poller.start()
        if self._grpc is not None:
            await self._grpc.health.refresh()
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
            self._http_frontend = HttpFrontend(self.dataplane, o.http_restrictions, o.http_max_input_bytes, o.openai,
                                               self.dataplane, header_forward(o.http_header_forward_pattern,
                                                                              "--http-header-forward-pattern"))
            self._http = AsgiServer(self._http_frontend.app(), self.http_address, o.http_port, "HTTP", tls=o.http_tls,
                                    protocol=chunk_limited_protocol())
            await self._http.start()
            log.info("serving HTTP on %s:%d", self.http_address, self.http_port)

    async def _start_metrics(self) -> None:
        o = self.options
        # Before loading: histograms attach as models build.
        self.metrics = ServerMetrics(self.dataplane, histogram_latencies=o.histogram_latencies)
        self._metrics_server = AsgiServer(self.metrics.asgi_app(), self.metrics_address, o.metrics_port, "metrics")
        await self._metrics_server.start()
        log.info("serving metrics on %s:%d/metrics", self.metrics_address, self.metrics_port)

    async def _start_grpc(self) -> None:
        o = self.options
        forward = header_forward(o.grpc_header_forward_pattern, "--grpc-header-forward-pattern")
        admission = self.dataplane.admission
        sockets = self.front_sockets(0) if o.behind_front else None
        if sockets is not None:
            self.spawn_front([sockets])
        door = Door(DoorPolicy(o.grpc_door_bound), on_refused=lambda: admission.count_refused(1))
        port = GrpcPort(InferenceServicer(self.dataplane, forward=forward), Health(self.dataplane), GrpcPortOptions(
            address=o.address, port=o.grpc_port, max_message_bytes=o.max_message_bytes, tls=o.grpc_tls,
            restrictions=o.grpc_restrictions, channel_args=tuple(o.grpc_options), front=sockets), door=door)
        await port.start()
        self._grpc = port
        await self.front_serving()
        log.info("serving gRPC%s on %s:%d%s", " (TLS)" if o.grpc_tls else "", o.address, self.grpc_port,
                 " through Envoy" if self.front is not None else "")

    def front_sockets(self, slot: int) -> FrontSockets:
        """Serving process ``slot``'s two sockets behind the gRPC front (its folder made on first use)."""
        if self._front_folder is None:
            self._front_folder = RunFolder()
        folder = self._front_folder.path
        return FrontSockets(str(folder / f"grpc-{slot}.sock"), str(folder / f"bridge-{slot}.sock"))

    def spawn_front(self, sockets: list[FrontSockets]) -> None:
        """Start Envoy on the gRPC port (reserved here: port 0 is resolved once), in front of ``sockets``;
        :meth:`front_serving` waits for it, so that its start overlaps the serving processes'."""
        o = self.options
        assert self._front_folder is not None
        if self._front_port is None:
            self._front_port = bind(o.address, o.grpc_port, "gRPC", reuse_port=True)  # never listens: Envoy does
        self.front = EnvoyFront(o.address, self.grpc_port, [Upstream(s.grpc, s.bridge) for s in sockets],
                                self._front_folder.path, o.grpc_front_threads, tls=o.grpc_tls,
                                max_held_calls=o.grpc_max_held_calls)
        self.front.spawn()
        self.dataplane.admission.elsewhere = self.front.refused

    async def front_serving(self) -> None:
        if self.front is not None:
            await self.front.serving()

    async def drain_front(self, deadline: float) -> None:
        """Once the calls in flight are answered: end the open streams and drain Envoy's connections, so
        that every answer and stream end reaches its client before the sockets behind Envoy close; waiting
        at most half of what is left until ``deadline`` (the loop's time) for them."""
        if self.front is None:
            return
        if self._grpc is not None:
            self._grpc.end_streams()
        left = deadline - asyncio.get_running_loop().time()
        await self.front.drain(answers_s=min(2.0, max(left / 2, 0.0)))

    async def stop_front(self) -> None:
        """Stop Envoy (its clients' next calls fail UNAVAILABLE), release the port, remove the folder."""
        if self.front is not None:
            await self.front.stop()
            self.dataplane.admission.elsewhere = None
            self.front = None
        if self._front_port is not None:
            self._front_port.close()
            self._front_port = None
        if self._front_folder is not None:
            self._front_folder.remove()
            self._front_folder = None

    async def stop(self, grace: float | None = None) -> None:
        """Graceful stop: not ready at once, refuse new work, let accepted requests finish (for ``grace``
        seconds, the options' by default), release models."""
        self.dataplane.drain()
        await self.dataplane.stop_batches()  # their unfinished lines (/v2's and /v1's) run at the next start
        if self.poller is not None:
            await self.poller.stop()
        if self._grpc is not None:
            self._grpc.health.drain()
        loop = asyncio.get_running_loop()
        grace = self.options.grace_seconds if grace is None else grace
        deadline = loop.time() + grace
        # The ports stay open meanwhile: health, readiness and metadata answer, inference is refused.
        # Part of the grace (STOP_RESERVE) is kept for closing the ports and releasing the models.
        try:
            await asyncio.wait_for(self.dataplane.drained(), timeout=grace - min(grace / 4, STOP_RESERVE))
        except asyncio.TimeoutError:
            log.warning("stopping: %d requests still unanswered after the %.3g s grace period",
                        self.dataplane.inflight(), grace)
        await self.drain_front(deadline)
        remaining = max(deadline - loop.time(), 0.0)
        closing = []
        if self._grpc is not None:
            closing.append(self._grpc.close(remaining / 2))
        if self._http is not None:
            closing.append(self._http.stop(remaining / 2))
        await asyncio.gather(*closing)
        await self.stop_front()
        self.hosts.stop_by = deadline  # a model host still finalizing then is killed
        await self.dataplane.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop(1.0)
        if self.metrics is not None:
            self.metrics.close()
        collector.thaw()  # this process may live on (a test, a benchmark): the server's objects may go
        log.info("stopped")

    async def startup_report(self, where: str) -> str:
        """The models table, then ``inferd: ready, N of N models ready; <where>`` or, when some
        model is not ready, ``inferd: NOT ready, ...`` naming them."""
        rows = model_rows(self.manager)
        ready = await self.dataplane.server_ready()
        status = "ready" if ready else "NOT ready"
        table = format_table(rows) or "no models"
        return f"{table}\ninferd: {status}, {readiness(rows, ready)}; serving {where}; event loop {event_loop.running()}"

    def request_stop(self) -> None:
        self._stopping.set()

    def child_pids(self) -> list[int]:
        """The processes this server started (its model hosts, Envoy, and the frontend workers of a core),
        for the watchdog to kill."""
        envoy = self.front.pid() if self.front is not None else None
        return self.hosts.pids() + ([envoy] if envoy is not None else [])

    def _on_signal(self, signum: int, frame: object) -> None:
        """SIGINT/SIGTERM, in the main thread between two bytecodes of whatever the loop runs, so
        it is seen even while the loop is swamped. Starts the graceful stop on the loop, and arms
        the watchdog: a stop still running WATCHDOG_MARGIN seconds past ``grace`` (``--exit-timeout-secs``:
        a model that never returns in this process, a loop that never gets back) ends the process tree
        at once, as Triton exits at its exit timeout whatever is still in flight. (The orderly stop is
        planned to end by the exit timeout; the margin is for what it cannot plan, under load.)"""
        if self._watchdog is None:
            delay = self.options.grace_seconds + WATCHDOG_MARGIN
            self._watchdog = threading.Timer(delay, self._hard_exit, args=(delay,))
            self._watchdog.daemon = True
            self._watchdog.start()
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self.request_stop)

    def _hard_exit(self, delay: float) -> None:
        log.error("stopping: the graceful stop did not end within %.3g s; killing the server", delay)
        for pid in self.child_pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os._exit(1)

    async def serve_forever(self) -> None:
        self._loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        await self.start()
        o = self.options
        where = [f"gRPC on {o.address}:{self.grpc_port}" if o.allow_grpc else "",
                 f"HTTP on {self.http_address}:{self.http_port}" if o.allow_http else "",
                 f"metrics on {self.metrics_address}:{self.metrics_port}/metrics" if o.allow_metrics else ""]
        print(await self.startup_report(", ".join(w for w in where if w)), flush=True)
        await self._stopping.wait()
        log.info("stopping: finishing in-flight requests")
        await self.stop()

"""``inferd serve --frontend-workers N``: this process is the core, N workers own the wire.

The core loads the models, runs the data plane, schedulers, ensembles, sequences
and Python models exactly as one process does, serves ``/metrics`` (the one
copy of every statistic), and reserves the gRPC and HTTP ports; the workers
(:mod:`inferd.handoff.worker`) serve those ports with SO_REUSEPORT. Start-up:
metrics port, port reservations, workers (live, not ready), then the models.
Stop (SIGTERM/SIGINT): readiness turns false everywhere at once, every worker
drains (refuses new requests, answers those it accepted, closes its ports,
exits), then the core finishes as the one-process server does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

from inferd.handoff import ports, wire
from inferd.handoff.endpoint import CoreEndpoint
from inferd.handoff.passthrough import Passthrough
from inferd.handoff.supervisor import Link, Supervisor
from inferd.server.app import InferenceServer, ServerOptions
from inferd.server.health import SERVICES, Health

log = logging.getLogger("inferd")


class MultiProcessServer(InferenceServer):
    def __init__(self, options: ServerOptions, workers: int) -> None:
        super().__init__(options)
        self.workers = workers
        self.supervisor: Supervisor | None = None
        self.passthrough = Passthrough(self.dataplane)
        self._reserved: list[socket.socket] = []
        self._http_port = 0
        self._relay: asyncio.Task | None = None
        self._tracing_sent: bool | None = None

    @property
    def http_port(self) -> int:  # type: ignore[override]
        return self._http_port

    async def _open_ports(self) -> None:
        o = self.options
        if o.allow_metrics:
            from inferd.observability.metrics import ServerMetrics
            from inferd.server.asgi import AsgiServer

            self.metrics = ServerMetrics(self.dataplane)
            self._metrics_server = AsgiServer(self.metrics.asgi_app(), self.metrics_address, o.metrics_port, "metrics")
            await self._metrics_server.start()
            log.info("serving metrics on %s:%d/metrics", self.metrics_address, self.metrics_port)
        if o.allow_grpc:
            sock = ports.reserve(o.address, o.grpc_port, "gRPC")
            self._reserved.append(sock)
            self.grpc_port = sock.getsockname()[1]
        if o.allow_http:
            sock = ports.reserve(self.http_address, o.http_port, "HTTP")
            self._reserved.append(sock)
            self._http_port = sock.getsockname()[1]
        self.health = Health(self.dataplane)  # not on a port: the workers mirror it
        await self.health.start()
        self.supervisor = Supervisor(self.workers, self._worker_config, self._endpoint)
        await self.supervisor.start()
        self._relay = asyncio.get_running_loop().create_task(self._relay_health(), name="inferd health relay")
        log.info("%d frontend workers serving%s%s", self.workers,
                 f" gRPC on {o.address}:{self.grpc_port}" if o.allow_grpc else "",
                 f" HTTP on {self.http_address}:{self.http_port}" if o.allow_http else "")

    def _state(self) -> dict[str, Any]:
        assert self.health is not None
        return {"tracing": self.dataplane.tracing.enabled,
                "health": {s: self.health.status(s) for s in SERVICES}}

    def _worker_config(self, index: int) -> dict[str, Any]:
        o = self.options
        return {
            "index": index,
            "grpc": {"address": o.address, "port": self.grpc_port, "max_message_bytes": o.max_message_bytes,
                     "options": [list(kv) for kv in o.grpc_options]} if o.allow_grpc else None,
            "http": {"address": self.http_address, "port": self.http_port} if o.allow_http else None,
            "state": self._state(),
            "grace": o.grace_seconds,  # a worker's own SIGTERM drains with the server's grace
            "log_level": logging.getLogger().level,
        }

    def _endpoint(self, link: Link) -> CoreEndpoint:
        return CoreEndpoint(link, self.dataplane, self._call)

    async def _call(self, method: str, args: tuple, kwargs: dict) -> Any:
        if method == "grpc":
            result: Any = await self.passthrough.grpc(*args, **kwargs)
        elif method == "http":
            result = await self.passthrough.http(*args, **kwargs)
        else:
            raise ValueError(f"unknown call '{method}'")
        if self.dataplane.tracing.enabled != self._tracing_sent:  # a TraceSetting call turned it on or off
            self._broadcast()
        return result

    def _broadcast(self) -> None:
        state = self._state()
        self._tracing_sent = state["tracing"]
        if self.supervisor is not None:
            for link in self.supervisor.links.values():
                link.channel.send([wire.STATE, state])

    async def _relay_health(self) -> None:
        """Push every change of the core's health to the workers (Health notifies; nothing polls here)."""
        assert self.health is not None
        while True:
            changed = self.health.changed
            self._broadcast()
            await changed.wait()

    async def stop(self) -> None:
        """Not ready at once, drain every worker (each answers what it accepted), then stop the core."""
        self.dataplane.draining = True
        if self.health is not None:
            self.health.drain()
        if self.supervisor is not None:
            await self.supervisor.stop(self.options.grace_seconds)
        if self._relay is not None:
            self._relay.cancel()
        for sock in self._reserved:
            sock.close()
        self._reserved.clear()
        await super().stop()

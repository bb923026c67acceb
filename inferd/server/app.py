"""Wiring: build the manager, data plane and frontends; run until a signal.

Start-up loads every model (a broken one is reported, not fatal, unless
``exit_on_error``), then opens the ports. SIGINT/SIGTERM start a graceful
stop: readiness turns false, new RPCs are refused, in-flight requests finish
(up to ``grace`` seconds), then the models are released.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from inferd.repository import ModelManager
from inferd.server import context
from inferd.server.dataplane import DataPlane
from inferd.server.grpc_service import InferenceServicer, add_to_server

log = logging.getLogger("inferd")


@dataclass
class ServerOptions:
    model_repositories: list[Path]
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    address: str = "0.0.0.0"
    max_message_bytes: int = 2**31 - 1
    grace_seconds: float = 30.0
    exit_on_error: bool = False
    grpc_options: list[tuple[str, object]] = field(default_factory=list)


class InferenceServer:
    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.manager = ModelManager(options.model_repositories)
        self.dataplane = DataPlane(self.manager)
        self._grpc: grpc.aio.Server | None = None
        self.grpc_port: int = 0
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        # Published before loading: a Python model may call other models (BLS).
        context.set_current(context.ServerContext(self.dataplane, asyncio.get_running_loop()))
        await self.manager.load_all()
        if self.options.exit_on_error and not self.manager.all_ready():
            broken = [e for e in self.manager.index() if e.state != "READY"]
            raise SystemExit(
                "exit-on-error: models failed to load: "
                + "; ".join(f"{e.name}: {e.reason}" for e in broken)
            )
        size = self.options.max_message_bytes
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", size),
                ("grpc.max_receive_message_length", size),
                *self.options.grpc_options,
            ]
        )
        add_to_server(InferenceServicer(self.dataplane), server)
        address = f"{self.options.address}:{self.options.grpc_port}"
        self.grpc_port = server.add_insecure_port(address)
        if self.grpc_port == 0:
            raise SystemExit(f"cannot listen for gRPC on {address}")
        await server.start()
        self._grpc = server
        log.info("serving gRPC on %s:%d", self.options.address, self.grpc_port)

    async def stop(self) -> None:
        """Graceful stop: refuse new work, let accepted requests finish, release models."""
        self.dataplane.draining = True
        if self._grpc is not None:
            await self._grpc.stop(self.options.grace_seconds)
        await self.manager.stop()
        current = context.current()
        if current is not None and current.dataplane is self.dataplane:
            context.set_current(None)
        log.info("stopped")

    def request_stop(self) -> None:
        self._stopping.set()

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.request_stop)
        await self.start()
        print(f"inferd: ready, gRPC on {self.options.address}:{self.grpc_port}", flush=True)
        await self._stopping.wait()
        log.info("stopping: finishing in-flight requests")
        await self.stop()

"""Standard gRPC services on the inference port, for orchestrators and tools.

``grpc.health.v1.Health`` answers for the server (service ``""``) and for
``inference.GRPCInferenceService``: SERVING only while the data plane is
ready, so NOT_SERVING while models load, while a model is unavailable and,
from the moment a stop begins, during the drain. ``Check`` reads readiness
when asked; ``Watch`` streams are told of changes within ``poll_seconds``
(of a drain at once), and end when the server closes its port.

Server reflection lists and describes our services. Our descriptors live in
a private pool (``inferd._proto._pool.POOL``, see there); the health and
reflection protos live in protobuf's default pool, so reflection is given a
view over both.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferd._proto._pool import POOL
from inferd.facade import DataPlaneAPI

INFERENCE_SERVICE = "inference.GRPCInferenceService"
SERVICES = ("", INFERENCE_SERVICE)
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class _Servicer(health_pb2_grpc.HealthServicer):
    def __init__(self, health: "Health") -> None:
        self._health = health

    async def Check(self, request, context):  # type: ignore[no-untyped-def]
        status = await self._health.status(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service '{request.service}'")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context):  # type: ignore[no-untyped-def]
        health = self._health
        last = None
        while True:
            changed = health.changed
            status = await health.status(request.service)
            status = SERVICE_UNKNOWN if status is None else status
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
            if health.closed:
                return  # the server is going away: end the stream (after NOT_SERVING was sent)
            await changed.wait()


class Health:
    """The serving status of :data:`SERVICES`, kept equal to the data plane's readiness."""

    def __init__(self, dataplane: DataPlaneAPI, poll_seconds: float = 0.5) -> None:
        self.dp = dataplane
        self.poll_seconds = poll_seconds
        self.servicer = _Servicer(self)
        self._status = NOT_SERVING
        self.draining = False
        self.closed = False
        self.changed = asyncio.Event()  # set (and replaced) on every change
        self._task: asyncio.Task | None = None

    def add_to_server(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def start(self) -> None:
        await self.refresh()
        # Watch streams learn of changes that no call here causes (a model failing, a reload).
        self._task = asyncio.get_running_loop().create_task(self._poll(), name="inferd health")

    async def status(self, service: str) -> int | None:
        """The status of ``service`` now; None for a service this server does not have."""
        if service not in SERVICES:
            return None
        await self.refresh()
        return self._status

    async def refresh(self) -> None:
        self._set(SERVING if not self.draining and await self.dp.server_ready() else NOT_SERVING)

    def _set(self, status: int) -> None:
        if status != self._status:
            self._status = status
            self._notify()

    def _notify(self) -> None:
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_seconds)
            await self.refresh()

    def drain(self) -> None:
        """NOT_SERVING for good: a stop has begun."""
        self.draining = True
        self._set(NOT_SERVING)
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def close(self) -> None:
        """End the Watch streams, so that they do not hold the gRPC server's stop."""
        self.drain()
        self.closed = True
        self._notify()


class _Pools:
    """The lookups reflection makes, tried in our pool, then in the default one."""

    def __init__(self, *pools: Any) -> None:
        self._pools = pools

    def _first(self, method: str, *args: Any) -> Any:
        error: Exception | None = None
        for pool in self._pools:
            try:
                return getattr(pool, method)(*args)
            except KeyError as exc:
                error = exc
        raise error  # type: ignore[misc]

    def FindFileByName(self, name: str) -> Any:
        return self._first("FindFileByName", name)

    def FindFileContainingSymbol(self, symbol: str) -> Any:
        return self._first("FindFileContainingSymbol", symbol)

    def FindMessageTypeByName(self, name: str) -> Any:
        return self._first("FindMessageTypeByName", name)

    def FindExtensionByNumber(self, message: Any, number: int) -> Any:
        return self._first("FindExtensionByNumber", message, number)

    def FindAllExtensions(self, message: Any) -> Any:
        return self._first("FindAllExtensions", message)


def enable_reflection(server: grpc.aio.Server) -> None:
    from grpc_reflection.v1alpha import reflection

    names = (INFERENCE_SERVICE, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server, pool=_Pools(POOL, descriptor_pool.Default()))

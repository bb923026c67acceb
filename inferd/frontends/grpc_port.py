"""The gRPC port: the grpc.aio server every process that serves gRPC builds here.

:class:`GrpcPort` puts the inference servicer, gRPC health and reflection on
one port with what every such port needs: the message-size limits, TLS or
mutual TLS (:mod:`inferd.frontends.tls`), the restricted groups
(:mod:`inferd.frontends.restrictions`), and gRPC core's own limits raised out of
the way so that the server, not the transport, decides what to refuse:

- gRPC core answers calls it holds unclaimed past ``grpc.server.max_pending_requests``
  (1,000, randomly up to the hard limit of 3,000) with CANCELLED, a status clients
  do not retry. A Python server claims one call per event-loop turn, so a burst of
  a few thousand calls reached it under load (issue 16: 8,060 CANCELLED in 12 s).
  Both limits are raised here; the data plane's admission caps
  (:mod:`inferd.dataplane.admission`) refuse what the server cannot take, with
  UNAVAILABLE and the reason, as soon as the call is claimed.

Closing the port (:meth:`GrpcPort.close`) never answers CANCELLED either. gRPC
core cancels every call that arrived but was not claimed yet when the server
shuts down, and under load there always are some (issue 16: 52 of 64 client
loops). So the port first *holds* every call it claims (the shutdown gate): a
client waiting for its answer sends nothing more, and once no call arrived for
``QUIET_SECONDS`` (at most ``LONGEST_HOLD_SECONDS``) nothing is left unclaimed.
Then the server shuts down (GOAWAY: clients take new calls elsewhere) and the
held calls, and any open stream, are answered UNAVAILABLE. A recycled frontend worker's port
(``close(grace, serve_held=True)``, :mod:`inferd.serve.recycling`) closes the same way but then
*serves* the calls it held: the server goes on, through the worker that replaced this one. It first
stops listening (:func:`stop_listening`), so that the clients its GOAWAY sends to a new connection
find only the other workers' sockets: a connection the kernel queued on a listener that then closes
is reset, and its client's calls fail UNAVAILABLE.

Behind the gRPC front (``--grpc-front envoy``, :mod:`inferd.serve.grpc_front`) the port is private:
grpc.aio listens on a unix socket only Envoy reaches (TLS is Envoy's), and the port's bridge
(:mod:`inferd.frontends.grpc_bridge`) serves the unary ModelInfer calls Envoy hands over as HTTP/1.1,
through the same guarded handler. Each socket is bound under a name of its own and then renamed onto
its slot's path (:func:`publish`): a process restarted or recycled in the slot takes the path over at
once, and nothing the old one removes when it closes is the new one's.

The port's door (:mod:`inferd.frontends.door`), when it has a bound, counts every call a handler takes and
gives back, and refuses an inference call taken while the server holds more than its bound, counting the calls
still waiting in gRPC core's queue (issue 42).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import grpc
from grpc_health.v1 import health_pb2_grpc

from inferd.clock import Alarm, Clock, MonotonicClock
from inferd.errors import Draining, Unavailable
from inferd.frontends.door import METHODS as DOOR_METHODS
from inferd.frontends.door import Door, DoorPolicy, channelz_counter, channelz_servers
from inferd.frontends.grpc_service import InferenceServicer, add_to_server
from inferd.frontends.grpc_health import Health, enable_reflection
from inferd.frontends.restrictions import GRPC_METHODS, Restrictions
from inferd.frontends.status import grpc_abort
from inferd.frontends.tls import TlsFiles

log = logging.getLogger(__name__)

# gRPC core's unclaimed-call limits, raised past any backlog a server process can hold.
PENDING_LIMIT = 1 << 20
QUIET_SECONDS = 0.05
LONGEST_HOLD_SECONDS = 1.0
CLOSING = "inferd is shutting down and this port is closing; retry the call on another server"
RECYCLING = ("this inferd frontend worker is being replaced (its memory passed --frontend-worker-max-memory-mib); "
             "open the stream again: another worker takes it")


@dataclass(frozen=True)
class GrpcPortOptions:
    address: str = "0.0.0.0"
    port: int = 8001
    max_message_bytes: int = 2**31 - 1
    tls: TlsFiles | None = None
    restrictions: Restrictions = field(default_factory=lambda: Restrictions(protocol="protocol"))
    channel_args: tuple[tuple[str, Any], ...] = ()  # more grpc server options (SO_REUSEPORT for workers, ...)
    front: "FrontSockets | None" = None  # behind the gRPC front: the two private sockets instead of address:port


@dataclass(frozen=True)
class FrontSockets:
    """A serving process's sockets behind the gRPC front: grpc.aio's, and the bridge's."""

    grpc: str
    bridge: str

    def to_plain(self) -> dict[str, str]:
        return {"grpc": self.grpc, "bridge": self.bridge}

    @classmethod
    def from_plain(cls, doc: dict[str, str] | None) -> "FrontSockets | None":
        return None if not doc else cls(doc["grpc"], doc["bridge"])


def private_name(path: str) -> str:
    """The name a socket for ``path`` is bound under before :func:`publish` renames it."""
    return f"{path}.{os.getpid()}"


def publish(path: str) -> None:
    """Rename this process's socket (bound at :func:`private_name`) onto ``path``, atomically: new
    connections reach it, and a previous process's socket there is unlinked (its connections live on)."""
    os.rename(private_name(path), path)


def server_options(o: GrpcPortOptions) -> list[tuple[str, Any]]:
    """The grpc.aio server options a port is built with (``channel_args`` last: they win)."""
    return [
        ("grpc.max_send_message_length", o.max_message_bytes),
        ("grpc.max_receive_message_length", o.max_message_bytes),
        ("grpc.server.max_pending_requests", PENDING_LIMIT),
        ("grpc.server.max_pending_requests_hard_limit", PENDING_LIMIT),
        *o.channel_args,
    ]


def stop_listening(port: int) -> int:
    """Shut this process's listening sockets on ``port`` (gRPC core's own, found through /proc): the kernel
    gives new connections to the other sockets of the SO_REUSEPORT group, and the connections already
    accepted serve on. gRPC core then logs "Closing acceptor. Failed accept4: Invalid argument" once and
    stops accepting. The sockets shut."""
    sockets: dict[str, int] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets[target[8:-1]] = int(fd)
    shut = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            # local address, state 0A (LISTEN), inode
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A" and fields[9] in sockets:
                with socket.socket(fileno=os.dup(sockets[fields[9]])) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                shut += 1
    return shut


class Gate:
    """The shutdown gate: once closed, calls are held until :meth:`release`, then refused (or served,
    as :meth:`release` says).

    :meth:`quiet` waits, on the injected clock, until no call arrived for a while."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock or MonotonicClock()
        self.closed = False
        self.held = 0  # calls held since the gate closed
        self.serve_held = False  # what release said: serve the held calls, not refuse them
        self._last = 0.0
        self._released: asyncio.Event | None = None

    def close(self) -> None:
        self.closed = True
        self._last = self.clock.now()
        self._released = asyncio.Event()

    async def hold(self) -> bool:
        """Wait until the gate is released (the server is shutting down by then); whether the call is
        then served (True) or refused."""
        self.held += 1
        self._last = self.clock.now()
        assert self._released is not None
        await self._released.wait()
        return self.serve_held

    async def quiet(self, quiet_s: float = QUIET_SECONDS, longest_s: float = LONGEST_HOLD_SECONDS) -> None:
        """Return once no call arrived for ``quiet_s``, or ``longest_s`` after this was called."""
        give_up = self.clock.now() + longest_s
        done = asyncio.get_running_loop().create_future()

        def check() -> None:
            now = self.clock.now()
            when = min(self._last + quiet_s, give_up)
            if now >= when:
                if not done.done():
                    done.set_result(None)
            else:
                alarm.arm(when)

        alarm = Alarm(self.clock, check)
        check()
        try:
            await done
        finally:
            alarm.cancel()

    def release(self, serve: bool = False) -> None:
        """Let the held calls go on: refused, or served (``serve``)."""
        self.serve_held = serve
        if self._released is not None:
            self._released.set()


class _Guarded:
    """A servicer as grpc registers it: each method behind the port's restrictions, gate and door."""

    def __init__(self, servicer: Any, restrictions: Restrictions, gate: Gate, door: Door) -> None:
        self._servicer = servicer
        self._restrictions = restrictions
        self._gate = gate
        self._door = door

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._servicer, name)
        if name not in GRPC_METHODS:  # not an RPC (a helper the registration may use): as it is
            return method
        group = GRPC_METHODS.get(name)
        restricted = group is not None and group in self._restrictions.by_group
        return _guard(method, name, group if restricted else None, self._restrictions, self._gate, self._door)


def _guard(method: Callable[..., Any], name: str, group: str | None, restrictions: Restrictions,
           gate: Gate, door: Door) -> Callable[..., Any]:
    async def refusal(context: grpc.aio.ServicerContext) -> Exception | None:
        if group is not None:
            error = restrictions.refusal(group, _header(context), name, context.peer())
            if error is not None:
                return error
        if gate.closed and not await gate.hold():
            return Draining(CLOSING)
        return None

    if inspect.isasyncgenfunction(method):
        async def streamed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            error = await refusal(context) if group is not None or gate.closed else None
            if error is not None:
                await context.abort(*grpc_abort(error))
            async for message in method(request, context):
                yield message
        return _counted_stream(streamed, door) if door.enabled else streamed

    at_the_door = name in DOOR_METHODS and door.enabled

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if group is not None or gate.closed:
            error = await refusal(context)
            if error is not None:
                await context.abort(*grpc_abort(error))
        if at_the_door:
            turned = door.refusal(request.model_name)
            if turned is not None:
                await context.abort(*grpc_abort(turned))
        return await method(request, context)
    return _counted(unary, door) if door.enabled else unary


# With a door (--grpc-max-held-calls), every call a handler holds is counted; without one, nothing is
# added to a call's path.
def _counted(handler: Callable[..., Any], door: Door) -> Callable[..., Any]:
    async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
        door.enter()
        try:
            return await handler(request, context)
        finally:
            door.leave()
    return counted


def _counted_stream(handler: Callable[..., Any], door: Door) -> Callable[..., Any]:
    async def counted(request: Any, context: grpc.aio.ServicerContext) -> Any:
        door.enter()
        try:
            async for message in handler(request, context):
                yield message
        finally:
            door.leave()
    return counted


def _header(context: grpc.aio.ServicerContext) -> Callable[[str], str | None]:
    def get(key: str) -> str | None:
        for m in context.invocation_metadata() or ():
            if m.key == key:
                return m.value if isinstance(m.value, str) else None
        return None
    return get


class GrpcPort:
    """One gRPC port: ``servicer`` (the inference service), ``health`` and reflection."""

    def __init__(self, servicer: InferenceServicer, health: Health, options: GrpcPortOptions,
                 clock: Clock | None = None, door: Door | None = None) -> None:
        self.servicer = servicer
        self.health = health
        self.options = options
        self.gate = Gate(clock)
        self.door = door or Door(DoorPolicy(bound=0))  # none given: no door
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self.bridge: Any = None  # a grpc_bridge.BridgePort behind the gRPC front

    async def start(self) -> int:
        """Bind and serve; the bound port. SystemExit when the address cannot be listened on."""
        o = self.options
        known = channelz_servers() if self.door.enabled else set()
        server = grpc.aio.server(options=server_options(o))
        add_to_server(_Guarded(self.servicer, o.restrictions, self.gate, self.door), server)  # type: ignore[arg-type]
        health_pb2_grpc.add_HealthServicer_to_server(
            _Guarded(self.health.servicer, o.restrictions, self.gate, self.door), server)  # type: ignore[arg-type]
        enable_reflection(server)
        address = f"{o.address}:{o.port}" if o.front is None else f"unix:{private_name(o.front.grpc)}"
        try:
            if o.tls is not None and o.front is None:
                self.port = server.add_secure_port(address, o.tls.grpc_credentials())
            else:
                self.port = server.add_insecure_port(address)
        except RuntimeError as exc:  # grpc raises for a port it cannot bind
            raise SystemExit(f"cannot listen for gRPC on {address}: {exc}") from None
        if self.port == 0:
            raise SystemExit(f"cannot listen for gRPC on {address}")
        await server.start()
        self._server = server
        if o.front is not None:
            from inferd.frontends.grpc_bridge import BridgePort  # here: only a port behind the front has one

            guarded = _Guarded(self.servicer, o.restrictions, self.gate, self.door)
            self.bridge = BridgePort(private_name(o.front.bridge), guarded.ModelInfer, o.max_message_bytes,
                                     guarded.ModelStreamInfer)
            await self.bridge.start()
            publish(o.front.grpc)
            publish(o.front.bridge)
        if self.door.enabled:
            self.door.counter = channelz_counter(known)  # gRPC core's count of the calls it holds here
        await self.health.start()
        return self.port

    def end_streams(self) -> None:
        """End the open streams now (health Watch streams with their last status, inference streams
        UNAVAILABLE): behind the gRPC front this runs before Envoy stops, so that they end as they do
        when the port closes, not cut with their connection."""
        self.health.close()
        self.servicer.close_streams(Draining(CLOSING))

    async def close(self, grace: float, serve_held: bool = False) -> None:
        """Close the port, answering every call UNAVAILABLE or as served, never CANCELLED (see the module);
        ``serve_held``: the calls held while it closes are served (a recycled worker's port).
        Calls being served when this is called get up to ``grace`` seconds to finish."""
        server = self._server
        if server is None:
            return
        self._server = None
        loop = asyncio.get_running_loop()
        started = loop.time()
        if serve_held and self.options.front is None:  # new connections go to the other workers before any
            # client is told GOAWAY (behind the front, the replacement took the socket paths over already)
            log.info("gRPC port %d: stopped listening (%d sockets) before it closes", self.port,
                     stop_listening(self.port))
        self.gate.close()
        await self.gate.quiet(longest_s=min(LONGEST_HOLD_SECONDS, max(grace, 0.0)))
        self.health.close()
        left = max(grace - (loop.time() - started), 0.0)
        stopping = loop.create_task(server.stop(left))
        bridge_closing = loop.create_task(self.bridge.close(left)) if self.bridge is not None else None
        await asyncio.sleep(0)  # the shutdown has begun (GOAWAY sent, nothing more is claimed)
        self.gate.release(serve=serve_held)
        self.servicer.close_streams(Unavailable(RECYCLING) if serve_held else Draining(CLOSING))
        await stopping
        if bridge_closing is not None:
            await bridge_closing
        if self.gate.held:
            log.info("gRPC port closed; %d calls that arrived while it closed were %s", self.gate.held,
                     "served" if serve_held else "answered UNAVAILABLE")

"""A frontend worker process: ``python -m inferd.serve.worker_process --index K --channel-fd FD --parent PID``.

Spawned by the core (:mod:`inferd.serve.supervisor`), never by hand. It
serves the reserved gRPC and HTTP ports (SO_REUSEPORT, :func:`listen`) with the
one-process frontends over :class:`~inferd.handoff.worker.proxy.RemoteDataPlane`
and hands every request to the core. It ends when the core says DRAIN or the
worker gets SIGTERM/SIGINT (stop taking requests, answer the accepted ones,
close the ports, exit 0), when the core says RECYCLE (its replacement serves
already: close the ports, serve every call taken, exit 0), or at once when the
core goes away.

A worker never outlives its core, by two ties, either enough on its own: the
control channel (the core's end closes when the core exits or is killed, and
the worker then stops at once), and ``PR_SET_PDEATHSIG`` (the kernel sends the
worker SIGKILL when the core dies, even if the worker is stuck and never reads
its channel: :func:`die_with_parent`). Either way its listening sockets close
with it, so the ports are free again.

What every worker runs is imported here, at the top: the core types, the
façade, the wire protocol and the frontends, nothing of the models
(tests/handoff/test_worker_imports.py walks what importing this module loads).
What only some servers or requests use (the /v1 frontend, the generate
extension, statistics, memory tracing, ...) is imported where it is first used,
so a worker starts with at most 40 of inferd's modules (issue 45; that test
counts them).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from typing import Any

from inferd import event_loop
from inferd.handoff.worker.core_link import CoreLink
from inferd.ipc.processes import die_with_parent
from inferd.handoff.worker.proxy import RemoteDataPlane
from inferd.frontends.asgi import AsgiServer, bind
from inferd.frontends.door import Door, DoorPolicy
from inferd.frontends.grpc_port import FrontSockets, GrpcPort, GrpcPortOptions
from inferd.frontends.grpc_service import InferenceServicer
from inferd.frontends.grpc_health import Health
from inferd.frontends.http_limits import chunk_limited_protocol
from inferd.frontends.http_service import DEFAULT_MAX_INPUT_BYTES, HttpFrontend
from inferd.frontends.openai import OpenAIOptions
from inferd.frontends.parameters import header_forward
from inferd.frontends.restrictions import Restrictions
from inferd.frontends.tls import TlsFiles

log = logging.getLogger("inferd.frontend")
# memtrace.ENV, read here so that a worker imports memtrace (tracemalloc and the snapshot tool) only when a
# leak hunt asks for it.
TRACEMALLOC_ENV = "INFERD_TRACEMALLOC"


def listen(host: str, port: int, what: str, backlog: int = 2048) -> socket.socket:
    """This worker's own listening socket on the core's reserved ``host:port`` (SO_REUSEPORT)."""
    sock = bind(host, port, what, reuse_port=True)
    try:
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    return sock


class ForwardedBatches:
    """OpenAI's Batch API (:class:`~inferd.facade.OpenAIBatchAPI`) as a worker's /v1 routes see it: every
    call answered by the core, which owns the batches and runs them. Sent with the link's own call, as
    :class:`RemoteDataPlane`'s control calls are (the hand-off's ``CALLS`` name them)."""

    def __init__(self, link: CoreLink) -> None:
        self.link = link

    async def openai_file_create(self, filename: str, purpose: str, upload: str) -> dict[str, Any]:
        return await self.link.call("openai_file_create", filename, purpose, upload)

    async def openai_file(self, file_id: str) -> dict[str, Any]:
        return await self.link.call("openai_file", file_id)

    async def openai_files(self, purpose: str | None) -> dict[str, Any]:
        return await self.link.call("openai_files", purpose)

    async def openai_file_delete(self, file_id: str) -> dict[str, Any]:
        return await self.link.call("openai_file_delete", file_id)

    async def openai_file_content(self, file_id: str) -> str:
        return await self.link.call("openai_file_content", file_id)

    async def openai_batch_create(self, input_file_id: str, endpoint: str,
                                  metadata: dict[str, str] | None) -> dict[str, Any]:
        return await self.link.call("openai_batch_create", input_file_id, endpoint, metadata)

    async def openai_batch(self, batch_id: str) -> dict[str, Any]:
        return await self.link.call("openai_batch", batch_id)

    async def openai_batches(self, after: str | None, limit: int) -> dict[str, Any]:
        return await self.link.call("openai_batches", after, limit)

    async def openai_batch_cancel(self, batch_id: str) -> dict[str, Any]:
        return await self.link.call("openai_batch_cancel", batch_id)


def _door(link: CoreLink, config: dict[str, Any] | None) -> Door:
    """The port's door: the server's bound on held calls, this worker's slot of the core's tally (the
    other workers' counts), refusals counted by the core as its own."""
    if not config or not config.get("bound"):
        return Door(DoorPolicy(bound=0))
    from inferd.ipc.tally import Tally  # here, past the return: the bound on held calls is off by default

    tally = Tally(*config["tally"]) if config.get("tally") else None
    return Door(DoorPolicy(config["bound"]), on_refused=link.count_refused, tally=tally, slot=config.get("slot", 0))


async def _start_grpc(dataplane: RemoteDataPlane, index: int, config: dict[str, Any]) -> GrpcPort:
    """The gRPC port, built as the one-process server builds its own (limits, TLS, restricted groups,
    the closing gate, the door), on the reserved port with SO_REUSEPORT, or behind the gRPC front on
    this worker's slot's sockets."""
    forward = header_forward(config.get("header_forward_pattern"), "--grpc-header-forward-pattern")
    port = GrpcPort(InferenceServicer(dataplane, forward=forward), Health(dataplane), GrpcPortOptions(  # readiness asked of the core
        address=config["address"], port=config["port"], max_message_bytes=config["max_message_bytes"],
        tls=TlsFiles.from_plain(config.get("tls")),
        restrictions=Restrictions.from_plain(config.get("restrictions"), protocol="protocol"),
        channel_args=(("grpc.so_reuseport", 1), *[tuple(kv) for kv in config["options"]]),
        front=FrontSockets.from_plain(config.get("front"))),
        door=_door(dataplane.link, config.get("door")))
    if await port.start() != config["port"] and not config.get("front"):
        raise SystemExit(f"frontend {index}: cannot listen for gRPC on {config['address']}:{config['port']}")
    return port


async def serve(index: int, channel_fd: int) -> int:
    loop = asyncio.get_running_loop()
    link = await CoreLink.connect(socket.socket(fileno=channel_fd))
    dataplane = RemoteDataPlane(link)  # one for both frontends
    config = link.config
    logging.getLogger().setLevel(config.get("log_level", logging.INFO))

    def drain_on_signal() -> None:
        if not link.drain_requested.done():
            link.drain_requested.set_result(-1.0)  # -1: with the server's own grace

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, drain_on_signal)
    grpc_port = health = http = None
    if config["grpc"]:
        grpc_port = await _start_grpc(dataplane, index, config["grpc"])
        health = grpc_port.health
    if config["http"]:
        h = config["http"]
        frontend = HttpFrontend(dataplane, Restrictions.from_plain(h.get("restrictions")),  # type: ignore[arg-type]
                                h.get("max_input_bytes", DEFAULT_MAX_INPUT_BYTES),
                                OpenAIOptions.from_plain(h.get("openai")), ForwardedBatches(link),
                                header_forward(h.get("header_forward_pattern"), "--http-header-forward-pattern"))
        http = AsgiServer(frontend.app(), h["address"], h["port"], "HTTP",
                          sock=listen(h["address"], h["port"], "HTTP"), tls=TlsFiles.from_plain(h.get("tls")),
                          protocol=chunk_limited_protocol())
        await http.start()
    from inferd.observability import collector  # as main() imports heap: not at the module's import

    collector.freeze()  # start-up's objects out of full collections
    link.hello()
    await asyncio.wait([link.drain_requested, link.recycle_requested], return_when=asyncio.FIRST_COMPLETED)
    if not link.drain_requested.done():
        return await _retire(index, link, grpc_port, http, link.recycle_requested.result())
    grace: float | None = link.drain_requested.result()
    if grace is None:  # the core went away: nothing can be answered any more
        log.warning("frontend %d: the core went away; exiting", index)
        grace = 0.0
    elif grace < 0:  # our own SIGTERM: drain with the core's grace
        grace = config.get("grace", 30.0)
    link.draining = True
    if health is not None:
        health.drain()  # NOT_SERVING at once; Watch streams are told
    deadline = loop.time() + grace
    try:
        await asyncio.wait_for(link.in_flight.idle(), timeout=grace)
    except asyncio.TimeoutError:
        log.warning("frontend %d: %d requests still unanswered after %.1f s", index, len(link.in_flight), grace)
    if grpc_port is not None and grpc_port.options.front is not None:
        grpc_port.end_streams()  # before the core stops Envoy, once it has every worker's answers
    if link.core_draining:
        # The whole server drains: keep answering (NOT_SERVING, new requests UNAVAILABLE) until
        # the core says every worker's requests are answered, as one process keeps its port open.
        try:
            await asyncio.wait_for(asyncio.shield(link.close_requested), timeout=max(deadline - loop.time(), 0.0))
        except asyncio.TimeoutError:
            pass
    # What is left of the grace (at most a second) lets the last answers and control calls finish;
    # past it the ports close and what is still running is cut off. The gRPC port answers what
    # arrives while it closes UNAVAILABLE, never CANCELLED (GrpcPort.close).
    left = min(max(deadline - loop.time(), 0.0), 1.0)
    closing = []
    if grpc_port is not None:
        closing.append(grpc_port.close(left))
    if http is not None:
        closing.append(http.stop(left))
    await asyncio.gather(*closing)
    link.channel.close()
    return 0


async def _retire(index: int, link: CoreLink, grpc_port: GrpcPort | None, http: AsgiServer | None,
                  grace: float) -> int:
    """Recycled (:mod:`inferd.serve.recycling`): the core already runs this worker's replacement. Stop
    taking connections and calls, serve every call taken (the gRPC calls held while the port closes
    too: nothing is refused), then exit. A DRAIN arriving meanwhile changes nothing: this ends sooner."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    closing = []
    if grpc_port is not None:
        closing.append(grpc_port.close(grace, serve_held=True))
    if http is not None:
        closing.append(http.stop(grace))
    await asyncio.gather(*closing)
    try:
        await asyncio.wait_for(link.in_flight.idle(), timeout=max(deadline - loop.time(), 0.0))
    except asyncio.TimeoutError:
        log.warning("frontend %d: recycled with %d requests still unanswered after %.1f s", index,
                    len(link.in_flight), grace)
    log.info("frontend %d: recycled; its calls answered, exiting", index)
    link.channel.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.serve.worker_process", description=__doc__)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--event-loop", choices=event_loop.KINDS, default="asyncio")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    if os.environ.get(TRACEMALLOC_ENV):  # a leak hunt's snapshots
        from inferd.observability import memtrace

        memtrace.install(f"frontend{args.index}")
    from inferd.observability import heap

    heap.limit_arenas()  # before grpc starts its threads (INFERD_MALLOC_ARENA_MAX)
    heap.start()  # freed heap memory back to the system (INFERD_MALLOC_TRIM_INTERVAL)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s frontend {args.index} %(name)s: %(message)s")
    return event_loop.run(serve(args.index, args.channel_fd), args.event_loop)



if __name__ == "__main__":
    sys.exit(main())

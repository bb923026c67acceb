"""A frontend worker process: ``python -m inferd.handoff.worker --index K --channel-fd FD --parent PID``.

Spawned by the core (:mod:`inferd.handoff.supervisor`), never by hand. It serves
the reserved gRPC and HTTP ports (SO_REUSEPORT) and hands every request to the
core. It ends when the core says DRAIN or the worker gets SIGTERM/SIGINT (stop
taking requests, answer the accepted ones, close the ports, exit 0), or at once
when the core goes away (channel EOF, or PR_SET_PDEATHSIG's SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from typing import Any

log = logging.getLogger("inferd.frontend")


async def _start_grpc(link: Any, config: dict[str, Any]) -> Any:
    """The gRPC port, built as the one-process server builds its own (limits, TLS, restricted groups,
    the closing gate), on the reserved port with SO_REUSEPORT."""
    from inferd.handoff.grpc_worker import WorkerServicer
    from inferd.server.grpc_server import GrpcPort, GrpcPortOptions
    from inferd.server.health import Health
    from inferd.server.restrictions import Restrictions
    from inferd.server.tls import TlsFiles

    servicer = WorkerServicer(link)
    port = GrpcPort(servicer, Health(servicer.dp), GrpcPortOptions(  # readiness asked of the core
        address=config["address"], port=config["port"], max_message_bytes=config["max_message_bytes"],
        tls=TlsFiles.from_plain(config.get("tls")),
        restrictions=Restrictions.from_plain(config.get("restrictions"), protocol="protocol"),
        channel_args=(("grpc.so_reuseport", 1), *[tuple(kv) for kv in config["options"]])))
    if await port.start() != config["port"]:
        raise SystemExit(f"frontend {link.index}: cannot listen for gRPC on {config['address']}:{config['port']}")
    return port


async def serve(index: int, channel_fd: int) -> int:
    from inferd.handoff import ports
    from inferd.handoff.link import WorkerLink
    from inferd.handoff.proxy import RemoteDataPlane
    from inferd.server.asgi import AsgiServer
    from inferd.server.http_service import DEFAULT_MAX_INPUT_BYTES, HttpFrontend
    from inferd.server.openai import OpenAIOptions
    from inferd.server.restrictions import Restrictions
    from inferd.server.tls import TlsFiles

    loop = asyncio.get_running_loop()
    link = await WorkerLink.connect(socket.socket(fileno=channel_fd))
    config = link.config
    logging.getLogger().setLevel(config.get("log_level", logging.INFO))

    def drain_on_signal() -> None:
        if not link.drain_requested.done():
            link.drain_requested.set_result(-1.0)  # -1: with the server's own grace

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, drain_on_signal)
    grpc_port = health = http = None
    if config["grpc"]:
        grpc_port = await _start_grpc(link, config["grpc"])
        health = grpc_port.health
    if config["http"]:
        h = config["http"]
        app = HttpFrontend(RemoteDataPlane(link), Restrictions.from_plain(h.get("restrictions")),  # type: ignore[arg-type]
                           h.get("max_input_bytes", DEFAULT_MAX_INPUT_BYTES),
                           OpenAIOptions.from_plain(h.get("openai"))).app()
        http = AsgiServer(app, h["address"], h["port"], "HTTP", sock=ports.listen(h["address"], h["port"], "HTTP"),
                          tls=TlsFiles.from_plain(h.get("tls")))
        await http.start()
    link.hello()
    grace: float | None = await link.drain_requested
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
        await asyncio.wait_for(link.pending.idle(), timeout=grace)
    except asyncio.TimeoutError:
        log.warning("frontend %d: %d requests still unanswered after %.1f s", index, len(link.pending), grace)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferd.handoff.worker", description=__doc__)
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    from inferd.handoff.lifeline import die_with_parent

    die_with_parent(args.parent)
    from inferd.observability import memtrace

    memtrace.install(f"frontend{args.index}")  # INFERD_TRACEMALLOC: a leak hunt's snapshots
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s %(levelname)s frontend {args.index} %(name)s: %(message)s")
    return asyncio.run(serve(args.index, args.channel_fd))


if __name__ == "__main__":
    sys.exit(main())

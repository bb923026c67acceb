"""Listening ports shared by every frontend worker (SO_REUSEPORT).

The core *reserves* each port: it binds a socket with SO_REUSEPORT and never
listens on it, so the kernel sends it no connection, but the port stays the
server's for its whole life (a restarted frontend binds it again; no other
program can take it in between), and a requested port 0 is resolved once, by
the core, to the port every worker then binds. Each worker binds and listens on
its own socket with SO_REUSEPORT, and the kernel spreads new connections over
the workers' sockets (by a hash of the connection's addresses: a client's
connection stays with one worker).
"""

from __future__ import annotations

import socket

from inferd.server.asgi import bind


def reserve(host: str, port: int, what: str) -> socket.socket:
    """A bound, never listening, SO_REUSEPORT socket on ``host:port`` (0: a free port);
    ``getsockname()[1]`` is the port the workers bind. Exits with a clear message if taken."""
    return bind(host, port, what, reuse_port=True)


def listen(host: str, port: int, what: str, backlog: int = 2048) -> socket.socket:
    """A worker's own listening socket on the reserved ``host:port``, non-blocking."""
    sock = bind(host, port, what, reuse_port=True)
    try:
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    return sock

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

import contextlib
import socket


def _socket(host: str, port: int, what: str) -> tuple[socket.socket, tuple]:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    return sock, address


def reserve(host: str, port: int, what: str) -> socket.socket:
    """A bound, never listening, SO_REUSEPORT socket on ``host:port`` (0: a free port);
    ``getsockname()[1]`` is the port the workers bind. Exits with a clear message if taken."""
    sock, address = _socket(host, port, what)
    try:
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    return sock


def listen(host: str, port: int, what: str, backlog: int = 2048) -> socket.socket:
    """A worker's own listening socket on the reserved ``host:port``, non-blocking."""
    sock, address = _socket(host, port, what)
    try:
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    return sock

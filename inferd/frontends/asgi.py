"""An ASGI app on its own port, served by uvicorn inside the server's event loop.

The HTTP/REST frontend and the metrics endpoint each run one of these next to
the grpc.aio server: ``uvicorn.Server.serve()`` as a task on the same loop, no
thread. The socket is bound here (so port 0 reports the port it got, and a
port in use fails start-up with a clear message), and uvicorn is kept away
from the process's signals: SIGINT/SIGTERM belong to :class:`InferenceServer`,
which stops every frontend in its own order.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, Iterator

import uvicorn

from inferd.errors import Unavailable
from inferd.frontends.http_limits import send_error
from inferd.frontends.tls import TlsFiles

log = logging.getLogger(__name__)


# How often a stopping server looks whether its connections and tasks have ended. uvicorn looks every
# 0.1 s and sleeps 0.1 s more before its first look, so each stop of an idle port took 0.1-0.3 s (a
# server's stop waits for three ports in turn); a look costs a few microseconds.
STOP_POLL_SECONDS = 0.005

# What a request still running when the graceful timeout ends is answered (503), where uvicorn would log
# the cancel as an application error with its traceback and answer 500.
CUT_AT_STOP = "inferd is shutting down: this request was still running when the shutdown's grace ended"


class _Server(uvicorn.Server):
    """uvicorn's server, kept off the process's signals, and stopping as soon as its work is done:
    :meth:`stop_now` wakes its main loop at once (uvicorn's ticks every 0.1 s), and :meth:`shutdown`
    waits for connections and tasks in :data:`STOP_POLL_SECONDS` steps, with uvicorn's rules
    otherwise (close the listeners, ask every connection to close after its response, cancel what
    is left when the graceful timeout ends)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()
        self.cutting = False  # the graceful timeout ended: what is cancelled now is answered 503

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the application owns SIGINT/SIGTERM
        yield

    def stop_now(self) -> None:
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # on_tick refreshes the Date header every 10th tick
            counter = (counter + 1) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 0.1)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()  # an idle one closes now, a busy one after its response
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                while (state.connections or state.tasks) and not self.force_exit:
                    await asyncio.sleep(STOP_POLL_SECONDS)
        except TimeoutError:
            log.error("%d HTTP request(s) still running past the graceful shutdown timeout: answered 503",
                      len(state.tasks))
            self.cutting = True
            for task in state.tasks:
                task.cancel(msg="cancelled: the graceful shutdown timeout ended")
        for server in self.servers:
            await server.wait_closed()


class _AnswerCuts:
    """ASGI: a request cancelled by the stop (:attr:`_Server.cutting`; a request whose body had not all
    arrived yet, or whose model had not answered) is answered 503 with :data:`CUT_AT_STOP`, a retryable
    refusal, instead of the 500 and traceback uvicorn gives any cancelled application. One whose answer
    had started already is left to uvicorn, which closes its connection."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.server: _Server | None = None

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, send)
        except asyncio.CancelledError:
            if self.server is None or not self.server.cutting or scope["type"] != "http":
                raise
            with contextlib.suppress(Exception):  # the answer had started: uvicorn closes the connection
                await send_error(scope, send, Unavailable(CUT_AT_STOP), 503)


def bind(host: str, port: int, what: str, reuse_port: bool = False) -> socket.socket:
    """A listening-ready TCP socket on ``host:port`` (0: a free port); ``reuse_port``: with
    SO_REUSEPORT, so that other sockets of this user can bind the same port (frontend workers)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise SystemExit(f"cannot listen for {what} on {host}:{port}: {exc}") from None
    return sock


class AsgiServer:
    """``app`` served on ``host:port``; :meth:`start` returns the bound port."""

    def __init__(self, app: Any, host: str, port: int, what: str, sock: socket.socket | None = None,
                 tls: TlsFiles | None = None, protocol: Any = None) -> None:
        """``sock``: a socket bound already (a frontend worker's SO_REUSEPORT one); else bound here.
        ``tls``: serve HTTPS (mutual TLS when it says so) with these files. ``protocol``: uvicorn's HTTP
        protocol class (the inference port's counts a body's chunks: http_limits); None: uvicorn's own."""
        self.app = app
        self.protocol = protocol
        self._sock = sock
        self.tls = tls
        self.host = host
        self.requested_port = port
        self.what = what
        self.port = 0
        self._server: _Server | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> int:
        sock = self._sock or bind(self.host, self.requested_port, self.what)
        self.port = sock.getsockname()[1]
        app = _AnswerCuts(self.app)
        config = uvicorn.Config(
            app,
            lifespan="off",
            log_config=None,  # leave the process's logging alone
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            ws="none",
            http=self.protocol or "auto",
            timeout_keep_alive=75,  # clients (perf_analyzer, tritonclient) keep connections open
            **(self.tls.uvicorn_options() if self.tls is not None else {}),
        )
        server = _Server(config)
        app.server = server
        self._server = server
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]), name=f"inferd {self.what}")
        while not server.started:
            if self._task.done():
                sock.close()
                exc = self._task.exception()
                raise SystemExit(f"cannot serve {self.what} on {self.host}:{self.port}: {exc!r}")
            await asyncio.sleep(0.005)
        return self.port

    async def stop(self, grace: float) -> None:
        """Close the port and idle connections; let requests being answered finish (up to ``grace`` s)."""
        server, task = self._server, self._task
        if server is None or task is None:
            return
        server.config.timeout_graceful_shutdown = max(grace, 0.0)
        server.stop_now()
        try:  # the server waits up to the grace itself
            await asyncio.wait_for(asyncio.shield(task), timeout=grace + 2.0)
        except asyncio.TimeoutError:
            server.force_exit = True
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        except Exception:
            log.exception("%s server failed while stopping", self.what)
        self._server = self._task = None

"""The host zygote: one process that has imported what every model host runs, and forks each new host.

A model host started from scratch imports numpy, the backends, pb_utils and the event loop: about half a
second of CPU, per host, on every load, restart and on-demand load. The zygote pays that once: it is
started on the core's first host (``python -m inferd.serve.host_process --zygote``), imports everything a
host needs, and then only forks, one child per host the core asks for (a few milliseconds each). The
child goes on as a host started from scratch would (:func:`inferd.serve.host_process.serve`).

The core asks over a SOCK_SEQPACKET socket pair, one request a message with the host's four fds attached
(SCM_RIGHTS): ``{"id": n, "label": ..., "sizes": [to_host, from_host], "loop": kind}``; the zygote
answers ``{"id": n, "pid": p}`` (or ``"error"``) and, when it has reaped a host, ``{"exited": p, "status":
s}`` (as Popen's returncode: negative for a signal). The core watches each host through a pidfd as well,
so a host's death is seen even if the zygote's word never comes (the zygote itself gone: its hosts die
with it, ``PR_SET_PDEATHSIG``). The zygote dies with the core by the same tie; a zygote that dies is
started again at the next host.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import signal
import socket
import subprocess
import sys
from typing import Callable

from inferd import event_loop

log = logging.getLogger(__name__)

HOST_MODULE = "inferd.serve.host_process"


class ZygoteFailed(OSError):
    """The zygote could not be started, or could not fork a host."""


class Zygote:
    """The core's side of the zygote (on the core's loop)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._ids = itertools.count(1)
        self._spawning: dict[int, asyncio.Future[int]] = {}
        self._exits: dict[int, Callable[[int], None]] = {}
        self._statuses: dict[int, int] = {}  # reaped before anyone asked

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None and self.process.poll() is None else None

    def _start(self) -> None:
        core, zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        zygote.set_inheritable(True)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", HOST_MODULE, "--zygote", "--control-fd", str(zygote.fileno()),
                 "--parent", str(os.getpid()), "--event-loop", event_loop.running()], pass_fds=(zygote.fileno(),))
        except OSError as exc:
            core.close()
            raise ZygoteFailed(f"model hosts: cannot start the host zygote: {exc}") from None
        finally:
            zygote.close()
        core.setblocking(False)
        self._sock = core
        asyncio.get_running_loop().add_reader(core.fileno(), self._readable)
        log.info("model hosts: zygote started (pid %d)", self.process.pid)

    async def fork(self, label: str, fds: list[int], sizes: list[int]) -> int:
        """A new host with ``fds`` (batch link, control link, to-host and from-host arenas); its pid."""
        if self._sock is None or self.pid is None:
            self._stop_reading()
            self._start()
        rid = next(self._ids)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._spawning[rid] = future
        request = json.dumps({"id": rid, "label": label, "sizes": sizes, "loop": event_loop.running()}).encode()
        try:
            socket.send_fds(self._sock, [request], fds)  # type: ignore[arg-type]
            return await asyncio.wait_for(future, timeout=60)
        except (OSError, asyncio.TimeoutError) as exc:
            self._spawning.pop(rid, None)
            raise ZygoteFailed(f"model host '{label}': the zygote did not fork it: {exc or 'no answer in 60 s'}") \
                from None

    def on_exit(self, pid: int, callback: Callable[[int], None]) -> None:
        """``callback(status)`` when the zygote has reaped ``pid`` (at once if it already has)."""
        if pid in self._statuses:
            callback(self._statuses.pop(pid))
        else:
            self._exits[pid] = callback

    def forget(self, pid: int) -> None:
        self._exits.pop(pid, None)
        self._statuses.pop(pid, None)

    def _readable(self) -> None:
        sock = self._sock
        assert sock is not None
        while True:
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the zygote has gone: the hosts it forked go with it
                self._stop_reading()
                for future in self._spawning.values():
                    if not future.done():
                        future.set_exception(ZygoteFailed("model hosts: the zygote exited"))
                self._spawning.clear()
                return
            msg = json.loads(data)
            if "exited" in msg:
                callback = self._exits.pop(msg["exited"], None)
                if callback is not None:
                    callback(msg["status"])
                elif len(self._statuses) < 4096:  # a host whose watcher has not registered yet
                    self._statuses[msg["exited"]] = msg["status"]
                continue
            future = self._spawning.pop(msg["id"], None)
            if future is not None and not future.done():
                if "pid" in msg:
                    future.set_result(msg["pid"])
                else:
                    future.set_exception(ZygoteFailed(msg.get("error", "the zygote refused")))

    def _stop_reading(self) -> None:
        if self._sock is not None:
            try:
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            except (RuntimeError, ValueError):
                pass
            self._sock.close()
            self._sock = None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)

"""One model host process as the core holds it: spawned, tied to the core, watched, stopped.

A host is ``python -m inferd.serve.host_process``, started from the core's event-loop thread
(so the kernel's parent-death signal, which follows the spawning thread, fires only when the
core itself ends) with exactly three inherited fds: its end of a socket pair (the channel) and
the two arenas (:mod:`inferd.hosts.protocol`). It stays in the core's process group, so a
signal to the group reaches it, and it dies with the core (its channel's EOF, and
``PR_SET_PDEATHSIG``). The core learns of its death from its pidfd (no thread, no polling).
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from typing import Any, Callable

from inferd import event_loop
from inferd.hosts import protocol as p
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.channel import Channel, socket_pair
from inferd.ipc.processes import describe_status, kill, watch_exit

log = logging.getLogger(__name__)

HOST_MODULE = "inferd.serve.host_process"
ARENA_BYTES = 1 << 32  # virtual: sparse memfds cost only the pages in flight


def host_command(channel_fd: int, to_host: Arena, from_host: Arena, label: str) -> list[str]:
    """The host's command line; called on the core's loop, whose kind the host runs too."""
    return [sys.executable, "-m", HOST_MODULE, "--channel-fd", str(channel_fd),
            "--to-host", f"{to_host.fd}:{to_host.size}", "--from-host", f"{from_host.fd}:{from_host.size}",
            "--parent", str(os.getpid()), "--event-loop", event_loop.running(), "--label", label]


class HostProcess:
    """A running host: its process, channel and arenas. Built by :meth:`spawn` on the core's loop;
    ``gone`` resolves with the exit status once the process has exited and been reaped."""

    def __init__(self, process: subprocess.Popen, to_host: ArenaWriter, from_host: Arena, label: str) -> None:
        self.process = process
        self.to_host = to_host  # the core allocates and writes, the host reads
        self.from_host = from_host  # the host allocates and writes, the core reads
        self.label = label
        self.channel: Channel | None = None
        self.gone: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.closed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def spawn(cls, label: str, on_message: Callable[[list[Any]], None],
                    arena_bytes: int = ARENA_BYTES) -> "HostProcess":
        """Start a host; on the core's loop. ``on_message`` gets every message it sends, in order."""
        core_end, host_end = socket_pair()
        to_host = Arena.create(arena_bytes, f"inferd-host-{label}-in")
        from_host = Arena.create(arena_bytes, f"inferd-host-{label}-out")
        try:
            process = subprocess.Popen(host_command(host_end.fileno(), to_host, from_host, label),
                                       pass_fds=(host_end.fileno(), to_host.fd, from_host.fd))
        except BaseException:
            for thing in (core_end, to_host, from_host):
                thing.close()
            raise
        finally:
            host_end.close()  # the host's copy is its own: our closing it lets us see its EOF
        host = cls(process, ArenaWriter(to_host), from_host, label)

        def exited(status: int) -> None:
            if not host.gone.done():
                host.gone.set_result(status)

        watch_exit(process, exited)
        host.channel = await Channel.open(core_end, on_message, f"host {label}")
        return host

    def send(self, msg: Any, at_once: bool = False) -> None:
        if self.channel is not None and not self.closed:
            self.channel.send(p.encode(msg), at_once)

    def kill(self) -> None:
        kill(self.process)

    def describe_exit(self) -> str:
        status = self.gone.result() if self.gone.done() else None
        return "is still running" if status is None else f"exited with status {describe_status(status)}"

    async def stop(self, grace: float) -> None:
        """Ask the host to finalize its model and exit; kill it past ``grace`` seconds. Returns once
        it is reaped."""
        if not self.gone.done():
            self.send(p.Finalize(), at_once=True)
            try:
                await asyncio.wait_for(asyncio.shield(self.gone), timeout=grace)
            except asyncio.TimeoutError:
                log.warning("model host %s (pid %d) did not finalize within %.3g s; killing it",
                            self.label, self.pid, grace)
        self.kill()
        await self.gone
        self.close()

    def close(self) -> None:
        """Release the channel and arenas (the process has exited)."""
        if self.closed:
            return
        self.closed = True
        if self.channel is not None:
            self.channel.close()
        self.to_host.arena.close()
        self.from_host.close()

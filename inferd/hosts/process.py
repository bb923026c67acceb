"""One model host process as the core holds it: spawned, tied to the core, watched, stopped.

A host is ``python -m inferd.serve.host_process``, started from the core's event-loop thread
(so the kernel's parent-death signal, which follows the spawning thread, fires only when the
core itself ends) with exactly four inherited fds: its ends of two socket pairs (the links, below)
and the two arenas (:mod:`inferd.hosts.protocol`). It stays in the core's process group, so a
signal to the group reaches it, and it dies with the core (its links' EOF, and
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
from inferd.ipc.channel import socket_pair
from inferd.ipc.frames import FrameChannel
from inferd.ipc.processes import describe_status, kill, watch_exit

log = logging.getLogger(__name__)

BATCH_LINK = (p.Load, p.Execute, p.Finalize)  # read by the host's model thread, in order


def _nothing(data: bytes) -> None:  # the control link carries nothing back
    log.warning("a model host sent a message on its control link; ignored")

HOST_MODULE = "inferd.serve.host_process"
ARENA_BYTES = 1 << 32  # virtual: sparse memfds cost only the pages in flight


def host_command(batch_fd: int, control_fd: int, to_host: Arena, from_host: Arena, label: str) -> list[str]:
    """The host's command line; called on the core's loop, whose kind the host runs too."""
    return [sys.executable, "-m", HOST_MODULE, "--batch-fd", str(batch_fd), "--control-fd", str(control_fd),
            "--to-host", f"{to_host.fd}:{to_host.size}", "--from-host", f"{from_host.fd}:{from_host.size}",
            "--parent", str(os.getpid()), "--event-loop", event_loop.running(), "--label", label]


class HostProcess:
    """A running host: its process, links and arenas. Built by :meth:`spawn` on the core's loop;
    ``gone`` resolves with the exit status once the process has exited and been reaped.

    Two socket pairs: the *batch* link carries what the host's model thread runs, in order (Load,
    Execute, Finalize: the model thread reads them itself, blocking, so a batch wakes no other
    thread there) and everything the host sends; the *control* link carries the rest (cancels,
    credits, answers to the model's calls, freed blocks, questions), which the host's event loop
    reads while the model runs."""

    def __init__(self, process: subprocess.Popen, to_host: ArenaWriter, from_host: Arena, label: str) -> None:
        self.process = process
        self.to_host = to_host  # the core allocates and writes, the host reads
        self.from_host = from_host  # the host allocates and writes, the core reads
        self.label = label
        self.batches: FrameChannel | None = None
        self.control: FrameChannel | None = None
        self.gone: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.closed = False

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    async def spawn(cls, label: str, on_message: Callable[[bytes], None],
                    arena_bytes: int = ARENA_BYTES) -> "HostProcess":
        """Start a host; on the core's loop. ``on_message`` gets every message it sends, in order."""
        batch_core, batch_host = socket_pair()
        control_core, control_host = socket_pair()
        control_host.set_inheritable(True)
        to_host = Arena.create(arena_bytes, f"inferd-host-{label}-in")
        from_host = Arena.create(arena_bytes, f"inferd-host-{label}-out")
        fds = (batch_host.fileno(), control_host.fileno(), to_host.fd, from_host.fd)
        try:
            process = subprocess.Popen(host_command(fds[0], fds[1], to_host, from_host, label), pass_fds=fds)
        except BaseException:
            for thing in (batch_core, control_core, to_host, from_host):
                thing.close()
            raise
        finally:
            batch_host.close()  # the host's copies are its own: our closing them lets us see its EOF
            control_host.close()
        host = cls(process, ArenaWriter(to_host), from_host, label)

        def exited(status: int) -> None:
            if not host.gone.done():
                host.gone.set_result(status)

        watch_exit(process, exited)
        host.batches = await FrameChannel.open(batch_core, on_message, f"host {label}")
        host.control = await FrameChannel.open(control_core, _nothing, f"host {label} (control)")
        return host

    def send(self, msg: Any) -> None:
        """Write ``msg`` to the host now (on the loop), on the link its kind goes by."""
        if self.closed:
            return
        link = self.batches if isinstance(msg, BATCH_LINK) else self.control
        if link is not None:
            link.send(p.encode(msg))

    def kill(self) -> None:
        kill(self.process)

    def describe_exit(self) -> str:
        status = self.gone.result() if self.gone.done() else None
        return "is still running" if status is None else f"exited with status {describe_status(status)}"

    async def stop(self, grace: float) -> None:
        """Ask the host to finalize its model and exit; kill it past ``grace`` seconds. Returns once
        it is reaped."""
        if not self.gone.done():
            self.send(p.Finalize())
            try:
                await asyncio.wait_for(asyncio.shield(self.gone), timeout=grace)
            except asyncio.TimeoutError:
                log.warning("model host %s (pid %d) did not finalize within %.3g s; killing it",
                            self.label, self.pid, grace)
        self.kill()
        await self.gone
        self.close()

    def close(self) -> None:
        """Release the links and arenas (the process has exited)."""
        if self.closed:
            return
        self.closed = True
        for link in (self.batches, self.control):
            if link is not None:
                link.close()
        self.to_host.arena.close()
        self.from_host.close()

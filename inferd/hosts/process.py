"""One model host process as the core holds it: spawned, tied to the core, watched, stopped.

A host is forked by the host zygote (:mod:`inferd.hosts.zygote`, itself the core's child) with exactly
four fds of its own: its ends of two socket pairs (the links, below) and the two arenas
(:mod:`inferd.hosts.protocol`). It stays in the core's process group, so a signal to the group reaches
it, and it dies with the zygote, which dies with the core (its links' EOF, and ``PR_SET_PDEATHSIG``
both times). The core learns of its death from the zygote, which reaps it, and from its pidfd (no
thread, no polling), through which it is also killed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from inferd.hosts import protocol as p
from inferd.hosts.zygote import Zygote
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.channel import socket_pair
from inferd.ipc.frames import FrameChannel
from inferd.ipc.processes import describe_status

log = logging.getLogger(__name__)

BATCH_LINK = (p.Load, p.Execute, p.Finalize)  # read by the host's model thread, in order


def _nothing(data: bytes) -> None:  # the control link carries nothing back
    log.warning("a model host sent a message on its control link; ignored")

ARENA_BYTES = 1 << 32  # virtual: sparse memfds cost only the pages in flight
STATUS_WAIT = 2.0  # after a host's pidfd says it exited, how long the zygote's status is waited for


# The thread a host's arenas are mapped and unmapped on. Its own, not the loop's default executor: the
# model builds there wait for their hosts' spawns, so a spawn that queued behind them would never run.
_maps: ThreadPoolExecutor | None = None


def _mapper() -> ThreadPoolExecutor:
    global _maps
    if _maps is None:
        _maps = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inferd-host-arenas")
    return _maps


def _arenas(label: str, size: int) -> tuple[Arena, Arena]:
    """A host's two arenas: the core's to it, and its own to the core."""
    to_host = Arena.create(size, f"inferd-host-{label}-in")
    try:
        return to_host, Arena.create(size, f"inferd-host-{label}-out")
    except BaseException:
        to_host.close()
        raise


def _close(arenas: tuple[Arena, ...]) -> None:
    for arena in arenas:
        arena.close()


def _close_made(made: asyncio.Future) -> None:
    if not made.cancelled() and made.exception() is None:
        _close(made.result())


class HostProcess:
    """A running host: its process, links and arenas. Built by :meth:`spawn` on the core's loop;
    ``gone`` resolves with the exit status (None: unknown) once the process has exited.

    Two socket pairs: the *batch* link carries what the host's model thread runs, in order (Load,
    Execute, Finalize: the model thread reads them itself, blocking, so a batch wakes no other
    thread there) and everything the host sends; the *control* link carries the rest (cancels,
    credits, answers to the model's calls, freed blocks, questions), which the host's event loop
    reads while the model runs."""

    def __init__(self, pid: int, to_host: ArenaWriter, from_host: Arena, label: str) -> None:
        self.pid = pid
        self.to_host = to_host  # the core allocates and writes, the host reads
        self.from_host = from_host  # the host allocates and writes, the core reads
        self.label = label
        self.batches: FrameChannel | None = None
        self.control: FrameChannel | None = None
        self._loop = asyncio.get_running_loop()
        self.gone: asyncio.Future[int | None] = self._loop.create_future()
        self.closed = False
        self._pidfd: int | None = None

    @classmethod
    async def spawn(cls, label: str, on_message: Callable[[bytes], None], zygote: Zygote,
                    arena_bytes: int = ARENA_BYTES) -> "HostProcess":
        """Start a host (forked by ``zygote``); on the core's loop. ``on_message`` gets every message it
        sends, in order."""
        batch_core, batch_host = socket_pair()
        control_core, control_host = socket_pair()
        # Mapped off the loop: mmap waits for the process's mmap lock, which a build's allocations on a
        # loader thread hold for milliseconds (the loop's stalls over 4 ms on a budgeted server, issue 43).
        made = asyncio.get_running_loop().run_in_executor(_mapper(), _arenas, label, arena_bytes)
        try:
            to_host, from_host = await asyncio.shield(made)
        except BaseException:  # cancelled (or failed): arenas mapped meanwhile are unmapped when they come
            made.add_done_callback(_close_made)
            for link in (batch_core, batch_host, control_core, control_host):
                link.close()
            raise
        try:
            pid = await zygote.fork(label, [batch_host.fileno(), control_host.fileno(), to_host.fd, from_host.fd],
                                    [to_host.size, from_host.size])
        except BaseException:
            for thing in (batch_core, control_core, to_host, from_host):
                thing.close()
            raise
        finally:
            batch_host.close()  # the host's copies are its own: our closing them lets us see its EOF
            control_host.close()
        host = cls(pid, ArenaWriter(to_host), from_host, label)
        host._watch(zygote)
        host.batches = await FrameChannel.open(batch_core, on_message, f"host {label}")
        host.control = await FrameChannel.open(control_core, _nothing, f"host {label} (control)")
        return host

    def _watch(self, zygote: Zygote) -> None:
        """``gone`` once the host has exited: the zygote's status, or, should that not come (the zygote
        gone too), the pidfd's word and an unknown status STATUS_WAIT later."""
        loop = self._loop

        def exited(status: int | None) -> None:
            if not self.gone.done():
                self.gone.set_result(status)
                zygote.forget(self.pid)

        zygote.on_exit(self.pid, exited)
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except ProcessLookupError:  # gone already
            loop.call_later(STATUS_WAIT, exited, None)
            return

        def readable() -> None:
            loop.remove_reader(self._pidfd)  # type: ignore[arg-type]
            loop.call_later(STATUS_WAIT, exited, None)

        loop.add_reader(self._pidfd, readable)

    def send(self, msg: Any) -> None:
        """Write ``msg`` to the host now (on the loop), on the link its kind goes by."""
        if self.closed:
            return
        link = self.batches if isinstance(msg, BATCH_LINK) else self.control
        if link is not None:
            link.send(p.encode(msg))

    def send_batches(self, msgs: list[Any]) -> None:
        """Write several batch-link messages (Execute) in one write: the host's model thread reads them
        with one wake-up."""
        if not self.closed and self.batches is not None:
            self.batches.send_many([p.encode(msg) for msg in msgs])

    def kill(self) -> None:
        """SIGKILL, through the pidfd (never a pid the system may have given another process since)."""
        if self._pidfd is not None and not self.gone.done():
            try:
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def describe_exit(self) -> str:
        if not self.gone.done():
            return "is still running"
        status = self.gone.result()
        return "exited (status unknown)" if status is None else f"exited with status {describe_status(status)}"

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
        arenas = (self.to_host.arena, self.from_host)
        try:  # unmapped off the loop, as they were mapped (spawn)
            self._loop.run_in_executor(_mapper(), _close, arenas)
        except RuntimeError:  # the loop or its executor has closed: here, then
            _close(arenas)
        if self._pidfd is not None:
            # The zygote may report the exit before the pidfd's own word is read: the loop must forget
            # the fd before it is closed, or a socket given the same number later cannot be added to
            # the loop (uvloop: EEXIST).
            if not self._loop.is_closed():
                self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None

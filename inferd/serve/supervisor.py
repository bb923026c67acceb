"""The core's side of its frontend workers: reserve their ports, spawn, watch, restart, drain.

Who spawns whom: the core process (``inferd serve``) loads the models and
spawns N frontend workers, ``python -m inferd.serve.worker_process --index K``, each
with its own control socket and pair of arenas (fds inherited at spawn, nothing
else: ``close_fds``). The workers stay in the core's process group, so a signal
to the group reaches every process and nothing outlives a ``kill -- -PGID``.

A worker first receives ``Config`` (what to serve, where its arenas are), binds
the reserved ports and answers ``Hello``; :meth:`Supervisor.start` returns once
every worker has. A worker that dies (its pidfd becomes readable, or its channel
closes) is *lost*: the core's endpoint for it fails what it had in flight, and
the slot is started again (when: :class:`RestartState`, a pure decision) with
fresh arenas, so nothing a dead worker wrote can be read again.
:meth:`Supervisor.stop` sends ``DRAIN`` to every worker: each stops taking
requests and answers those it accepted, its ports still answering (not ready,
UNAVAILABLE); once the core's requests are all answered it sends ``CLOSE``, and
each closes its ports and exits; one still running after the grace is killed. Every worker is reaped before stop returns.

A worker whose memory grew past a bound is *recycled* (:mod:`inferd.serve.recycling`): its
replacement is started in its slot first, then the old one is sent ``RECYCLE``; it closes its ports,
serves every call it took and exits, and is reaped as a worker that finished, not one that died.

The ports: the core *reserves* each one (:func:`reserve`): it binds a socket
with SO_REUSEPORT and never listens on it, so the kernel sends it no
connection, but the port stays the server's for its whole life (a restarted
worker binds it again; no other program can take it in between), and a
requested port 0 is resolved once, by the core, to the port every worker then
binds. Each worker binds and listens on its own socket with SO_REUSEPORT
(:func:`inferd.serve.worker_process.listen`), and the kernel spreads new
connections over the workers' sockets by a hash of the connection's addresses,
so a client's connection stays with one worker.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Iterable, Protocol

from inferd import event_loop
from inferd.clock import Clock, MonotonicClock
from inferd.handoff.messages import Close, Config, Drain, Hello, Recycle, ToCore
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.channel import Channel, socket_pair
from inferd.ipc.processes import RestartPolicy, RestartState, describe_status, kill, watch_exit
from inferd.frontends.asgi import bind
from inferd.serve.recycling import FLAG as RECYCLE_FLAG
from inferd.serve.recycling import RecyclePolicy, anon_rss, recycle_due

log = logging.getLogger(__name__)

WORKER_MODULE = "inferd.serve.worker_process"
ARENA_BYTES = 1 << 32  # virtual: sparse memfds cost only the pages in flight
KILL_WAIT = 5.0  # a worker whose channel closed but that still runs is killed after this
EXIT_MARGIN = 1.0  # past the drain's grace, how long stop waits for a worker to exit before killing it


def reserve(host: str, port: int, what: str) -> socket.socket:
    """A bound, never listening, SO_REUSEPORT socket on ``host:port`` (0: a free port);
    ``getsockname()[1]`` is the port the workers bind. Exits with a clear message if taken."""
    return bind(host, port, what, reuse_port=True)


class Endpoint(Protocol):
    """What the core runs for one live worker, the request hand-off proper
    (:class:`~inferd.handoff.core.endpoint.DataPlaneEndpoint`)."""

    def on_message(self, msg: ToCore) -> None:
        """Every message from the worker but Hello, in order, on the loop."""

    def lost(self) -> None:
        """The worker is gone: answer nothing more to it, drop its requests."""


def due_for_recycle(workers: Iterable[WorkerProcess], policy: RecyclePolicy, now: float,
                    heap: Callable[[int], int | None] = anon_rss) -> tuple[WorkerProcess, int] | None:
    """The oldest serving worker whose heap is past the bound (:func:`recycle_due`), with its heap;
    None if none is. Oldest, not the first slot: a recycle under load takes seconds, so a slot's
    replacement may be old enough again by the next check, and taking slots in order would recycle
    it again and again while the other slots' workers never were."""
    for worker in sorted(workers, key=lambda w: w.started):
        if worker.closed or not worker.hello.done():
            continue
        rss = heap(worker.pid)
        if recycle_due(policy, rss, now - worker.started):
            assert rss is not None
            return worker, rss
    return None


class WorkerFailed(Exception):
    """A worker could not be started (it exited, or never said Hello in time)."""


def worker_command(index: int, channel_fd: int) -> list[str]:
    """The worker's command line; called on the core's loop, whose kind the worker runs too."""
    return [sys.executable, "-m", WORKER_MODULE, "--index", str(index), "--channel-fd", str(channel_fd),
            "--parent", str(os.getpid()), "--event-loop", event_loop.running()]


@dataclass(eq=False)
class WorkerProcess:
    """One running worker as the core sees it: its process, channel and arenas."""

    index: int
    process: subprocess.Popen
    channel: Channel
    inputs: Arena  # the worker writes, the core reads
    outputs: ArenaWriter  # the core writes, the worker reads
    started: float
    hello: asyncio.Future = field(repr=False)
    gone: asyncio.Future = field(repr=False)  # resolves with the exit status
    endpoint: Endpoint | None = None
    closed: bool = False
    # Resolves once the worker is being recycled: with its replacement, or None when none could start.
    replaced: asyncio.Future | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def close(self) -> None:
        self.channel.close()
        self.inputs.close()
        self.outputs.arena.close()


class Supervisor:
    """``count`` frontend workers, kept running until :meth:`stop`."""

    def __init__(self, count: int, config: Callable[[int], dict], endpoint: Callable[[WorkerProcess], Endpoint],
                 *, command: Callable[[int, int], list[str]] = worker_command, clock: Clock | None = None,
                 policy: RestartPolicy | None = None, arena_bytes: int = ARENA_BYTES,
                 start_timeout: float = 120.0, shared_fds: tuple[int, ...] = (),
                 recycle: RecyclePolicy | None = None, grace: float = 30.0) -> None:
        if count < 1:
            raise ValueError(f"frontend workers: need at least 1, got {count}")
        self.count = count
        self.config = config
        self.make_endpoint = endpoint
        self.command = command
        self.clock = clock or MonotonicClock()
        self.policy = policy or RestartPolicy()
        self.arena_bytes = arena_bytes
        self.start_timeout = start_timeout
        self.shared_fds = shared_fds  # inherited by every worker (the gRPC door's tally)
        self.recycle = recycle or RecyclePolicy(0)
        self.grace = grace  # how long a recycled worker may take to answer what it took
        self.workers: dict[int, WorkerProcess] = {}
        self.retiring: set[WorkerProcess] = set()  # recycled, still answering what they took
        self.restarts = 0
        self.recycles = 0
        self._stopping = False
        self._slots: list[asyncio.Task] = []
        self._waits: set[asyncio.Future] = set()

    def pids(self) -> list[int]:
        return [worker.pid for worker in (*self.workers.values(), *self.retiring)]

    # -- start ------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn every worker and return once all serve; raises WorkerFailed (none left running)."""
        results = await asyncio.gather(*(self._spawn(i) for i in range(self.count)), return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self.stop(0.0)
            raise failures[0]
        loop = asyncio.get_running_loop()
        for worker in results:
            assert isinstance(worker, WorkerProcess)
            self._slots.append(loop.create_task(self._watch(worker), name=f"frontend {worker.index}"))
        if self.recycle.enabled:
            self._slots.append(loop.create_task(self._sample(), name="frontend memory"))

    async def _spawn(self, index: int) -> WorkerProcess:
        loop = asyncio.get_running_loop()
        core_end, worker_end = socket_pair()
        inputs = Arena.create(self.arena_bytes, f"inferd-frontend-{index}-inputs")
        outputs = Arena.create(self.arena_bytes, f"inferd-frontend-{index}-outputs")
        try:
            process = subprocess.Popen(self.command(index, worker_end.fileno()),
                                       pass_fds=(worker_end.fileno(), inputs.fd, outputs.fd, *self.shared_fds))
        except BaseException:
            for thing in (core_end, inputs, outputs):
                thing.close()
            raise
        finally:
            worker_end.close()  # the worker's copy is its own: our closing it lets us see its EOF
        hello: asyncio.Future = loop.create_future()
        gone: asyncio.Future = loop.create_future()
        box: list[WorkerProcess] = []

        def on_message(msg: ToCore) -> None:
            if type(msg) is Hello:
                if not hello.done():
                    hello.set_result(msg)
            elif box[0].endpoint is not None:
                box[0].endpoint.on_message(msg)

        channel = await Channel.open(core_end, on_message, f"frontend {index}", receives=ToCore)
        worker = WorkerProcess(index, process, channel, inputs, ArenaWriter(outputs), self.clock.now(), hello, gone,
                               replaced=loop.create_future())
        box.append(worker)
        self.workers[index] = worker
        self._watch_exit(worker)
        worker.endpoint = self.make_endpoint(worker)
        config = dict(self.config(index), inputs=[inputs.fd, inputs.size], outputs=[outputs.fd, outputs.size])
        channel.send(Config(config))
        try:
            done, _ = await asyncio.wait([hello, gone], timeout=self.start_timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if hello not in done:
                why = (f"exited with status {gone.result()}" if gone in done
                       else f"did not start serving within {self.start_timeout:.0f} s")
                raise WorkerFailed(f"frontend worker {index} (pid {process.pid}) {why}")
        except BaseException:
            await self._reap(worker, force=True)
            raise
        log.info("frontend %d serving (pid %d)", index, process.pid)
        return worker

    def _watch_exit(self, worker: WorkerProcess) -> None:
        """Resolve ``worker.gone`` when the process exits; the channel closing without an exit gets
        the process killed after a grace."""

        def exited(status: int) -> None:
            if not worker.gone.done():
                worker.gone.set_result(status)

        watch_exit(worker.process, exited)

        def channel_closed(_: asyncio.Future) -> None:
            if not worker.gone.done():
                self.clock.call_at(self.clock.now() + KILL_WAIT, lambda: kill(worker.process))

        worker.channel.closed.add_done_callback(channel_closed)  # type: ignore[union-attr]

    # -- watch and restart ------------------------------------------------------------

    async def _watch(self, worker: WorkerProcess) -> None:
        """Keep slot ``worker.index`` served: follow it to its replacement when it is recycled, start
        it again when it dies."""
        state = RestartState(self.policy)
        while True:
            replaced = worker.replaced
            assert replaced is not None
            await asyncio.wait([worker.gone, replaced], return_when=asyncio.FIRST_COMPLETED)
            if worker in self.retiring and not replaced.done():
                await replaced  # it died while its replacement starts: that decides
            if replaced.done():
                if replaced.result() is not None:
                    worker = replaced.result()  # the recycling reaps the old one
                    continue
                if not worker.gone.done():
                    continue  # its replacement could not start: it serves on
            status = await worker.gone
            died = self.clock.now()
            self._lost(worker)
            if self._stopping:
                return
            log.warning("frontend %d (pid %d) exited with status %s; its in-flight requests failed",
                        worker.index, worker.pid, describe_status(status))
            while not self._stopping:
                await self._sleep_until(state.next_start(worker.started, died))
                if self._stopping:
                    return
                try:
                    worker = await self._spawn(worker.index)
                    self.restarts += 1
                    break
                except (WorkerFailed, OSError) as exc:
                    log.error("restarting frontend %d failed: %s", worker.index, exc)
                    died = self.clock.now()

    # -- recycle ----------------------------------------------------------------------

    async def _sample(self) -> None:
        """Every ``recycle.check_s``, recycle the worker :func:`due_for_recycle` names (one at a time:
        the others keep serving while it is replaced)."""
        policy = self.recycle
        while not self._stopping:
            await self._sleep_until(self.clock.now() + policy.check_s)
            if self._stopping or self.retiring:
                continue
            due = due_for_recycle(self.workers.values(), policy, self.clock.now())
            if due is not None:
                await self._recycle(*due)

    def _not_recycled(self, old: WorkerProcess) -> None:
        """``old`` serves on in its slot after all: its watcher hears so (None), and it may be recycled later."""
        assert old.replaced is not None
        self.retiring.discard(old)
        old.replaced.set_result(None)
        old.replaced = asyncio.get_running_loop().create_future()

    async def _recycle(self, old: WorkerProcess, rss: int) -> None:
        """Start ``old``'s replacement in its slot, then tell ``old`` to finish what it took and exit;
        return once it is reaped (killed if it takes past the grace)."""
        assert old.replaced is not None
        self.retiring.add(old)
        bound = self.recycle.max_rss_bytes >> 20
        try:
            new = await self._spawn(old.index)
        except BaseException as exc:
            if not old.closed:
                self.workers[old.index] = old  # it keeps its slot
            self._not_recycled(old)
            if not isinstance(exc, (WorkerFailed, OSError)):
                raise
            log.error("frontend %d (pid %d): %d MiB of heap, past %s %d, but its replacement could not start "
                      "(%s); it keeps serving", old.index, old.pid, rss >> 20, RECYCLE_FLAG, bound, exc)
            return
        if self._stopping:  # the server stops: the replacement is not needed (stop drains the old one)
            self._not_recycled(old)
            await self._reap(new, force=True)
            return
        old.replaced.set_result(new)
        self.recycles += 1
        log.info("frontend %d (pid %d): %d MiB of heap, past %s %d: recycled; pid %d serves in its place, "
                 "pid %d answers what it took and exits", old.index, old.pid, rss >> 20, RECYCLE_FLAG, bound,
                 new.pid, old.pid)
        try:
            old.channel.send(Recycle(self.grace))
            await self._until_gone([old], self.clock.now() + self.grace + EXIT_MARGIN)
            if not old.gone.done():
                log.warning("frontend %d (pid %d): recycled, still running after %.0f s; killed", old.index,
                            old.pid, self.grace + EXIT_MARGIN)
            await self._reap(old, force=True)
        finally:
            self.retiring.discard(old)

    def _lost(self, worker: WorkerProcess) -> None:
        if worker.closed:
            return
        worker.closed = True
        if self.workers.get(worker.index) is worker:
            del self.workers[worker.index]
        if worker.endpoint is not None:
            try:
                worker.endpoint.lost()
            except Exception:
                log.exception("frontend %d: failing its requests failed", worker.index)
        worker.close()

    async def _sleep_until(self, when: float) -> None:
        if when <= self.clock.now():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waits.add(fut)
        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = self.clock.call_at(when, wake)
        try:
            await fut
        finally:
            handle.cancel()
            self._waits.discard(fut)

    # -- stop -------------------------------------------------------------------------

    async def stop(self, grace: float, drained: Awaitable[None] | None = None) -> None:
        """Drain every worker (each answers what it accepted); once ``drained`` (the core's own
        requests are all answered) tell them to CLOSE their ports and exit; kill what is left after
        ``grace`` seconds; return once every worker is reaped."""
        self._stopping = True
        for fut in self._waits:
            if not fut.done():
                fut.set_result(None)
        workers = [*self.workers.values(), *self.retiring]  # a recycled one finishes as it was told
        for worker in workers:
            worker.channel.send(Drain(grace))
        if drained is not None and workers:
            try:
                await asyncio.wait_for(drained, timeout=max(grace - min(grace / 4, 1.0), 0.0))
            except asyncio.TimeoutError:
                pass  # the workers' own grace ends it
        for worker in workers:
            worker.channel.send(Close())
        await self._until_gone(workers, self.clock.now() + grace + EXIT_MARGIN)
        for worker in workers:
            await self._reap(worker, force=True)
        if self._slots:
            await asyncio.gather(*self._slots, return_exceptions=True)
        self._slots.clear()

    async def _until_gone(self, workers: list[WorkerProcess], when: float) -> None:
        """Return once every one of ``workers`` has exited, or at ``when`` on the clock (stop's
        deadline: whatever is left is then killed)."""
        pending: set[asyncio.Future] = {w.gone for w in workers if not w.gone.done()}
        if not pending:
            return
        deadline = asyncio.get_running_loop().create_future()
        handle = self.clock.call_at(when, lambda: deadline.done() or deadline.set_result(None))
        try:
            while pending and not deadline.done():
                _, pending = await asyncio.wait(pending | {deadline}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(deadline)
        finally:
            handle.cancel()

    async def _reap(self, worker: WorkerProcess, force: bool) -> None:
        if not worker.gone.done() and force:
            kill(worker.process)
        await worker.gone
        self._lost(worker)

"""inferd.serve.supervisor with stand-in workers (fake_worker.py): spawn on a shared port, restart
after a kill, clean failure at start, drain and kill at stop, workers that die with their core, and a
worker past its memory bound recycled (its replacement first)."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from inferd.ipc.processes import RestartPolicy, RestartState
from inferd.clock import FakeClock
from inferd.serve.recycling import RecyclePolicy, anon_rss, recycle_due
from inferd.serve.supervisor import EXIT_MARGIN, Supervisor, WorkerFailed, WorkerProcess, due_for_recycle, reserve

FAKE = str(Path(__file__).with_name("fake_worker.py"))
ARENA = 1 << 20


def fake_command(index: int, fd: int) -> list[str]:
    return [sys.executable, FAKE, "--index", str(index), "--channel-fd", str(fd), "--parent", str(os.getpid())]


class Endpoints:
    """The endpoint factory: records each link it was made for and each link lost."""

    def __init__(self) -> None:
        self.made: list[WorkerProcess] = []
        self.lost: list[WorkerProcess] = []
        self.changed = asyncio.Event()

    def __call__(self, link: WorkerProcess) -> "Endpoints._One":
        self.made.append(link)
        self.changed.set()
        return Endpoints._One(self, link)

    class _One:
        def __init__(self, owner: "Endpoints", link: WorkerProcess) -> None:
            self.owner, self.link = owner, link

        def on_message(self, msg: list) -> None:
            pass

        def lost(self) -> None:
            self.owner.lost.append(self.link)

    async def until_made(self, n: int) -> None:
        async def wait() -> None:
            while len(self.made) < n:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), 60)


async def answering_pid(port: int) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    line = await asyncio.wait_for(reader.readline(), 10)
    writer.close()
    return int(line)


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def port():  # type: ignore[no-untyped-def]
    sock = reserve("127.0.0.1", 0, "test")
    yield sock.getsockname()[1]
    sock.close()


def supervisor(port: int, endpoints: Endpoints, count: int = 2, behaviour: dict[int, str] | None = None,
               **kw) -> Supervisor:  # type: ignore[no-untyped-def]
    behaviour = behaviour or {}
    return Supervisor(count, lambda i: {"port": port, "behaviour": behaviour.get(i, "")}, endpoints,
                      command=fake_command, arena_bytes=ARENA, **kw)


async def test_workers_share_the_reserved_port_and_stop_releases_it(port: int) -> None:
    endpoints = Endpoints()
    sup = supervisor(port, endpoints)
    await sup.start()
    pids = set(sup.pids())
    assert len(pids) == 2
    # The kernel spreads connections over both workers' sockets (40 connections: both are all but sure).
    seen = {await answering_pid(port) for _ in range(40)}
    assert seen == pids
    await sup.stop(5.0)
    assert sup.workers == {} and all(gone(p) for p in pids)
    assert [link.process.returncode for link in endpoints.made] == [0, 0]
    with pytest.raises(ConnectionRefusedError):
        await answering_pid(port)


async def test_a_killed_worker_is_lost_and_restarted_while_the_other_serves_on(port: int) -> None:
    endpoints = Endpoints()
    sup = supervisor(port, endpoints)
    await sup.start()
    victim, other = sup.workers[0], sup.workers[1]
    os.kill(victim.pid, signal.SIGKILL)
    await endpoints.until_made(3)
    await asyncio.wait_for(endpoints.made[2].hello, 60)
    assert endpoints.lost == [victim] and victim.process.returncode == -signal.SIGKILL
    assert sup.workers[0] is endpoints.made[2] and sup.workers[0].pid != victim.pid
    assert sup.workers[1] is other and not gone(other.pid)
    assert sup.restarts == 1
    await sup.stop(5.0)
    assert gone(victim.pid) and gone(other.pid) and gone(endpoints.made[2].pid)


async def test_a_worker_exiting_before_it_serves_fails_start_and_leaves_nothing_running(port: int) -> None:
    endpoints = Endpoints()
    sup = supervisor(port, endpoints, behaviour={1: "exit"})
    with pytest.raises(WorkerFailed, match="frontend worker 1 .* exited with status 3"):
        await sup.start()
    assert sup.workers == {} and all(gone(link.pid) for link in endpoints.made)


async def test_a_worker_that_never_serves_fails_start_after_the_timeout(port: int) -> None:
    endpoints = Endpoints()
    sup = supervisor(port, endpoints, count=1, behaviour={0: "silent"}, start_timeout=3.0)
    with pytest.raises(WorkerFailed, match="did not start serving within 3 s"):
        await sup.start()
    assert all(gone(link.pid) for link in endpoints.made)


async def test_a_worker_ignoring_drain_is_killed_after_the_grace(port: int) -> None:
    """The grace runs on the supervisor's clock: the obedient worker exits on the DRAIN however long it
    takes (a loaded machine), and only then does the test move time past the grace."""
    endpoints = Endpoints()
    clock = FakeClock()
    sup = supervisor(port, endpoints, behaviour={1: "deaf"}, clock=clock)
    await sup.start()
    obedient = sup.workers[0]
    stopping = asyncio.get_running_loop().create_task(sup.stop(0.2))
    assert await asyncio.wait_for(asyncio.shield(obedient.gone), 60) == 0
    assert not stopping.done()  # the deaf worker holds the stop until its grace has passed
    clock.advance(0.2 + EXIT_MARGIN)
    await asyncio.wait_for(stopping, 60)
    codes = {link.index: link.process.returncode for link in endpoints.made}
    assert codes == {0: 0, 1: -signal.SIGKILL}


async def test_a_worker_past_its_memory_bound_is_replaced_first_then_finishes_and_is_not_restarted(
        port: int) -> None:
    """Time on a FakeClock: before its minimum age nothing happens, whatever its memory; then the
    replacement serves the port beside it before it is told RECYCLE, and it exits 0, a recycle, not a
    death (no restart, its slot already served)."""
    endpoints = Endpoints()
    clock = FakeClock()
    policy = RecyclePolicy(max_rss_bytes=1 << 20, check_s=1.0, min_age_s=6.0)  # any process is past 1 MiB
    sup = supervisor(port, endpoints, count=1, clock=clock, recycle=policy)
    await sup.start()
    old = sup.workers[0]
    clock.advance(1.0)
    for _ in range(20):  # the sampler's turn: too young to recycle
        await asyncio.sleep(0)
    assert len(endpoints.made) == 1 and sup.recycles == 0
    clock.advance(5.0)  # six seconds old
    await endpoints.until_made(2)
    new = endpoints.made[1]
    await asyncio.wait_for(asyncio.shield(new.hello), 60)
    assert await asyncio.wait_for(asyncio.shield(old.gone), 60) == 0  # told only once the new one served
    assert sup.workers[0] is new and sup.recycles == 1 and sup.restarts == 0
    for _ in range(50):
        if old in endpoints.lost:
            break
        await asyncio.sleep(0.01)
    assert endpoints.lost == [old]
    assert await answering_pid(port) == new.pid
    await sup.stop(5.0)
    assert gone(new.pid) and sup.workers == {} and not sup.retiring


def test_a_worker_is_recycled_past_its_bound_once_old_enough_and_never_with_no_bound() -> None:
    policy = RecyclePolicy(max_rss_bytes=100 << 20, check_s=10.0, min_age_s=60.0)
    assert recycle_due(policy, (100 << 20) + 1, age_s=60.0)
    assert not recycle_due(policy, 100 << 20, age_s=3600.0)  # at the bound, not past it
    assert not recycle_due(policy, 1 << 30, age_s=59.0)  # too young: a bound below a fresh worker's need
    assert not recycle_due(policy, None, age_s=3600.0)  # unknown (it is gone)
    assert not recycle_due(RecyclePolicy(0), 1 << 40, age_s=1e9)
    assert RecyclePolicy.from_flags(512, 2.0) == RecyclePolicy(512 << 20, 2.0, 12.0)
    with pytest.raises(ValueError, match="--frontend-worker-max-memory-mib must be >= 0"):
        RecyclePolicy.from_flags(-1)
    with pytest.raises(ValueError, match="--frontend-worker-memory-check-secs must be > 0"):
        RecyclePolicy.from_flags(512, 0.0)
    rss = anon_rss(os.getpid())
    assert rss is not None and rss > 1 << 20 and anon_rss(2**22 + 7) is None



def test_the_oldest_worker_past_its_bound_is_recycled_first_not_the_first_slot() -> None:
    """Slot 0's replacement is old enough again by the next check (a recycle under load took
    seconds): slot 1's older worker goes first, or it would never be recycled while slot 0's were."""
    from types import SimpleNamespace

    policy = RecyclePolicy(max_rss_bytes=1 << 20, check_s=0.5, min_age_s=3.0)
    ready = SimpleNamespace(done=lambda: True)
    slot0 = SimpleNamespace(pid=11, started=100.0, closed=False, hello=ready)  # a replacement, 4 s old
    slot1 = SimpleNamespace(pid=12, started=10.0, closed=False, hello=ready)  # the first worker, 94 s old
    heaps = {11: 2 << 20, 12: 2 << 20}
    assert due_for_recycle([slot0, slot1], policy, 104.0, heaps.get) == (slot1, 2 << 20)
    heaps[12] = 1 << 20  # at the bound, not past it: the next one
    assert due_for_recycle([slot0, slot1], policy, 104.0, heaps.get) == (slot0, 2 << 20)
    slot0.closed = True  # closed, or not yet said Hello: never
    slot1.hello = SimpleNamespace(done=lambda: False)
    heaps[12] = 2 << 20
    assert due_for_recycle([slot0, slot1], policy, 104.0, heaps.get) is None
    assert due_for_recycle([SimpleNamespace(pid=13, started=102.0, closed=False, hello=ready)], policy, 104.0,
                           lambda pid: 2 << 20) is None  # too young

_CORE = """
import asyncio, json, os, sys
sys.path.insert(0, {tests!r})
from handoff.test_supervisor import Endpoints, supervisor
async def main():
    sup = supervisor({port}, Endpoints(), behaviour={{1: "stuck"}})
    await sup.start()
    print(json.dumps(sup.pids()), flush=True)
    await asyncio.sleep(600)
asyncio.run(main())
"""


def test_workers_die_with_their_core_and_the_port_is_released(port: int) -> None:
    """The core is SIGKILLed: worker 0 sees its channel close, worker 1 (its loop blocked) is
    killed by PR_SET_PDEATHSIG; both are gone and nothing listens on the port any more."""
    tests = str(Path(__file__).resolve().parent.parent)
    core = subprocess.Popen([sys.executable, "-c", _CORE.format(tests=tests, port=port)],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(core.stdout.readline())  # type: ignore[union-attr]
        assert len(pids) == 2
        fds = [os.pidfd_open(p) for p in pids]
        core.kill()
        core.wait(30)
        for fd in fds:
            readable, _, _ = select.select([fd], [], [], 30)  # a pidfd turns readable when its process exits
            assert readable, "a worker outlived its core"
            os.close(fd)
        with pytest.raises(ConnectionRefusedError):
            asyncio.run(answering_pid(port))
    finally:
        if core.poll() is None:
            core.kill()
            core.wait()


# -- the restart decision ------------------------------------------------------------


def test_first_death_restarts_at_once_then_the_delay_doubles_up_to_the_maximum() -> None:
    state = RestartState(RestartPolicy(first_backoff=0.1, max_delay=1.0, stable_after=30.0))
    t = 100.0
    delays = []
    for _ in range(7):
        start = state.next_start(started=t, died=t + 1.0)
        delays.append(round(start - (t + 1.0), 3))
        t = start
    assert delays == [0.0, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_a_worker_that_ran_long_enough_resets_the_backoff() -> None:
    state = RestartState(RestartPolicy(first_backoff=0.1, max_delay=10.0, stable_after=30.0))
    assert state.next_start(0.0, 1.0) == 1.0
    assert state.next_start(1.0, 2.0) == pytest.approx(2.1)
    assert state.next_start(2.1, 40.0) == 40.0  # ran 37.9 s: stable
    assert state.next_start(40.0, 41.0) == pytest.approx(41.1)


def test_bad_restart_policies_are_refused() -> None:
    with pytest.raises(ValueError, match="first_backoff"):
        RestartPolicy(first_backoff=0.0)
    with pytest.raises(ValueError):
        RestartPolicy(first_backoff=2.0, max_delay=1.0)

"""HostProcess without a zygote: its pidfd, its arenas and the loop (inferd/hosts/process.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading

import pytest

from inferd import event_loop
from inferd.hosts.process import HostProcess
from inferd.ipc.arena import Arena, ArenaWriter
from inferd.ipc.frames import FrameChannel


class _Zygote:
    """What HostProcess asks of the zygote: the exit report, here made by the test."""

    def __init__(self) -> None:
        self.callbacks: dict[int, object] = {}

    def on_exit(self, pid: int, callback) -> None:  # type: ignore[no-untyped-def]
        self.callbacks[pid] = callback

    def forget(self, pid: int) -> None:
        self.callbacks.pop(pid, None)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_host_whose_exit_the_zygote_reports_first_leaves_no_reader_behind(loop: str) -> None:
    event_loop.run(_exit_reported_first(), event_loop.resolve(loop))


async def _exit_reported_first() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = HostProcess(child.pid, ArenaWriter(Arena.create(1 << 16, "test-process-in")),
                           Arena.create(1 << 16, "test-process-out"), "test")
        zygote = _Zygote()
        host._watch(zygote)  # type: ignore[arg-type]
        fd = host._pidfd
        assert fd is not None
        child.kill()
        child.wait()  # its pidfd is readable now, and the loop has not looked yet
        # The zygote's report arrives before the loop has read the pidfd (no await in between), and the
        # host is closed at once, as HostedInstance._lost does.
        zygote.callbacks[child.pid](0)  # type: ignore[operator]
        assert host.gone.done()
        host.close()
        assert not asyncio.get_running_loop().remove_reader(fd)  # the loop forgot the fd
        # A socket given the closed pidfd's number must join the loop (uvloop refused it: EEXIST; asyncio's
        # selector: the stale key's modify failed).
        a, b = socket.socketpair()
        if a.fileno() == fd:  # the lowest free number: the pidfd's own
            reused = a
        else:
            os.dup2(a.fileno(), fd)
            a.close()
            reused = socket.socket(fileno=fd)
        channel = await FrameChannel.open(reused, lambda data: None, "reused")
        channel.close()
        b.close()
    finally:
        child.kill()
        child.wait()


class _ForkingZygote(_Zygote):
    """Forks nothing: hands back a child the test started."""

    def __init__(self, pid: int) -> None:
        super().__init__()
        self.pid = pid

    async def fork(self, label: str, fds: list[int], sizes: list[int]) -> int:
        return self.pid


def test_a_hosts_arenas_are_mapped_and_unmapped_off_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """mmap and munmap wait for the process's mmap lock, which an in-process build's allocations hold for
    milliseconds: the loop never makes them for a host (issue 43)."""
    threads: list[tuple[str, str]] = []
    mine: set[int] = set()  # this test's arenas (another test's may be unmapped meanwhile)
    create, close = Arena.create.__func__, Arena.close  # type: ignore[attr-defined]

    def recorded_create(cls, size: int, name: str = "x") -> Arena:  # type: ignore[no-untyped-def]
        threads.append(("map", threading.current_thread().name))
        arena = create(cls, size, name)
        mine.add(id(arena))
        return arena

    def recorded_close(self: Arena) -> None:
        if id(self) in mine:
            threads.append(("unmap", threading.current_thread().name))
        close(self)

    monkeypatch.setattr(Arena, "create", classmethod(recorded_create))
    monkeypatch.setattr(Arena, "close", recorded_close)

    async def main() -> None:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            zygote = _ForkingZygote(child.pid)
            host = await HostProcess.spawn("test", lambda data: None, zygote, 1 << 16)  # type: ignore[arg-type]
            child.kill()
            child.wait()
            zygote.callbacks[child.pid](0)  # type: ignore[operator]
            host.close()
            for _ in range(200):  # the executor's close, bounded
                if len(threads) == 4:
                    break
                await asyncio.sleep(0.01)
        finally:
            child.kill()
            child.wait()

    event_loop.run(main(), event_loop.resolve("uvloop"))
    assert sorted(kind for kind, _ in threads) == ["map", "map", "unmap", "unmap"]
    assert all(name != threading.main_thread().name for _, name in threads), threads


def test_a_spawn_cancelled_while_its_arenas_are_mapped_unmaps_them_and_closes_its_links(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.hosts import process

    mapping, release = threading.Event(), threading.Event()
    made: list[Arena] = []
    closed: list[Arena] = []
    arenas = process._arenas

    def slow_arenas(label: str, size: int):  # type: ignore[no-untyped-def]
        mapping.set()
        release.wait(10)
        made.extend(arenas(label, size))
        return tuple(made)

    monkeypatch.setattr(process, "_arenas", slow_arenas)
    close = process._close

    def recorded_close(pair: tuple[Arena, ...]) -> None:
        closed.extend(pair)
        close(pair)

    monkeypatch.setattr(process, "_close", recorded_close)
    links: list[socket.socket] = []
    pair = process.socket_pair

    def recorded_pair():  # type: ignore[no-untyped-def]
        ends = pair()
        links.extend(ends)
        return ends

    monkeypatch.setattr(process, "socket_pair", recorded_pair)

    async def main() -> None:
        task = asyncio.ensure_future(HostProcess.spawn("test", lambda data: None, _ForkingZygote(0), 1 << 16))
        while not mapping.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        for _ in range(200):  # the executor's mapping, then the close on its arrival, bounded
            if closed:
                break
            await asyncio.sleep(0.01)

    event_loop.run(main(), event_loop.resolve("uvloop"))
    assert len(made) == 2 and closed == made
    assert len(links) == 4 and all(link.fileno() == -1 for link in links)


def test_a_spawn_does_not_wait_for_the_loops_default_executor() -> None:
    """The core's model builds run on the loop's default executor and wait there for their hosts' spawns:
    a spawn that needed a thread of it would wait for ever once the builds took them all."""
    from concurrent.futures import ThreadPoolExecutor

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        busy = threading.Event()
        blocked = loop.run_in_executor(None, busy.wait, 30)  # as a build waiting for its host
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        try:
            zygote = _ForkingZygote(child.pid)
            host = await asyncio.wait_for(HostProcess.spawn("test", lambda data: None, zygote, 1 << 16), 10)
            child.kill()
            child.wait()
            zygote.callbacks[child.pid](0)  # type: ignore[operator]
            host.close()
        finally:
            busy.set()
            await blocked
            child.kill()
            child.wait()

    event_loop.run(main(), event_loop.resolve("uvloop"))

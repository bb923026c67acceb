"""HostProcess without a zygote: its pidfd and the loop (inferd/hosts/process.py)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys

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
        os.dup2(a.fileno(), fd)
        a.close()
        reused = socket.socket(fileno=fd)
        channel = await FrameChannel.open(reused, lambda data: None, "reused")
        channel.close()
        b.close()
    finally:
        child.kill()
        child.wait()

"""The lifetime of a child process, as the core and its children share it: the child's tie to its
parent, the parent's watch on the child, killing, describing an exit, and when to restart.

The core spawns two kinds of child (frontend workers, :mod:`inferd.serve.supervisor`; model hosts,
:mod:`inferd.hosts.instance`) and both follow the same rules: a child never outlives the core
(:func:`die_with_parent`, besides its channel's EOF), the core learns of a child's death from its
pidfd (:func:`watch_exit`: no thread, no polling), and a child that keeps dying soon after it starts
is restarted with a doubling delay (:class:`RestartState`, a pure decision on plain times).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask for SIGKILL when the process that spawned us exits; exit now if it already has.

    The signal follows the *thread* that forked us: the core spawns its children from
    its event-loop thread, which lives as long as the core."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before the prctl took effect
        os._exit(1)


# Run by a fresh interpreter that then becomes the program: ties it to its parent (SIGKILL when the parent
# exits; the setting survives execv) and execs it. A preexec_fn would run in the fork of the server, whose
# other threads (gRPC's) may hold locks the child then waits on or corrupts: Envoy started that way was
# seen to abort (SIGABRT) before its first line.
_TIED = ("import ctypes, os, sys; ctypes.CDLL(None).prctl({pdeathsig}, {sigkill}, 0, 0, 0); "
         "os.getppid() == int(sys.argv[1]) or os._exit(1); os.execv(sys.argv[2], sys.argv[2:])")


def tied_command(parent_pid: int, argv: list[str]) -> list[str]:
    """The command line that runs ``argv`` (a program inferd executes, not a Python child: those call
    :func:`die_with_parent` themselves) tied to ``parent_pid`` as :func:`die_with_parent` ties a child."""
    code = _TIED.format(pdeathsig=PR_SET_PDEATHSIG, sigkill=int(signal.SIGKILL))
    return [sys.executable, "-I", "-S", "-c", code, str(parent_pid), *argv]


def watch_exit(process: subprocess.Popen, on_exit: Callable[[int], None]) -> None:
    """Call ``on_exit(status)`` on the running loop once ``process`` has exited (and is reaped):
    its pidfd turns readable. ``status`` as Popen's returncode (negative: the signal)."""
    loop = asyncio.get_running_loop()
    pidfd = os.pidfd_open(process.pid)

    def exited() -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        on_exit(process.wait())

    loop.add_reader(pidfd, exited)


def kill(process: subprocess.Popen) -> None:
    """SIGKILL, unless it has already been reaped."""
    if process.returncode is None:
        try:
            process.send_signal(signal.SIGKILL)
        except ProcessLookupError:
            pass


def describe_status(status: int) -> str:
    """An exit status as a person reads it: ``-11 (SIGSEGV)``, ``1``."""
    if status < 0:
        try:
            return f"{status} ({signal.Signals(-status).name})"
        except ValueError:
            return str(status)
    return str(status)


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """When to start a child again after it died. The first death is answered at once (its
    peers never notice, and its clients reconnect to a fresh one); a child that keeps dying
    soon after it starts is restarted with a doubling delay, up to ``max_delay``, so a crash
    loop cannot eat the cores the models need; one that ran for ``stable_after`` seconds
    before dying starts the count afresh."""

    first_backoff: float = 0.1  # the delay after a second quick death
    max_delay: float = 10.0
    stable_after: float = 30.0

    def __post_init__(self) -> None:
        if self.first_backoff <= 0 or self.max_delay < self.first_backoff or self.stable_after <= 0:
            raise ValueError(f"restart policy: need 0 < first_backoff <= max_delay and stable_after > 0, got {self}")


class RestartState:
    """One child slot's history of deaths: the restart decision on plain times."""

    __slots__ = ("policy", "quick_deaths")

    def __init__(self, policy: RestartPolicy) -> None:
        self.policy = policy
        self.quick_deaths = 0

    def next_start(self, started: float, died: float) -> float:
        """The time to start the next child, given when the dead one started and died."""
        p = self.policy
        if died - started >= p.stable_after:
            self.quick_deaths = 0
        n = self.quick_deaths
        self.quick_deaths += 1
        if n == 0:
            return died
        return died + min(p.max_delay, p.first_backoff * 2 ** (n - 1))

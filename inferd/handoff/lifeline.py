"""A frontend worker never outlives its core.

Two ties, either enough on its own: the control channel (the core's end closes
when the core exits or is killed, and the worker then stops at once), and
``PR_SET_PDEATHSIG`` (the kernel sends the worker SIGKILL when the core dies,
even if the worker is stuck and never reads its channel). Either way the
worker's listening sockets close with it, so the ports are free again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask for SIGKILL when the process that spawned us exits; exit now if it already has.

    The signal follows the *thread* that forked us: the core spawns workers from
    its event-loop thread, which lives as long as the core."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the core died before the prctl took effect
        os._exit(1)

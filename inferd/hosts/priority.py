"""A model host's load at the lowest CPU priority, so warm requests on the same cores come first.

A model's load (ONNX Runtime building its session, a Python model's ``initialize``) takes tens to
hundreds of milliseconds of CPU; on a server that loads models on demand it competes with the warm
requests of every other model for the same cores. In a host the load is the process's own, so its
model thread (and every thread the load starts: ONNX Runtime's pool) can run it at the lowest priority
and come back to its own once loaded. The lowest is SCHED_IDLE (at nice 19): Linux preempts an
idle-policy thread as soon as a normal one wakes on its CPU, and counts a CPU that runs only such
threads as free when it places a waking thread, where a nice-19 thread, a small share of the CPU but
a normal one, may finish its slice first (bench/RESULTS.md many_models). The load still progresses
whenever a core is free, which on a server loading on demand is most of the time.
A host starts at the lowest priority as well (:func:`start_low`: the zygote forks at it, so a host's
fork, its event loop's start and its first messages give way too) and comes back, every thread of it,
when its load ends. A host that finalizes its model and exits (an unload, an eviction) does so at the
lowest too (:func:`leaving`): its ``finalize`` and the freeing of its memory as it exits; and reads its
own footprint at it (:func:`lowest`: a walk of its page tables, milliseconds of kernel time).

Coming back needs raising the priority again, which Linux allows only with CAP_SYS_NICE or an
RLIMIT_NICE that covers the old nice (leaving SCHED_IDLE counts as raising it): where it does not,
loads keep their normal priority (a thread left low would serve at it). :func:`can_restore` finds out
once, on a throwaway thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Iterator

log = logging.getLogger(__name__)

LOAD_NICE = 19
LOAD_POLICY = os.SCHED_IDLE
_restorable: bool | None = None
_serving_nice: int | None = None  # set by start_low: the nice this process's threads come back to once loaded


def _tids() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


def can_restore() -> bool:
    """Whether a thread of this process may go to the lowest priority and back (asked once)."""
    global _restorable
    if _restorable is None:
        result: list[bool] = []

        def probe() -> None:
            tid = threading.get_native_id()
            try:
                before = os.getpriority(os.PRIO_PROCESS, tid)
                _lower(tid)
                _restore(tid, before)
                result.append(True)
            except OSError:  # PermissionError: no way back
                result.append(False)

        thread = threading.Thread(target=probe, name="inferd-nice-probe")
        thread.start()
        thread.join()
        _restorable = bool(result and result[0])
        if not _restorable:
            log.debug("model loads run at normal priority: this process may not raise a thread's priority back")
    return _restorable


def start_low() -> None:
    """The calling thread at the lowest priority from now on, with the threads it starts and the processes
    it forks, until a load (:func:`loading`) brings every thread of its process back to the nice it had.
    The zygote calls it before it forks any host. Where priority cannot come back, nothing changes."""
    global _serving_nice
    if _serving_nice is not None or not can_restore():
        return
    tid = threading.get_native_id()
    nice = os.getpriority(os.PRIO_PROCESS, tid)
    _lower(tid)
    _serving_nice = nice


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """The body (a model's load, on the calling thread) at the lowest priority, with every thread it starts;
    all of them back to the calling thread's nice, and the normal policy, at the end. In a process that
    started low (:func:`start_low`), every thread of it comes back, to the nice it started from."""
    global _serving_nice
    if not can_restore():
        yield
        return
    tid = threading.get_native_id()
    if _serving_nice is not None:
        nice, before = _serving_nice, set()
    else:
        nice, before = os.getpriority(os.PRIO_PROCESS, tid), _tids() - {tid}
    _lower(tid)
    try:
        yield
    finally:
        for other in (_tids() - before) | {tid}:
            try:
                _restore(other, nice)
            except ProcessLookupError:  # a thread of the load that has ended
                pass
        _serving_nice = None


def leaving() -> None:
    """Every thread of this process at the lowest priority, for good (it is about to exit: lowering needs
    no right, and nothing comes back)."""
    for tid in _tids():
        try:
            _lower(tid)
        except OSError:  # ended meanwhile; or a nice already above it, which lowering cannot cross back
            pass


def lowest() -> None:
    """The calling thread at the lowest priority, for good (a thread that ends after one task: lowering
    needs no right)."""
    try:
        _lower(threading.get_native_id())
    except OSError:  # a nice already above it
        pass


def of(tid: int) -> tuple[int, int]:
    """A thread's (nice, scheduling policy): ``(LOAD_NICE, LOAD_POLICY)`` while low."""
    return os.getpriority(os.PRIO_PROCESS, tid), os.sched_getscheduler(tid)


def _lower(tid: int) -> None:
    os.setpriority(os.PRIO_PROCESS, tid, LOAD_NICE)  # what the thread comes back from, and its share if it is
    os.sched_setscheduler(tid, LOAD_POLICY, os.sched_param(0))  # ever made normal by someone else


def _restore(tid: int, nice: int) -> None:
    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, tid, nice)

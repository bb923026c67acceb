"""A host's load at the lowest priority (SCHED_IDLE at nice 19) and back (inferd/hosts/priority.py), with
the threads it starts."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Iterator

import pytest

from inferd.hosts import priority


LOW = (priority.LOAD_NICE, priority.LOAD_POLICY)


def _nice(tid: int) -> tuple[int, int]:
    return priority.of(tid)


def _in_a_thread(body):  # type: ignore[no-untyped-def]
    """Run ``body`` on a fresh thread (its nice is its own: the test's thread is never changed)."""
    out: list = []
    error: list = []

    def run() -> None:
        try:
            out.append(body())
        except BaseException as exc:  # noqa: BLE001  (re-raised in the test)
            error.append(exc)

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    if error:
        raise error[0]
    return out[0]


@pytest.mark.skipif(not priority.can_restore(),
                    reason="this process may not raise a thread's priority back (no CAP_SYS_NICE, RLIMIT_NICE 0): "
                           "loads keep their priority here, which the next test covers")
def test_a_load_and_the_threads_it_starts_run_at_the_lowest_priority_then_come_back() -> None:
    def body():  # type: ignore[no-untyped-def]
        me = threading.get_native_id()
        before = _nice(me)
        started = threading.Event()
        release = threading.Event()
        child: list[int] = []

        def pool_thread() -> None:  # as ONNX Runtime's pool threads, started by the load
            child.append(threading.get_native_id())
            started.set()
            release.wait(30)

        with priority.loading():
            during = _nice(me)
            t = threading.Thread(target=pool_thread)
            t.start()
            started.wait(30)
            child_during = _nice(child[0])
        after, child_after = _nice(me), _nice(child[0])
        release.set()
        t.join(30)
        return before, during, child_during, after, child_after

    before, *rest = _in_a_thread(body)
    assert before[1] == os.SCHED_OTHER
    assert rest == [LOW, LOW, before, before]


def test_where_priority_cannot_come_back_a_load_keeps_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(priority, "_restorable", False)

    def body():  # type: ignore[no-untyped-def]
        me = threading.get_native_id()
        before = _nice(me)
        with priority.loading():
            return before, _nice(me)

    before, during = _in_a_thread(body)
    assert during == before


@contextlib.contextmanager
def _two_threads() -> Iterator[tuple[int, int]]:
    """(this thread, another started now and waiting), with priority's view of the process narrowed to the
    two: the test's own runner keeps its priority."""
    started, release = threading.Event(), threading.Event()
    other: list[int] = []

    def wait() -> None:
        other.append(threading.get_native_id())
        started.set()
        release.wait(30)

    t = threading.Thread(target=wait)
    t.start()
    started.wait(30)
    me, original = threading.get_native_id(), priority._tids
    priority._tids = lambda: {me, other[0]}  # type: ignore[assignment]
    try:
        yield me, other[0]
    finally:
        priority._tids = original  # type: ignore[assignment]
        release.set()
        t.join(30)


def test_a_host_that_leaves_gives_way_with_every_thread() -> None:
    def body():  # type: ignore[no-untyped-def]
        with _two_threads() as (me, other):
            priority.leaving()
            return _nice(me), _nice(other)

    assert _in_a_thread(body) == (LOW, LOW)


@pytest.mark.skipif(not priority.can_restore(),
                    reason="this process may not raise a thread's priority back (no CAP_SYS_NICE, RLIMIT_NICE 0): "
                           "a host then starts and loads at its normal priority")
def test_a_host_started_low_runs_every_thread_at_the_lowest_priority_until_its_load_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """As the zygote's hosts: forked low (start_low before the fork), every thread of the host, its loop's
    included, low until the load has ended, then all of them at the nice and policy it started from."""
    monkeypatch.setattr(priority, "_serving_nice", None)

    def body():  # type: ignore[no-untyped-def]
        before = _nice(threading.get_native_id())
        priority.start_low()
        with _two_threads() as (me, other):  # the other as the host's loop: started before the load, not by it
            at_start = _nice(me), _nice(other)
            with priority.loading():
                during = _nice(me), _nice(other)
            after = _nice(me), _nice(other)
        return before, *at_start, *during, *after

    before, *rest = _in_a_thread(body)
    assert rest == [LOW, LOW, LOW, LOW, before, before]
    assert priority._serving_nice is None  # a later load (none in a host) would come back to its own nice


def test_lowest_lowers_the_calling_thread_only() -> None:
    mine = _nice(threading.get_native_id())
    assert _in_a_thread(lambda: (priority.lowest(), _nice(threading.get_native_id()))[1]) == LOW
    assert _nice(threading.get_native_id()) == mine

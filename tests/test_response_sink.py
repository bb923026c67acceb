"""ResponseSink: bounded by count and bytes, waits off the loop, refuses on it, cancels,
wakes its reader once per wait. Orders are forced with threading events, never timing."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from inferd.errors import ResourceExhausted
from inferd.streaming import ResponseSink, StreamEvent, StreamLimits, _resolve

WAIT = 30  # bounds a hang only


def _event(i: int, nbytes: int = 4, final: bool = False) -> StreamEvent:
    return StreamEvent(outputs={"OUT": np.full(nbytes // 4, i, dtype=np.int32)}, final=final)


def _value(event: StreamEvent) -> int:
    assert event.outputs is not None
    return int(event.outputs["OUT"][0])


async def _in_thread(fn) -> threading.Thread:  # type: ignore[no-untyped-def]
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


async def _until(predicate) -> None:  # type: ignore[no-untyped-def]
    # A bounded wait for another thread to reach a state (no timing asserted).
    for _ in range(WAIT * 1000):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition not reached")


async def test_a_full_sink_holds_the_sender_until_the_reader_takes_one():
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=3))
    sent: list[int] = []
    blocked = threading.Event()

    def model() -> None:
        for i in range(10):
            if i == 3:
                blocked.set()
            sink.put(_event(i))
            sent.append(i)
        sink.put(StreamEvent(final=True))

    thread = await _in_thread(model)
    await asyncio.to_thread(blocked.wait, WAIT)
    await _until(lambda: len(sink) == 3)
    # The fourth put cannot complete while three wait unread.
    assert sent == [0, 1, 2] and len(sink) == 3
    got = []
    while True:
        event = await asyncio.wait_for(sink.get(), WAIT)
        if event.final:
            break
        got.append(_value(event))
        assert len(sink) <= 3 + 1  # three responses, and the final flag that is never held back
    thread.join(WAIT)
    assert got == list(range(10)) and sent == list(range(10))


async def test_the_byte_limit_holds_too_and_a_lone_large_response_passes():
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=100, max_bytes=1000))
    sink.put(_event(0, nbytes=4000))  # larger than the limit alone: it passes an empty sink (on the loop)
    assert len(sink) == 1
    with_room = threading.Event()

    def model() -> None:
        sink.put(_event(1, nbytes=400))
        with_room.set()

    thread = await _in_thread(model)
    assert not await asyncio.to_thread(with_room.wait, 0.2)  # held behind the 4000 bytes
    assert _value(await sink.get()) == 0
    await asyncio.to_thread(with_room.wait, WAIT)
    thread.join(WAIT)
    assert _value(await sink.get()) == 1


async def test_a_final_event_is_never_held_back():
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=1))
    sink.put(_event(0))
    sink.put(StreamEvent(final=True))  # on the loop, full: still accepted
    assert len(sink) == 2 and sink.closed


async def test_on_the_loop_a_full_sink_ends_the_stream_with_resource_exhausted():
    request = SimpleNamespace(cancelled=False)
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=2), "flood", request)
    for i in range(3):
        sink.put(_event(i))
    events = [await sink.get() for _ in range(3)]
    assert [_value(e) for e in events[:2]] == [0, 1]
    last = events[2]
    assert last.final and isinstance(last.error, ResourceExhausted)
    assert "model 'flood'" in last.error.message and "--stream-max-responses" in last.error.message
    assert "2 responses" in last.error.message
    assert request.cancelled and sink.cancelled
    sink.put(_event(9))  # dropped: the stream has ended
    assert len(sink) == 0


async def test_a_reader_that_reads_nothing_for_the_stall_timeout_ends_the_stream():
    request = SimpleNamespace(cancelled=False)
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=1, stall_seconds=0.05),
                        "slow", request)
    done = threading.Event()

    def model() -> None:
        sink.put(_event(0))
        sink.put(_event(1))  # waits 0.05 s for a reader that never comes, then gives up
        done.set()

    thread = await _in_thread(model)
    await asyncio.to_thread(done.wait, WAIT)
    thread.join(WAIT)
    assert _value(await sink.get()) == 0
    last = await sink.get()
    assert last.final and isinstance(last.error, ResourceExhausted)
    assert "--stream-stall-timeout" in last.error.message
    assert request.cancelled


async def test_cancel_releases_a_waiting_sender_and_drops_the_rest():
    request = SimpleNamespace(cancelled=False)
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=1), "m", request)
    returned = threading.Event()
    waiting = threading.Event()

    def model() -> None:
        sink.put(_event(0))
        waiting.set()
        sink.put(_event(1))  # held: the stream is full
        returned.set()
        for i in range(2, 100_000):  # a model that ignores is_cancelled(): each put returns at once
            sink.put(_event(i))

    thread = await _in_thread(model)
    await asyncio.to_thread(waiting.wait, WAIT)
    sink.cancel()
    await asyncio.to_thread(returned.wait, WAIT)
    thread.join(WAIT)
    assert not thread.is_alive()
    assert request.cancelled and len(sink) == 0


async def test_the_reader_is_woken_once_per_wait_not_once_per_response():
    loop = asyncio.get_running_loop()
    sink = ResponseSink(loop, StreamLimits(max_responses=1000))
    wakes = 0
    original = loop.call_soon_threadsafe

    def counting(callback, *args):  # type: ignore[no-untyped-def]
        nonlocal wakes
        if callback is _resolve:  # the sink waking its reader (to_thread wakes the loop too)
            wakes += 1
        return original(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        reader = asyncio.ensure_future(sink.get())
        await asyncio.sleep(0)  # the reader now waits

        def model() -> None:
            for i in range(500):
                sink.put(_event(i))

        thread = await _in_thread(model)
        await asyncio.to_thread(thread.join, WAIT)
        first = await asyncio.wait_for(reader, WAIT)
        rest = [await sink.get() for _ in range(499)]
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
    assert _value(first) == 0 and [_value(e) for e in rest] == list(range(1, 500))
    assert wakes == 1  # the one waiting reader; the other 499 puts found nobody waiting


def test_limits_are_checked():
    with pytest.raises(ValueError, match="--stream-max-responses must be >= 1, got 0"):
        StreamLimits(max_responses=0)
    with pytest.raises(ValueError, match="--stream-stall-timeout"):
        StreamLimits(stall_seconds=0)


async def test_a_paced_producer_is_called_back_once_the_reader_takes_it_below_the_bound():
    sink = ResponseSink(asyncio.get_running_loop(), StreamLimits(max_responses=2))
    resumed: list[int] = []
    assert not sink.resume_when_room(1, 4, lambda: resumed.append(1))  # room for one more
    sink.put(_event(0), paced=True)
    assert sink.resume_when_room(1, 4, lambda: resumed.append(len(sink)))  # the next would reach the bound
    sink.put(_event(1), paced=True)
    sink.put(_event(2), paced=True)  # past it, on the loop, and neither refused nor failed
    assert len(sink) == 3
    assert _value(await sink.get()) == 0 and resumed == []  # two left: still at the bound
    assert _value(await sink.get()) == 1 and resumed == [1]  # below it: called back, once
    assert _value(await sink.get()) == 2 and resumed == [1]
    # A cancelled stream calls nobody back.
    sink.put(_event(3), paced=True)
    sink.put(_event(4), paced=True)
    assert sink.resume_when_room(0, 0, lambda: resumed.append(99))
    sink.cancel()
    assert not sink.resume_when_room(0, 0, lambda: resumed.append(99)) and resumed == [1]

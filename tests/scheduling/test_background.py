"""The batch-job lane: the pure admission decision, and its driver with a FakeClock."""

from __future__ import annotations

import asyncio
import math
from typing import Callable

import numpy as np
import pytest

from inferd.clock import FakeClock
from inferd.scheduling.background import BackgroundLane, LanePolicy, LaneState, admit, pace
from inferd.scheduling.base import Completion, Scheduler
from inferd.types import InferenceRequest

P = LanePolicy(gap_s=0.002, burst_after_s=1.0, trickle=1, burst=8)


@pytest.mark.parametrize("state, now, expected", [
    (LaneState(waiting=0), 5.0, (0, None)),  # nothing to admit
    (LaneState(interactive=1, waiting=3, last_interactive=4.0), 5.0, (0, None)),  # interactive in flight
    (LaneState(waiting=3, last_interactive=5.0), 5.001, (0, 5.002)),  # quiet too short: wait for the gap
    (LaneState(waiting=3, last_interactive=5.0), 5.002, (1, 6.0)),  # trickle, burst later
    (LaneState(waiting=3, batch=1, last_interactive=5.0), 5.5, (0, 6.0)),  # the trickle is running
    (LaneState(waiting=20, batch=3, last_interactive=5.0), 6.0, (5, None)),  # burst: up to 8 at once
    (LaneState(waiting=2), 0.0, (2, None)),  # never any interactive traffic: burst
])
def test_admit(state, now, expected):
    assert admit(P, state, now) == expected


def test_while_interactive_traffic_is_recent_batch_work_keeps_to_its_duty():
    policy = LanePolicy(gap_s=0.002, burst_after_s=1.0, duty=0.2, overhead_s=0.0005)
    state = LaneState(waiting=5, last_interactive=10.0)
    pace(policy, state, started=10.010, now=10.011)  # 1 ms in the scheduler, 0.5 ms around it
    assert state.paced_until == pytest.approx(10.011 + 0.0015 * 4)
    assert admit(policy, state, 10.012) == (0, state.paced_until)
    assert admit(policy, state, 10.018) == (1, 11.0)
    quiet = LaneState(waiting=5, last_interactive=10.0)
    pace(policy, quiet, started=11.5, now=11.6)  # interactive traffic long gone: no pacing
    assert quiet.paced_until == -math.inf and admit(policy, quiet, 11.6) == (5, None)


class Inner(Scheduler):
    """A scheduler whose requests finish when the test says. Like a real one's in-flight count, it
    counts its interactive requests and calls back (``when_quiet``) each time none is left."""

    def __init__(self) -> None:
        self.running: list[tuple[InferenceRequest, Completion]] = []
        self.withdrawn: list[InferenceRequest] = []
        self._quiet: Callable[[], None] | None = None

    def submit(self, request, rows, completion, more=False):  # type: ignore[no-untyped-def]
        entry = (request, completion)
        self.running.append(entry)

        def cancel() -> None:
            self.withdrawn.append(request)
            self._leave(entry)

        return cancel

    def interactive(self) -> int:
        return sum(not r.background for r, _ in self.running)

    def when_quiet(self, callback: Callable[[], None]) -> None:
        self._quiet = callback

    def inflight(self) -> int:
        return len(self.running)

    async def stop(self) -> None:
        pass

    def finish(self, index: int = 0) -> InferenceRequest:
        request, completion = entry = self.running[index]
        self._leave(entry)
        completion.set_result({"OUT": np.zeros(1)})
        return request

    def _leave(self, entry: tuple[InferenceRequest, Completion]) -> None:
        self.running.remove(entry)
        if not entry[0].background and not self.interactive() and self._quiet is not None:
            self._quiet()

    queue_depth = 7  # something only the inner scheduler has


def req(background: bool = False) -> InferenceRequest:
    return InferenceRequest("m", {}, background=background)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


async def test_batch_work_waits_for_interactive_quiet_then_trickles_then_bursts():
    clock, inner = FakeClock(), Inner()
    lane = BackgroundLane(inner, P, clock, lowest_priority=3)
    user = asyncio.ensure_future(lane.infer(req(), 1))
    jobs = [asyncio.ensure_future(lane.infer(req(True), 1)) for _ in range(4)]
    await settle()
    assert len(inner.running) == 1 and lane.inflight() == 5  # only the user's request went on
    inner.finish()
    await settle()
    assert len(inner.running) == 0  # interactive quiet for less than the gap
    clock.advance(0.002)
    await settle()
    assert len(inner.running) == 1 and inner.running[0][0].priority == 3  # one, at the lowest level
    inner.finish()
    await settle()
    assert len(inner.running) == 0  # paced: batch work keeps to its duty while interactive traffic is recent
    clock.advance(P.overhead_s * (1 / P.duty - 1))
    await settle()
    assert len(inner.running) == 1  # the next one, still one at a time
    clock.advance(1.0)
    await settle()
    assert len(inner.running) == 3  # quiet long enough: the rest at once
    for _ in range(3):
        inner.finish()
    await asyncio.gather(user, *jobs)
    assert lane.admitted == 4 and lane.admitted_over_interactive == 0


async def test_an_interactive_arrival_stops_further_batch_work():
    clock, inner = FakeClock(), Inner()
    lane = BackgroundLane(inner, P, clock)
    jobs = [asyncio.ensure_future(lane.infer(req(True), 1)) for _ in range(10)]
    await settle()
    assert len(inner.running) == 8  # idle server: a burst
    user = asyncio.ensure_future(lane.infer(req(), 1))
    await settle()
    assert lane.interactive_met_batch == 1
    for _ in range(8):
        inner.finish(0)
    await settle()
    assert [r.background for r, _ in inner.running] == [False]  # no batch work while the user's runs
    inner.finish()
    await user
    clock.advance(0.002)
    await settle()
    assert len(inner.running) == 1  # trickle after the gap
    clock.advance(1.0)
    await settle()
    while inner.running:
        inner.finish()
        await settle()
    await asyncio.gather(*jobs)
    assert lane.admitted_over_interactive == 0


async def test_a_cancelled_batch_request_gives_its_place_back():
    clock, inner = FakeClock(), Inner()
    lane = BackgroundLane(inner, LanePolicy(burst=1), clock)
    first = asyncio.ensure_future(lane.infer(req(True), 1))
    second = asyncio.ensure_future(lane.infer(req(True), 1))
    await settle()
    second.cancel()
    first.cancel()  # admitted and running in the scheduler
    await settle()
    inner.running.clear()
    assert lane.state.batch == 0 and lane.state.waiting == 0 and lane.inflight() == 0
    third = asyncio.ensure_future(lane.infer(req(True), 1))
    await settle()
    inner.finish()
    await third


async def test_the_lane_shows_what_the_scheduler_has():
    lane = BackgroundLane(Inner(), P, FakeClock())
    assert lane.queue_depth == 7
    assert lane.state.last_interactive == -math.inf


async def test_a_submitted_interactive_request_holds_batch_work_until_it_is_answered_or_cancelled():
    clock, inner = FakeClock(), Inner()
    lane = BackgroundLane(inner, P, clock)
    loop = asyncio.get_running_loop()
    answered, dropped = loop.create_future(), loop.create_future()
    lane.submit(req(), 1, answered)
    cancel = lane.submit(req(), 1, dropped)
    job = asyncio.ensure_future(lane.infer(req(True), 1))
    await settle()
    assert len(inner.running) == 2 and lane.interactive() == 2  # the job waits for them
    inner.finish(0)
    await settle()
    assert answered.done() and lane.interactive() == 1
    cancel()
    await settle()
    assert lane.interactive() == 0 and not dropped.done()
    assert len(inner.withdrawn) == 1  # the cancel reached the inner scheduler
    clock.advance(P.gap_s)
    await settle()
    assert [r.background for r, _ in inner.running] == [True]  # quiet for the gap: the job goes on
    inner.finish()
    await job

"""The gRPC port's shutdown gate (inferd.frontends.grpc_port.Gate), on a FakeClock: once closed it
holds every call until released, and ``quiet`` returns only once no call arrived for a while (or
the longest hold passed), so a port closes with nothing left unclaimed in gRPC core."""

from __future__ import annotations

import asyncio

from inferd.clock import FakeClock
from inferd.frontends.grpc_port import Gate


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_quiet_waits_until_no_call_arrived_for_the_quiet_time() -> None:
    clock = FakeClock()
    gate = Gate(clock)
    gate.close()
    quiet = asyncio.ensure_future(gate.quiet(quiet_s=0.05, longest_s=1.0))
    held = [asyncio.ensure_future(gate.hold())]
    await _turns()
    for _ in range(5):  # a call every 40 ms keeps the port from being quiet
        clock.advance(0.04)
        held.append(asyncio.ensure_future(gate.hold()))
        await _turns()
        assert not quiet.done()
    clock.advance(0.049)
    await _turns()
    assert not quiet.done()
    clock.advance(0.002)  # 50 ms after the last arrival
    await _turns()
    assert quiet.done() and gate.held == 6
    assert not any(h.done() for h in held)  # still held until the release
    gate.release()
    await _turns()
    assert all(h.done() for h in held)


async def test_quiet_gives_up_after_the_longest_hold() -> None:
    clock = FakeClock()
    gate = Gate(clock)
    gate.close()
    quiet = asyncio.ensure_future(gate.quiet(quiet_s=0.05, longest_s=0.2))
    for _ in range(10):  # arrivals never stop
        clock.advance(0.03)
        asyncio.ensure_future(gate.hold())
        await _turns()
        if quiet.done():
            break
    assert quiet.done() and 0.2 <= clock.now() - 1000.0 < 0.25
    gate.release()
    await _turns()


async def test_an_idle_port_is_quiet_after_the_quiet_time_and_cancels_its_timer() -> None:
    clock = FakeClock()
    gate = Gate(clock)
    gate.close()
    quiet = asyncio.ensure_future(gate.quiet(quiet_s=0.05, longest_s=1.0))
    await _turns()
    assert not quiet.done()
    clock.advance(0.05)
    await _turns()
    assert quiet.done() and clock.pending_timers() == 0
    assert Gate(clock).closed is False  # a new port lets calls through

"""The data plane drives the queue-delay controller: it refuses (UNAVAILABLE) a request whose received
stamp says it already waited past the target while the server sheds, before it costs anything; it bounds
an admitted one's wait; and it feeds the controller each served request's queueing delay counted from
the stamp. Stamps are injected (the real monotonic clock, which the data plane and schedulers read)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from inferd.dataplane import DataPlane
from inferd.dataplane.shedding import QueueDelay
from inferd.errors import Unavailable
from inferd.examples import onnx_models as om
from inferd.repository import ModelManager
from inferd.types import InferenceRequest
from repo_builder import add_model, config

IO = [("INPUT0", "TYPE_INT32", [16]), ("INPUT1", "TYPE_INT32", [16])]
OUT = [("OUTPUT0", "TYPE_INT32", [16]), ("OUTPUT1", "TYPE_INT32", [16])]
SECOND_NS = 1_000_000_000


async def _plane(tmp_path, shedding: QueueDelay) -> DataPlane:
    add_model(tmp_path, "simple", om.add_sub(np.int32, 16, batch=True), config("simple", IO, OUT, 8))
    dp = DataPlane(ModelManager([tmp_path]), shedding=shedding)
    await dp.load_models()
    return dp


def _request(received_ns: int = 0) -> InferenceRequest:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    return InferenceRequest("simple", {"INPUT0": a, "INPUT1": a}, received_ns=received_ns)


def _overloaded(shedding: QueueDelay) -> None:
    """Delays above target for a whole interval, just now (on the data plane's clock)."""
    now = time.monotonic()
    shedding.observe(1.0, now - 0.2)
    shedding.observe(1.0, now)
    assert shedding.dropping


@pytest.fixture
async def plane(tmp_path):
    dp = await _plane(tmp_path, QueueDelay(20_000, 100_000))
    yield dp
    await dp.close()


async def test_a_request_that_already_waited_past_the_target_is_shed_before_it_is_admitted(plane):
    dp = plane
    _overloaded(dp.queue_delay("simple"))
    old = _request(time.monotonic_ns() - SECOND_NS)  # its frontend received it a second ago
    with pytest.raises(Unavailable) as info:
        await dp.infer(old)
    m = info.value.message
    assert "model 'simple'" in m and "shed" in m and "target of 20000 us" in m and "--no-shed" in m
    assert dp.inflight() == 0 and dp.admission.refused == 0  # refused: not counted as a cap's refusal
    assert dp.queue_delay("simple").shed == 1
    # A fresh one is admitted, with the time past which it would be shed if still queued.
    fresh = _request(time.monotonic_ns())
    await dp.infer(fresh)
    assert fresh.shed_at == pytest.approx(fresh.received_ns * 1e-9 + 0.02)


async def test_the_callback_path_sheds_alike(plane):
    dp = plane
    _overloaded(dp.queue_delay("simple"))
    with pytest.raises(Unavailable, match="shed"):
        dp.submit(_request(time.monotonic_ns() - SECOND_NS), lambda run: None)


async def test_the_queueing_delay_fed_to_the_controller_counts_from_the_received_stamp(plane):
    dp = plane
    request = _request(time.monotonic_ns() - SECOND_NS)
    await dp.infer(request)  # not shedding yet: served
    assert request.dispatched > 0
    delay = dp.queue_delay("simple")
    assert delay.last_delay >= 1.0  # it waited at least the second before the core saw it
    assert delay.above_since is not None


async def test_one_models_overload_sheds_only_its_own_requests(plane):
    dp = plane
    _overloaded(dp.queue_delay("other"))
    await dp.infer(_request(time.monotonic_ns() - SECOND_NS))  # 'simple' is not shedding: served


async def test_target_zero_never_sheds(tmp_path):
    dp = await _plane(tmp_path, QueueDelay(0, 100_000))
    try:
        delay = dp.queue_delay("simple")
        _ = [delay.observe(5.0, time.monotonic() + i) for i in range(3)]
        assert not delay.dropping
        await dp.infer(_request(time.monotonic_ns() - 10 * SECOND_NS))
    finally:
        await dp.close()


async def test_a_request_served_well_within_the_target_leaves_the_controller_as_it_was(tmp_path):
    # The data plane skips feeding it (QueueDelay.settled): nothing about the decision changes.
    dp = await _plane(tmp_path, QueueDelay(5_000_000, 100_000))  # 5 s: no load makes a fresh request wait so long
    try:
        delay = dp.queue_delay("simple")
        request = _request(time.monotonic_ns())
        await dp.infer(request)
        assert request.dispatched > 0  # handed to an instance: observed, were it not settled
        assert delay.last_delay == 0.0 and delay.above_since is None and not delay.dropping
        late = _request(time.monotonic_ns() - 10 * SECOND_NS)
        await dp.infer(late)
        assert delay.last_delay >= 10.0 and delay.above_since is not None  # one past the target is fed
    finally:
        await dp.close()


async def test_a_batch_lines_wait_never_feeds_the_controller(plane):
    """A batch line (``background``: /v2's, or an OpenAI batch's run in the core) waits for idle capacity
    on purpose; counting that as queueing delay would shed interactive requests."""
    dp = plane
    line = _request(time.monotonic_ns() - SECOND_NS)
    line.background = True
    await dp.infer(line)
    assert line.dispatched > 0  # handed to an instance: an interactive one would be fed
    delay = dp.queue_delay("simple")
    assert delay.last_delay == 0.0 and delay.above_since is None

"""The queue-delay controller (inferd.dataplane.shedding), a pure decision: made-up delays and times,
no clock, no loop. Times are float seconds from an arbitrary origin T0."""

from __future__ import annotations

import pytest

from inferd.dataplane.shedding import REENTER_INTERVALS, QueueDelay
from inferd.errors import Unavailable

T0 = 1000.0
MS = 1e-3


def controller(target_ms: float = 20, interval_ms: float = 100) -> QueueDelay:
    return QueueDelay(round(target_ms * 1000), round(interval_ms * 1000))


def test_delays_above_target_for_less_than_an_interval_are_a_burst_and_shed_nothing():
    c = controller()
    c.observe(50 * MS, T0)
    c.observe(80 * MS, T0 + 99 * MS)
    assert not c.dropping
    assert c.refusal("mlp", 1.0, T0 + 99 * MS) is None  # even a request that waited a second
    assert c.shed_at(T0) is None


def test_delays_above_target_for_a_whole_interval_start_shedding():
    c = controller()
    c.observe(30 * MS, T0)
    c.observe(25 * MS, T0 + 50 * MS)
    c.observe(40 * MS, T0 + 100 * MS)
    assert c.dropping
    # A request that has already waited past the target is shed, one that has not is admitted,
    # with a time past which, still queued, it is shed.
    refused = c.refusal("mlp", 35 * MS, T0 + 100 * MS)
    assert isinstance(refused, Unavailable)
    m = refused.message
    assert "model 'mlp'" in m and "shed" in m and "overloaded" in m
    assert "waited 35000 us" in m and "target of 20000 us" in m and "100000 us" in m
    assert "last queueing delay 40000 us" in m
    assert "--queue-delay-target-us" in m and "--no-shed" in m and "retry" in m
    assert c.refusal("mlp", 5 * MS, T0 + 100 * MS) is None
    assert c.shed_at(T0 + 90 * MS) == pytest.approx(T0 + 110 * MS)
    assert c.shed == 1


def test_one_delay_below_target_in_the_interval_means_no_standing_queue():
    c = controller()
    c.observe(30 * MS, T0)
    c.observe(19 * MS, T0 + 60 * MS)  # the minimum over the interval is below target
    c.observe(30 * MS, T0 + 100 * MS)
    c.observe(30 * MS, T0 + 150 * MS)
    assert not c.dropping  # above target again only since T0 + 100 ms
    c.observe(30 * MS, T0 + 200 * MS)
    assert c.dropping


def test_a_delay_below_target_ends_shedding_at_once():
    c = controller()
    for i in range(3):
        c.observe(50 * MS, T0 + i * 60 * MS)
    assert c.dropping
    c.observe(2 * MS, T0 + 130 * MS)
    assert not c.dropping
    assert c.refusal("mlp", 1.0, T0 + 130 * MS) is None and c.shed_at(T0 + 130 * MS) is None


def test_soon_after_an_overload_the_first_delay_above_target_starts_shedding_again():
    c = controller()
    for i in range(3):
        c.observe(50 * MS, T0 + i * 60 * MS)
    c.observe(2 * MS, T0 + 200 * MS)  # the requests served while shedding waited less than the target
    c.observe(25 * MS, T0 + 210 * MS)
    assert c.dropping  # no second interval of regrowing queue
    c.observe(2 * MS, T0 + 220 * MS)
    later = T0 + 221 * MS + REENTER_INTERVALS * 100 * MS
    c.observe(25 * MS, later)  # long after: a burst again, tolerated for an interval
    assert not c.dropping
    c.observe(25 * MS, later + 100 * MS)
    assert c.dropping


def test_target_zero_is_off():
    c = QueueDelay(0, 100_000)
    assert not c.enabled
    for i in range(10):
        c.observe(5.0, T0 + i)
    assert not c.dropping and c.refusal("mlp", 10.0, T0 + 10) is None and c.shed_at(T0) is None


@pytest.mark.parametrize("target, interval", [(-1, 100_000), (20_000, 0)])
def test_bad_settings_are_refused_naming_the_flag(target: int, interval: int):
    with pytest.raises(ValueError, match="--queue-delay-(target|interval)-us must be"):
        QueueDelay(target, interval)


def test_a_models_target_follows_its_mean_execution():
    c = QueueDelay(50_000, 100_000, execution_multiple=5)
    c.follow(0.4)  # a slow model: 400 ms an execution
    assert c.target_s == pytest.approx(2.0)
    # A request or two queued behind its running execution is its normal load, never shed.
    c.observe(0.8, 0.0)
    c.observe(0.8, 0.5)
    assert not c.dropping and c.above_since is None
    # Five executions' worth of waiting, for an interval, is an overload.
    c.observe(2.5, 1.0)
    c.observe(2.5, 1.2)
    assert c.dropping
    c.follow(0.001)  # a fast model: the configured target is the floor
    assert c.target_s == pytest.approx(0.05)


def test_a_fresh_controller_has_the_settings_and_none_of_the_state():
    c = QueueDelay(20_000, 100_000, execution_multiple=3)
    c.observe(1.0, 0.0)
    c.observe(1.0, 0.2)
    fresh = c.fresh()
    assert c.dropping and not fresh.dropping
    assert (fresh.base_s, fresh.interval_s, fresh.execution_multiple) == (0.02, 0.1, 3)
    with pytest.raises(ValueError, match="--queue-delay-execution-multiple must be >= 0"):
        QueueDelay(execution_multiple=-1)


def test_a_delay_is_settled_only_below_the_configured_target_with_no_overload_building():
    slow = controller(target_ms=20)
    slow.follow(1.0)  # a slow model: its target is 5 s, but "settled" asks the configured 20 ms
    assert slow.settled(19 * MS)
    assert not slow.settled(20 * MS)  # may start one: observed (and the target followed first)
    c = controller(target_ms=20)
    c.observe(30 * MS, T0)  # above the target: an overload is building
    assert c.above_since is not None and not c.settled(1 * MS)  # the short one must end it
    c.observe(1 * MS, T0 + 10 * MS)
    assert c.above_since is None and c.settled(1 * MS)
    c.observe(30 * MS, T0 + 20 * MS)
    c.observe(30 * MS, T0 + 130 * MS)
    assert c.dropping and not c.settled(1 * MS)  # shedding: every delay counts (and ends it)


def test_observing_a_settled_delay_would_change_nothing_but_the_last_delay():
    # What the data plane relies on when it skips one: the decision's state is the same after it.
    c = controller()
    c.observe(5 * MS, T0)
    before = (c.target_s, c.above_since, c.dropping, c.left_at, c.shed)
    assert c.settled(3 * MS)
    c.observe(3 * MS, T0 + 1)
    assert (c.target_s, c.above_since, c.dropping, c.left_at, c.shed) == before

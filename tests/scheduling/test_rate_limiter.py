"""The rate limiter (Triton's semantics): resources, the order of waiting instances, the load-time checks."""

from __future__ import annotations

import pytest

from inferd.config import RateLimitResource as R
from inferd.errors import ConfigError, InvalidArgument
from inferd.scheduling.rate_limiter import EVERY_DEVICE, GLOBAL, RateLimiter, parse_resource


class Log:
    """Start callbacks that record which instance started."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, name: str):  # type: ignore[no-untyped-def]
        return lambda: self.started.append(name)


def test_by_default_a_resource_has_the_most_units_any_instance_needs():
    limiter = RateLimiter()
    limiter.register("a", "a_0", 0, (R("R1", 4), R("R2", 4)), 0)
    limiter.register("b", "b_0", 0, (R("R2", 5), R("R3", 10)), 0)
    limiter.register("c", "c_0", 1, (R("R1", 1), R("G", 2, is_global=True)), 0)
    assert limiter.available() == {(0, "R1"): 4, (0, "R2"): 5, (0, "R3"): 10, (1, "R1"): 1, (GLOBAL, "G"): 2}


def test_instances_sharing_a_resource_run_one_at_a_time():
    limiter, log = RateLimiter(), Log()
    a = limiter.register("a", "a_0", 0, (R("R", 1),), 0)
    b = limiter.register("b", "b_0", 0, (R("R", 1),), 0)
    a.request(log.start("a"))
    b.request(log.start("b"))
    assert log.started == ["a"]  # b waits for the unit a holds
    a.release()
    assert log.started == ["a", "b"]
    b.release()
    a.request(log.start("a"))
    assert log.started == ["a", "b", "a"]


def test_instances_on_other_devices_do_not_share_a_per_device_resource_but_share_a_global_one():
    limiter, log = RateLimiter(), Log()
    a = limiter.register("a", "a_0", 0, (R("R", 1),), 0)
    b = limiter.register("b", "b_1", 1, (R("R", 1),), 0)
    a.request(log.start("a"))
    b.request(log.start("b"))
    assert log.started == ["a", "b"]
    a.release(), b.release()
    g1 = limiter.register("g", "g_0", 0, (R("G", 1, is_global=True),), 0)
    g2 = limiter.register("g", "g_1", 1, (R("G", 1, is_global=True),), 0)
    g1.request(log.start("g_0"))
    g2.request(log.start("g_1"))
    assert log.started[-1] == "g_0"


def test_the_waiting_instance_with_fewest_executions_times_priority_goes_first():
    limiter, log = RateLimiter(), Log()
    holder = limiter.register("h", "h_0", 0, (R("R", 1),), 0)
    low = limiter.register("low", "low_0", 0, (R("R", 1),), 2)  # priority 2: half the turns
    high = limiter.register("high", "high_0", 0, (R("R", 1),), 1)
    for ticket in (low, high):  # one execution each so far
        holder.request(log.start("h"))
        ticket.request(log.start("x"))
        holder.release()
        ticket.release()
    log.started.clear()
    holder.request(log.start("h"))
    low.request(log.start("low"))  # staged first, but 1 execution x 2 > 1 x 1
    high.request(log.start("high"))
    holder.release()
    assert log.started == ["h", "high"]
    high.release()
    assert log.started == ["h", "high", "low"]


def test_nothing_overtakes_the_first_waiting_instance():
    limiter, log = RateLimiter(), Log()
    big = limiter.register("big", "big_0", 0, (R("R", 2),), 0)
    small = limiter.register("small", "small_0", 0, (R("R", 1),), 0)
    other = limiter.register("small", "small_1", 0, (R("R", 1),), 0)
    small.request(log.start("small"))  # 1 of 2 units
    big.request(log.start("big"))  # needs both: waits
    other.request(log.start("other"))  # would fit, but waits behind big (Triton's order)
    assert log.started == ["small"]
    small.release()
    assert log.started == ["small", "big"]
    big.release()
    assert log.started == ["small", "big", "other"]


def test_an_instance_needing_no_resources_is_never_held_back_by_them():
    limiter, log = RateLimiter(), Log()
    free = limiter.register("f", "f_0", 0, (), 3)
    free.request(log.start("f"))
    free.request(log.start("f"))  # a second execution request while the first holds nothing
    assert log.started == ["f", "f"]


def test_a_resource_both_global_and_per_device_fails_the_load():
    limiter = RateLimiter()
    limiter.register("a", "a_0", 0, (R("R", 1, is_global=True),), 0)
    with pytest.raises(ConfigError, match='model \'b\': Resource "R" is present as both global and device-specific'):
        limiter.register("b", "b_0", 0, (R("R", 1),), 0)
    assert limiter.available() == {(GLOBAL, "R"): 1}  # the refused instance left nothing behind


def test_explicit_counts_replace_the_default_and_must_cover_every_instance():
    limiter = RateLimiter([("R", 3, EVERY_DEVICE), ("R", 5, 1), ("G", 1, 0), ("G", 4, EVERY_DEVICE)])
    limiter.register("a", "a_0", 0, (R("R", 2),), 0)
    limiter.register("a", "a_1", 1, (R("R", 2),), 0)
    limiter.register("g", "g_0", 0, (R("G", 2, is_global=True),), 0)
    assert limiter.available() == {(0, "R"): 3, (1, "R"): 5, (GLOBAL, "G"): 4}
    with pytest.raises(ConfigError, match='Resource count for "R" is limited to 3 which will prevent scheduling of '
                                          'one or more model instances, the minimum required count is 4'):
        limiter.register("b", "b_0", 0, (R("R", 4),), 0)
    with pytest.raises(ConfigError, match='"S" is limited to 0 .* required count is 1 .*--rate-limit-resource S:1'):
        limiter.register("c", "c_0", 0, (R("S", 1),), 0)


def test_unloading_an_instance_gives_its_share_back():
    limiter = RateLimiter()
    a = limiter.register("a", "a_0", 0, (R("R", 4),), 0)
    limiter.register("b", "b_0", 0, (R("R", 1),), 0)
    a.close()
    assert limiter.available() == {(0, "R"): 1}


@pytest.mark.parametrize("arg, parsed", [("R1:10", ("R1", 10, EVERY_DEVICE)), ("R2:5:0", ("R2", 5, 0))])
def test_rate_limit_resource_option(arg: str, parsed: tuple):
    assert parse_resource(arg) == parsed


@pytest.mark.parametrize("arg", ["R1", "R1:1:2:3", ":4", "R1:x", "R1:-1", "R1:2:-1"])
def test_bad_rate_limit_resource_option_is_refused(arg: str):
    with pytest.raises(InvalidArgument, match="--rate-limit-resource"):
        parse_resource(arg)

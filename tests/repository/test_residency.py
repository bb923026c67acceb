"""The residency decision (inferd/repository/residency.py) as a state machine on made-up
times: which models a load evicts, which it never may, and when it is refused."""

from __future__ import annotations

import pytest

from inferd.repository.residency import Resident, format_size, over_budget, parse_size, plan_load

MB = 2**20


def r(name: str, mb: int, last: float, **kw) -> Resident:  # type: ignore[no-untyped-def]
    return Resident(name, mb * MB, last, **kw)


def test_fits_without_evicting() -> None:
    plan = plan_load("new", 10 * MB, 100 * MB, [r("a", 40, 1.0), r("b", 40, 2.0)], now=3.0)
    assert plan.evict == () and plan.refusal is None


def test_evicts_least_recently_used_first_and_only_as_many_as_needed() -> None:
    residents = [r("a", 30, 5.0), r("b", 30, 1.0), r("c", 30, 3.0)]
    plan = plan_load("new", 30 * MB, 100 * MB, residents, now=6.0)
    assert plan.evict == ("b",)
    plan = plan_load("new", 60 * MB, 100 * MB, residents, now=6.0)
    assert plan.evict == ("b", "c")


def test_ties_in_last_use_go_by_name() -> None:
    plan = plan_load("new", 50 * MB, 100 * MB, [r("z", 50, 1.0), r("m", 50, 1.0)], now=2.0)
    assert plan.evict == ("m",)


def test_busy_pinned_and_kept_warm_are_skipped() -> None:
    residents = [r("busy", 20, 0.0, busy=True), r("pin", 20, 0.0, pinned=True),
                 r("warm", 20, 0.0, keep_warm_until=10.0), r("idle", 20, 9.0)]
    plan = plan_load("new", 30 * MB, 90 * MB, residents, now=9.5)
    assert plan.evict == ("idle",)


def test_keep_warm_ends_with_its_time() -> None:
    residents = [r("warm", 50, 0.0, keep_warm_until=10.0), r("later", 50, 5.0)]
    assert plan_load("new", 50 * MB, 100 * MB, residents, now=9.0).evict == ("later",)
    assert plan_load("new", 50 * MB, 100 * MB, residents, now=10.0).evict == ("warm",)


def test_refused_when_only_busy_or_pinned_models_could_make_room() -> None:
    residents = [r("busy", 40, 0.0, busy=True), r("pin", 40, 0.0, pinned=True), r("idle", 10, 1.0)]
    plan = plan_load("new", 30 * MB, 100 * MB, residents, now=2.0)
    assert plan.evict == ()  # evicting 'idle' alone would not be enough: nothing goes
    assert plan.refusal is not None
    for words in ("'new' needs 30.0 MiB", "budget of 100.0 MiB", "10.0 MiB free", "pinned: 'pin' 40.0 MiB",
                  "in use: 'busy' 40.0 MiB", "idle: 'idle' 10.0 MiB", "--model-memory-budget"):
        assert words in plan.refusal


def test_a_model_larger_than_the_budget_is_refused_even_when_nothing_is_loaded() -> None:
    plan = plan_load("huge", 200 * MB, 100 * MB, [], now=0.0)
    assert plan.refusal is not None and "more than the whole model memory budget of 100.0 MiB" in plan.refusal


def test_exactly_full_fits() -> None:
    assert plan_load("new", 50 * MB, 100 * MB, [r("a", 50, 0.0)], now=1.0) == plan_load("x", 0, 0, [], 0.0)


def test_over_budget_trims_the_coldest_idle_models() -> None:
    residents = [r("a", 40, 3.0), r("b", 40, 1.0), r("c", 40, 2.0, busy=True)]
    assert over_budget(100 * MB, residents, now=4.0) == ("b",)
    assert over_budget(50 * MB, residents, now=4.0) == ("b", "a")  # 'c' is busy: as far as it can
    assert over_budget(200 * MB, residents, now=4.0) == ()


@pytest.mark.parametrize("text,size", [("1073741824", 2**30), ("512MiB", 512 * MB), ("2G", 2 * 10**9),
                                       ("1.5GB", 1_500_000_000), ("64 mi", 64 * MB), ("10k", 10_000)])
def test_parse_size(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "12 parsecs", "0", "-5M"])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="--model-memory-budget must be"):
        parse_size(text)


def test_format_size() -> None:
    assert format_size(512) == "512 B" and format_size(3 * MB // 2) == "1.5 MiB" and format_size(2**31) == "2.0 GiB"

"""The residency decision (inferd/repository/residency.py) as a state machine on made-up
times: which models a load evicts, which it never may, and when it is refused; per GPU too
(``--model-gpu-memory-budget``); with loads in progress beside it, when it waits (for a slot, or for
memory they hold) and when it is refused at once."""

from __future__ import annotations

import pytest

from inferd.repository.residency import (Plan, Resident, format_size, over_budget, parse_gpu_budgets,
                                        parse_size, plan_load)

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


# -- per GPU ------------------------------------------------------------------------------


def g(name: str, last: float, host: int = 1, **gpus_mb: int) -> Resident:
    """A resident holding ``host`` MiB on the host and ``gpu<k>=MiB`` on GPU k."""
    kw = {k: v for k, v in gpus_mb.items() if not k.startswith("gpu")}
    held = tuple(sorted((int(k[3:]), v * MB) for k, v in gpus_mb.items() if k.startswith("gpu")))
    return Resident(name, host * MB, last, gpus=held, **kw)  # type: ignore[arg-type]


def test_a_gpu_load_evicts_only_models_holding_memory_on_that_gpu() -> None:
    residents = [g("cpu_only", 0.0), g("other_gpu", 1.0, gpu1=60), g("on0_old", 2.0, gpu0=40),
                 g("on0_new", 3.0, gpu0=40)]
    plan = plan_load("new", MB, None, residents, now=4.0, gpu_footprint={0: 30 * MB},
                     gpu_budgets={0: 100 * MB, 1: 64 * MB})
    assert plan.evict == ("on0_old",)  # the least recently used on GPU 0; the colder ones hold nothing there


def test_a_load_needing_nothing_on_a_gpu_ignores_that_gpus_budget() -> None:
    residents = [g("full", 0.0, gpu0=100)]
    assert plan_load("cpu", MB, None, residents, now=1.0, gpu_budgets={0: 100 * MB}) == plan_load("x", 0, 0, [], 0.0)


def test_gpu_rules_are_the_hosts_pinned_busy_and_kept_warm_stay() -> None:
    residents = [g("pin", 0.0, gpu0=30, pinned=True), g("busy", 0.0, gpu0=30, busy=True),
                 g("warm", 0.0, gpu0=30, keep_warm_until=9.0), g("idle", 5.0, gpu0=10)]
    plan = plan_load("new", MB, None, residents, now=6.0, gpu_footprint={0: 10 * MB}, gpu_budgets={0: 100 * MB})
    assert plan.evict == ("idle",)  # GPU 0 is full: 'idle' is the only one that may go
    plan = plan_load("new", MB, None, residents, now=6.0, gpu_footprint={0: 25 * MB}, gpu_budgets={0: 100 * MB})
    assert plan.evict == () and plan.refusal is not None  # 'idle' alone frees 10 of the 25 needed: nothing goes
    for words in ("'new' needs 25.0 MiB on GPU 0 (its footprint)", "GPU 0's model memory budget of 100.0 MiB",
                  "0 B free", "pinned: 'pin' 30.0 MiB", "in use: 'busy' 30.0 MiB", "kept warm: 'warm' 30.0 MiB",
                  "idle: 'idle' 10.0 MiB", "--model-gpu-memory-budget 0:SIZE"):
        assert words in plan.refusal, (words, plan.refusal)


def test_the_refusal_names_only_what_holds_that_gpu() -> None:
    residents = [g("on1", 0.0, gpu1=50, pinned=True), g("on0", 0.0, gpu0=90, pinned=True)]
    plan = plan_load("new", MB, None, residents, now=1.0, gpu_footprint={1: 20 * MB},
                     gpu_budgets={0: 100 * MB, 1: 60 * MB})
    assert plan.refusal is not None and "on GPU 1" in plan.refusal and "'on1' 50.0 MiB" in plan.refusal
    assert "'on0'" not in plan.refusal


def test_a_model_larger_than_a_gpus_budget_is_refused_naming_the_device() -> None:
    plan = plan_load("huge", MB, 100 * MB, [], now=0.0, gpu_footprint={1: 9 * 2**30}, gpu_budgets={1: 8 * 2**30})
    assert plan.refusal == ("model 'huge' needs 9.0 GiB on GPU 1 (its footprint), more than the whole of GPU 1's "
                            "model memory budget of 8.0 GiB; raise --model-gpu-memory-budget 1:SIZE")


def test_host_and_gpu_budgets_are_one_pass_in_lru_order() -> None:
    # The host is short by 20 MiB, GPU 0 by 30: 'a' (coldest) frees host only, 'b' both.
    residents = [g("a", 0.0, host=30), g("b", 1.0, host=10, gpu0=40), g("c", 2.0, host=50, gpu0=40)]
    plan = plan_load("new", 30 * MB, 100 * MB, residents, now=3.0, gpu_footprint={0: 50 * MB},
                     gpu_budgets={0: 100 * MB})
    assert plan.evict == ("a", "b")
    # Only GPU 0 is short: 'a' holds nothing there and stays.
    plan = plan_load("new", MB, 1000 * MB, residents, now=3.0, gpu_footprint={0: 50 * MB}, gpu_budgets={0: 100 * MB})
    assert plan.evict == ("b",)


def test_over_budget_trims_each_gpu_past_its_budget() -> None:
    residents = [g("cold_cpu", 0.0, host=5), g("a", 1.0, gpu0=60), g("b", 2.0, gpu0=60), g("c", 3.0, gpu1=60)]
    assert over_budget(None, residents, now=4.0, gpu_budgets={0: 100 * MB, 1: 100 * MB}) == ("a",)
    assert over_budget(None, residents, now=4.0, gpu_budgets={0: 100 * MB, 1: 50 * MB}) == ("a", "c")
    assert over_budget(None, residents, now=4.0) == ()


@pytest.mark.parametrize("texts,budgets", [
    (["0:8GiB"], {0: 8 * 2**30}), (["0:8GiB,1:4GiB"], {0: 8 * 2**30, 1: 4 * 2**30}),
    (["0:1G", "3:512MiB"], {0: 10**9, 3: 512 * MB}), ([], {})])
def test_parse_gpu_budgets(texts: list[str], budgets: dict[int, int]) -> None:
    assert parse_gpu_budgets(texts) == budgets


@pytest.mark.parametrize("text,words", [
    ("8GiB", "GPU:SIZE items such as 0:8GiB,1:4GiB"), ("gpu0:8G", "got 'gpu0:8G'"), ("0:8G,0:4G", "gives GPU 0 twice"),
    ("1:lots", "1:SIZE must be a size"), ("0:0", "0:SIZE must be > 0")])
def test_parse_gpu_budgets_refuses(text: str, words: str) -> None:
    with pytest.raises(ValueError, match="--model-gpu-memory-budget") as info:
        parse_gpu_budgets([text])
    assert words in str(info.value)


# -- loads in parallel: the room they hold, slots, waiting ------------------------------------


def loading(name: str, mb: int, **kw) -> Resident:  # type: ignore[no-untyped-def]
    return Resident(name, mb * MB, 0.0, busy=True, loading=True, **kw)


def test_a_load_in_progress_holds_its_room_and_is_never_evicted() -> None:
    residents = [loading("other", 40), r("idle", 40, 1.0)]
    plan = plan_load("new", 40 * MB, 100 * MB, residents, now=2.0)
    assert plan.evict == ("idle",)  # 'other' holds 40 MiB though nothing of it is loaded yet


def test_waits_when_loads_in_progress_hold_the_room_it_needs() -> None:
    residents = [loading("a", 50), r("busy", 40, 1.0, busy=True)]
    plan = plan_load("new", 30 * MB, 100 * MB, residents, now=2.0)
    assert plan.wait == "memory that loads in progress hold" and plan.evict == () and plan.refusal is None


def test_refused_at_once_when_the_loads_in_progress_could_not_make_the_room_either() -> None:
    residents = [loading("a", 10), r("busy", 70, 1.0, busy=True)]
    assert plan_load("new", 25 * MB, 100 * MB, residents, now=2.0).wait is not None  # 'a' idle later: room
    plan = plan_load("new", 40 * MB, 100 * MB, residents, now=2.0)  # 'busy' alone leaves 30 MiB: never
    assert plan.wait is None and plan.refusal is not None
    assert "loading: 'a' 10.0 MiB" in plan.refusal and "in use: 'busy' 70.0 MiB" in plan.refusal


def test_a_refusal_names_the_loads_in_progress_holding_memory() -> None:
    plan = plan_load("new", 60 * MB, 100 * MB, [loading("a", 50)], now=1.0, may_wait=False)
    assert plan.refusal is not None and "loading: 'a' 50.0 MiB" in plan.refusal


def test_loads_past_the_slots_wait_for_one_to_end() -> None:
    residents = [loading("a", 1), loading("b", 1)]
    assert plan_load("c", MB, None, residents, now=0.0, slots=2).wait == "a load slot (2 loads in progress, 2 at a time)"
    assert plan_load("c", MB, None, residents, now=0.0, slots=3) == Plan()
    assert plan_load("c", MB, None, residents, now=0.0) == Plan()  # no limit


def test_a_load_another_load_waits_for_neither_waits_for_a_slot_nor_for_memory() -> None:
    residents = [loading("caller", 60), loading("b", 1)]
    assert plan_load("callee", MB, 100 * MB, residents, now=0.0, slots=2, may_wait=False) == Plan()
    plan = plan_load("callee", 50 * MB, 100 * MB, residents, now=0.0, slots=2, may_wait=False)
    assert plan.wait is None and plan.refusal is not None  # refused: it would wait for its own caller


def test_a_model_too_large_for_the_budget_is_refused_before_waiting_for_a_slot() -> None:
    plan = plan_load("huge", 200 * MB, 100 * MB, [loading("a", 1)], now=0.0, slots=1)
    assert plan.refusal is not None and "more than the whole model memory budget" in plan.refusal


def test_over_budget_never_picks_a_load_in_progress() -> None:
    assert over_budget(50 * MB, [loading("a", 40), r("b", 40, 1.0)], now=2.0) == ("b",)

"""Adaptive waits and SLO decisions (inferd.scheduling.adaptive): pure functions, made-up times, no clock."""

from __future__ import annotations

import pytest

from inferd.errors import DeadlineExceeded, SloRefused, Unavailable
from inferd.scheduling.adaptive import (
    ADAPTIVE, FIXED, PROBE_NEAR, Instance, WaitPolicy, admission, completion, deadline_refusal, slo_rows, start,
    wait_until,
)
from inferd.scheduling.estimates import PROBE_EVERY, ArrivalRate, ExecutionModel

US = 1e-6
BOUND = 500 * US
ADAPT = WaitPolicy(ADAPTIVE, BOUND)


def batching_model(a_us: float = 50, c_us: float = 5) -> ExecutionModel:
    """Executions of a + c x rows, seen at several batch sizes."""
    model = ExecutionModel()
    for rows in (1, 4, 16, 64) * 60:  # enough for the early misfits to fade from the spread
        model.observe(rows, (a_us + c_us * rows) * US)
    return model


def busy_rate(gap_us: float = 100, until: float = 0.0) -> ArrivalRate:
    """A row every ``gap_us`` while requests are queued, ending at ``until`` with one queued."""
    rate = ArrivalRate()
    n = 2000
    for i in range(n + 1):
        rate.arrived(until - (n - i) * gap_us * US, 1, queued_before=1)
    return rate


def lone_rate() -> ArrivalRate:
    """A closed loop of one client: requests queued and answered alone for a long while."""
    rate = ArrivalRate()
    t = -1.0
    while t < -0.001:
        rate.arrived(t, 1, queued_before=0)
        rate.queued(t + BOUND, False)  # it waited the whole bound: nobody came
        t += 1000 * US
    return rate


def test_fixed_waits_the_whole_delay_as_triton():
    assert wait_until(WaitPolicy(FIXED, BOUND), 0.0, 1, 1, 100 * US, lone_rate(), batching_model()) == BOUND
    assert wait_until(WaitPolicy(FIXED, BOUND), 0.0, 1, 1, BOUND, busy_rate(), batching_model()) is None


def test_a_lone_request_runs_at_once():
    rate = lone_rate()
    assert rate.informed and not rate.company_last_time
    assert [wait_until(ADAPT, 0.0, seq, 1, 0.0, rate, batching_model()) for seq in range(1, PROBE_EVERY)] == (
        [None] * (PROBE_EVERY - 1))  # but for the probes


def test_under_load_it_waits_as_fixed_does():
    assert wait_until(ADAPT, 0.0, 1, 1, 0.0, busy_rate(gap_us=100), batching_model()) == BOUND
    # Not stopping early because the next row seems late: the whole delay, as fixed.
    assert wait_until(ADAPT, 0.0, 1, 3, 450 * US, busy_rate(gap_us=100, until=450 * US), batching_model()) == BOUND
    assert wait_until(ADAPT, 0.0, 1, 1, BOUND, busy_rate(gap_us=100), batching_model()) is None


def test_company_that_joined_the_last_wait_is_expected_again_until_the_rate_is_informed():
    rate = ArrivalRate()
    rate.arrived(0.0, 1, queued_before=0)
    rate.arrived(100 * US, 1, queued_before=1)  # someone joined
    rate.queued(BOUND, False)
    assert rate.company_last_time and not rate.informed
    assert wait_until(ADAPT, BOUND, 1, 1, BOUND, rate, batching_model()) == 2 * BOUND
    lone = lone_rate()  # informed that nobody comes: one companion once does not make it wait
    lone.arrived(0.0, 1, queued_before=0)
    lone.arrived(100 * US, 1, queued_before=1)
    lone.queued(BOUND, False)
    assert lone.company_last_time and lone.informed
    assert wait_until(ADAPT, BOUND, 1, 1, BOUND, lone, batching_model()) is None


def test_one_lonely_wait_does_not_stop_waiting_under_load():
    rate = busy_rate(gap_us=100)
    rate.queued(0.0, False)
    rate.arrived(0.0, 1, queued_before=0)
    rate.queued(BOUND, False)  # this head waited alone
    assert not rate.company_last_time
    assert wait_until(ADAPT, BOUND, 1, 1, BOUND, rate, batching_model()) == 2 * BOUND


def test_company_slower_than_the_bound_is_not_waited_for():
    rate = busy_rate(gap_us=2000)  # 500 rows/s: one row per 2 ms, the bound is 0.5 ms
    assert wait_until(ADAPT, 0.0, 1, 1, 0.0, rate, batching_model()) is None


def test_with_no_company_expected_a_few_heads_wait_to_find_out():
    fresh = ArrivalRate()
    waits = [wait_until(ADAPT, 0.0, seq, 1, 0.0, fresh, batching_model()) for seq in range(2 * PROBE_EVERY)]
    assert waits.count(BOUND) == 2 and waits.count(None) == 2 * PROBE_EVERY - 2
    lone = lone_rate()  # evidence that nobody comes: still probes
    waits = [wait_until(ADAPT, 0.0, seq, 1, 0.0, lone, batching_model()) for seq in range(2 * PROBE_EVERY)]
    assert waits.count(BOUND) == 2


def test_a_model_whose_time_is_proportional_to_rows_is_not_waited_for_once_that_is_settled():
    proportional = batching_model(a_us=0.1, c_us=100)
    assert proportional.settled
    assert wait_until(ADAPT, 0.0, 1, 8, 0.0, busy_rate(), proportional) is None
    assert wait_until(WaitPolicy(FIXED, BOUND), 0.0, 1, 8, 0.0, busy_rate(), proportional) == BOUND
    few = ExecutionModel()
    for rows in (1, 8):  # two timings fit this line too, but prove nothing
        few.observe(rows, rows * 100 * US)
    assert not few.settled
    assert wait_until(ADAPT, 0.0, 1, 8, 0.0, busy_rate(), few) == BOUND


def test_before_batch_sizes_spread_batching_is_assumed_to_pay():
    singles = ExecutionModel()
    for _ in range(20):
        singles.observe(1, 100 * US)
    assert wait_until(ADAPT, 0.0, 1, 1, 0.0, busy_rate(), singles) is not None


# -- SLO -------------------------------------------------------------------------------------------


def test_an_slo_ends_the_wait_in_time_for_the_batch_to_run():
    model = batching_model(a_us=200, c_us=10)  # 2 rows: 220 us
    slo = WaitPolicy(FIXED, 5000 * US, slo_s=1000 * US)
    assert wait_until(slo, 0.0, 1, 1, 0.0, busy_rate(), model) == pytest.approx((1000 - 220) * US, rel=0.01)
    # Past that point the batch runs at once, whatever the delay allows.
    assert wait_until(slo, 0.0, 1, 1, 900 * US, busy_rate(), model) is None


def test_a_batch_is_cut_to_the_rows_that_fit_the_heads_budget():
    model = batching_model(a_us=100, c_us=10)
    slo = WaitPolicy(ADAPTIVE, BOUND, slo_s=1000 * US)
    rows = [16, 16, 16, 16, 16]  # 80 rows: 900 us; the head waited 300 us: 700 us left -> 48 rows (580 us)
    assert slo_rows(slo, 0.0, 300 * US, rows, model) == 3
    assert slo_rows(slo, 0.0, 0.0, rows, model) == 5
    assert slo_rows(slo, 0.0, 990 * US, rows, model) == 1  # the head runs anyway
    assert slo_rows(ADAPT, 0.0, 990 * US, rows, model) == 5  # no SLO: the whole batch


def test_completion_runs_the_rows_ahead_in_full_batches_on_the_instances_as_they_free():
    model = batching_model(a_us=100, c_us=10)  # a full batch of 64: 740 us
    one = [Instance(0.0, model)]
    assert completion(0.0, 0, 1, 64, one) == pytest.approx(110 * US, rel=0.01)
    assert completion(0.0, 127, 1, 64, one) == pytest.approx(2 * 740 * US, rel=0.01)
    busy = [Instance(500 * US, model)]  # executing until 500 us
    assert completion(0.0, 0, 1, 64, busy) == pytest.approx(610 * US, rel=0.01)
    two = [Instance(0.0, model), Instance(0.0, model)]
    assert completion(0.0, 127, 1, 64, two) == pytest.approx(740 * US, rel=0.01)


def test_a_request_that_cannot_meet_the_slo_is_refused_with_the_estimate():
    model = batching_model(a_us=100, c_us=10)
    slo = WaitPolicy(ADAPTIVE, BOUND, slo_s=2000 * US)
    instances = [Instance(0.0, model)]
    assert admission(slo, "mlp", 0.0, 64, 1, 64, instances) is None  # 2 batches: 850 us
    refused = admission(slo, "mlp", 0.0, 64 * 3, 1, 64, instances)  # 3 full batches and its own: 2330 us
    assert isinstance(refused, SloRefused) and isinstance(refused, Unavailable)
    assert refused.message.startswith(
        "model 'mlp': request refused: it cannot meet the latency SLO of 2000 us (inferd.max_latency_microseconds): "
        "estimated 2330 us to answer it")
    assert "192 rows queued ahead of it, about 740 us per batch of 64 rows on 1 instance" in refused.message
    assert admission(ADAPT, "mlp", 0.0, 10_000, 1, 64, instances) is None  # no SLO: no admission control


def test_a_very_long_queue_is_estimated_without_simulating_every_batch():
    model = batching_model(a_us=100, c_us=10)
    estimate = completion(0.0, 64 * 10_000, 1, 64, [Instance(0.0, model)])
    assert estimate == pytest.approx(10_000 * 740 * US, rel=0.01)


def test_after_a_lull_under_load_heads_probe_more_often():
    rate = busy_rate(gap_us=1200)  # ~0.4 rows per 500 us delay: nearly expected
    waits = [wait_until(ADAPT, 0.0, seq, 1, 0.0, rate, batching_model()) for seq in range(16)]
    assert waits.count(BOUND) == 16 // PROBE_NEAR


def test_a_request_with_nothing_ahead_and_an_instance_free_is_admitted_whatever_the_estimate():
    slow = batching_model(a_us=50_000, c_us=0)  # 50 ms a batch: far past a 20 ms SLO
    slo = WaitPolicy(ADAPTIVE, BOUND, slo_s=20_000 * US)
    assert admission(slo, "m", 0.0, 0, 1, 64, [Instance(0.0, slow)]) is None
    assert admission(slo, "m", 0.0, 0, 1, 64, [Instance(0.01, slow)]) is not None  # it would wait for it


def test_the_slo_counts_the_time_a_request_waited_before_its_queue():
    model = batching_model(a_us=100, c_us=10)
    slo = WaitPolicy(ADAPTIVE, BOUND, slo_s=2000 * US)
    instances = [Instance(0.0, model)]
    assert admission(slo, "mlp", 0.0, 64, 1, 64, instances) is None  # 850 us of 2000
    refused = admission(slo, "mlp", 0.0, 64, 1, 64, instances, waited=1500 * US)  # 850 + 1500 waited
    assert isinstance(refused, SloRefused)
    assert "estimated 2350 us to answer it (1500 us waited since its frontend received it" in refused.message


# -- deadlines and queue timeouts at admission (issue 42) ---------------------------------------------------


def spread_model(a_us: float = 100, c_us: float = 10) -> ExecutionModel:
    """A model whose executions miss their line (alternately 20% over and under): its upper estimate
    is well above its expected time."""
    model = ExecutionModel()
    for i, rows in enumerate((1, 4, 16, 64) * 60):
        model.observe(rows, (a_us + c_us * rows) * US * (1.2 if i % 2 else 0.8))
    return model


def test_a_deadline_that_already_passed_is_refused_deadline_exceeded_and_not_run():
    refused = deadline_refusal("m", 1.0, 0.999, None, 0, 1, 64, [])
    assert isinstance(refused, DeadlineExceeded)
    assert refused.message == "model 'm': the request's deadline passed 1000 us before it reached the model's queue; it was not run"


def test_a_queue_timeout_that_already_passed_is_refused_unavailable():
    refused = deadline_refusal("m", 1.0, None, 0.9995, 0, 1, 64, [])
    assert isinstance(refused, Unavailable) and "its queue timeout passed 500 us ago; it was not run" in refused.message


def test_a_deadline_the_queue_ahead_cannot_meet_is_refused_with_the_estimate():
    model = batching_model(a_us=100, c_us=10)  # a full batch of 64: 740 us
    one = [Instance(0.0, model)]
    assert deadline_refusal("mlp", 0.0, 2000 * US, None, 64, 1, 64, one) is None  # 850 us of 2000
    refused = deadline_refusal("mlp", 0.0, 2000 * US, None, 64 * 3, 1, 64, one)  # 2330 us
    assert isinstance(refused, Unavailable) and not isinstance(refused, DeadlineExceeded)
    assert refused.message.startswith("model 'mlp': request refused: its deadline cannot be met: estimated 2330 us "
                                      "to answer it, 2000 us left (192 rows queued ahead of it, about 740 us per "
                                      "batch of 64 rows on 1 instance); retry later or elsewhere")


def test_a_deadline_is_refused_on_the_expected_time_not_the_upper_estimate_an_slo_plans_with():
    model = spread_model()
    one = [Instance(0.0, model)]
    expected, upper = completion(0.0, 64, 1, 64, one, expected=True), completion(0.0, 64, 1, 64, one)
    assert expected < upper
    deadline = (expected + upper) / 2  # the budget's view misses it, the expectation makes it
    assert deadline_refusal("m", 0.0, deadline, None, 64, 1, 64, one) is None


def test_a_queue_timeout_the_queue_ahead_cannot_meet_is_refused_when_no_instance_would_take_it_in_time():
    model = batching_model(a_us=100, c_us=10)
    one = [Instance(0.0, model)]
    assert start(0.0, 128, 64, one) == pytest.approx(2 * 740 * US, rel=0.01)  # after two full batches
    assert deadline_refusal("m", 0.0, None, 1500 * US, 128, 1, 64, one) is None
    refused = deadline_refusal("m", 0.0, None, 1400 * US, 128, 1, 64, one)
    assert isinstance(refused, Unavailable)
    assert "it cannot start within its queue timeout: estimated 1480 us until an instance takes it, 1400 us left" \
        in refused.message
    two = [Instance(0.0, model), Instance(0.0, model)]  # the second instance takes it after one batch
    assert deadline_refusal("m", 0.0, None, 1400 * US, 128, 1, 64, two) is None


def test_nothing_ahead_and_an_instance_free_is_admitted_whatever_the_estimates_or_none_at_all():
    slow = batching_model(a_us=50_000, c_us=0)
    assert deadline_refusal("m", 0.0, 0.001, 0.001, 0, 1, 64, [Instance(0.0, slow)]) is None
    assert deadline_refusal("m", 0.0, 0.001, None, 0, 1, 64, [Instance(0.01, slow)]) is not None  # it would wait
    assert deadline_refusal("m", 0.0, 0.001, 0.001, 10_000, 1, 64, []) is None  # no estimates: no refusal
    cold = [Instance(0.0, ExecutionModel())]  # never executed: expected 0 s, nothing to refuse on
    assert deadline_refusal("m", 0.0, 0.001, 0.001, 10_000, 1, 64, cold) is None


def test_a_deadline_far_beyond_any_simulated_completion_is_admitted_without_simulating(monkeypatch):
    from inferd.scheduling import adaptive

    model = batching_model(a_us=100, c_us=10)
    one = [Instance(0.0, model)]

    def simulated(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("simulated")

    monkeypatch.setattr(adaptive, "_simulate", simulated)
    assert deadline_refusal("m", 0.0, 120.0, 60.0, 10_000, 1, 64, one) is None  # ~0.12 s of work ahead
    with pytest.raises(AssertionError, match="simulated"):  # a close call is simulated
        deadline_refusal("m", 0.0, 0.1, None, 10_000, 1, 64, one)

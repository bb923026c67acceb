"""The online estimates (inferd.scheduling.estimates), fed made-up times."""

from __future__ import annotations

import pytest

from inferd.scheduling.estimates import ArrivalRate, ExecutionModel

US = 1e-6


def closed_loop_of_one(rate: ArrivalRate, n: int = 50, rtt: float = 400 * US) -> float:
    """One client: each request is queued, answered, and the next comes after it."""
    t = 0.0
    for _ in range(n):
        rate.arrived(t, 1, queued_before=0)
        rate.queued(t + 50 * US, False)
        t += rtt
    return t


def steady(rate: ArrivalRate, n: int, t: float = 0.0, rows: int = 1, gap: float = 100 * US,
           queued_before: int = 1) -> float:
    """``n`` requests of ``rows`` rows, one every ``gap`` seconds from ``t``, each finding others queued."""
    for _ in range(n):
        rate.arrived(t, rows, queued_before=queued_before)
        t += gap
    return t


def test_company_is_learned_from_arrivals_while_requests_are_queued():
    rate = ArrivalRate()
    t = steady(rate, 200, queued_before=3)  # a new row every 100 us, the queue never empty
    assert rate.rate(t) == pytest.approx(10_000, rel=0.1)


def test_a_lone_client_brings_no_company_whatever_its_overall_rate():
    rate = ArrivalRate()
    t = closed_loop_of_one(rate)
    assert rate.rate(t) == 0.0  # 2500 requests/s overall, none while another waited


def test_rows_count_not_requests():
    rate = ArrivalRate()
    t = steady(rate, 200, rows=4)
    assert rate.rate(t) == pytest.approx(40_000, rel=0.1)


def test_company_that_stops_coming_is_forgotten():
    rate = ArrivalRate(horizon_s=0.01)
    t = steady(rate, 100)
    busy = rate.rate(t)
    # Then requests wait with nobody joining them: 40 ms queued (4 horizons), no arrival.
    for _ in range(80):
        rate.arrived(t, 1, queued_before=0)
        rate.queued(t + 500 * US, False)
        t += 1000 * US
    assert rate.rate(t) < busy / 20


def test_the_rate_falls_while_a_queued_request_waits_alone():
    rate = ArrivalRate()
    t = steady(rate, 50, gap=200 * US)
    before = rate.rate(t)
    assert rate.rate(t + 0.002) < before  # queued time passes, no one comes


def test_the_rate_is_informed_after_half_a_horizon_of_queued_time():
    rate = ArrivalRate(horizon_s=0.01)
    t = steady(rate, 40)  # 4 ms queued
    assert not rate.informed
    steady(rate, 100, t)  # 10 ms more
    assert rate.informed


# -- execution model ------------------------------------------------------------------


def test_a_line_is_fitted_once_batch_sizes_spread():
    model = ExecutionModel()
    for rows in [1, 8, 16, 32, 64] * 20:
        model.observe(rows, 100 * US + rows * 10 * US)
    a, c = model.coefficients()  # type: ignore[misc]
    assert a == pytest.approx(100 * US, rel=1e-3) and c == pytest.approx(10 * US, rel=1e-3)
    assert model.predict(40) == pytest.approx(500 * US, rel=1e-3)
    assert model.fixed_cost() == pytest.approx(100 * US, rel=1e-3)


def test_one_batch_size_scales_up_proportionally_and_down_flat():
    model = ExecutionModel()
    for _ in range(10):
        model.observe(4, 400 * US)
    assert model.coefficients() is None and model.fixed_cost() is None
    assert model.predict(8) == pytest.approx(800 * US)
    assert model.predict(1) == pytest.approx(400 * US)
    assert ExecutionModel().predict(8) == 0.0


def test_the_model_follows_a_machine_that_slows_down():
    model = ExecutionModel(decay=0.1)
    for rows in [1, 64] * 50:
        model.observe(rows, rows * 10 * US)
    for rows in [1, 64] * 50:
        model.observe(rows, rows * 30 * US)
    assert model.predict(64) == pytest.approx(64 * 30 * US, rel=0.05)


def test_upper_covers_the_usual_spread():
    steady, noisy = ExecutionModel(), ExecutionModel()
    for i in range(100):
        steady.observe(8, 800 * US)
        noisy.observe(8, (600 if i % 2 else 1000) * US)
    assert steady.upper(8) == pytest.approx(800 * US)
    assert noisy.upper(8) > 1000 * US


def test_negative_slopes_from_noise_are_clamped():
    model = ExecutionModel()
    for rows, t in [(1, 300), (32, 200)] * 10:
        model.observe(rows, t * US)
    a, c = model.coefficients()  # type: ignore[misc]
    assert c == 0.0 and a == pytest.approx(250 * US, rel=0.05)  # the (weighted) mean


def test_one_stalled_execution_moves_the_estimate_by_a_bounded_step():
    model = ExecutionModel()
    for _ in range(50):
        model.observe(1, 100 * US)
    model.observe(1, 40_000 * US)  # a 40 ms stall of a 0.1 ms model
    assert model.predict(1) < 130 * US
    assert model.upper(1) < 300 * US

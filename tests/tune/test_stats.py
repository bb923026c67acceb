"""inferd.tune.stats: the signed-rank interval and Hodges–Lehmann estimate decisions rest on."""

from __future__ import annotations

import math
import random

import pytest

from inferd.tune.stats import MIN_PAIRS, coverage, hodges_lehmann, median, signed_rank_critical


def test_the_critical_values_are_the_signed_rank_tables() -> None:
    # Two-sided 90% (alpha 0.05 each side): the published critical values T are k - 1.
    assert [signed_rank_critical(n, 0.90) - 1 for n in (5, 6, 7, 8, 9, 10, 20)] == [0, 2, 3, 5, 8, 10, 60]
    assert signed_rank_critical(4, 0.90) == 0  # 1/16 per side: 90% cannot be reached with 4 pairs
    assert MIN_PAIRS == 5
    assert coverage(5, 1) == pytest.approx(1 - 2 / 32)
    assert all(coverage(n, signed_rank_critical(n, 0.90)) >= 0.90 for n in range(5, 40))


def test_too_few_values_give_an_unbounded_interval() -> None:
    est = hodges_lehmann([0.1, 0.2, 0.05, 0.15], 0.90)
    assert not est.bounded and math.isinf(est.low) and est.coverage == 0.0
    assert hodges_lehmann([0.1, 0.2, 0.05, 0.15, 0.12], 0.90).bounded


def test_the_estimate_shrugs_off_a_wild_round_that_moves_the_mean() -> None:
    rng = random.Random(1)
    values = [rng.gauss(0.1, 0.05) for _ in range(15)]
    wild = values + [-1.2]  # one round at 0.3x its neighbours, as this host produces
    assert abs(hodges_lehmann(wild).estimate - hodges_lehmann(values).estimate) < 0.02
    assert abs(sum(wild) / len(wild) - sum(values) / len(values)) > 0.07
    est = hodges_lehmann(wild)
    assert est.low > 0 and est.low < est.estimate < est.high


def test_the_interval_covers_the_centre_as_often_as_it_says() -> None:
    rng = random.Random(7)
    hits = sum(1 for _ in range(400) if (lambda e: e.low <= 0.05 <= e.high)(
        hodges_lehmann([rng.gauss(0.05, 0.2) for _ in range(12)], 0.90)))
    assert 0.86 * 400 <= hits <= 0.97 * 400


def test_median() -> None:
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5
    with pytest.raises(ValueError):
        median([])

"""The report's statistics against values worked out by hand."""

from __future__ import annotations

import pytest

from runs.experiments import stats


def test_it_takes_quantiles_by_linear_interpolation():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert stats.p50(values) == 5.5
    assert stats.p95(values) == pytest.approx(9.55)
    assert stats.mean(values) == 5.5


def test_it_refuses_statistics_of_nothing_or_nan():
    with pytest.raises(ValueError, match="no values"):
        stats.p50([])
    with pytest.raises(ValueError, match="finite"):
        stats.mean([1.0, float("nan")])
    with pytest.raises(ValueError, match="between 0 and 1"):
        stats.quantile([1.0], 1.5)


def test_it_bootstraps_the_same_interval_for_the_same_seed_and_brackets_the_mean():
    values = [0.8, 1.1, 0.9, 1.3, 1.0, 0.95, 1.2, 1.05]
    one = stats.bootstrap_mean(values)
    assert one == stats.bootstrap_mean(values)
    assert one["low"] < one["value"] < one["high"]
    assert one["value"] == pytest.approx(sum(values) / len(values))
    # A sample of constants has no spread to resample.
    assert stats.bootstrap_mean([2.0, 2.0, 2.0]) == {"value": 2.0, "low": 2.0, "high": 2.0}
    assert stats.bootstrap_mean([3.0]) == {"value": 3.0, "low": 3.0, "high": 3.0}


def test_it_narrows_the_interval_as_the_sample_grows():
    import random

    rng = random.Random(4)
    small = [rng.gauss(10, 2) for _ in range(10)]
    large = [rng.gauss(10, 2) for _ in range(400)]
    width = lambda i: i["high"] - i["low"]  # noqa: E731
    assert width(stats.bootstrap_mean(large)) < width(stats.bootstrap_mean(small)) / 3


def test_it_gives_a_ratio_of_medians_with_its_interval():
    ratio = stats.bootstrap_ratio([2.0, 2.2, 1.8, 2.0], [1.0, 1.1, 0.9, 1.0])
    assert ratio["value"] == pytest.approx(2.0)
    assert ratio["low"] <= 2.0 <= ratio["high"]
    with pytest.raises(ValueError, match="zero"):
        stats.bootstrap_ratio([1.0], [0.0])


def test_it_prices_a_solved_task_as_total_cost_over_solved_runs():
    cost = stats.bootstrap_sum_ratio([1.0, 1.0, 1.0, 1.0], [True, False, True, False])
    assert cost["value"] == 2.0
    assert cost["low"] <= 2.0 <= cost["high"]
    with pytest.raises(ValueError, match="unbounded"):
        stats.bootstrap_sum_ratio([1.0, 2.0], [False, False])


def test_it_gives_wilson_intervals_that_stay_inside_zero_and_one():
    # Worked by hand: 0 of 5 at z=1.96 is [0, z^2/(n+z^2)] = [0, 0.4345].
    zero = stats.wilson(0, 5)
    assert zero["value"] == 0 and zero["low"] == 0
    assert zero["high"] == pytest.approx(0.4345, abs=1e-3)
    full = stats.wilson(5, 5)
    assert full["high"] == 1 and full["low"] == pytest.approx(0.5655, abs=1e-3)
    half = stats.wilson(50, 100)
    assert half["low"] == pytest.approx(0.4038, abs=1e-3)
    assert half["high"] == pytest.approx(0.5962, abs=1e-3)
    with pytest.raises(ValueError, match="no trials"):
        stats.wilson(0, 0)


def test_it_gives_a_difference_of_means_with_an_interval_excluding_zero_when_clear():
    before = [10.0, 10.5, 9.5, 10.2, 9.8, 10.1]
    after = [8.0, 8.2, 7.9, 8.1, 7.8, 8.3]
    delta = stats.difference_interval(before, after)
    assert delta["value"] == pytest.approx(sum(after) / 6 - sum(before) / 6)
    assert delta["high"] < 0

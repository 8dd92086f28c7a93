"""The statistics of an experiment's report: quantiles, means with seeded bootstrap 95%
intervals, ratios of two samples' statistics, and Wilson intervals for proportions. Seeded,
so the same runs give the same report."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypedDict

import numpy as np

RESAMPLES = 2000
SEED = 20_261_126
Z95 = 1.959963984540054


class Interval(TypedDict):
    value: float
    low: float
    high: float


def _clean(values: Sequence[float]) -> np.ndarray:
    array = np.asarray([float(v) for v in values if v is not None], dtype=float)
    if array.size and not np.all(np.isfinite(array)):
        raise ValueError("statistics need finite numbers; got NaN or infinity")
    return array


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (linear interpolation between order statistics, as numpy's default)."""
    if not 0 <= q <= 1:
        raise ValueError(f"a quantile is between 0 and 1, got {q}")
    array = _clean(values)
    if not array.size:
        raise ValueError("a quantile of no values is undefined")
    return float(np.quantile(array, q))


def p50(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def p95(values: Sequence[float]) -> float:
    return quantile(values, 0.95)


def mean(values: Sequence[float]) -> float:
    array = _clean(values)
    if not array.size:
        raise ValueError("a mean of no values is undefined")
    return float(array.mean())


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


def bootstrap(
    values: Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.mean,  # type: ignore[assignment]
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
    level: float = 0.95,
) -> Interval:
    """The statistic of `values` with its percentile bootstrap interval. One value gives a
    zero-width interval: there is nothing to resample, and the report says n beside it."""
    array = _clean(values)
    if not array.size:
        raise ValueError("a bootstrap of no values is undefined")
    value = float(statistic(array))
    if array.size == 1:
        return {"value": value, "low": value, "high": value}
    picks = _rng(seed).integers(0, array.size, size=(resamples, array.size))
    stats = np.array([statistic(array[row]) for row in picks], dtype=float)
    tail = (1 - level) / 2
    low, high = np.quantile(stats, [tail, 1 - tail])
    return {"value": value, "low": float(low), "high": float(high)}


def bootstrap_mean(values: Sequence[float], *, seed: int = SEED) -> Interval:
    return bootstrap(values, np.mean, seed=seed)  # type: ignore[arg-type]


def bootstrap_ratio(
    numerator: Sequence[float],
    denominator: Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.median,  # type: ignore[assignment]
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """statistic(numerator) / statistic(denominator), each sample resampled on its own
    (two independent sets of runs), with its percentile 95% interval."""
    top, bottom = _clean(numerator), _clean(denominator)
    if not top.size or not bottom.size:
        raise ValueError("a ratio needs values on both sides")
    base = float(statistic(bottom))
    if base == 0:
        raise ValueError("a ratio to a statistic of zero is undefined")
    value = float(statistic(top)) / base
    rng = _rng(seed)
    tops = rng.integers(0, top.size, size=(resamples, top.size))
    bottoms = rng.integers(0, bottom.size, size=(resamples, bottom.size))
    ratios = []
    for i in range(resamples):
        b = float(statistic(bottom[bottoms[i]]))
        if b != 0:
            ratios.append(float(statistic(top[tops[i]])) / b)
    low, high = np.quantile(np.array(ratios), [0.025, 0.975]) if ratios else (value, value)
    return {"value": value, "low": float(low), "high": float(high)}


def bootstrap_sum_ratio(
    numerator: Sequence[float],
    solved: Sequence[bool],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Interval:
    """sum(numerator) / count(solved) over the same runs (cost per solved task), resampling
    runs as pairs. Raises when no run solved its task: the cost per solved task is then
    infinite and the report says so instead of a number."""
    values, wins = _clean(numerator), np.asarray(list(solved), dtype=bool)
    if values.size != wins.size:
        raise ValueError("one solved flag per value")
    if not wins.any():
        raise ValueError("no run solved its task: the cost per solved task is unbounded")
    value = float(values.sum() / wins.sum())
    picks = _rng(seed).integers(0, values.size, size=(resamples, values.size))
    ratios = [values[row].sum() / wins[row].sum() for row in picks if wins[row].any()]
    low, high = np.quantile(np.array(ratios, dtype=float), [0.025, 0.975])
    return {"value": value, "low": float(low), "high": float(high)}


def wilson(successes: int, trials: int, *, z: float = Z95) -> Interval:
    """A proportion with its Wilson score interval (sound at 0 and at n: the interval of
    0 of 5 is [0, 0.43], not [0, 0])."""
    if trials <= 0:
        raise ValueError("a proportion of no trials is undefined")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be between 0 and {trials}, got {successes}")
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    return {"value": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half)}


def difference_interval(
    before: Sequence[float], after: Sequence[float], *, seed: int = SEED
) -> Interval:
    """mean(after) - mean(before) with a bootstrap 95% interval (independent samples)."""
    a, b = _clean(before), _clean(after)
    if not a.size or not b.size:
        raise ValueError("a difference needs values on both sides")
    value = float(b.mean() - a.mean())
    rng = _rng(seed)
    deltas = [
        b[rng.integers(0, b.size, b.size)].mean() - a[rng.integers(0, a.size, a.size)].mean()
        for _ in range(RESAMPLES)
    ]
    low, high = np.quantile(np.array(deltas), [0.025, 0.975])
    return {"value": value, "low": float(low), "high": float(high)}

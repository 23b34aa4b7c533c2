"""The confidence intervals of the deltas against the baseline: a percentile bootstrap for latency percentiles (drawn
from order-statistic distributions, O(resamples) per interval) and the delta method for ratios of sums (the prefix
cache hit rate)."""

from __future__ import annotations

import math

import numpy as np

from tracebench.report.metrics.definitions import CI_LEVEL


def bootstrap_percentile(sorted_values: np.ndarray, q: float, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`resamples` draws of the linear-interpolation q-percentile of a bootstrap resample (n draws with replacement)
    of `sorted_values`, without materialising the resamples.

    A draw with replacement is x[ceil(n*U) - 1] with U uniform, a non-decreasing map of U; so the k-th smallest of
    n draws is x[ceil(n*U_(k)) - 1] where U_(k), the k-th smallest of n uniforms, is Beta(k, n+1-k). The next order
    statistic is U_(k+1) = U_(k) + (1 - U_(k)) * Beta(1, n-k). This is the same distribution as resampling the
    requests and taking the percentile, at O(resamples) cost instead of O(resamples * n)."""
    n = sorted_values.size
    h = (n - 1) * q
    j = int(math.floor(h))
    frac = h - j

    def pick(u: np.ndarray) -> np.ndarray:
        return sorted_values[np.clip(np.ceil(u * n).astype(np.int64), 1, n) - 1]

    u_low = rng.beta(j + 1, n - j, resamples)
    low = pick(u_low)
    if frac == 0.0 or j + 1 >= n:
        return low
    u_high = u_low + (1.0 - u_low) * rng.beta(1, n - j - 1, resamples)
    return low + frac * (pick(u_high) - low)


def bootstrap_ci(
    run_sorted: np.ndarray, base_sorted: np.ndarray, q: float, resamples: int, seed: list[int]
) -> tuple[float, float] | None:
    """95% percentile-bootstrap interval of percentile_q(run) - percentile_q(baseline). None with < 2 values."""
    if resamples <= 0 or run_sorted.size < 2 or base_sorted.size < 2:
        return None
    rng = np.random.default_rng(seed)
    diff = bootstrap_percentile(run_sorted, q, resamples, rng) - bootstrap_percentile(base_sorted, q, resamples, rng)
    tail = (1.0 - CI_LEVEL) / 2 * 100
    low, high = np.percentile(diff, [tail, 100 - tail])
    return float(low), float(high)


def percentile_ci(sorted_values: np.ndarray, q: float, resamples: int, seed: list[int]) -> tuple[float, float] | None:
    """95% percentile-bootstrap interval of one run's q-percentile. None with < 2 values or no resamples."""
    if resamples <= 0 or sorted_values.size < 2:
        return None
    draws = bootstrap_percentile(sorted_values, q, resamples, np.random.default_rng(seed))
    tail = (1.0 - CI_LEVEL) / 2 * 100
    low, high = np.percentile(draws, [tail, 100 - tail])
    return float(low), float(high)


def ratio_ci(run: tuple[np.ndarray, np.ndarray], base: tuple[np.ndarray, np.ndarray]) -> tuple[float, float] | None:
    """95% interval of sum(num)/sum(den) of `run` minus that of `base` ((num, den) per request), by the delta method:
    var(R) ~ var(num - R den) / (n mean(den)^2). None with < 2 requests or no denominator."""
    z = 1.959963984540054  # two-sided 95% normal quantile
    parts = []
    for num, den in (run, base):
        if num.size < 2 or den.sum() <= 0:
            return None
        ratio = num.sum() / den.sum()
        resid = num - ratio * den
        parts.append((ratio, resid.var(ddof=1) / (num.size * den.mean() ** 2)))
    diff = parts[0][0] - parts[1][0]
    half = z * math.sqrt(parts[0][1] + parts[1][1])
    return float(diff - half), float(diff + half)

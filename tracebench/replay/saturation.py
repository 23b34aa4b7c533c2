"""Over-saturation: the run stops early when requests arrive faster than the servers finish them, for good.

When the offered rate is above what the servers can serve, the requests outstanding (arrived, not finished) grow
without bound, and every latency measured then depends only on how long the run went on: numbers without meaning.
The watcher samples two counts of the run, requests arrived and requests finished, SAMPLES_PER_WINDOW times per
window of W run seconds (`--saturation-window`, given in trace seconds), and declares the run over-saturated when all
of these hold (docs/sweep.md, "When a point is over-saturated"):

1. growth: over the last window the least-squares slope of the outstanding count is positive with 95% confidence
   (its t interval, n - 2 degrees of freedom, widened by (1 + rho) / (1 - rho) for the lag-1 autocorrelation rho of
   the residuals: a queue's count is autocorrelated, and the plain interval would be far too narrow);
2. a material shortfall: the rise that slope gives over the window, slope x W, is at least MIN_RISE requests and
   at least MIN_SHORTFALL of the requests that arrived in the window;
3. a lasting shortfall: the window before it too finished less than (1 - MIN_SHORTFALL) of what arrived in it, and
   at least MIN_COMPLETIONS requests (the servers were serving, not still filling up at the start of the run);
4. persistence: 1-3 hold at PERSIST consecutive samples (a quarter of a window); nothing is judged before the run
   has gone two windows.

Why not "while throughput stays flat" (guidellm's detector also watches TTFT growing): with continuous batching the
throughput of an overloaded server keeps rising as its batch grows, until its KV cache is full. Where the rule fires
on the simulator, by load, is measured by bench/bench_saturation.py (table in docs/sweep.md): with W = 10 s never at
0.9 x capacity or below, always at 1.25 x or above (at 22 s: two windows and the persistence), a toss-up in between.
Overload milder than that, or a run whose servers finish fewer than MIN_COMPLETIONS requests a window, is not
stopped: it runs to its end and reports its (high) latencies. A request that takes longer than W to finish looks
like a shortfall while the run fills up: choose W above the run's typical total latency (the default 10 s of
`tracebench sweep` fits a few hundred output tokens on llama-2-7b).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracebench.replay.clock import RunClock, ticks

SAMPLES_PER_WINDOW = 20
RULE = ("Over-saturated (the run stops; requests never sent are recorded not_sent, those in flight cancelled): "
        "sampled 20 times per window of W seconds (--saturation-window), the requests outstanding (arrived, not "
        "finished) grow over the last window with a least-squares slope whose 95% interval (widened for the "
        "residuals' lag-1 autocorrelation) is above 0; that slope's rise over the window is >= 8 requests and >= 15% "
        "of the window's arrivals; the window before also finished < 85% of its arrivals and >= 10 requests; all of "
        "it at 5 consecutive samples (nothing is judged before two windows).")
MIN_SAMPLES = 10  # fewer samples in the window (a stalled loop): no verdict
MIN_RISE = 8  # requests
MIN_SHORTFALL = 0.15  # of the requests that arrived in the window
MIN_COMPLETIONS = 10  # in the window before: fewer and the servers have not started finishing
PERSIST = SAMPLES_PER_WINDOW // 4
Z_975 = 1.959963984540054


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with `df` degrees of freedom, by the Cornish-Fisher expansion around the
    normal quantile (Abramowitz & Stegun 26.7.5; within 0.3% of the exact value for df >= 8)."""
    z = Z_975
    return (z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)
            + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * df**3))


MAX_LAG1 = 0.95  # the residuals' lag-1 autocorrelation is taken at most this (inflation at most 39)


def ar1_inflation(xs: list[float], ys: list[float], slope: float) -> float:
    """How much wider the slope's variance is when the residuals are autocorrelated (a queue's count is): with
    lag-1 autocorrelation rho of the residuals (an AR(1) approximation), (1 + rho) / (1 - rho); 1 when rho <= 0."""
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    res = [y - mean_y - slope * (x - mean_x) for x, y in zip(xs, ys)]
    denom = sum(r * r for r in res)
    if denom <= 0:
        return 1.0
    rho = min(max(sum(a * b for a, b in zip(res, res[1:])) / denom, 0.0), MAX_LAG1)
    return (1 + rho) / (1 - rho)


@dataclass(frozen=True)
class Saturation:
    """Why the watcher declared the run over-saturated. Times in run seconds, rates per run second."""

    t: float
    window: float
    slope: float  # outstanding requests per second, least squares over the window
    slope_low: float  # lower end of its 95% interval
    rise: float  # slope x window
    arrived: int  # requests that arrived in the window
    outstanding: int  # arrived, not finished, at t
    previous_rate: float  # completions per second in the window before
    rate: float  # completions per second in the window

    def describe(self, speed: float | None) -> str:
        """One line in trace seconds (run seconds x K at --speed K)."""
        k = speed or 1.0
        return (f"over-saturated at {self.t * k:.1f} s: over the last {self.window * k:.3g} s the outstanding requests "
                f"grew by {self.rise:.0f} (slope {self.slope / k:.2f}/s, 95% interval from {self.slope_low / k:.2f}/s), "
                f"{self.rise / max(self.arrived, 1):.0%} of the window's {self.arrived} arrivals left behind, and the "
                f"window before fell short too (completions {self.previous_rate / k:.2f} then {self.rate / k:.2f} "
                f"req/s); {self.outstanding} outstanding")

    def to_json(self, speed: float | None) -> dict[str, Any]:
        """For run.json, in trace seconds like every other option-facing time there."""
        k = speed or 1.0
        return {"t": self.t * k, "slope_per_s": self.slope / k, "slope_low_per_s": self.slope_low / k,
                "rise": self.rise, "arrived_in_window": self.arrived, "outstanding": self.outstanding,
                "completions_per_s": [self.previous_rate / k, self.rate / k]}


class SaturationWatch:
    """The rule of the module docstring, fed one sample at a time (pure: testable without a run)."""

    def __init__(self, window: float) -> None:
        if not window > 0:
            raise ValueError(f"saturation window must be > 0, got {window}")
        self.window = window
        self.interval = window / SAMPLES_PER_WINDOW
        self._samples: deque[tuple[float, int, int]] = deque()  # (t, arrived, finished) over two windows
        self._streak = 0

    def sample(self, t: float, arrived: int, finished: int) -> Saturation | None:
        """Add the counts at run time t (non-decreasing); the verdict once the rule has held PERSIST samples."""
        samples = self._samples
        samples.append((t, arrived, finished))
        while samples[0][0] < t - 2 * self.window - 1e-9:
            samples.popleft()
        found = self._check(t) if t >= 2 * self.window else None
        self._streak = self._streak + 1 if found is not None else 0
        return found if self._streak >= PERSIST else None

    def _check(self, t: float) -> Saturation | None:
        start = t - self.window - 1e-9
        samples = [s for s in self._samples if s[0] >= start]
        n = len(samples)
        if n < MIN_SAMPLES:
            return None
        xs = [s[0] for s in samples]
        ys = [s[1] - s[2] for s in samples]
        mean_x, mean_y = sum(xs) / n, sum(ys) / n
        sxx = sum((x - mean_x) ** 2 for x in xs)
        if sxx <= 0:
            return None
        sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
        syy = sum((y - mean_y) ** 2 for y in ys)
        slope = sxy / sxx
        residual = max(syy - slope * sxy, 0.0) / (n - 2)
        slope_low = slope - t_quantile_975(n - 2) * math.sqrt(residual / sxx * ar1_inflation(xs, ys, slope))
        span = xs[-1] - xs[0]
        rise = slope * span
        arrived = samples[-1][1] - samples[0][1]
        if slope_low <= 0 or rise < max(MIN_RISE, MIN_SHORTFALL * arrived):
            return None
        before = self._samples[0]  # a window before the window's first sample (or as near as the ticks came)
        previous_span = xs[0] - before[0]
        previous, current = samples[0][2] - before[2], samples[-1][2] - samples[0][2]
        previous_arrived = samples[0][1] - before[1]
        if (previous < MIN_COMPLETIONS or previous_span < span / 2
                or previous_arrived - previous < MIN_SHORTFALL * previous_arrived):
            return None
        return Saturation(
            t=t, window=span, slope=slope, slope_low=slope_low, rise=rise, arrived=arrived,
            outstanding=samples[-1][1] - samples[-1][2],
            previous_rate=previous / previous_span, rate=current / span,
        )


async def watch_saturation(watch: SaturationWatch, clock: RunClock, arrived: Callable[[], int],
                           finished: Callable[[], int], on_saturated: Callable[[Saturation], None]) -> None:
    """Sample every watch.interval run seconds (absolute ticks, like the load poller) until the rule holds, then
    hand the verdict to `on_saturated` (which ends the run) and return."""
    async for now in ticks(clock, watch.interval, first=1):
        verdict = watch.sample(now, arrived(), finished())
        if verdict is not None:
            on_saturated(verdict)
            return

"""Arrival processes: when requests reach the router.

Every process has mean rate `rate` (requests/s); they differ in how the gaps between arrivals vary:
- poisson: exponential gaps (coefficient of variation of the gaps, CV = 1);
- gamma: gamma-distributed gaps with CV = `burstiness` (shape k = 1/burstiness**2, scale = 1/(rate*k));
  burstiness 1 is Poisson, above 1 requests come in bursts separated by long pauses, below 1 more regular;
- constant: every gap is exactly 1/rate (CV = 0).

The first request arrives at 0; request i arrives after the sum of the first i gaps. Everything is vectorised numpy
drawn from the Generator passed in, so the same seed gives the same arrivals.
"""

from __future__ import annotations

import math

import numpy as np

from tracebench.errors import ConfigError

ARRIVAL_KINDS = ("poisson", "gamma", "constant")

# A trace this long is a typo, not a benchmark (and would not fit in memory).
MAX_REQUESTS = 50_000_000
# The latest arrival a generated trace may have (31.7 years). Arrivals are written to the microsecond (%.6f); a float64
# holds microseconds exactly only below 2^53 us (285 years), and `--rate 1e-300` used to write 300-digit times.
MAX_ARRIVAL_S = 1e9
# Gamma gaps have shape k = 1/B^2: beyond B = 1000 (k = 1e-6) almost every gap is 0.0 and B^2 overflows near 1e154.
MAX_BURSTINESS = 1000.0
# Below B = 0.001 (k = 1e6) the gaps are constant to a part in a thousand (use --arrival constant), and B^2 underflows
# to 0 near 1e-162 (`--burstiness 1e-300` divided by zero).
MIN_BURSTINESS = 0.001


def check_arrival(kind: str, rate: float, burstiness: float | None) -> None:
    """Raise ConfigError unless (kind, rate, burstiness) describe an arrival process."""
    if kind not in ARRIVAL_KINDS:
        raise ConfigError(f"--arrival must be one of {', '.join(ARRIVAL_KINDS)}, got {kind!r}")
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError(f"--rate must be a number > 0 (requests per second), got {rate!r}")
    if kind == "gamma":
        if burstiness is None:
            raise ConfigError("--arrival gamma needs --burstiness (the CV of the gaps: 1 is Poisson, 4 is very bursty)")
        if not (math.isfinite(burstiness) and MIN_BURSTINESS <= burstiness <= MAX_BURSTINESS):
            raise ConfigError(f"--burstiness must be a number from {MIN_BURSTINESS:g} to {MAX_BURSTINESS:g} (below, use "
                              f"--arrival constant), got {burstiness!r}")
    elif burstiness is not None:
        raise ConfigError(f"--burstiness only applies to --arrival gamma (got --arrival {kind})")


def gaps(kind: str, rate: float, count: int, rng: np.random.Generator, burstiness: float | None = None) -> np.ndarray:
    """`count` inter-arrival gaps in seconds (float64), mean 1/rate."""
    check_arrival(kind, rate, burstiness)
    if kind == "poisson":
        return rng.exponential(1.0 / rate, count)
    if kind == "gamma":
        assert burstiness is not None  # check_arrival enforces it
        shape = 1.0 / (burstiness * burstiness)
        return rng.gamma(shape, 1.0 / (rate * shape), count)
    return np.full(count, 1.0 / rate)


def arrivals_by_count(kind: str, rate: float, count: int, rng: np.random.Generator,
                      burstiness: float | None = None) -> np.ndarray:
    """Arrival times (s) of `count` requests, the first at 0, non-decreasing."""
    if count < 1 or count > MAX_REQUESTS:
        raise ConfigError(f"--num-requests must be between 1 and {MAX_REQUESTS}, got {count}")
    if kind == "constant":
        check_arrival(kind, rate, burstiness)
        return np.arange(count, dtype=np.float64) / rate  # exact multiples: no drift from summing 1/rate
    out = np.empty(count, dtype=np.float64)
    out[0] = 0.0
    np.cumsum(gaps(kind, rate, count - 1, rng, burstiness), out=out[1:])
    return out


def arrivals_by_duration(kind: str, rate: float, duration_s: float, rng: np.random.Generator,
                         burstiness: float | None = None) -> np.ndarray:
    """Arrival times (s) of every request arriving in [0, duration_s): the first at 0, then gaps drawn until the
    duration is passed."""
    check_arrival(kind, rate, burstiness)
    if not (math.isfinite(duration_s) and 0 < duration_s <= MAX_ARRIVAL_S):
        raise ConfigError(f"--duration must be a number of seconds > 0 and at most {MAX_ARRIVAL_S:,.0f}, "
                          f"got {duration_s!r}")
    expected = rate * duration_s
    if expected > MAX_REQUESTS:
        raise ConfigError(f"--rate {rate:g} for --duration {duration_s:g} s makes about {expected:.3g} requests; "
                          f"at most {MAX_REQUESTS} are supported")
    if kind == "constant":
        arrivals = np.arange(math.ceil(duration_s * rate) + 1, dtype=np.float64) / rate
        return arrivals[: int(np.searchsorted(arrivals, duration_s, side="left"))]
    # Draw a little more than the expected count (6 standard deviations of the count) so that one draw almost always
    # suffices; further draws continue the same stream, so the result depends only on the arguments and the seed.
    cv = 1.0 if kind == "poisson" else float(burstiness)  # type: ignore[arg-type]
    chunk = int(expected + 6.0 * cv * math.sqrt(expected) + 16)
    parts = [np.zeros(1)]
    last = 0.0
    while last < duration_s:
        times = last + np.cumsum(gaps(kind, rate, chunk, rng, burstiness))
        parts.append(times)
        last = float(times[-1])
    arrivals = np.concatenate(parts)
    return arrivals[: int(np.searchsorted(arrivals, duration_s, side="left"))]

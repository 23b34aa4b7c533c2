"""One run's headline figures with their own 95% intervals: what `tracebench sweep` puts in a row per point.

Everything comes from the report's own code (`_run_stats`, the same kept/ok requests, percentiles, throughput and
goodput as `tracebench report`); what is added here is an interval for one run's percentile (the report has intervals
only for differences between runs) and the SLO check of a capacity search:

- A percentile's 95% interval: the percentile bootstrap, `bootstrap_percentile` (each resample draws the run's
  values with replacement; the 2.5th and 97.5th percentiles of the resampled percentile). Pooled ITL has no
  interval (its values are gaps, not requests: the report gives it none either).
- The SLO check (`--slo KEY=LIMIT,...` with the report's keys, and a percentile P): for each key, the P-th percentile
  of the request's value for that key (the report's per-request SLO definition: `ttft`, `total`, `tpot`, `server`,
  `wait`, and `itl` = the request's largest gap) over the kept requests, where a kept request that did not complete
  (error, timeout, cancelled, not_sent) counts as an infinite value: a failure misses every limit. It is "met" when the
  interval's upper end is within the limit, "missed" when its lower end is above it, "uncertain" otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracebench.report.load import load_run
from tracebench.report.metrics import CI_LEVEL, PERCENTILES, SLO_KEYS, bootstrap_percentile, latency_expr
from tracebench.report.metrics.stats import _run_stats

HEADLINE_METRICS = ("ttft", "tpot", "itl", "total")  # the latencies of a sweep's table
# a closed loop (every request arriving at 0, held by --max-concurrency at the client): the latencies from dispatch,
# when the client sent the request (bench_serving's closed-loop TTFT), not from arrival, which counts the client wait
FROM_DISPATCH = {"ttft": "ttft_dispatch", "total": "server_client"}
HEADLINE_STATS = ("p50", "p99")
_FAILED = 1e300  # stands for an infinite value inside the bootstrap (inf - inf would be nan); >= _INF_FROM is inf
_INF_FROM = 1e200


@dataclass(frozen=True)
class Estimate:
    """A value (seconds, or per second) and its 95% interval (None where the report has none)."""

    value: float | None
    ci_low: float | None = None
    ci_high: float | None = None


@dataclass(frozen=True)
class SloCheck:
    limit: float  # seconds
    percentile: float  # e.g. 99
    estimate: Estimate  # the percentile of the key's per-request value; inf when it falls on failed requests
    verdict: str  # "met" / "missed" / "uncertain"


@dataclass
class Headline:
    run: str  # the run folder's name
    status: str  # run.json status (completed, saturated, interrupted, failed)
    speed: float | None
    requests: int  # kept requests
    counts: dict[str, int]  # per request status, over kept requests
    duration: float | None  # first arrival to the last ok finish (the report's window)
    requests_per_s: float | None
    output_tokens_per_s: float | None
    goodput: float | None  # requests meeting every --slo limit per second (None without --slo)
    slo_fraction: float | None  # fraction of kept requests meeting every limit
    latency: dict[str, dict[str, Estimate]]  # HEADLINE_METRICS -> HEADLINE_STATS -> estimate
    slo: dict[str, SloCheck] = field(default_factory=dict)
    lag: Any = None  # the run's LagStats (report/metrics/lag.py): the share of each figure the host's lag could move

    @property
    def slo_verdict(self) -> str | None:
        """"met" when every key is met, "missed" when one is missed, else "uncertain"; None without an SLO check."""
        if not self.slo:
            return None
        verdicts = {check.verdict for check in self.slo.values()}
        return "missed" if "missed" in verdicts else "uncertain" if "uncertain" in verdicts else "met"


def _percentile(sorted_values: np.ndarray, q: float) -> float:
    """The report's percentile (linear interpolation between order statistics), with _FAILED values as inf."""
    n = sorted_values.size
    h = (n - 1) * q
    j = int(np.floor(h))
    low, high = sorted_values[j], sorted_values[min(j + 1, n - 1)]
    value = float(low + (h - j) * (high - low)) if high < _INF_FROM or h == j else float("inf")
    return float("inf") if value >= _INF_FROM else value


def percentile_estimate(sorted_values: np.ndarray, q: float, resamples: int, seed: list[int]) -> Estimate:
    """The q-percentile of the sorted values and its 95% percentile-bootstrap interval (none with < 2 values or
    resamples = 0). Values of _FAILED are infinite: an interval that reaches them ends at inf."""
    if sorted_values.size == 0:
        return Estimate(None)
    value = _percentile(sorted_values, q)
    if resamples <= 0 or sorted_values.size < 2:
        return Estimate(value)
    draws = bootstrap_percentile(sorted_values, q, resamples, np.random.default_rng(seed))
    tail = (1.0 - CI_LEVEL) / 2 * 100
    low, high = (float(v) for v in np.percentile(draws, [tail, 100 - tail]))
    return Estimate(value, float("inf") if low >= _INF_FROM else low, float("inf") if high >= _INF_FROM else high)


def headline(folder: Path, *, warmup: float = 0.0, slo: dict[str, float] | None = None, slo_percentile: float = 99.0,
             bootstrap: int = 1000, seed: int = 0, from_dispatch: bool = False) -> Headline:
    """The figures of one run folder. `slo` in seconds (report's parse_slo); `slo_percentile` in (0, 100).
    `from_dispatch` (a closed-loop run): TTFT and total latency, in the table and in the SLO check, are the
    report's from-dispatch metrics (FROM_DISPATCH), and goodput (the report's, from arrival) is left out."""
    source = FROM_DISPATCH if from_dispatch else {}
    run = load_run(folder)
    st = _run_stats(run, warmup, slo)
    latency: dict[str, dict[str, Estimate]] = {}
    for m_index, key in enumerate(HEADLINE_METRICS):
        metric = source.get(key, key)
        stats = st.latency[metric]
        if metric in st.sorted_latency:
            latency[key] = {stat: percentile_estimate(st.sorted_latency[metric], PERCENTILES[stat], bootstrap,
                                                      [seed, m_index, s_index])
                            for s_index, stat in enumerate(HEADLINE_STATS)}
        else:  # pooled (ITL): the report's values, no interval
            latency[key] = {stat: Estimate(stats[stat]) for stat in HEADLINE_STATS}
    checks: dict[str, SloCheck] = {}
    if slo is not None:
        # kept requests that did not complete (ok or mismatch): a miss of every limit (the report's SLO counts them
        # as misses too)
        unfinished = st.kept.height - st.ok.height
        for k_index, (key, limit) in enumerate(slo.items()):
            metric = SLO_KEYS[key]
            values = st.ok.select(latency_expr(source.get(metric, metric)).alias("v"))["v"].drop_nulls().to_numpy()
            values = np.sort(np.concatenate([values.astype(np.float64), np.full(unfinished, _FAILED)]))
            estimate = percentile_estimate(values, slo_percentile / 100.0, bootstrap, [seed, 100, k_index])
            if estimate.value is None:
                verdict = "missed"  # no request at all: nothing met it
            else:
                high = estimate.ci_high if estimate.ci_high is not None else estimate.value
                low = estimate.ci_low if estimate.ci_low is not None else estimate.value
                verdict = "met" if high <= limit else "missed" if low > limit else "uncertain"
            checks[key] = SloCheck(limit, slo_percentile, estimate, verdict)
    counts = dict(st.counts)
    return Headline(
        run=folder.name, status=run.status, speed=run.speed, requests=st.kept.height, counts=counts,
        duration=st.summary.duration, requests_per_s=st.throughput["requests_per_s"],
        output_tokens_per_s=st.throughput["output_tokens_per_s"],
        goodput=st.slo.get("goodput") if slo is not None and not from_dispatch else None,
        slo_fraction=st.slo.get("fraction") if slo is not None and not from_dispatch else None,
        latency=latency, slo=checks, lag=st.lag,
    )

"""How far the simulators' own lateness could have moved a simulated run's latencies (issue 24).

A simulator times its steps on the wall clock: when its event loop runs late (a busy machine), it hands out tokens
late, and a request it reads late enters its model late. Each request records the most its simulator was behind the
model while serving it (`sim_lag`, wall seconds, meta_info tracebench_sim_lag). At `--speed K` the simulated timeline is
K times the wall clock, so a lag of L wall seconds can move that request's simulated times by up to K * L (the
conversion counts a late token as host time, once; a late arrival moves the model's schedule K times as much). Per
run, the p50 (p99) of K * sim_lag against the p50 (p99) of TTFT and of total latency is the share of each figure the
lag could account for; past LAG_BOUND the report warns. A bound, not a correction: a late step moves only what follows
it, and a shifted arrival need not wait longer. The client's own lateness is its release lag, reported with the
latencies. Runs on real sglang record no sim_lag and get no row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracebench.report.metrics.definitions import latency_expr

LAG_BOUND = 0.02   # issue 24: a sped-up run within 2% of speed 1 on TTFT and total p50/p99
FIGURES = (("ttft", "p50", 0.50), ("ttft", "p99", 0.99), ("total", "p50", 0.50), ("total", "p99", 0.99))
_LABELS = {"ttft": "TTFT", "total": "total latency"}


@dataclass(frozen=True)
class LagStats:
    """One simulated run's lag (seconds) and the share of each latency figure it could account for."""

    sim_p50: float           # the simulators' own lag, wall seconds
    sim_p99: float
    could_p50: float         # K * sim_lag, simulated seconds
    could_p99: float
    shares: dict[str, float]  # "ttft p50" -> could / figure

    def over(self) -> list[str]:
        """The figures the lag could account for more than LAG_BOUND of."""
        return [key for key, share in self.shares.items() if share > LAG_BOUND]


def lag_stats(ok: pl.DataFrame, speed: float | None) -> LagStats | None:
    """The lag of a run's completed requests (already in simulated seconds, report/speed.py); None when no request
    carries a simulator's lag (real sglang, or a run recorded before sim_lag existed)."""
    with_lag = ok.filter(pl.col("sim_lag").is_not_null())
    if with_lag.height == 0:
        return None
    k = speed if speed is not None else 1.0
    sim = with_lag["sim_lag"].to_numpy()
    could = k * sim
    shares = {}
    for metric, stat, q in FIGURES:
        values = with_lag.select(latency_expr(metric).alias("v"))["v"].drop_nulls().to_numpy()
        if values.size:
            figure = float(np.quantile(values, q))
            shares[f"{metric} {stat}"] = float(np.quantile(could, q)) / figure if figure > 0 else float("inf")
    return LagStats(float(np.quantile(sim, 0.5)), float(np.quantile(sim, 0.99)), float(np.quantile(could, 0.5)),
                    float(np.quantile(could, 0.99)), shares)


def lag_warning(label: str, speed: float | None, stats: LagStats) -> str | None:
    """The warning for a run whose lag could account for more than LAG_BOUND of a latency figure (None otherwise)."""
    over = stats.over()
    if not over:
        return None
    k = speed if speed is not None else 1.0
    which = ", ".join(f"{stats.shares[key]:.0%} of {_LABELS[key.split()[0]]} {key.split()[1]}" for key in over)
    return (f"run '{label}': its simulators ran late (p50/p99 {stats.sim_p50 * 1e3:.2f}/{stats.sim_p99 * 1e3:.2f} ms "
            f"wall, up to {stats.could_p50 * 1e3:.1f}/{stats.could_p99 * 1e3:.1f} ms of simulated time at --speed "
            f"{k:g}): that could account for {which}, more than "
            f"{LAG_BOUND:.0%}; its simulated latencies may be distorted by the machine's load: rerun at a lower --speed "
            "or on a quieter machine")

"""How far the host's lateness could have moved a simulated run's latencies (issue 24).

A simulator times its steps on the wall clock: when its event loop runs late (a busy machine), it hands out tokens
late, and a request it reads late enters its model late. Each request records the most its simulator was behind the
model while serving it (`sim_lag`, wall seconds: its first token's or its end's, meta_info tracebench_sim_lag). The
client is late too: its release lag (`t_released - t_arrival`). At `--speed K` the simulated timeline is K times the
wall clock, so per request the lag could move its simulated times by up to

    K * sim_lag + (K - 1) * release_lag        (simulated seconds)

(a late token counts once as host time in the conversion, report/speed.py, but a late arrival shifts the model's
schedule K times as much; the release lag is already counted once). Per run, the p50 (p99) of that against the p50
(p99) of TTFT and of total latency is the share of each figure the lag could account for; past LAG_BOUND the report
warns. A bound, not a correction: a late step moves only what follows it, and a shifted arrival need not wait longer.
At speed 1 it is the simulators' own lag (a few tenths of a ms to ~1 ms on a quiet machine: timers fire up to 1 ms
late, a step's ~24 chunks are written one after another). Runs on real sglang record no sim_lag and get no row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracebench.report.metrics.definitions import latency_expr

# issue 24 holds a sped-up run to 2% of speed 1 on TTFT and total p50/p99; the bound above is loose (a late step moves
# only what follows it), so the warning comes later: on the workload (bench/bench_speed.py, 2-core machine) it
# is 2% at speed 1 (quiet or beside a CPU-bound process), 5-6% at speed 2 (within speed 1's run-to-run noise), 7% at
# speed 2 beside a CPU hog (TTFT p50 +4%), 11% at speed 4 (TTFT p99 +9%), 20% at speed 4 beside a hog (TTFT p50 +40%)
LAG_BOUND = 0.06
FIGURES = (("ttft", "p50", 0.50), ("ttft", "p99", 0.99), ("total", "p50", 0.50), ("total", "p99", 0.99))
_LABELS = {"ttft": "TTFT", "total": "total latency"}


@dataclass(frozen=True)
class LagStats:
    """One simulated run's lag (seconds) and the share of each latency figure it could account for."""

    sim_p50: float           # the simulators' own lag, wall seconds
    sim_p99: float
    could_p50: float         # K * sim_lag + (K - 1) * release_lag, simulated seconds
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
    release = with_lag.select((pl.col("t_released") - pl.col("t_arrival")).alias("v"))["v"].to_numpy()
    could = k * sim + (k - 1.0) * release
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
    return (f"run '{label}': the host ran late (simulators p50/p99 {stats.sim_p50 * 1e3:.2f}/{stats.sim_p99 * 1e3:.2f} "
            f"ms wall, and the client's release lag: up to {stats.could_p50 * 1e3:.1f}/{stats.could_p99 * 1e3:.1f} ms "
            f"of simulated time at --speed {k:g}): that could account for {which}, more than "
            f"{LAG_BOUND:.0%}; its simulated latencies may be distorted by the machine's load: rerun at a lower --speed "
            "or on a quieter machine")

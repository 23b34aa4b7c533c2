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
late, a step's ~24 chunks are written one after another).

The client's own time counts too (issue 33 A4: on a loaded 2-core machine a simulated point read TTFT p50 +32% over
a quiet host while this check said 2.8%: the difference was tracebench's own time before the wire, 9.3 ms p50 against
0.65 ms quiet). Per request, `own` = tracebench's time before the wire (release lag + router and policy + request
body + request written, the waits the run asked for taken out: report/breakdown.py OWN_BEFORE) + the first token's
way in (server_first_sent -> t_first_token, where sglang's stamps are on the run clock): host time, in the figures
as measured, so it counts once:

    K * sim_lag + (K - 1) * release_lag + own        (simulated seconds; a real run: own alone)

A run on real sglang records no sim_lag: its row is its own time (K = 1), so a client host too busy to send on time
is warned about too. Runs recorded before the breakdown's stamps (no t_written) have no own time: the sim_lag terms
alone, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tracebench.report.breakdown import OWN_BEFORE, stage_expr
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
    """One run's lag (seconds) and the share of each latency figure it could account for."""

    sim_p50: float | None    # the simulators' own lag, wall seconds (None: real sglang, no sim_lag)
    sim_p99: float | None
    could_p50: float         # K * sim_lag + (K - 1) * release_lag + own, simulated seconds
    could_p99: float
    shares: dict[str, float]  # "ttft p50" -> could / figure
    own_p50: float | None = None  # tracebench's own time (module doc), host seconds (None: not recorded)
    own_p99: float | None = None

    def over(self) -> list[str]:
        """The figures the lag could account for more than LAG_BOUND of."""
        return [key for key, share in self.shares.items() if share > LAG_BOUND]


def own_time_expr(columns: list[str]) -> pl.Expr | None:
    """tracebench's own time per request (module doc), host seconds; None when the records lack the stamps."""
    if "t_written" not in columns:
        return None
    own = stage_expr(OWN_BEFORE)
    if "server_first_sent" in columns:
        first_in = pl.col("t_first_token") - pl.col("server_first_sent")
        own = own + pl.when(first_in.is_not_null()).then(first_in).otherwise(0.0)
    return own


def lag_stats(ok: pl.DataFrame, speed: float | None) -> LagStats | None:
    """The lag of a run's completed requests (already in simulated seconds, report/speed.py); None when no request
    carries a simulator's lag nor tracebench's own time (a run recorded before either existed)."""
    simulated = ok.filter(pl.col("sim_lag").is_not_null()) if "sim_lag" in ok.columns else ok.clear()
    rows = simulated if simulated.height else ok
    own_expr = own_time_expr(rows.columns)
    if own_expr is not None and rows.height and not rows.select(own_expr.is_not_null().any()).item():
        own_expr = None  # recorded before the breakdown's stamps (every t_written null)
    if own_expr is not None:
        rows = rows.filter(own_expr.is_not_null())
    if rows.height == 0 or (not simulated.height and own_expr is None):
        return None
    k = speed if speed is not None else 1.0
    sim = rows["sim_lag"].to_numpy() if simulated.height else np.zeros(rows.height)
    release = rows.select((pl.col("t_released") - pl.col("t_arrival")).alias("v"))["v"].to_numpy()
    own = rows.select(own_expr.alias("v"))["v"].to_numpy() if own_expr is not None else None
    could = k * sim + (k - 1.0) * release + (own if own is not None else 0.0)
    shares = {}
    for metric, stat, q in FIGURES:
        values = rows.select(latency_expr(metric).alias("v"))["v"].drop_nulls().to_numpy()
        if values.size:
            figure = float(np.quantile(values, q))
            shares[f"{metric} {stat}"] = float(np.quantile(could, q)) / figure if figure > 0 else float("inf")
    return LagStats(
        float(np.quantile(sim, 0.5)) if simulated.height else None,
        float(np.quantile(sim, 0.99)) if simulated.height else None,
        float(np.quantile(could, 0.5)), float(np.quantile(could, 0.99)), shares,
        float(np.quantile(own, 0.5)) if own is not None else None,
        float(np.quantile(own, 0.99)) if own is not None else None)


def lag_warning(label: str, speed: float | None, stats: LagStats) -> str | None:
    """The warning for a run whose lag could account for more than LAG_BOUND of a latency figure (None otherwise)."""
    over = stats.over()
    if not over:
        return None
    k = speed if speed is not None else 1.0
    which = ", ".join(f"{stats.shares[key]:.0%} of {_LABELS[key.split()[0]]} {key.split()[1]}" for key in over)
    parts = []
    if stats.sim_p50 is not None:
        parts.append(f"simulators p50/p99 {stats.sim_p50 * 1e3:.2f}/{stats.sim_p99 * 1e3:.2f} ms wall")  # type: ignore[operator]
    if stats.own_p50 is not None:
        parts.append(f"tracebench's own time before the wire and reading the first token p50/p99 "
                     f"{stats.own_p50 * 1e3:.2f}/{stats.own_p99 * 1e3:.2f} ms")  # type: ignore[operator]
    if stats.sim_p50 is None:
        return (f"run '{label}': the client's host ran late ({'; '.join(parts)}): that could account for {which}, more "
                f"than {LAG_BOUND:.0%}; its latencies include that much of tracebench's own time: rerun on a quieter "
                "machine, or spread the load over more client processes")
    return (f"run '{label}': the host ran late ({'; '.join(parts)}; with the client's release lag: up to "
            f"{stats.could_p50 * 1e3:.1f}/{stats.could_p99 * 1e3:.1f} ms of simulated time at --speed {k:g}): that "
            f"could account for {which}, more than {LAG_BOUND:.0%}; its simulated latencies may be distorted by the "
            "machine's load: rerun at a lower --speed or on a quieter machine")

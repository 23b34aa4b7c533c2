"""How far the simulator is from real sglang: a run on real GPUs next to the same trace replayed on `--backend sim`.

    .venv/bin/python bench/sim_vs_real.py RUN_REAL RUN_SIM [RUN_REAL RUN_SIM ...] [--title TEXT] [--summary]
    .venv/bin/python bench/sim_vs_real.py reports/examples/h200x2-routing/random reports/examples/sim2-routing/random \
        reports/examples/h200x2-routing/sjf reports/examples/sim2-routing/sjf

Prints one Markdown table per pair (named after the real run): throughput and latency percentiles, real, sim and
the difference in % of real. The metrics are the report's own (tracebench.report: the same loader, which converts a
sped-up run to simulated seconds, and the same definitions and percentiles), over the `ok` requests of each run.
Rows marked `*` are the ones issue 6 holds to 15% (throughput, total latency p50/p99, TTFT p50); a difference beyond
that is flagged `OFF`. Below each table: what each run's servers were, and whether the machine kept up: the sim run's
release lag (p50/p99/max, run seconds: the engine kept to the schedule) and, for both runs, the HTTP path's own time,
client-side server latency (t_finish - t_dispatch) minus sglang's e2e_latency (p50/p99: a simulator whose loop falls
behind delivers tokens late, and this grows). `--summary`: one line per pair with the starred rows only;
`--overview`: one line per pair with throughput, total p50/p99, router wait p99, TTFT p50 and TPOT p50.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.report.load import Run, load_run  # noqa: E402
from tracebench.report.metrics import latency_expr  # noqa: E402

TOLERANCE = 0.15  # issue 6: refit the profile when the simulator is off by more than this


@dataclass(frozen=True)
class Metric:
    label: str
    unit: str
    held: bool        # one of the figures issue 6 holds to TOLERANCE


# (key, stat, Metric): key is a latency_expr key or a throughput name
ROWS: tuple[tuple[str, str, Metric], ...] = (
    ("requests_per_s", "", Metric("throughput", "req/s", True)),
    ("output_tokens_per_s", "", Metric("output throughput", "tok/s", False)),
    ("total", "p50", Metric("total latency p50", "ms", True)),
    ("total", "p99", Metric("total latency p99", "ms", True)),
    ("server_client", "p50", Metric("server latency (client) p50", "ms", False)),
    ("server_client", "p99", Metric("server latency (client) p99", "ms", False)),
    ("router_wait", "p50", Metric("router wait p50", "ms", False)),
    ("router_wait", "p99", Metric("router wait p99", "ms", False)),
    ("ttft", "p50", Metric("TTFT from arrival p50", "ms", True)),
    ("ttft_dispatch", "p50", Metric("TTFT from dispatch p50", "ms", False)),
    ("tpot", "p50", Metric("TPOT p50", "ms", False)),
)
QUANTILES = {"p50": 0.50, "p99": 0.99}
# --overview: the columns issue 11 asks for, one line per policy
OVERVIEW = (("requests_per_s", ""), ("total", "p50"), ("total", "p99"), ("router_wait", "p99"), ("ttft", "p50"),
            ("tpot", "p50"))


def figures(run: Run) -> dict[tuple[str, str], float]:
    """The table's figures for one run (seconds for latencies, per second for throughputs; simulated seconds)."""
    ok = run.requests.filter(pl.col("status") == "ok")
    if ok.height == 0:
        raise SystemExit(f"{run.path}: no ok request")
    start = float(run.requests["t_arrival"].min())
    end = float(ok["t_finish"].max())
    duration = end - start
    out: dict[tuple[str, str], float] = {
        ("requests_per_s", ""): ok.height / duration,
        ("output_tokens_per_s", ""): float(ok["completion_tokens"].sum()) / duration,
    }
    for key, stat, _ in ROWS:
        if stat in QUANTILES:
            values = ok.select(latency_expr(key).alias("v"))["v"].drop_nulls().to_numpy()
            if values.size == 0:
                raise SystemExit(f"{run.path}: no value of {key} (a run without streaming has no TTFT)")
            out[(key, stat)] = float(np.quantile(values, QUANTILES[stat]))
    return out


def release_lag(run: Run) -> tuple[float, float, float]:
    """Release lag p50/p99/max in run seconds (the loader scaled it by speed: undo that)."""
    lag = run.requests.select((pl.col("t_released") - pl.col("t_arrival")).alias("v"))["v"].drop_nulls().to_numpy()
    lag = lag / (run.speed or 1.0)
    return float(np.quantile(lag, 0.5)), float(np.quantile(lag, 0.99)), float(lag.max())


def http_overhead(run: Run) -> tuple[float, float]:
    """p50/p99 of (t_finish - t_dispatch) - server_e2e_latency over ok requests, simulated seconds."""
    ok = run.requests.filter(pl.col("status") == "ok")
    gap = ok.select((latency_expr("server_client") - pl.col("server_e2e_latency")).alias("v"))["v"].drop_nulls().to_numpy()
    return float(np.quantile(gap, 0.5)), float(np.quantile(gap, 0.99))


def describe(run: Run) -> str:
    servers = run.meta["servers"]
    accel = sorted({str(s.get("accelerator")) for s in servers})
    profile = sorted({str((s.get("server_info") or {}).get("tracebench_sim", {}).get("profile", "-")) for s in servers})
    caps = run.meta["caps"]["initial"]
    parts = [f"backend {run.meta['backend']}", f"{len(servers)} servers ({', '.join(accel)})", f"caps {caps}",
             f"policy {run.meta['policy']['name']}", f"speed {run.speed or 1:g}"]
    if profile != ["-"]:
        parts.append(f"profile {', '.join(profile)}")
    return " · ".join(parts)


def table(real: Run, sim: Run) -> list[str]:
    if real.trace_sha256 != sim.trace_sha256:
        raise SystemExit(f"{real.path} and {sim.path} replayed different traces "
                         f"({real.trace_sha256[:12]} vs {sim.trace_sha256[:12]})")
    fr, fs = figures(real), figures(sim)
    real_http, sim_http = http_overhead(real), http_overhead(sim)
    lines = [f"### {real.meta['policy']['name']}", "",
             "| metric | unit | real | sim | sim − real |", "| --- | --- | ---: | ---: | ---: |"]
    off = []
    for key, stat, metric in ROWS:
        scale = 1e3 if metric.unit == "ms" else 1.0
        r, s = fr[(key, stat)] * scale, fs[(key, stat)] * scale
        diff = s / r - 1
        flag = ""
        if metric.held and abs(diff) > TOLERANCE:
            flag = " OFF"
            off.append(metric.label)
        label = metric.label + (" *" if metric.held else "")
        digits = 2 if metric.unit == "req/s" else 1
        lines.append(f"| {label} | {metric.unit} | {r:,.{digits}f} | {s:,.{digits}f} | {diff:+.1%}{flag} |")
    lag50, lag99, lagmax = release_lag(sim)
    lines += ["", f"real: `{real.path}` — {describe(real)}; HTTP path p50/p99 {real_http[0] * 1e3:.2f}/"
              f"{real_http[1] * 1e3:.2f} ms  ",
              f"sim: `{sim.path}` — {describe(sim)}; HTTP path p50/p99 {sim_http[0] * 1e3:.2f}/{sim_http[1] * 1e3:.2f} ms; "
              f"release lag p50/p99/max {lag50 * 1e3:.2f}/{lag99 * 1e3:.2f}/{lagmax * 1e3:.2f} ms  ",
              f"within {TOLERANCE:.0%} on every * row" if not off else f"off by more than {TOLERANCE:.0%}: "
              + ", ".join(off), ""]
    return lines


def summary(pairs: list[tuple[Run, Run]], rows: list[tuple[str, str, Metric]]) -> list[str]:
    """One line per pair: for each of `rows`, real / sim / difference (bold beyond the tolerance)."""
    lines = ["| policy | " + " | ".join(f"{m.label} ({m.unit}) real / sim / Δ" for _, _, m in rows) + " |",
             "| --- |" + " ---: |" * len(rows)]
    for real, sim in pairs:
        fr, fs = figures(real), figures(sim)
        cells = []
        for key, stat, metric in rows:
            scale = 1e3 if metric.unit == "ms" else 1.0
            r, s = fr[(key, stat)] * scale, fs[(key, stat)] * scale
            diff = s / r - 1
            mark = "**" if metric.held and abs(diff) > TOLERANCE else ""
            digits = 2 if metric.unit == "req/s" else 1
            cells.append(f"{r:,.{digits}f} / {s:,.{digits}f} / {mark}{diff:+.1%}{mark}")
        lines.append(f"| {real.meta['policy']['name']} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="pairs: RUN_REAL RUN_SIM ...")
    parser.add_argument("--title", default="Simulator vs real sglang")
    shape = parser.add_mutually_exclusive_group()
    shape.add_argument("--summary", action="store_true", help="one line per pair, the starred rows only")
    shape.add_argument("--overview", action="store_true",
                       help="one line per pair: throughput, total p50/p99, router wait p99, TTFT p50, TPOT p50")
    opts = parser.parse_args()
    if len(opts.runs) % 2:
        parser.error("give run folders in pairs: RUN_REAL RUN_SIM")
    if opts.summary or opts.overview:
        pairs = [(load_run(Path(r)), load_run(Path(s))) for r, s in zip(opts.runs[::2], opts.runs[1::2])]
        rows = [row for row in ROWS if (row[2].held if opts.summary else row[:2] in OVERVIEW)]
        print("\n".join(summary(pairs, rows)))
        return
    lines = [f"## {opts.title}", "",
             "Figures over ok requests, in simulated seconds (the report's loader and metric definitions); "
             f"sim − real in % of real; `*`: held to {TOLERANCE:.0%} by issue 6.", ""]
    for real_dir, sim_dir in zip(opts.runs[::2], opts.runs[1::2]):
        lines += table(load_run(Path(real_dir)), load_run(Path(sim_dir)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""What the report computes, with one definition per number (docs/report.md says the same in prose).

- Times: seconds on the run clock; for a run replayed with `--speed K`, simulated seconds (the simulators' time × K,
  tracebench's host time as measured: report/speed.py, converted once by the loader), so sped-up simulator runs and
  real-GPU runs compare like with like.

- Requests kept: every record whose `t_arrival >= warmup` (default 0: all). Everything below is over kept requests.
- Latencies: over kept `ok` requests that have the stamps the metric needs.
- Percentiles: linear interpolation between order statistics (numpy's default `method="linear"`, polars'
  `interpolation="linear"`): with n sorted values x[0..n-1], p_q = x[j] + (h - j)(x[j+1] - x[j]), h = (n-1)q, j = floor(h).
- Duration (the measurement window): from the first arrival of a kept request to the last finish of a kept `ok`
  request. Throughput = ok requests (input_len / completion_tokens summed over them) / duration.
- Per server: share = dispatched requests to that server / all dispatched requests; busy time = length of the union of
  its [t_dispatch, t_finish] intervals inside the window; mean in-flight = the sum of those intervals / duration.
  Balanced when the coefficient of variation (population std / mean) of the per-server request counts <= 0.10.
- Deltas against the baseline: absolute and % of the baseline. For latency percentiles, a bootstrap 95% interval of
  the difference (percentile method, independent resamples of each run's requests, `--bootstrap` resamples); the
  difference is "significant" only when the interval excludes 0.
- Prefix cache (runs whose records carry sglang's `cached_tokens`): hit rate = sum(cached_tokens) / sum(prompt_tokens)
  over kept ok requests (token-weighted), per run and per server; prefill tokens computed = sum(prompt_tokens -
  cached_tokens); a request "hits" when cached_tokens > 0 (TTFT is split by that). The hit-rate delta's 95% interval
  is the delta method's for a ratio of sums (normal approximation, requests independent), fast at any run size. The
  trace's ceiling (the reusable fraction of prompt tokens with one unbounded cache) comes from run.json.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from tracebench.errors import ConfigError
from tracebench.itl import bucket_value
from tracebench.report.load import Run
from tracebench.report.speed import uncapped
from tracebench.report.metrics.definitions import (BALANCE_CV_MAX, CACHE_SPLIT_METRICS, CI_LEVEL, LATENCY, LATENCY_LABELS,
                                                   LATENCY_METRICS, LATENCY_STATS, PERCENTILES, POOLED, SLO_KEYS, MetricDef,
                                                   latency_expr, parse_slo)
from tracebench.report.metrics.schema import (Balance, ConfigDiff, Delta, Report, Row, RunSeries, RunSummary, Section,
                                              ServerLoad, ServerSeries)
from tracebench.report.metrics.config import (SPEED_SENSITIVE, _show, attached_sim_speeds, backend_text, config_of,
                                              diff_config, simulated_accelerators, speed_text, speed_warning, time_note)
from tracebench.report.metrics.ci import bootstrap_ci, bootstrap_percentile, ratio_ci
from tracebench.report.metrics.stats import (CacheStats, _balance, _busy_time, _cache_stats, _counter_loads, _mark,
                                             _run_stats, _RunStats, _server_loads, pooled_itl)


# ------------------------------------------------------------------------------------------------ assembly

def _delta(value: float | None, base: float | None) -> Delta | None:
    if value is None or base is None:
        return Delta(None, None)
    diff = value - base
    return Delta(diff, diff / base * 100.0 if base != 0 else None)


def _row(section: str, metric: str, label: str, stat: str, unit: str, better: str | None,
         values: list[float | None], baseline: int) -> Row:
    deltas = [None if i == baseline else _delta(v, values[baseline]) for i, v in enumerate(values)]
    return Row(section, metric, label, stat, unit, better, values, deltas)


def check_same_trace(runs: list[Run], baseline: int, allow_different: bool) -> list[str]:
    """Refuse runs of different traces (ConfigError naming both) unless allowed; then return a warning instead."""
    base = runs[baseline]
    warnings: list[str] = []
    for run in runs:
        if run.trace_sha256 != base.trace_sha256:
            what = (f"runs replay different traces: '{base.label}' replayed {base.trace_path} (sha256 {base.trace_sha256[:12]}), "
                    f"'{run.label}' replayed {run.trace_path} (sha256 {run.trace_sha256[:12]})")
            if not allow_different:
                raise ConfigError(f"{what}; compare them anyway with --allow-different-traces")
            warnings.append(what + " (compared anyway: --allow-different-traces)")
    return warnings


def build_report(
    runs: list[Run], baseline: int, *, warmup: float = 0.0, slo: dict[str, float] | None = None,
    bootstrap: int = 1000, seed: int = 0, allow_different_traces: bool = False, with_series: bool = False,
) -> Report:
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup:g}")
    if bootstrap < 0:
        raise ConfigError(f"--bootstrap must be >= 0, got {bootstrap}")
    warnings = check_same_trace(runs, baseline, allow_different_traces)
    stats = [_run_stats(run, warmup, slo) for run in runs]
    if (speeds := speed_warning([st.summary for st in stats])) is not None:
        warnings.append(speeds)
    for run in runs:
        if speeds := attached_sim_speeds(run.meta):
            warnings.append(
                f"run '{run.label}' attached simulators running at --speed {'/'.join(_show(v) for v in sorted(set(speeds)))}: "
                "the run itself was not compressed, so its server times are that many times shorter than simulated "
                "seconds (use --backend sim --speed K for a compressed run)")
    for st in stats:
        if st.summary.speed is not None and st.summary.speed > 1 and st.latency_n["itl"]:
            warnings.append(
                f"ITL of {st.summary.label} at --speed {_show(st.summary.speed)}: its stream's chunks came "
                f"{_show(st.summary.speed)} times closer in real time, and chunks the client reads together count "
                f"as 0 ms gaps ({st.zero_gaps:.0%} of them here): measure ITL at --speed 1")
    for st in stats:
        s = st.summary
        if s.mark is not None:
            stopped = f"stopped at {s.t_end:.2f} s" if s.t_end is not None else "no end recorded"
            why = " (run.json still says running: the replay was killed, or is still going)" if s.status == "running" else ""
            warnings.append(f"run '{s.label}' is {s.mark}{why} ({stopped}; "
                            f"{s.records} of {s.trace_requests} requests recorded, {st.counts['cancelled']} of the kept "
                            "ones cancelled): its numbers cover only what happened before it stopped")
        elif s.missing:
            warnings.append(f"run '{s.label}': {s.missing} requests of the trace have no record")

    sections: list[Section] = []
    req_rows = [
        _row("requests", "kept", "requests (after warm-up)" if warmup > 0 else "requests", "count", "requests", None,
             [float(st.summary.kept) for st in stats], baseline),
    ]
    req_rows += [
        _row("requests", status, status, "count", "requests", "higher" if status == "ok" else "lower",
             [float(st.counts[status]) for st in stats], baseline)
        for status in ("ok", "error", "timeout", "cancelled")
    ]
    if any(st.summary.missing for st in stats):
        req_rows.append(_row("requests", "not_recorded", "not recorded", "count", "requests", "lower",
                             [float(st.summary.missing) for st in stats], baseline))
    sections.append(Section("requests", "Requests", req_rows))

    sections.append(Section("throughput", "Throughput", [
        _row("throughput", "duration", "duration", "value", "s", None, [st.summary.duration for st in stats], baseline),
        _row("throughput", "requests_per_s", "requests/s", "value", "req/s", "higher",
             [st.throughput["requests_per_s"] for st in stats], baseline),
        _row("throughput", "input_tokens_per_s", "input tokens/s", "value", "tok/s", "higher",
             [st.throughput["input_tokens_per_s"] for st in stats], baseline),
        _row("throughput", "output_tokens_per_s", "output tokens/s", "value", "tok/s", "higher",
             [st.throughput["output_tokens_per_s"] for st in stats], baseline),
    ]))

    any_hit = any(st.cache is not None and st.cache.hit_requests for st in stats)
    lat_rows: list[Row] = []
    for m_index, (key, label, _) in enumerate(LATENCY_METRICS):
        if all(st.latency_n[key] == 0 for st in stats):
            continue  # e.g. no first-token stamps in any run (not streamed): the metric does not exist here
        if key in CACHE_SPLIT_METRICS and not any_hit:
            continue  # no request hit the prefix cache anywhere: the split says nothing the TTFT rows do not
        for s_index, stat in enumerate(LATENCY_STATS):
            row = _row("latency", key, label, stat, "s", "lower", [st.latency[key][stat] for st in stats], baseline)
            if stat in PERCENTILES and bootstrap > 0 and key not in POOLED:
                for r_index, delta in enumerate(row.deltas):
                    if delta is None or delta.abs is None:
                        continue
                    ci = bootstrap_ci(stats[r_index].sorted_latency[key], stats[baseline].sorted_latency[key],
                                      PERCENTILES[stat], bootstrap, [seed, m_index, s_index, r_index])
                    if ci is not None:
                        delta.ci_low, delta.ci_high = ci
            lat_rows.append(row)
    sections.append(Section("latency", "Latency", lat_rows))

    if slo is not None:
        spec = ", ".join(f"{k} <= {v:g} s" for k, v in slo.items())
        sections.append(Section("slo", f"SLO ({spec})", [
            _row("slo", "met", "requests meeting all", "count", "requests", "higher", [st.slo["met"] for st in stats], baseline),
            _row("slo", "fraction", "fraction meeting all", "value", "fraction", "higher",
                 [st.slo["fraction"] for st in stats], baseline),
            _row("slo", "goodput", "goodput", "value", "req/s", "higher", [st.slo["goodput"] for st in stats], baseline),
        ]))

    if any(st.cache is not None for st in stats):
        sections.append(_cache_section(stats, baseline))

    series = [_series(run, st) for run, st in zip(runs, stats)] if with_series else None
    if series is not None:
        _common_time_axis(series, runs, stats)
    return Report(
        runs=[st.summary for st in stats], baseline=baseline, config=diff_config([run.meta for run in runs]),
        sections=sections, servers=[st.servers for st in stats], balance=[st.balance for st in stats], slo=slo,
        warmup_s=warmup, bootstrap=bootstrap, seed=seed, warnings=warnings, series=series,
    )


def _cache_section(stats: list[_RunStats], baseline: int) -> Section:
    caches = [st.cache for st in stats]

    def values(get: Any) -> list[float | None]:
        return [None if c is None else get(c) for c in caches]

    hit = _row("cache", "hit_rate", "prefix cache hit rate (tokens)", "value", "fraction", "higher",
               values(lambda c: c.hit_rate), baseline)
    base = caches[baseline]
    for i, delta in enumerate(hit.deltas):
        mine = caches[i]
        if delta is not None and mine is not None and base is not None:
            ci = ratio_ci((mine.cached, mine.prompt), (base.cached, base.prompt))
            if ci is not None:
                delta.ci_low, delta.ci_high = ci
    rows = [
        hit,
        _row("cache", "hit_requests", "requests with a hit", "value", "fraction", "higher",
             values(lambda c: c.hit_requests), baseline),
        _row("cache", "prefill_tokens", "prompt tokens computed (prefill)", "count", "tokens", "lower",
             values(lambda c: float(c.prefill_tokens)), baseline),
        _row("cache", "ceiling", "trace ceiling (one unbounded cache)", "value", "fraction", None,
             values(lambda c: c.ceiling), baseline),
    ]
    return Section("cache", "Prefix cache", rows)


# ------------------------------------------------------------------------------------------------ plot series

CDF_METRICS = ("total", "ttft", "server_client", "router_wait", "tpot")
SCATTER_POINTS = 4000  # latency-by-arrival points per run (an even sample of the ok requests beyond that)
CDF_POINTS = 600
TIME_BINS = 240
COMPLETIONS_PER_WINDOW = 40


def _cdf(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF, downsampled to at most ~CDF_POINTS points (denser in the tail, where the p99 lives)."""
    n = sorted_values.size
    if n == 0:
        return np.empty(0), np.empty(0)
    if n <= CDF_POINTS:
        return sorted_values, np.arange(1, n + 1) / n
    probs = np.unique(np.concatenate([
        np.linspace(1.0 / n, 1.0, CDF_POINTS // 2),
        1.0 - np.geomspace(0.1, 1.0 / n, CDF_POINTS // 2),
        [1.0],
    ]))
    idx = np.clip(np.ceil(probs * n).astype(np.int64), 1, n) - 1
    return sorted_values[idx], (idx + 1) / n


def _integral_of_count(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each t in `at`: the integral over [0, t] of the number of intervals [start, end) covering the clock,
    i.e. sum_i (min(t, end_i) - min(t, start_i))."""
    def sum_min(points: np.ndarray) -> np.ndarray:
        ordered = np.sort(points)
        prefix = np.concatenate([[0.0], np.cumsum(ordered)])
        below = np.searchsorted(ordered, at, side="left")
        return prefix[below] + at * (ordered.size - below)
    return sum_min(ends) - sum_min(starts)


def _cap_labels(changes: list[dict[str, Any]], num_servers: int) -> list[tuple[float, str]]:
    """Cap changes as labelled moments: an `all` change (one entry per server in run.json) is one label."""
    by_time: dict[tuple[float, int], list[int]] = {}
    for change in changes:
        by_time.setdefault((float(change["t"]), int(change["cap"])), []).append(change["server"])
    labels = []
    for (t, cap), servers in sorted(by_time.items()):
        if len(servers) == num_servers > 1:
            labels.append((t, f"all={cap}"))
        else:
            labels += [(t, f"server{server}={cap}") for server in servers]
    return labels


def _series(run: Run, st: _RunStats) -> RunSeries:
    cdf = {key: _cdf(st.sorted_latency[key]) for key in CDF_METRICS}
    caps = _cap_labels(run.meta["caps"]["changes"], run.num_servers)
    ok = st.ok.select("t_arrival", (pl.col("t_finish") - pl.col("t_arrival")).alias("total")).sort("t_arrival")
    if ok.height > SCATTER_POINTS:
        ok = ok.gather_every(math.ceil(ok.height / SCATTER_POINTS))
    return RunSeries(cdf=cdf, time_edges=np.empty(0), completions_per_s=np.empty(0), smoothing_s=0.0,
                     in_flight=np.empty(0), queue=np.empty(0), cap_changes=caps,
                     by_arrival=(ok["t_arrival"].to_numpy(), ok["total"].to_numpy()))


def read_telemetry(run: Run) -> pl.DataFrame | None:
    """telemetry.jsonl (t, server, sglang's waiting count and KV usage), times in simulated seconds for a sped-up
    run; None when the run folder has none."""
    path = run.path / "telemetry.jsonl"
    if not path.is_file():
        return None
    schema = {"t": pl.Float64, "server": pl.Int64, "num_waiting_reqs": pl.Int64, "token_usage": pl.Float64}
    frame = pl.read_ndjson(path, schema=schema)
    return frame.with_columns(pl.col("t") * (run.speed or 1.0))


def _server_series(run: Run, edges: np.ndarray) -> list[ServerSeries]:
    c = pl.col
    step = edges[1] - edges[0]
    telemetry = read_telemetry(run)
    out = []
    for index in range(run.num_servers):
        mine = run.requests.filter(c("t_dispatch").is_not_null() & (c("server") == index))
        integral = _integral_of_count(mine["t_dispatch"].to_numpy(), mine["t_finish"].to_numpy(), edges)
        initial = run.meta["caps"]["initial"][index]
        steps = [(0.0, initial)] + [(float(ch["t"]), ch["cap"]) for ch in run.meta["caps"]["changes"]
                                    if ch["server"] == index]
        cap_t = np.array([t for t, _ in steps])
        cap_v = np.array([np.nan if v is None else float(v) for _, v in steps])
        if telemetry is None:
            tele = pl.DataFrame(schema={"t": pl.Float64, "num_waiting_reqs": pl.Int64, "token_usage": pl.Float64})
        else:
            tele = telemetry.filter(c("server") == index).sort("t")
        out.append(ServerSeries(
            in_flight=np.diff(integral) / step, cap_t=cap_t, cap_v=cap_v, telemetry_t=tele["t"].to_numpy(),
            waiting=tele["num_waiting_reqs"].cast(pl.Float64).to_numpy(), kv_usage=tele["token_usage"].to_numpy(),
        ))
    return out


def _nice_step(span: float, bins: int) -> float:
    raw = span / bins
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return mult * mag
    return 10 * mag


def _common_time_axis(series: list[RunSeries], runs: list[Run], stats: list[_RunStats]) -> None:
    """Time series of the whole run (warm-up included; the plots shade it), on one axis for every run."""
    c = pl.col
    t_max = 0.0
    for run in runs:
        last = run.requests.select(pl.max_horizontal(c("t_finish").max(), c("t_arrival").max())).item()
        t_max = max(t_max, float(last), float(run.meta["t_end"] or 0.0))
    step = _nice_step(max(t_max, 1e-3), TIME_BINS)
    edges = np.arange(0.0, t_max + step, step)
    if edges.size < 2:
        edges = np.array([0.0, step])
    # Completions are a point process: per-bin counts are mostly noise at low rates, so the throughput curve is a
    # moving average over a window that holds ~COMPLETIONS_PER_WINDOW completions at the runs' mean rate.
    mean_rate = max(st.counts["ok"] for st in stats) / max(t_max, 1e-9)
    width_bins = int(np.clip(round(COMPLETIONS_PER_WINDOW / max(mean_rate, 1e-9) / step), 1, TIME_BINS // 8))
    for ser, run in zip(series, runs):
        frame = run.requests
        finish = frame.filter(c("status") == "ok")["t_finish"].to_numpy()
        ser.time_edges = edges
        counts = np.histogram(finish, edges)[0].astype(float)
        window = np.ones(width_bins)
        # divide by the bins actually inside the run at each end, so the curve does not sag at the edges
        ser.completions_per_s = np.convolve(counts, window, mode="same") / np.convolve(np.ones_like(counts), window, mode="same") / step
        ser.smoothing_s = width_bins * step
        flying = frame.filter(c("t_dispatch").is_not_null())
        integral = _integral_of_count(flying["t_dispatch"].to_numpy(), flying["t_finish"].to_numpy(), edges)
        ser.in_flight = np.diff(integral) / step
        # in the router queue from release to dispatch; never dispatched: until the failure was seen (or the run end)
        queued = frame.filter(c("t_released").is_not_null()).select(
            "t_released",
            pl.coalesce(c("t_dispatch"), c("t_finish"), pl.lit(t_max)).alias("left"),
        )
        integral = _integral_of_count(queued["t_released"].to_numpy(), queued["left"].to_numpy(), edges)
        ser.queue = np.diff(integral) / step
        ser.servers = _server_series(run, edges)

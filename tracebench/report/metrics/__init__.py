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
from tracebench.report.metrics.series import (CDF_METRICS, CDF_POINTS, COMPLETIONS_PER_WINDOW, SCATTER_POINTS, TIME_BINS,
                                              _cap_labels, _cdf, _common_time_axis, _integral_of_count, _nice_step,
                                              _series, _server_series, read_telemetry)


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

"""The report assembled: `build_report` checks the runs, computes each run's statistics once (stats.py), collects the
warnings, then builds the sections, one builder each (requests, throughput, latency, SLO, prefix cache); a builder
returns None when its section does not apply. Every row carries each run's delta against the baseline."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracebench.errors import ConfigError
from tracebench.report.breakdown import ALL_STAGES, CAP, GATE, STATIC, STATS
from tracebench.report.load import REQUEST_STATUSES, Run
from tracebench.report.metrics.ci import bootstrap_ci, percentile_ci, ratio_ci
from tracebench.report.metrics.config import _show, attached_sim_speeds, diff_config, speed_warning
from tracebench.report.metrics.definitions import LATENCY, LATENCY_STATS, MIN_GROUP, PERCENTILES, PROMPT_BANDS
from tracebench.report.metrics.lag import FIGURES, LAG_BOUND, lag_warning
from tracebench.report.metrics.schema import Delta, Report, Row, Section
from tracebench.report.pd import STAGES
from tracebench.report.metrics.series import _common_time_axis, _series
from tracebench.report.metrics.stats import _run_stats, _RunStats
from tracebench.report.threads import per_run


def _delta(value: float | None, base: float | None) -> Delta | None:
    if value is None or base is None:
        return Delta(None, None)
    diff = value - base
    return Delta(diff, diff / base * 100.0 if base != 0 else None)


def _row(section: str, metric: str, label: str, stat: str, unit: str, better: str | None,
         values: list[float | None], baseline: int) -> Row:
    deltas = [None if i == baseline else _delta(v, values[baseline]) for i, v in enumerate(values)]
    return Row(section, metric, label, stat, unit, better, values, deltas)


def _sweep_source(run: Run) -> str | None:
    """The sha256 of the trace a `tracebench sweep` point's trace was made from (its header's sweep_point), else None."""
    point = (run.meta["trace"].get("header") or {}).get("sweep_point")
    return point.get("source_sha256") if isinstance(point, dict) else None


def check_same_trace(runs: list[Run], baseline: int, allow_different: bool) -> list[str]:
    """Refuse runs of different traces (ConfigError naming both) unless allowed; then return a warning instead.
    Points of a sweep made from one trace (arrivals rescaled, or all at 0) are compared with a note, not refused."""
    base = runs[baseline]
    warnings: list[str] = []
    points = [run for run in runs if run.trace_sha256 != base.trace_sha256 and _sweep_source(run) is not None
              and _sweep_source(run) == _sweep_source(base)]
    if points:
        warnings.append(f"{', '.join(repr(run.label) for run in [base, *points])} are points of a sweep made from one "
                        f"trace (sha256 {_sweep_source(base)[:12]}; docs/sweep.md): the same requests in the same "
                        "order at different loads (a --point-duration point keeps a prefix of them)")
    for run in runs:
        if run.trace_sha256 != base.trace_sha256 and run not in points:
            what = (f"runs replay different traces: '{base.label}' replayed {base.trace_path} (sha256 {base.trace_sha256[:12]}), "
                    f"'{run.label}' replayed {run.trace_path} (sha256 {run.trace_sha256[:12]})")
            if not allow_different:
                raise ConfigError(f"{what}; compare them anyway with --allow-different-traces")
            warnings.append(what + " (compared anyway: --allow-different-traces)")
    return warnings


def _warnings(runs: list[Run], stats: list[_RunStats]) -> list[str]:
    """What the reader must know before trusting the numbers: speeds, sped-up ITL, runs that did not complete."""
    warnings: list[str] = []
    if (speeds := speed_warning([st.summary for st in stats])) is not None:
        warnings.append(speeds)
    for run in runs:  # the replay measured the time spent inside the policy and found a call over its bound
        if (policy_warning := (run.meta.get("policy_time") or {}).get("warning")) is not None:
            warnings.append(f"run '{run.label}': {policy_warning}")
    for run in runs:  # the replay found its p99 release lag or own time before the wire past its bound (keepup.py)
        if (behind := (run.meta.get("client_keepup") or {}).get("behind")) is not None:
            warnings.append(f"run '{run.label}': {behind}")
    for run in runs:
        if speeds := attached_sim_speeds(run.meta):
            warnings.append(
                f"run '{run.label}' attached simulators running at --speed {'/'.join(_show(v) for v in sorted(set(speeds)))}: "
                "the run itself was not compressed, so its server times are that many times shorter than simulated "
                "seconds (use --backend sim --speed K for a compressed run)")
    warnings += [w for run, st in zip(runs, stats) if (w := api_warning(run, st)) is not None]
    warnings += [w for run, st in zip(runs, stats) if (w := load_warning(run, st)) is not None]
    if (loop := closed_loop_note(runs)) is not None:
        warnings.append(loop)
    for run in runs:  # replay --adapt-speed lowered the speed (tracebench/speedguard.py)
        if (guard := run.meta.get("speed_guard")) is not None and guard["used"] != guard["requested"]:
            tried = "; ".join(f"--speed {_show(a['speed'])}: {max(a['shares'].values()):.0%}"
                              for a in guard["attempts"][:-1])
            warnings.append(f"run '{run.label}' was made at --speed {_show(guard['used'])}, not the "
                            f"{_show(guard['requested'])} asked for: --adapt-speed found the host could not hold the "
                            f"faster speeds (the largest share of a latency figure their lag could account for: "
                            f"{tried}; bound {guard['bound']:.0%}) and replayed the run again")
    for st in stats:
        if st.lag is not None and (lagging := lag_warning(st.summary.label, st.summary.speed, st.lag)) is not None:
            warnings.append(lagging)
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
                            f"ones cancelled, {st.counts['not_sent']} never sent): its numbers cover only what happened "
                            "before it stopped")
        elif s.missing:
            warnings.append(f"run '{s.label}': {s.missing} requests of the trace have no record")
    warnings += [w for st in stats if (w := mismatch_warning(st)) is not None]
    return warnings


def closed_loop_note(runs: list[Run]) -> str | None:
    """A closed-loop trace (after/delay_s) is not an arrival schedule: its requests come when earlier ones finished
    (docs/replay.md, "Closed loop"). Runs recorded before run.json kept the count: the generator's header says it."""
    counts = []
    for run in runs:
        trace = run.meta["trace"]
        count = trace.get("closed_loop")
        if count is None and ((trace.get("header") or {}).get("workload") or {}).get("closed_loop"):
            count = -1  # a closed-loop multi-turn trace, how many of its requests is not recorded
        counts.append(count or 0)
    if not any(counts):
        return None
    base = runs[0].meta["trace"]
    how_many = (f"{max(counts)} of its {base['num_requests']} requests" if max(counts) > 0 else "its later turns")
    return (f"closed loop: {how_many} are sent their delay_s after the request they follow finished (trace fields "
            f"after/delay_s, generate --closed-loop), not at a fixed time: a run whose requests finish sooner is sent "
            f"them sooner, so the offered load, the duration and the throughput follow the servers' speed (compare "
            f"latencies; a higher req/s here means faster answers, not more load handled)")


def load_warning(run: Run, st: _RunStats) -> str | None:
    """The trace's offered load against the run's servers (tracebench/capacity.py, the rule `inspect` and `replay`
    apply): a warning from LOAD_WARN of their estimated capacity on. Servers of no known profile (a simulator's, or a
    real GPU with a built-in one) and PD runs are not judged."""
    from tracebench.capacity import costs_of_servers
    from tracebench.capacity import load_warning as warning_for

    meta = run.meta
    costs = costs_of_servers([s.get("server_info") for s in meta["servers"]],
                             [s.get("accelerator") for s in meta["servers"]])
    trace = meta["trace"]
    requests, duration = trace["num_requests"], trace.get("duration_s")
    if costs is None or meta.get("pd") or requests < 2 or not duration or st.kept.height == 0:
        return None
    caps = [c for c in meta["caps"]["initial"] if c is not None] if meta.get("caps") else []
    text = warning_for(costs, requests=requests, rate=(requests - 1) / duration, input_mean=float(st.kept["input_len"].mean()),
                       output_mean=float(st.kept["output_len"].mean()),
                       cached_fraction=float((trace.get("prefix") or {}).get("reusable_fraction") or 0.0),
                       servers=len(meta["servers"]), cap=max(caps) if caps else None)
    return None if text is None else f"run '{run.label}': {text}"


def api_warning(run: Run, st: _RunStats) -> str | None:
    """What a run replayed through an OpenAI route cannot give (docs/report.md, "What each API gives"): sglang's
    meta_info (e2e_latency, the queue time and time stamps) comes only with /generate; cache hits only when the
    servers ran with --enable-cache-report (replay launches them so since issue 23; run.json `cache_reported`)."""
    api = run.meta.get("api") or "generate"
    if api == "generate":
        return None
    text = (f"run '{run.label}' replayed --api {api}: OpenAI answers carry no sglang meta_info, so 'server latency, "
            f"sglang' and sglang's own stamps (queue time, prefill and finish times, the simulators' lag) exist only "
            f"for --api generate runs")
    if st.cache is None:
        why = ("its servers ran without --enable-cache-report" if run.meta.get("cache_reported") is False
               else "it was recorded before tracebench launched servers with --enable-cache-report"
               if "cache_reported" not in run.meta else "no answer reported them")
        text += (f"; it cannot know its prefix-cache hits ({why}: usage had no prompt_tokens_details), so it has no "
                 f"prefix-cache figures")
    return text


# what completed-but-mismatched answers distort (docs/report.md, "Mismatches")
MISMATCH_DISTORTS = ("TPOT", "total latency", "output throughput")


def mismatch_warning(st: _RunStats) -> str | None:
    """The warning for a run with mismatch records: how many, why (grouped), and what they distort."""
    count = st.counts["mismatch"]
    if not count:
        return None
    reasons = "; ".join(f"{n} x {reason}" for reason, n in st.summary.mismatch_reasons.items())
    return (f"run '{st.summary.label}': {count} of {st.summary.kept} requests are mismatch, finished but not as the "
            f"trace asked ({reasons}). They count as completed, so {', '.join(MISMATCH_DISTORTS[:-1])} and "
            f"{MISMATCH_DISTORTS[-1]} include requests of other lengths than the trace's: compare runs without "
            "mismatches, or replay a trace that fits the servers (tracebench generate clamps to sglang's context rule)")


@dataclass
class _Inputs:
    """What every section builder reads."""

    stats: list[_RunStats]
    baseline: int
    warmup: float
    slo: dict[str, float] | None
    bootstrap: int
    seed: int


def requests_section(inp: _Inputs) -> Section:
    stats, baseline = inp.stats, inp.baseline
    rows = [
        _row("requests", "kept", "requests (after warm-up)" if inp.warmup > 0 else "requests", "count", "requests", None,
             [float(st.summary.kept) for st in stats], baseline),
    ]
    rows += [
        _row("requests", status, status, "count", "requests", "higher" if status == "ok" else "lower",
             [float(st.counts[status]) for st in stats], baseline)
        for status in REQUEST_STATUSES
    ]
    if any(st.summary.missing for st in stats):
        rows.append(_row("requests", "not_recorded", "not recorded", "count", "requests", "lower",
                         [float(st.summary.missing) for st in stats], baseline))
    return Section("requests", "Requests", rows)


def throughput_section(inp: _Inputs) -> Section:
    stats, baseline = inp.stats, inp.baseline
    return Section("throughput", "Throughput", [
        _row("throughput", "duration", "duration", "value", "s", None, [st.summary.duration for st in stats], baseline),
        _row("throughput", "requests_per_s", "requests/s", "value", "req/s", "higher",
             [st.throughput["requests_per_s"] for st in stats], baseline),
        _row("throughput", "input_tokens_per_s", "input tokens/s", "value", "tok/s", "higher",
             [st.throughput["input_tokens_per_s"] for st in stats], baseline),
        _row("throughput", "output_tokens_per_s", "output tokens/s", "value", "tok/s", "higher",
             [st.throughput["output_tokens_per_s"] for st in stats], baseline),
    ])


def latency_section(inp: _Inputs) -> Section:
    """One row per metric and statistic; percentile deltas get a bootstrap interval (seeded per cell)."""
    stats, baseline, bootstrap, seed = inp.stats, inp.baseline, inp.bootstrap, inp.seed
    rows: list[Row] = []
    for m_index, metric in enumerate(LATENCY):
        key = metric.key
        if all(st.latency_n[key] == 0 for st in stats):
            continue  # e.g. no first-token stamps in any run (not streamed): the metric does not exist here
        if metric.client_gate and not any(st.summary.max_concurrency is not None for st in stats):
            continue  # no run had --max-concurrency: nothing waited at the client
        for s_index, stat in enumerate(LATENCY_STATS):
            row = _row("latency", key, metric.label, stat, metric.unit, metric.better,
                       [st.latency[key][stat] for st in stats], baseline)
            if stat in PERCENTILES and bootstrap > 0 and not metric.pooled:
                # each run's own interval (seeded apart from the deltas': a 5th seed word)
                row.cis = [percentile_ci(st.sorted_latency[key], PERCENTILES[stat], bootstrap,
                                         [seed, m_index, s_index, r_index, 1]) if value is not None else None
                           for r_index, (st, value) in enumerate(zip(stats, row.values))]
                for r_index, delta in enumerate(row.deltas):
                    if delta is None or delta.abs is None:
                        continue
                    ci = bootstrap_ci(stats[r_index].sorted_latency[key], stats[baseline].sorted_latency[key],
                                      PERCENTILES[stat], bootstrap, [seed, m_index, s_index, r_index])
                    if ci is not None:
                        delta.ci_low, delta.ci_high = ci
            rows.append(row)
    return Section("latency", "Latency", rows)


def slo_section(inp: _Inputs) -> Section | None:
    if inp.slo is None:
        return None
    stats, baseline = inp.stats, inp.baseline
    spec = ", ".join(f"{k} <= {v:g} s" for k, v in inp.slo.items())
    # the share meeting every limit together: --fail-on-slo's figure; `tracebench sweep` judges each key's percentile
    # alone (its verdict; its summary shows this share too, as "all met") (issue 33 A6)
    return Section("slo", f"SLO ({spec}): share of requests meeting every limit together", [
        _row("slo", "met", "requests meeting all", "count", "requests", "higher", [st.slo["met"] for st in stats], baseline),
        _row("slo", "fraction", "fraction meeting all", "value", "fraction", "higher",
             [st.slo["fraction"] for st in stats], baseline),
        _row("slo", "goodput", "goodput", "value", "req/s", "higher", [st.slo["goodput"] for st in stats], baseline),
        *(_row("slo", f"fraction_{key}", f"fraction meeting {key} <= {limit:g} s", "value", "fraction", "higher",
               [st.slo[f"fraction_{key}"] for st in stats], baseline) for key, limit in inp.slo.items()),
    ])


def cache_section(inp: _Inputs) -> Section | None:
    """The prefix cache, for runs whose records carry sglang's cached_tokens; the hit-rate delta gets the delta
    method's interval."""
    if not any(st.cache is not None for st in inp.stats):
        return None
    baseline = inp.baseline
    caches = [st.cache for st in inp.stats]

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
        _row("cache", "kv_tokens", "KV capacity, all servers (tokens)", "count", "tokens", None,
             values(lambda c: None if c.kv_tokens is None else float(c.kv_tokens)), baseline),
        _row("cache", "shared_tokens", "trace working set (shared blocks, tokens)", "count", "tokens",
             None, values(lambda c: None if c.shared_tokens is None else float(c.shared_tokens)), baseline),
    ]
    return Section("cache", "Prefix cache", rows)


def _band_label(band: int) -> str:
    low = PROMPT_BANDS[band]
    high = PROMPT_BANDS[band + 1] - 1 if band + 1 < len(PROMPT_BANDS) else None
    return f"prompt {low:,}+ tokens" if high is None else f"prompt {low:,}-{high:,} tokens"


def cache_ttft_section(inp: _Inputs) -> Section | None:
    """TTFT from dispatch of prefix hits and misses, per prompt-length band (stats.py `_ttft_groups`): n, the uncached
    prompt tokens and the percentiles of each group. A group is shown when some run has MIN_GROUP requests in it;
    a run with fewer there has its n and '-' (too few for a percentile). Only when some run had a hit."""
    caches = [st.cache for st in inp.stats]
    if not any(c is not None and c.hit_requests for c in caches):
        return None
    keys = sorted({key for c in caches if c is not None for key in c.ttft_groups}, key=lambda k: (k[0], not k[1]))
    rows: list[Row] = []
    for band, hit in keys:
        groups = [None if c is None else c.ttft_groups.get((band, hit)) for c in caches]
        if not any(g is not None and g.n >= MIN_GROUP for g in groups):
            continue
        metric = f"{PROMPT_BANDS[band]}.{'hit' if hit else 'miss'}"
        label = f"{_band_label(band)}, {'hit' if hit else 'miss'}"
        for stat, unit, better, get in (("n", "requests", None, lambda g: float(g.n)),
                                        ("uncached mean", "tokens", None, lambda g: g.uncached_mean),
                                        ("p50", "s", "lower", lambda g: g.ttft_p50),
                                        ("p90", "s", "lower", lambda g: g.ttft_p90)):
            rows.append(_row("cache_ttft", metric, label, stat, unit, better,
                             [None if g is None else get(g) for g in groups], inp.baseline))
    if not rows:
        return None
    return Section("cache_ttft", f"TTFT from dispatch by prefix hit, within prompt-length bands (ms; groups under "
                                 f"{MIN_GROUP} requests: n only)", rows)


def pd_section(inp: _Inputs) -> Section | None:
    """PD runs (report/pd.py): TTFT split into its stages, KV per request and the prefill servers' transfer rate.
    A plain run's cells are empty: its TTFT is compared in the latency section."""
    pds = [st.pd for st in inp.stats]
    if not any(p is not None for p in pds):
        return None
    baseline = inp.baseline
    rows: list[Row] = []
    for index, (key, label) in enumerate(STAGES):
        for stat in ("p50", "mean"):
            values = [None if p is None or not p.stages else getattr(p.stages[index], stat) for p in pds]
            rows.append(_row("pd", key, label, stat, "s", "lower", values, baseline))
    rows.append(_row("pd", "kv_mib", "KV per request", "mean", "MiB", None,
                     [None if p is None else p.kv_mib_per_request for p in pds], baseline))

    def pool_rate(p: Any) -> float | None:
        mb = sum(r.kv_mib or 0.0 for r in p.servers if r.role == "prefill")
        ms = sum((r.kv_ms_mean or 0.0) * (r.kv_transfers or 0) for r in p.servers if r.role == "prefill")
        return (mb / 1024) / (ms / 1000) if mb and ms else None

    rows.append(_row("pd", "kv_gib_s", "KV MiB / transfer latency (sglang's counters; link queueing included)",
                     "value", "GiB/s", "higher",
                     [None if p is None else pool_rate(p) for p in pds], baseline))
    return Section("pd", "PD disaggregation: TTFT by stage (ms), KV transfer", rows)


def lag_section(inp: _Inputs) -> Section | None:
    """How late the host ran (metrics/lag.py: the simulators' lag, tracebench's own time; simulated and real runs) and
    the share of each latency figure that could account for (LAG_BOUND and up is warned about)."""
    lags = [st.lag for st in inp.stats]
    if all(lag is None for lag in lags):
        return None
    baseline = inp.baseline

    def values(get: Any) -> list[float | None]:
        return [None if lag is None else get(lag) for lag in lags]

    rows = [
        _row("lag", "sim_lag", "simulator lag (wall)", "p50", "s", "lower", values(lambda x: x.sim_p50), baseline),
        _row("lag", "sim_lag", "simulator lag (wall)", "p99", "s", "lower", values(lambda x: x.sim_p99), baseline),
        _row("lag", "own", "tracebench's own time (before the wire, first token in)", "p50", "s", "lower",
             values(lambda x: x.own_p50), baseline),
        _row("lag", "own", "tracebench's own time (before the wire, first token in)", "p99", "s", "lower",
             values(lambda x: x.own_p99), baseline),
        _row("lag", "could", "time it could move (simulated at --speed K)", "p50", "s", "lower",
             values(lambda x: x.could_p50), baseline),
        _row("lag", "could", "time it could move (simulated at --speed K)", "p99", "s", "lower",
             values(lambda x: x.could_p99), baseline),
    ]
    for metric, stat, _ in FIGURES:
        key = f"{metric} {stat}"
        rows.append(_row("lag", f"share_{metric}", f"share of {metric} it could account for", stat, "fraction",
                         "lower", values(lambda x, key=key: x.shares.get(key)), baseline))
    return Section("lag", f"Host lag (the simulators' and tracebench's own time; warned past {LAG_BOUND:.0%})", rows)


def breakdown_section(inp: _Inputs) -> Section | None:
    """Where the requests' time went (report/breakdown.py): each stage between two of a record's stamps, p50, p99 and
    mean over the kept completed requests; a stage no run has the stamps of is left out (the client gate's without
    --max-concurrency), and so are the wait for a free slot and the wait for the batch where no run waited for one (no
    cap; continuous batching)."""
    rows: list[Row] = []
    for stage in ALL_STAGES:
        got = [st.breakdown[stage.key] if st.breakdown is not None else None for st in inp.stats]
        if not any(g is not None and g.n for g in got):
            continue
        if stage.whose == GATE and not any(st.summary.max_concurrency is not None for st in inp.stats):
            continue
        if stage.whose in (CAP, STATIC) and not any(g is not None and g.mean for g in got):
            continue
        for stat in STATS:
            rows.append(_row("breakdown", stage.key, stage.label, stat, "s", "lower",
                             [None if g is None else getattr(g, stat) for g in got], inp.baseline))
    if not rows:
        return None
    return Section("breakdown", "Where the time went (ms)", rows)


SECTIONS = (requests_section, throughput_section, latency_section, slo_section, cache_section, cache_ttft_section,
            pd_section, lag_section, breakdown_section)


def build_report(
    runs: list[Run], baseline: int, *, warmup: float = 0.0, slo: dict[str, float] | None = None,
    bootstrap: int = 1000, seed: int = 0, allow_different_traces: bool = False, with_series: bool = False,
) -> Report:
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup:g}")
    if bootstrap < 0:
        raise ConfigError(f"--bootstrap must be >= 0, got {bootstrap}")
    warnings = check_same_trace(runs, baseline, allow_different_traces)
    stats = per_run(lambda run: _run_stats(run, warmup, slo), runs)
    warnings += _warnings(runs, stats)
    inputs = _Inputs(stats, baseline, warmup, slo, bootstrap, seed)
    sections = [section for build in SECTIONS if (section := build(inputs)) is not None]
    series = [_series(run, st) for run, st in zip(runs, stats)] if with_series else None
    if series is not None:
        _common_time_axis(series, runs, stats)
    return Report(
        runs=[st.summary for st in stats], baseline=baseline, config=diff_config([run.meta for run in runs]),
        sections=sections, servers=[st.servers for st in stats], balance=[st.balance for st in stats], slo=slo,
        warmup_s=warmup, bootstrap=bootstrap, seed=seed, warnings=warnings, series=series, pd=[st.pd for st in stats],
    )

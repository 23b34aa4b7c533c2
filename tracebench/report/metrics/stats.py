"""Per-run statistics, computed once per run and read by every section: `run_stats` = counts, throughput, latency
(per request, and ITL pooled over gaps), SLO attainment, per-server load and balance, and the prefix cache."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from tracebench.errors import ConfigError
from tracebench.itl import bucket_value
from tracebench.report.breakdown import StageStats, breakdown_stats
from tracebench.report.load import COMPLETED_STATUSES, REQUEST_STATUSES, Run, is_completed
from tracebench.report.metrics.lag import LagStats, lag_stats
from tracebench.report.pd import PdRunStats, pd_stats
from tracebench.report.metrics.config import backend_text
from tracebench.report.metrics.definitions import (BALANCE_CV_MAX, LATENCY, LATENCY_STATS, MIN_GROUP, PERCENTILES,
                                                   PROMPT_BANDS, SLO_KEYS, latency_expr)
from tracebench.report.metrics.schema import Balance, RunSummary, ServerLoad


ITL_SLICE = 262_144  # records whose ITL histograms are parsed at once (~60 MB of text)
_PAIR_SCHEMA = {"bucket": pl.Int32, "count": pl.Int64}  # a bucket is < _BUCKET_MAX
_BUCKET_MAX = 100_000  # bucket 100,000 holds gaps of ~10^855 s: a larger one is not a gap (tracebench/itl.py)


def pooled_itl(ok: pl.DataFrame, speed: float | None) -> tuple[dict[str, float | None], int, float]:
    """ITL statistics over every gap of the given records (their histograms summed), how many records had gaps, and
    the fraction of gaps in bucket 0 (chunks read together). Percentiles interpolate linearly between order
    statistics, as for the other latencies."""
    # "b:n,b:n,..." read as CSV: a slice's strings joined by ',' into one byte string (by polars, handed to Python as
    # bytes), read by polars' CSV reader with ',' ending a line and ':' between its two integers, each bucket's
    # counts summed by polars: the same CPU as numpy's C parser and a bincount (a third less than polars' split,
    # explode and cast; 24 million numbers in a 1M record run), but outside the GIL, so the two runs a report reads at
    # once parse their histograms together. In slices of ITL_SLICE records, so the text and numbers of a million
    # records are never held at once. The loader checked every string against HIST_PATTERN, so each line is two
    # integers (one too big for an int64 is refused by the reader).
    hists = ok["itl_hist"].drop_nulls()
    n_requests = hists.len()
    per_bucket = np.zeros(0, dtype=np.int64)
    for start in range(0, n_requests, ITL_SLICE):
        text = hists.slice(start, ITL_SLICE).str.join(",").cast(pl.Binary).item()
        # the bytes themselves, not a BytesIO: polars reads them in place (a BytesIO it copies first)
        pairs = pl.read_csv(text, has_header=False, separator=":", eol_char=",", quote_char=None, schema=_PAIR_SCHEMA)
        assert pairs.null_count().row(0) == (0, 0), "itl_hist not as HIST_PATTERN says"
        summed = pairs.lazy().group_by("bucket").agg(pl.col("count").sum()).collect()
        top = int(summed["bucket"].max())  # type: ignore[arg-type]
        assert top < _BUCKET_MAX, "itl_hist bucket beyond any gap (tracebench/itl.py)"
        if top >= per_bucket.size:
            per_bucket = np.concatenate([per_bucket, np.zeros(top + 1 - per_bucket.size, dtype=np.int64)])
        per_bucket[summed["bucket"].to_numpy()] += summed["count"].to_numpy()
    buckets = np.flatnonzero(per_bucket)
    counts = per_bucket[buckets]
    total = int(counts.sum()) if counts.size else 0
    if total == 0:
        return {name: None for name in LATENCY_STATS}, 0, 0.0
    values = np.array([bucket_value(int(b)) for b in buckets]) * (speed or 1.0)
    ends = np.cumsum(counts)  # order statistics 0..ends[i]-1 hold values[<= i]

    def order_stat(j: int) -> float:
        return float(values[np.searchsorted(ends, j, side="right")])

    stats: dict[str, float | None] = {"mean": float((values * counts).sum() / total),
                                      "max": float(ok["itl_max"].max())}  # type: ignore[arg-type]
    for name, q in PERCENTILES.items():
        h = (total - 1) * q
        j = math.floor(h)
        stats[name] = order_stat(j) + (h - j) * (order_stat(min(j + 1, total - 1)) - order_stat(j))
    zero = float(counts[0]) / total if int(buckets[0]) == 0 else 0.0
    return stats, n_requests, zero


@dataclass
class CacheStats:
    """The prefix cache as sglang reported it (records' cached_tokens), over kept completed requests."""

    cached: np.ndarray  # cached_tokens per request
    prompt: np.ndarray  # prompt_tokens per request
    hit_rate: float | None
    prefill_tokens: int
    hit_requests: float | None  # fraction with cached_tokens > 0
    ceiling: float | None  # the trace's reusable fraction with one unbounded cache (run.json), None when unknown
    kv_tokens: int | None = None  # the servers' KV pools together (/server_info max_total_num_tokens), None: unknown
    shared_tokens: int | None = None  # the trace's working set (run.json trace.prefix.shared_tokens), None: unknown
    # TTFT from dispatch of hits and misses within prompt-length bands: (band index, hit) -> its group
    ttft_groups: dict[tuple[int, bool], TtftGroup] = field(default_factory=dict)


@dataclass(frozen=True)
class TtftGroup:
    """The completed requests of one prompt-length band (PROMPT_BANDS) that hit the prefix cache, or missed it."""

    n: int
    uncached_mean: float | None  # prompt tokens the server computed (prompt_tokens - cached_tokens), mean
    ttft_p50: float | None  # TTFT from dispatch (seconds); None below MIN_GROUP requests
    ttft_p90: float | None


def _ttft_groups(have: pl.DataFrame) -> dict[tuple[int, bool], TtftGroup]:
    """Hits and misses compared like with like: a miss computes its whole prompt, a hit only the uncached part, and
    prompts of different lengths take different times, so each prompt-length band is split apart (first turns of a
    conversation are short and miss: pooled, misses would look faster than hits)."""
    frame = have.select(pl.col("input_len"), (pl.col("cached_tokens") > 0).alias("hit"),
                        (pl.col("prompt_tokens") - pl.col("cached_tokens")).alias("uncached"),
                        (pl.col("t_first_token") - pl.col("t_dispatch")).alias("ttft")
                        ).filter(pl.col("ttft").is_not_null())
    bands = np.searchsorted(np.asarray(PROMPT_BANDS[1:]), frame["input_len"].to_numpy(), side="right")
    hits = frame["hit"].to_numpy()
    uncached = frame["uncached"].to_numpy().astype(np.float64)
    ttft = frame["ttft"].to_numpy()
    groups = {}
    for band in np.unique(bands).tolist():
        for hit in (False, True):
            mine = (bands == band) & (hits == hit)
            n = int(mine.sum())
            if n == 0:
                continue
            if n < MIN_GROUP:
                groups[(band, hit)] = TtftGroup(n=n, uncached_mean=None, ttft_p50=None, ttft_p90=None)
                continue
            p50, p90 = np.percentile(ttft[mine], [50, 90])  # one partition for both
            groups[(band, hit)] = TtftGroup(n=n, uncached_mean=float(uncached[mine].mean()), ttft_p50=float(p50),
                                            ttft_p90=float(p90))
    return groups


def _cache_stats(run: Run, ok: pl.DataFrame) -> CacheStats | None:
    """None when the run's records have no cached_tokens (recorded before tracebench kept it)."""
    have = _only(ok.select("cached_tokens", "prompt_tokens", "input_len", "t_first_token", "t_dispatch"),
                 pl.col("cached_tokens").is_not_null())
    if have.height == 0:
        return None
    if have.height != ok.height:
        raise ConfigError(f"run '{run.label}': {ok.height - have.height} of {ok.height} completed records lack cached_tokens "
                          "(a run folder mixes record versions?)")
    cached = have["cached_tokens"].to_numpy().astype(np.float64)
    prompt = have["prompt_tokens"].to_numpy().astype(np.float64)
    prefix = run.meta["trace"].get("prefix")  # absent in run folders older than prefix support, null without blocks
    return CacheStats(
        cached=cached, prompt=prompt,
        hit_rate=float(cached.sum() / prompt.sum()) if prompt.sum() > 0 else None,
        prefill_tokens=int(prompt.sum() - cached.sum()),
        hit_requests=float((cached > 0).mean()),
        ceiling=None if prefix is None else float(prefix["reusable_fraction"]),
        ttft_groups=_ttft_groups(have),
        kv_tokens=kv_tokens(run.meta), shared_tokens=None if prefix is None else prefix.get("shared_tokens"),
    )


def kv_tokens(meta: dict) -> int | None:
    """The KV pool of all the run's servers in tokens, as their /server_info said (max_total_num_tokens)."""
    sizes = [(server.get("server_info") or {}).get("max_total_num_tokens") for server in meta["servers"]]
    return sum(sizes) if sizes and all(isinstance(n, int) for n in sizes) else None


@dataclass
class _RunStats:
    summary: RunSummary
    kept: pl.DataFrame
    ok: pl.DataFrame  # the completed records: ok + mismatch (what latencies and throughputs are over)
    counts: dict[str, int]
    throughput: dict[str, float | None]
    latency: dict[str, dict[str, float | None]]  # metric -> stat -> seconds
    latency_n: dict[str, int]
    sorted_latency: dict[str, np.ndarray]
    slo: dict[str, float | None]
    servers: list[ServerLoad]
    balance: Balance
    cache: CacheStats | None
    zero_gaps: float = 0.0  # fraction of the ITL gaps under 10 us (chunks read together)
    pd: PdRunStats | None = None  # a PD run's stages, transfers and pools (report/pd.py)
    lag: LagStats | None = None  # a simulated run's lag and what it could account for (metrics/lag.py)
    breakdown: dict[str, StageStats] | None = None  # where the requests' time went (report/breakdown.py)


def _mark(status: str) -> str | None:
    """The word a run that did not complete is marked with, everywhere it is named: INTERRUPTED, FAILED, UNFINISHED."""
    if status == "completed":
        return None
    return "UNFINISHED" if status == "running" else status.upper()


def _busy_time(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals [starts[i], ends[i]]."""
    if starts.size == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, reach = starts[order], np.maximum.accumulate(ends[order])
    new_segment = np.empty(s.size, dtype=bool)
    new_segment[0] = True
    new_segment[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new_segment)
    last = np.append(first[1:] - 1, s.size - 1)
    return float((reach[last] - s[first]).sum())


def _balance(run: Run, counts: np.ndarray) -> Balance:
    if counts.sum() == 0:
        return Balance("no dispatched request", None, None)
    if run.num_servers == 1:
        return Balance("single server", None, None)
    cv = float(counts.std() / counts.mean())
    ratio = float(counts.max() / counts.min()) if counts.min() > 0 else None
    return Balance("balanced" if cv <= BALANCE_CV_MAX else "imbalanced", cv, ratio)


def _counter_loads(run: Run) -> tuple[list[ServerLoad], Balance]:
    """A run through sglang-router: requests per server from the servers' own counters, over the whole run (no
    warm-up cut, no busy time: which request each server served is not known)."""
    rows = run.meta["external_router"]["server_counters"] or [{"requests": None}] * run.num_servers
    counts = [row["requests"] for row in rows]
    total = sum(counts) if None not in counts else None
    loads = [
        ServerLoad(server=index, url=server["url"], requests=counts[index],
                   share=counts[index] / total if total else None, busy_s=None, busy_fraction=None, mean_in_flight=None)
        for index, server in enumerate(run.meta["servers"])
    ]
    for load, row in zip(loads, rows):  # the prefix cache as each server counted it (null where it could not)
        cached, prompt = row.get("cached_tokens"), row.get("prompt_tokens")
        if cached is not None and prompt:
            load.cache_hit_rate, load.prefill_tokens = cached / prompt, int(prompt - cached)
    if total is None:
        return loads, Balance("unknown: via sglang-router, and a server's /metrics counters could not be read", None, None)
    balance = _balance(run, np.array(counts))
    balance.verdict += " (via sglang-router: requests per server from the servers' own /metrics counters, whole run)"
    return loads, balance


def _pd_loads(run: Run, kept: pl.DataFrame, start: float | None, end: float | None) -> tuple[list[ServerLoad], Balance]:
    """A PD run through tracebench's router: each pool apart. A prefill server is busy from dispatch to its answer
    (after the KV transfer), a decode server from dispatch to the finish; each server's share is of its pool; the
    prefix cache is the prefill server's (the decode server only reports the prefill's hit); balance per pool."""
    pools = run.meta["pd"]["pools"]
    loads: list[ServerLoad | None] = [None] * run.num_servers
    verdicts = []
    for role, column, until in (("prefill", "prefill_server", "t_prefill_answer"), ("decode", "server", "t_finish")):
        # only the columns read here: a filter copies every column it keeps
        sub = (kept.select(list(dict.fromkeys((column, "t_dispatch", until, "t_finish", "status", "cached_tokens",
                                               "prompt_tokens"))))
               .filter(pl.col(column).is_not_null() & pl.col("t_dispatch").is_not_null()))
        ids = sub[column].to_numpy()
        counts = np.array([int((ids == i).sum()) for i in pools[role]])
        total = int(counts.sum())
        duration = None if start is None or end is None or end <= start else end - start
        t0 = sub["t_dispatch"].to_numpy()
        t1 = sub[until].fill_null(sub["t_finish"]).to_numpy()
        for n, index in zip(counts, pools[role]):
            busy = fraction = in_flight = None
            if duration is not None:
                mine = ids == index
                lo, hi = np.clip(t0[mine], start, end), np.clip(t1[mine], start, end)
                busy = _busy_time(lo, hi)
                fraction, in_flight = busy / duration, float((hi - lo).sum()) / duration
            load = ServerLoad(server=index, url=run.meta["servers"][index]["url"], requests=int(n),
                              share=float(n / total) if total else None, busy_s=busy, busy_fraction=fraction,
                              mean_in_flight=in_flight, role=role)
            if role == "prefill":
                ok = sub.filter((pl.col("status") == "ok") & (pl.col(column) == index) & pl.col("cached_tokens").is_not_null())
                prompt = int(ok["prompt_tokens"].sum()) if ok.height else 0
                if prompt:
                    load.cache_hit_rate = float(ok["cached_tokens"].sum()) / prompt
                    load.prefill_tokens = prompt - int(ok["cached_tokens"].sum())
            loads[index] = load
        if total == 0:
            verdicts.append(f"{role} pool: no dispatched request")
        elif len(pools[role]) == 1:
            verdicts.append(f"{role} pool: single server")
        else:
            cv = float(counts.std() / counts.mean())
            verdicts.append(f"{role} pool: {'balanced' if cv <= BALANCE_CV_MAX else 'imbalanced'} (CV {cv:.3f})")
    return [load for load in loads if load is not None], Balance("; ".join(verdicts), None, None)


def _server_loads(run: Run, kept: pl.DataFrame, start: float | None, end: float | None) -> tuple[list[ServerLoad], Balance]:
    if run.via_router:
        loads, balance = _counter_loads(run)
        if run.meta.get("pd"):   # shares within each pool; the prefix cache is the prefill servers' own
            pools = run.meta["pd"]["pools"]
            for role, pool in pools.items():
                mine = [load for load in loads if load.server in pool]
                total = sum(load.requests or 0 for load in mine) if all(load.requests is not None for load in mine) else None
                for load in mine:
                    load.role = role
                    load.share = load.requests / total if total else None
                    if role == "decode":
                        load.cache_hit_rate = load.prefill_tokens = None
        return loads, balance
    if run.meta.get("pd"):
        return _pd_loads(run, kept, start, end)
    dispatched = kept.select("server", "t_dispatch", "t_finish").filter(pl.col("t_dispatch").is_not_null())
    server_ids = dispatched["server"].to_numpy()
    counts = np.bincount(server_ids, minlength=run.num_servers) if server_ids.size else np.zeros(run.num_servers, int)
    total = int(counts.sum())
    duration = None if start is None or end is None or end <= start else end - start
    loads: list[ServerLoad] = []
    t_dispatch = dispatched["t_dispatch"].to_numpy()
    t_finish = dispatched["t_finish"].to_numpy()
    for index, server in enumerate(run.meta["servers"]):
        busy = fraction = in_flight = None
        if duration is not None:
            mine = server_ids == index
            lo = np.clip(t_dispatch[mine], start, end)
            hi = np.clip(t_finish[mine], start, end)
            busy = _busy_time(lo, hi)
            fraction = busy / duration
            in_flight = float((hi - lo).sum()) / duration
        loads.append(ServerLoad(
            server=index, url=server["url"], requests=int(counts[index]),
            share=float(counts[index] / total) if total else None, busy_s=busy, busy_fraction=fraction,
            mean_in_flight=in_flight,
        ))
    ok = (kept.select("status", "server", "cached_tokens", "prompt_tokens")
          .filter(is_completed() & pl.col("cached_tokens").is_not_null()))
    if ok.height:
        per_server = ok.group_by("server").agg(pl.col("cached_tokens").sum(), pl.col("prompt_tokens").sum())
        for server, cached, prompt in per_server.iter_rows():
            loads[server].cache_hit_rate = cached / prompt if prompt else None
            loads[server].prefill_tokens = int(prompt - cached)
    return loads, _balance(run, counts)


def _counts(kept: pl.DataFrame) -> dict[str, int]:
    """Kept records per status, and `completed` (ok + mismatch)."""
    c = pl.col
    row = kept.select([(c("status") == s).sum().alias(s) for s in REQUEST_STATUSES]).row(0, named=True)
    counts = {k: int(v) for k, v in row.items()}
    counts["completed"] = sum(counts[s] for s in COMPLETED_STATUSES)
    return counts


# a mismatch's text without the request's own numbers (tracebench/replay/answer_check.py writes "FIELD n != FIELD m:
# REASON", two such parts joined by "; "): what its mismatches are counted by
_MISMATCH_COUNTS = r"(\w+) [^\s:;]+ != (\w+) [^\s:;]+"


def mismatch_reasons(kept: pl.DataFrame) -> dict[str, int]:
    """Kept mismatch records by reason, most frequent first."""
    reasons = (kept.lazy().filter(pl.col("status") == "mismatch")
               .select(pl.col("mismatch").str.replace_all(_MISMATCH_COUNTS, "$1 != $2").alias("reason"))
               .group_by("reason").len().sort(["len", "reason"], descending=[True, False]).collect())
    return {reason: int(n) for reason, n in reasons.iter_rows()}


def _throughput(kept: pl.DataFrame, counts: dict[str, int]
                ) -> tuple[float | None, float | None, float | None, dict[str, float | None]]:
    """The measurement window (start, end, duration) and the throughputs over it."""
    c = pl.col
    completed = is_completed()
    bounds = kept.select(
        c("t_arrival").min().alias("start"),
        c("t_finish").filter(completed).max().alias("end"),
        c("input_len").filter(completed).sum().alias("input_tokens"),
        c("completion_tokens").filter(completed).sum().alias("output_tokens"),
    ).row(0, named=True)
    start, end = bounds["start"], bounds["end"]
    duration = end - start if end is not None and end > start else None
    throughput: dict[str, float | None] = {
        "requests_per_s": counts["completed"] / duration if duration else None,
        "input_tokens_per_s": bounds["input_tokens"] / duration if duration else None,
        "output_tokens_per_s": bounds["output_tokens"] / duration if duration else None,
    }
    return start, end, duration, throughput


def _latency(ok: pl.DataFrame, speed: float | None
             ) -> tuple[dict[str, dict[str, float | None]], dict[str, int], dict[str, np.ndarray], float]:
    """Per metric: its statistics, how many requests it covers, its sorted values; and ITL's fraction of zero gaps."""
    # Each latency column is sorted once, by numpy (its vectorised sort: a third of the CPU of polars' parallel sort on
    # these columns, and outside the GIL), and handed back to polars marked sorted, which then aggregates it in O(1)
    # (the same mean, max and quantiles as before). The sorted arrays also feed the bootstrap and the CDFs.
    per_request = [m.key for m in LATENCY if not m.pooled]
    columns = ok.lazy().select([latency_expr(key).alias(key) for key in per_request]).collect()
    latency: dict[str, dict[str, float | None]] = {}
    latency_n: dict[str, int] = {}
    sorted_latency: dict[str, np.ndarray] = {}
    latency["itl"], latency_n["itl"], zero_gaps = pooled_itl(ok, speed)
    for key in per_request:
        sorted_latency[key] = values = np.sort(columns[key].drop_nulls().to_numpy())
        ordered = pl.Series(key, values).set_sorted()
        latency_n[key] = ordered.len()
        latency[key] = {"mean": ordered.mean(), "max": ordered.max()}
        latency[key].update({name: ordered.quantile(q, interpolation="linear") for name, q in PERCENTILES.items()})
    return latency, latency_n, sorted_latency, zero_gaps


def _slo(run: Run, kept: pl.DataFrame, ok: pl.DataFrame, counts: dict[str, int], latency_n: dict[str, int],
         duration: float | None, slo: dict[str, float] | None) -> dict[str, float | None]:
    """Requests meeting every objective (met, fraction of the kept ones, goodput), and each objective alone
    (`fraction_<key>`: which one a run misses); {} without --slo. A kept request not ok meets none."""
    c = pl.col
    if slo is None:
        return {}
    for key in slo:
        if latency_n[SLO_KEYS[key]] == 0 and counts["completed"] > 0 and key in ("ttft", "tpot"):
            raise ConfigError(f"--slo {key}: run '{run.label}' has no first-token stamps (replayed without streaming?)")
        if key == "itl" and ok.select(pl.col("t_first_token").is_not_null().sum()).item() == 0 and counts["completed"] > 0:
            raise ConfigError(f"--slo itl: run '{run.label}' has no streamed answers (replayed without streaming?)")
    met_expr = is_completed()  # a mismatch's latencies count (the report warns of them)
    alone: dict[str, float | None] = {}
    for key, limit in slo.items():
        value = latency_expr(SLO_KEYS[key])
        within = value <= limit
        if key == "tpot":  # one output token: no time per output token to miss
            within = within | (c("completion_tokens") <= 1)
        if key == "itl":  # a streamed answer in one chunk: no gap to miss
            within = within | (c("itl_max").is_null() & c("t_first_token").is_not_null())
        met_expr = met_expr & within.fill_null(False)
        alone[f"fraction_{key}"] = kept.select(((c("status") == "ok") & within.fill_null(False)).sum()).item() / kept.height
    met = int(kept.select(met_expr.sum()).item())
    return {"met": float(met), "fraction": met / kept.height, "goodput": met / duration if duration else None,
            **alone}


def _summary(run: Run, kept: pl.DataFrame, start: float | None, end: float | None, duration: float | None
             ) -> RunSummary:
    meta = run.meta
    return RunSummary(
        label=run.label, path=str(run.path), run_name=meta["run_name"], status=meta["status"], mark=_mark(meta["status"]),
        backend=backend_text(meta), trace_path=run.trace_path, trace_sha256=run.trace_sha256,
        trace_requests=meta["trace"]["num_requests"], records=run.requests.height, missing=run.missing,
        kept=kept.height, window_start=start, window_end=end, duration=duration, t_end=meta["t_end"],
        speed=run.speed, speed_conversion=meta.get("speed_conversion"), mismatch_reasons=mismatch_reasons(kept),
        max_concurrency=meta.get("max_concurrency"),  # absent in runs recorded before --max-concurrency: none then
    )


def _only(frame: pl.DataFrame, keep: pl.Expr) -> pl.DataFrame:
    """The rows where `keep` holds; the frame itself when that is every row (a copy of a million-record frame costs
    more than the test)."""
    mask = frame.select(keep.fill_null(False).alias("keep")).to_series()
    return frame if mask.all() else frame.filter(mask)


def _run_stats(run: Run, warmup: float, slo: dict[str, float] | None) -> _RunStats:
    kept = _only(run.requests, pl.col("t_arrival") >= warmup)
    if kept.height == 0:
        last = run.requests["t_arrival"].max()
        raise ConfigError(f"--warmup {warmup:g} leaves no request of run '{run.label}' (its last arrival is at {last:g} s)")
    ok = _only(kept, is_completed())
    counts = _counts(kept)
    start, end, duration, throughput = _throughput(kept, counts)
    latency, latency_n, sorted_latency, zero_gaps = _latency(ok, run.speed)
    slo_out = _slo(run, kept, ok, counts, latency_n, duration, slo)
    loads, balance = _server_loads(run, kept, start, end)
    summary = _summary(run, kept, start, end, duration)
    return _RunStats(summary, kept, ok, counts, throughput, latency, latency_n, sorted_latency, slo_out, loads, balance,
                     _cache_stats(run, ok), zero_gaps, pd_stats(run.meta, ok), lag_stats(ok, run.speed),
                     breakdown_stats(ok))

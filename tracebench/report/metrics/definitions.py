"""What the report computes, with one definition per number (docs/report.md says the same in prose).

- Times: seconds on the run clock; for a run replayed with `--speed K`, simulated seconds (the simulators' time × K,
  tracebench's host time as measured: report/speed.py, converted once by the loader), so sped-up simulator runs and
  real-GPU runs compare like with like.

- Requests kept: every record whose `t_arrival >= warmup` (default 0: all). Everything below is over kept requests.
- Completed requests: `ok` and `mismatch` (finished, but the server generated or counted something else than the trace
  asked: the record's `mismatch` says what). Mismatches are counted apart, by reason, and the report warns what they
  distort (TPOT, total latency, output throughput).
- Latencies: over kept completed requests that have the stamps the metric needs.
- Percentiles: linear interpolation between order statistics (numpy's default `method="linear"`, polars'
  `interpolation="linear"`): with n sorted values x[0..n-1], p_q = x[j] + (h - j)(x[j+1] - x[j]), h = (n-1)q, j = floor(h).
- Duration (the measurement window): from the first arrival of a kept request to the last finish of a kept completed
  request. Throughput = completed requests (input_len / completion_tokens summed over them) / duration.
- Per server: share = dispatched requests to that server / all dispatched requests; busy time = length of the union of
  its [t_dispatch, t_finish] intervals inside the window; mean in-flight = the sum of those intervals / duration.
  Balanced when the coefficient of variation (population std / mean) of the per-server request counts <= 0.10.
- Deltas against the baseline: absolute and % of the baseline. For latency percentiles, a bootstrap 95% interval of
  the difference (percentile method, independent resamples of each run's requests, `--bootstrap` resamples); the
  difference is "significant" only when the interval excludes 0.
- Prefix cache (runs whose records carry sglang's `cached_tokens`): hit rate = sum(cached_tokens) / sum(prompt_tokens)
  over kept completed requests (token-weighted), per run and per server; prefill tokens computed = sum(prompt_tokens -
  cached_tokens); a request "hits" when cached_tokens > 0. TTFT from dispatch is compared between hits and misses
  like with like: within bands of prompt length (PROMPT_BANDS), each group with its request count, its percentiles
  only from MIN_GROUP requests up. The hit-rate delta's 95% interval
  is the delta method's for a ratio of sums (normal approximation, requests independent), fast at any run size. The
  trace's ceiling (the reusable fraction of prompt tokens with one unbounded cache) comes from run.json.

Every latency metric is one `MetricDef` row of `LATENCY`: key, label, definition (the words docs/report.md and the
HTML page show), expression over a run's records, unit, which way is better, whether it is pooled over gaps, whether
and its --slo key. LATENCY_METRICS, latency_expr, POOLED, LATENCY_LABELS and SLO_KEYS are views of that table, kept
for their readers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from tracebench.errors import ConfigError

PERCENTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
LATENCY_STATS = ("mean", "p50", "p90", "p99", "max")
BALANCE_CV_MAX = 0.10
# TTFT by prefix hit (cache section): prompt-length bands (input_len in tokens, [edge, next edge); the last is open),
# and the fewest requests a group needs for its percentiles to be shown (fewer: n only; p50 of 3 requests is noise)
PROMPT_BANDS = (0, 256, 512, 1024, 2048, 4096)
MIN_GROUP = 20
CI_LEVEL = 0.95


@dataclass(frozen=True)
class MetricDef:
    """One latency metric. Values in seconds; over kept completed requests where `expr` is not null."""

    key: str
    label: str
    definition: str
    expr: pl.Expr
    unit: str = "s"
    better: str = "lower"
    pooled: bool = False          # over gaps, not one value per request: no bootstrap interval, no CDF
    slo_key: str | None = None    # its key in --slo
    client_gate: bool = False     # shown only when some run had --max-concurrency's client gate


_c = pl.col
LATENCY: tuple[MetricDef, ...] = (
    MetricDef("total", "total", "t_finish - t_arrival", _c("t_finish") - _c("t_arrival"), slo_key="total"),
    # t_admitted: the request entered the router queue (= t_released without --max-concurrency); runs recorded before
    # it have none, and their router wait is from the arrival, as it was defined then
    MetricDef("router_wait", "router wait", "t_dispatch - t_admitted (runs recorded before t_admitted: t_dispatch - "
              "t_arrival)", _c("t_dispatch") - pl.coalesce(_c("t_admitted"), _c("t_arrival")), slo_key="wait"),
    MetricDef("client_wait", "client wait", "t_admitted - t_released: held by --max-concurrency's gate at the client "
              "before the router queue (included in total and TTFT from arrival)",
              _c("t_admitted") - _c("t_released"), client_gate=True),
    MetricDef("server_client", "server latency, client", "t_finish - t_dispatch", _c("t_finish") - _c("t_dispatch"),
              slo_key="server"),
    MetricDef("server_sglang", "server latency, sglang", "server_e2e_latency (sglang meta_info.e2e_latency)",
              _c("server_e2e_latency")),
    MetricDef("ttft", "TTFT from arrival", "t_first_token - t_arrival", _c("t_first_token") - _c("t_arrival"),
              slo_key="ttft"),
    MetricDef("ttft_dispatch", "TTFT from dispatch", "t_first_token - t_dispatch",
              _c("t_first_token") - _c("t_dispatch")),
    MetricDef("tpot", "TPOT",
              "(t_finish - t_first_token) / (completion_tokens - 1), requests with completion_tokens > 1",
              pl.when(_c("completion_tokens") > 1)
              .then((_c("t_finish") - _c("t_first_token")) / (_c("completion_tokens") - 1)).otherwise(None),
              slo_key="tpot"),
    MetricDef("release_lag", "release lag", "t_released - t_arrival", _c("t_released") - _c("t_arrival")),
    # per request (for --slo itl): its largest gap; the ITL rows pool every gap instead
    MetricDef("itl", "ITL", "every gap between a streamed answer's chunks after its first token, pooled over requests "
              "(vllm's ITL); percentiles and mean from the records' 2% histograms (within 1%), max exact",
              _c("itl_max"), pooled=True, slo_key="itl"),
)
_BY_KEY = {m.key: m for m in LATENCY}

# views of the table, for their readers
LATENCY_METRICS: tuple[tuple[str, str, str], ...] = tuple((m.key, m.label, m.definition) for m in LATENCY)
POOLED = tuple(m.key for m in LATENCY if m.pooled)
LATENCY_LABELS = {m.key: m.label for m in LATENCY}
_SLO_ORDER = ("ttft", "total", "tpot", "server", "wait", "itl")  # as --help and the errors list them
# --slo keys -> latency metric
SLO_KEYS: dict[str, str] = dict(sorted(((m.slo_key, m.key) for m in LATENCY if m.slo_key is not None),
                                       key=lambda pair: _SLO_ORDER.index(pair[0])))


def latency_expr(key: str) -> pl.Expr:
    return _BY_KEY[key].expr


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ms|s)?\s*$")


def parse_slo(spec: str) -> dict[str, float]:
    """`"ttft=0.5,total=10"` -> {"ttft": 0.5, "total": 10.0} in seconds (a value may end in `ms` or `s`)."""
    slo: dict[str, float] = {}
    for part in spec.split(","):
        if "=" not in part:
            raise ConfigError(f"--slo: '{part.strip()}' is not KEY=SECONDS (keys: {', '.join(SLO_KEYS)})")
        key, value = (s.strip() for s in part.split("=", 1))
        if key not in SLO_KEYS:
            raise ConfigError(f"--slo: unknown key '{key}' (keys: {', '.join(SLO_KEYS)})")
        if key in slo:
            raise ConfigError(f"--slo: '{key}' is given twice")
        match = _DURATION.match(value)
        if match is None:
            raise ConfigError(f"--slo: {key}={value!r} is not a duration (seconds, or with ms/s: 0.5, 500ms)")
        seconds = float(match.group(1)) / (1000.0 if match.group(2) == "ms" else 1.0)
        if seconds <= 0:
            raise ConfigError(f"--slo: {key} must be > 0, got {value!r}")
        slo[key] = seconds
    return slo

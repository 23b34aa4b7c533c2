"""The report as data: a `Report` of sections of rows (each value with its delta against the baseline), the runs'
summaries, per-server loads and balance, the configuration diff, and the plot series. Built by sections.py, read by
report/render/."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Delta:
    """A run's value minus the baseline's; `pct` is % of the baseline (None when the baseline is 0)."""

    abs: float | None
    pct: float | None
    ci_low: float | None = None
    ci_high: float | None = None

    @property
    def significant(self) -> bool | None:
        if self.ci_low is None or self.ci_high is None:
            return None
        return self.ci_low > 0 or self.ci_high < 0


@dataclass
class Row:
    section: str
    metric: str  # machine key, e.g. "total"
    label: str  # for people, e.g. "TTFT from arrival"
    stat: str  # "mean", "p50", "count", "value", ...
    unit: str  # "s", "req/s", "tok/s", "requests", "fraction"
    better: str | None  # "lower" / "higher" / None: which way a delta is an improvement
    values: list[float | None]
    deltas: list[Delta | None]  # None for the baseline
    # each run's own 95% interval of its value (latency percentiles, bootstrap; None where there is none)
    cis: list[tuple[float, float] | None] | None = None


@dataclass
class Section:
    key: str
    title: str
    rows: list[Row]


@dataclass
class RunSummary:
    label: str
    path: str
    run_name: str
    status: str  # run.json status
    mark: str | None  # "INTERRUPTED" / "FAILED" / "UNFINISHED" (run.json still says running) / None
    backend: str
    trace_path: str
    trace_sha256: str
    trace_requests: int
    records: int
    missing: int  # trace requests without a record
    kept: int  # records after the warm-up cut
    window_start: float | None
    window_end: float | None
    duration: float | None
    t_end: float | None
    speed: float | None  # --speed K of the replay: its times are simulated seconds (report/speed.py); None: real time
    speed_conversion: str | None = None  # how a sped-up run's times were converted (report/speed.py), else None
    # kept mismatch records by reason (the request's own numbers taken out): what the server did otherwise than asked
    mismatch_reasons: dict[str, int] = field(default_factory=dict)
    max_concurrency: int | None = None  # --max-concurrency N of the replay (its client gate); None: none


@dataclass
class ServerLoad:
    server: int
    url: str
    requests: int | None  # None: not known (a run through sglang-router whose server counters could not be read)
    share: float | None
    busy_s: float | None
    busy_fraction: float | None
    mean_in_flight: float | None
    cache_hit_rate: float | None = None  # sum(cached_tokens) / sum(prompt_tokens) of its kept ok requests
    prefill_tokens: int | None = None  # sum(prompt_tokens - cached_tokens): prompt tokens it computed
    role: str | None = None  # a PD run's pool: "prefill" or "decode" (None: a plain server)


@dataclass
class Balance:
    verdict: str  # "balanced" / "imbalanced" / "single server" / "no dispatched request"
    cv: float | None  # coefficient of variation of per-server request counts
    max_min_ratio: float | None  # largest / smallest request count (None when the smallest is 0)


@dataclass
class ConfigDiff:
    changed: list[tuple[str, list[str]]]  # setting, value per run
    same: list[tuple[str, str]]


@dataclass
class GpuSeries:
    """One GPU's nvidia-smi samples (gpu.jsonl), HTML only; times in simulated seconds for sped-up runs."""

    index: int  # nvidia-smi's GPU index
    name: str
    t: np.ndarray
    util_pct: np.ndarray  # utilization.gpu: % of the sample period a kernel ran (nan: not reported)
    mem_pct: np.ndarray  # memory.used / memory.total, %
    power_w: np.ndarray


@dataclass
class MetricsSeries:
    """One server's sglang /metrics over the run (server_metrics.jsonl), HTML only; good scrapes only, times in
    simulated seconds and rates per simulated second for sped-up runs (nan: the family was absent)."""

    t: np.ndarray
    running: np.ndarray  # sglang:num_running_reqs
    queued: np.ndarray  # sglang:num_queue_reqs
    token_usage: np.ndarray  # sglang:token_usage, fraction of the KV cache
    gen_throughput: np.ndarray  # sglang:gen_throughput, tok/s
    hit_t: np.ndarray  # end of each window of HIT_WINDOW scrapes (fewer in a short run) that counted prompt tokens
    hit_rate: np.ndarray  # Δcached_tokens_total / Δprompt_tokens_total over that window


@dataclass
class ServerSeries:
    """One server's time series (HTML only): the router's in-flight count against its cap, and what the server
    itself reported in /v1/loads (telemetry.jsonl): its waiting queue and KV cache usage."""

    in_flight: np.ndarray  # time-average per bin of the common time axis
    cap_t: np.ndarray  # the cap as steps: value cap_v[i] from cap_t[i] on (nan: no cap)
    cap_v: np.ndarray
    telemetry_t: np.ndarray  # poll times (simulated seconds for sped-up runs); empty when the run has no telemetry
    waiting: np.ndarray  # sglang num_waiting_reqs (nan where the poll failed)
    kv_usage: np.ndarray  # sglang token_usage, fraction of the KV cache
    metrics: MetricsSeries | None = None  # its /metrics scrapes; None when the run has none for it
    gpus: list[GpuSeries] = field(default_factory=list)  # the GPU(s) tracebench launched it on, when sampled


@dataclass
class RunSeries:
    """Plot data of one run (HTML only), already downsampled."""

    cdf: dict[str, tuple[np.ndarray, np.ndarray]]  # latency key -> (seconds, cumulative fraction)
    time_edges: np.ndarray  # seconds, bin edges on the run clock
    completions_per_s: np.ndarray  # moving average over `smoothing_s`
    smoothing_s: float
    in_flight: np.ndarray  # time-average per bin, all servers
    queue: np.ndarray  # router queue length, time-average per bin
    cap_changes: list[tuple[float, str]]  # (time, "server1=2" / "all=8")
    by_arrival: tuple[np.ndarray, np.ndarray] = (np.empty(0), np.empty(0))  # ok requests: t_arrival, total latency
    servers: list[ServerSeries] = field(default_factory=list)
    host_gpus: list[GpuSeries] = field(default_factory=list)  # sampled GPUs of no known server (attached servers)


@dataclass
class Report:
    runs: list[RunSummary]
    baseline: int
    config: ConfigDiff
    sections: list[Section]
    servers: list[list[ServerLoad]]
    balance: list[Balance]
    slo: dict[str, float] | None
    warmup_s: float
    bootstrap: int
    seed: int
    warnings: list[str]
    series: list[RunSeries] | None = field(default=None, repr=False)
    pd: list[Any] = field(default_factory=list)  # per run: report/pd.py PdRunStats, None for a plain run

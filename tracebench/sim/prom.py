"""The sim-server's metrics: a stats object fed through hooks (the engine's steps, the faces' finished and aborted
requests) and the Prometheus text of `/metrics`, rendered from one table of families in sglang 0.5.17's order.

Nothing here schedules or answers: the engine calls `on_prefill` / `on_decode`, the faces `on_finished` (when the
final answer is formatted, as sglang's tokenizer manager counts) and `on_abort`."""

from __future__ import annotations

import functools
from bisect import bisect_left
from itertools import accumulate
from collections.abc import Callable
from dataclasses import dataclass

from tracebench.sim.args import MODEL_NAME
from tracebench.sim.model import BatchModel, SimRequest, Step

DECODE_LOG_INTERVAL = 40       # sglang's decode_log_interval: gen_throughput is refreshed every 40 decode steps

_TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0)
_E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0, 400.0,
                600.0, 1200.0, 1800.0, 2400.0)
# the engine's lag (tracebench's own family): how late a step's tokens were handed out against the model's plan
_LAG_BUCKETS = (0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
_QUEUE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 15.0, 20.0, 30.0,
                  40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, 200.0, 300.0, 400.0, 500.0, 600.0, 700.0, 800.0, 900.0,
                  1000.0, 1200.0, 1400.0, 1600.0, 1800.0, 2000.0, 2500.0, 3000.0)


class Histogram:
    """A Prometheus histogram (cumulative buckets rendered on demand)."""

    __slots__ = ("bounds", "counts", "total", "n", "_rendered")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.n = 0
        # the last render's lines, with (name, labels, n): until the next observation they are the same (a family
        # nothing updates, such as the non-streamed requests' of a streamed run, is rendered once)
        self._rendered: tuple[tuple[str, str, int], list[str]] | None = None

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1   # the first bucket whose bound is >= value (le)
        self.total += value
        self.n += 1

    def render(self, name: str, labels: str) -> list[str]:
        """The histogram's lines (callers do not change the list)."""
        key = (name, labels, self.n)
        if self._rendered is not None and self._rendered[0] == key:
            return self._rendered[1]
        sum_head, bucket_heads, inf_head, count_head = _histogram_heads(name, labels, self.bounds)
        n = repr(float(self.n))
        # the cumulative counts (the last count is +Inf's: self.n says it), each after its bucket's line head
        cums = map(repr, map(float, accumulate(self.counts[:-1])))
        lines = [sum_head + repr(self.total), *map(str.__add__, bucket_heads, cums), inf_head + n, count_head + n]
        self._rendered = (key, lines)
        return lines


@functools.lru_cache(maxsize=256)
def _histogram_heads(name: str, labels: str, bounds: tuple[float, ...]) -> tuple[str, tuple[str, ...], str, str]:
    """A histogram's lines up to their values (_sum, each finite bucket, +Inf, _count; `le` among the bucket's
    labels): the same for every scrape, so made once (a server scraped every second renders ~200 of them; a
    virtual-clock run of many servers, thousands a second)."""
    buckets = tuple(f"{name}_bucket{{{_with_le(labels, repr(float(bound)))}}} " for bound in bounds)
    return (f"{name}_sum{{{labels}}} ", buckets, f"{name}_bucket{{{_with_le(labels, '+Inf')}}} ",
            f"{name}_count{{{labels}}} ")


def _with_le(labels: str, le: str) -> str:
    """Insert `le` among labels in alphabetical order, as prometheus_client's multiprocess collector prints them."""
    parts = labels.split(",")
    parts.append(f'le="{le}"')
    parts.sort(key=lambda p: p.split("=", 1)[0])
    return ",".join(parts)


class SimStats:
    """The counters, histograms and gauges sglang keeps that the model's state does not hold."""

    def __init__(self, observe_ttft: bool = True) -> None:
        self.observe_ttft = observe_ttft   # False on a PD prefill server (tokenizer_manager.py L2844-2853)
        self.gen_throughput = 0.0
        self._decode_steps_since_log = 0
        self._tokens_since_log = 0
        self._t_last_log = 0.0
        self.ttft_hist = {True: Histogram(_TTFT_BUCKETS), False: Histogram(_TTFT_BUCKETS)}
        self.e2e_hist = {True: Histogram(_E2E_BUCKETS), False: Histogram(_E2E_BUCKETS)}
        self.queue_hist = Histogram(_QUEUE_BUCKETS)
        self.prompt_tokens_total = {True: 0, False: 0}
        self.cached_tokens_total = 0  # prompt tokens served from the prefix cache, over finished requests
        self.generation_tokens_total = {True: 0, False: 0}
        self.num_requests_total = {True: 0, False: 0}
        self.num_aborted_total = 0
        self.cache_hit_rate = 0.0        # sglang: the last prefill batch's, reset by the decode log
        self.lag_hist = Histogram(_LAG_BUCKETS)
        self.lag_max = 0.0

    def start(self, now: float) -> None:
        """The engine starts: the first gen_throughput window opens."""
        self._t_last_log = now

    def on_prefill(self, step: Step) -> None:
        hit = step.cached_tokens
        self.cache_hit_rate = hit / (hit + step.batch_tokens)

    def on_decode(self, t_end: float, tokens: int) -> None:
        self._decode_steps_since_log += 1
        self._tokens_since_log += tokens
        if self._decode_steps_since_log >= DECODE_LOG_INTERVAL:
            self._log(t_end)

    def on_decodes(self, ends: list[float], tokens: int) -> None:
        """`on_decode` for consecutive decode steps ending at `ends`, each giving `tokens` (a decode run)."""
        left = DECODE_LOG_INTERVAL - self._decode_steps_since_log   # steps until the next log
        if left > len(ends):
            self._decode_steps_since_log += len(ends)
            self._tokens_since_log += tokens * len(ends)
            return
        for end in ends:
            self.on_decode(end, tokens)

    def _log(self, t_end: float) -> None:
        """sglang's decode log: gen_throughput over the steps since the last one."""
        elapsed = t_end - self._t_last_log
        self.gen_throughput = self._tokens_since_log / elapsed if elapsed > 0 else 0.0
        self.cache_hit_rate = 0.0
        self._decode_steps_since_log = 0
        self._tokens_since_log = 0
        self._t_last_log = t_end

    def on_finished(self, stream: bool, sim: SimRequest, e2e: float, ttft: float | None) -> None:
        """A request's final answer was formatted (`ttft`: None when no token was ever handed out)."""
        self.num_requests_total[stream] += 1
        self.prompt_tokens_total[stream] += sim.input_len
        self.cached_tokens_total += sim.cached_tokens
        self.generation_tokens_total[stream] += sim.output_len
        self.e2e_hist[stream].observe(e2e)
        if ttft is not None and self.observe_ttft:
            self.ttft_hist[stream].observe(ttft)
        self.queue_hist.observe(sim.t_forward_entry - sim.t_ready)

    def on_lag(self, late: float) -> None:
        """A step's tokens were handed out `late` wall seconds after the model's plan."""
        self.lag_hist.observe(late)
        if late > self.lag_max:
            self.lag_max = late

    def on_abort(self) -> None:
        self.num_aborted_total += 1

    def current_gen_throughput(self, model: BatchModel) -> float:
        """Decode tokens/s over the last 40 decode steps; 0 when nothing decodes (like sglang)."""
        return self.gen_throughput if model.num_decoding else 0.0


# ---- /metrics: one row per family, in sglang's order (tokenizer counters, scheduler gauges, histograms) ----------

_STREAM_LABELS = 'engine_type="unified",is_streaming="{s}",model_name="{m}"'
_LABELS = {
    "tokenizer": f'engine_type="unified",model_name="{MODEL_NAME}"',
    "device cache": f'cache_source="device",engine_type="unified",model_name="{MODEL_NAME}"',
    "scheduler": f'engine_type="unified",model_name="{MODEL_NAME}",moe_ep_rank="0",pp_rank="0",tp_rank="0"',
    "sim": f'model_name="{MODEL_NAME}"',
}


@dataclass(frozen=True)
class Family:
    """One Prometheus family. labels: "stream" (one series per is_streaming, false first; `value` gives a dict by
    stream) or a key of _LABELS (one series). value: a number, or a Histogram for kind "histogram"."""

    name: str
    kind: str
    doc: str
    labels: str
    value: Callable[[SimStats, BatchModel], object]


def _token_usage(stats: SimStats, model: BatchModel) -> float:
    return round(model.kv_used_tokens() / model.limits.max_total_num_tokens, 4)


FAMILIES: tuple[Family, ...] = (
    Family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.", "stream",
           lambda s, m: s.prompt_tokens_total),
    Family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.", "stream",
           lambda s, m: s.generation_tokens_total),
    Family("sglang:num_requests_total", "counter", "Number of requests processed.", "stream",
           lambda s, m: s.num_requests_total),
    Family("sglang:cached_tokens_total", "counter",
           "Number of cached prompt tokens by source (device/host/storage).", "device cache",
           lambda s, m: s.cached_tokens_total),
    Family("sglang:num_aborted_requests_total", "counter", "Number of requests aborted.", "tokenizer",
           lambda s, m: s.num_aborted_total),
    Family("sglang:max_total_num_tokens", "gauge", "Maximum total number of tokens in the KV cache pool.",
           "scheduler", lambda s, m: m.limits.max_total_num_tokens),
    Family("sglang:num_running_reqs", "gauge", "The number of running requests.", "scheduler",
           lambda s, m: m.num_decoding),
    Family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", "scheduler",
           lambda s, m: m.num_waiting),
    Family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).", "scheduler",
           lambda s, m: s.current_gen_throughput(m)),
    Family("sglang:cache_hit_rate", "gauge", "The prefix cache hit rate.", "scheduler",
           lambda s, m: s.cache_hit_rate),
    Family("sglang:decode_sum_seq_lens", "gauge", "The sum of all sequence lengths in decode.", "scheduler",
           lambda s, m: sum(r.kv_used for r in m.running)),
    Family("sglang:token_usage", "gauge", "The token usage.", "scheduler", _token_usage),
    Family("sglang:num_used_tokens", "gauge", "The number of used tokens.", "scheduler",
           lambda s, m: m.kv_used_tokens()),
    Family("sglang:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.",
           "stream", lambda s, m: s.ttft_hist),
    Family("sglang:e2e_request_latency_seconds", "histogram", "Histogram of End-to-end request latency in seconds",
           "stream", lambda s, m: s.e2e_hist),
    Family("sglang:queue_time_seconds", "histogram", "Histogram of queueing time in seconds.", "scheduler",
           lambda s, m: s.queue_hist),
    # tracebench's own (no sglang family): the simulator's event loop behind its model's schedule, wall seconds
    Family("tracebench:sim_lag_seconds", "histogram",
           "How late the simulator handed out a step's tokens against its model's schedule (wall seconds; at --speed "
           "K a simulated time error of up to K times this).", "sim", lambda s, m: s.lag_hist),
    Family("tracebench:sim_lag_max_seconds", "gauge", "The largest lag of tracebench:sim_lag_seconds so far.", "sim",
           lambda s, m: s.lag_max),
)



def _series(fam: Family) -> tuple[tuple[str, bool | None], ...]:
    """A family's series: (labels, is_streaming: the key of its value by stream, or None for one series)."""
    if fam.labels == "stream":
        return tuple((_STREAM_LABELS.format(s=str(stream).lower(), m=MODEL_NAME), stream) for stream in (False, True))
    return ((_LABELS[fam.labels], None),)


# what a page repeats every scrape, made once: each family's HELP and TYPE lines and its series' labels
_ROWS = tuple((fam, (f"# HELP {fam.name} {fam.doc}", f"# TYPE {fam.name} {fam.kind}"), _series(fam))
              for fam in FAMILIES)


def metrics_text(stats: SimStats, model: BatchModel, engine_type: str = "unified",
                 pd_lines: Callable[[str], list[str]] | None = None) -> str:
    """The /metrics page (prometheus_client's text format, as sglang 0.5.17 with --enable-metrics prints it).
    `engine_type`: prefill or decode on a PD server (disaggregation/utils.py L105-111); `pd_lines` renders the PD
    families with the scheduler's labels (pd.py)."""
    lines: list[str] = []
    for fam, header, series in _ROWS:
        lines += header
        value = fam.value(stats, model)
        if fam.labels == "stream":
            assert isinstance(value, dict)
        for labels, stream in series:
            v = value if stream is None else value[stream]  # type: ignore[index]
            if isinstance(v, Histogram):
                lines += v.render(fam.name, labels)
            else:
                lines.append(f"{fam.name}{{{labels}}} {float(v)!r}")  # type: ignore[arg-type]
    if pd_lines is not None:
        lines += pd_lines(_LABELS["scheduler"])
    text = "\n".join(lines) + "\n"
    # every family carries the server's engine_type (tokenizer_manager.py L676-684, metrics_collector.py L1079-1084)
    return text if engine_type == "unified" else text.replace('engine_type="unified"', f'engine_type="{engine_type}"')


@functools.lru_cache(maxsize=8)
def _sample_plan(names: frozenset[str]) -> tuple[tuple[Family, str | None, str | None, tuple[bool | None, ...]], ...]:
    """For `metrics_samples`: each family with a sample named in `names` (a histogram's NAME_sum, NAME_count; any
    other's NAME), the names kept (None: not asked for) and its series' keys (_series)."""
    plan = []
    for fam in FAMILIES:
        first, second = (f"{fam.name}_sum", f"{fam.name}_count") if fam.kind == "histogram" else (fam.name, "")
        kept_first, kept_second = (first if first in names else None), (second if second in names else None)
        if kept_first is not None or kept_second is not None:
            plan.append((fam, kept_first, kept_second, tuple(stream for _, stream in _series(fam))))
    return tuple(plan)


def metrics_samples(stats: SimStats, model: BatchModel, names: frozenset[str]) -> dict[str, list[float]]:
    """The values /metrics' page (`metrics_text`) prints for the samples named in `names` (full names, such as
    "sglang:num_running_reqs", or a histogram's "..._sum" / "..._count"), one per series, each the float its text
    reads as; a name the page has not is absent. What parsing the page's lines for them gives, without the page: a
    virtual-clock run of many servers scrapes thousands a second (tests/test_telemetry.py checks the two agree).
    A PD server's own families (pd.py) are not among them."""
    out: dict[str, list[float]] = {}
    for fam, first, second, streams in _sample_plan(names):
        value = fam.value(stats, model)
        for stream in streams:
            v = value if stream is None else value[stream]  # type: ignore[index]
            if isinstance(v, Histogram):
                if first is not None:
                    out.setdefault(first, []).append(float(v.total))
                if second is not None:
                    out.setdefault(second, []).append(float(v.n))
            else:
                out.setdefault(first, []).append(float(v))  # type: ignore[arg-type]
    return out

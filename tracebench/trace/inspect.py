"""Statistics of a trace (`tracebench inspect`).

Definitions (docs/trace-format.md):
- duration: last arrival - first arrival (s);
- mean rate: 1 / mean inter-arrival gap = (requests - 1) / duration;
- gap CV: std / mean of the inter-arrival gaps (population std; 1 for Poisson, 0 for constant);
- peak rate (1 s): the most requests arriving within any 1-second interval [t, t + 1);
- length percentiles: linear interpolation between order statistics (numpy's default), as `tracebench report`'s;
- offered tokens/s: mean rate x mean length (input, output, and both).
Statistics that need more requests than the trace has (a rate needs 2, a CV 3) are None.
Prefix structure (`prefix`, None when no request has prefix_blocks): tracebench/trace/prefix.py.
Context fit (`context`): requests with input_len + output_len > C - 2, which sglang 0.5.17 serves short (it clips
max_new_tokens to C - 1 - input_len - 1: .DUCUMENT/failure-modes.md); C is --max-context, else the header's
max_context (a generated trace), else llama-2's 4096.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from tracebench.trace.format import TraceHeader, read_columns
from tracebench.trace.lengths import OUTPUT_RESERVE, PROMPT_RESERVE
from tracebench.trace.prefix import DEFAULT_LRU_TOKENS, PrefixStats, prefix_stats

LLAMA2_CONTEXT = 4096  # what a trace is checked against when neither --max-context nor its header says


@dataclass(frozen=True)
class ContextFit:
    """How many requests sglang would serve short: input_len + output_len > max_context - 2 (`over`; the whole
    answer comes only up to there), and prompts over max_context - 7 (`prompt_over`: refused)."""

    max_context: int
    source: str  # "--max-context", "header" (the generator's max_context) or "llama-2 default"
    over: int
    prompt_over: int


@dataclass(frozen=True)
class CapacityFit:
    """The trace against `servers` servers of one profile (tracebench/capacity.py): their KV beside its working set,
    and its offered load as a share of what they serve."""

    profile: str
    accelerator: str
    servers: int
    kv_tokens_per_server: int
    shared_tokens: int | None  # None: no prefix blocks
    working_set: str | None  # what the working set means for routing
    load: float | None  # None: fewer than 2 requests (no rate)
    capacity_rate: float | None
    batch: int
    requests: int = 0  # the trace's (fewer than capacity.MIN_REQUESTS: a burst, not judged)


@dataclass(frozen=True)
class LengthStats:
    mean: float
    p50: float
    p90: float
    p99: float
    max: int


@dataclass(frozen=True)
class TraceStats:
    path: str
    requests: int
    duration_s: float | None
    mean_rate: float | None
    gap_cv: float | None
    peak_rate_1s: int | None
    input_len: LengthStats | None
    output_len: LengthStats | None
    offered_input_tokens_per_s: float | None
    offered_output_tokens_per_s: float | None
    offered_tokens_per_s: float | None
    prefix: PrefixStats | None = None
    context: ContextFit | None = None
    capacity: CapacityFit | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def length_stats(values: np.ndarray) -> LengthStats | None:
    if values.size == 0:
        return None
    # the report's percentiles (linear interpolation, numpy's default): one definition for both commands
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return LengthStats(mean=float(values.mean()), p50=float(p50), p90=float(p90), p99=float(p99), max=int(values.max()))


def stats_from_columns(path: str, arrival_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray) -> TraceStats:
    count = int(arrival_s.size)
    duration = float(arrival_s[-1] - arrival_s[0]) if count else None
    mean_rate = (count - 1) / duration if count >= 2 and duration else None
    gap_cv = None
    if count >= 3:
        gaps = np.diff(arrival_s)
        mean_gap = float(gaps.mean())
        gap_cv = float(gaps.std()) / mean_gap if mean_gap > 0 else None
    peak = None
    if count:
        # for each request, how many arrive in [its arrival, its arrival + 1 s)
        ends = np.searchsorted(arrival_s, arrival_s + 1.0, side="left")
        peak = int((ends - np.arange(count)).max())
    in_stats, out_stats = length_stats(input_len), length_stats(output_len)
    offered_in = offered_out = offered = None
    if mean_rate is not None and in_stats is not None and out_stats is not None:
        offered_in, offered_out = mean_rate * in_stats.mean, mean_rate * out_stats.mean
        offered = offered_in + offered_out
    return TraceStats(
        path=path, requests=count, duration_s=duration, mean_rate=mean_rate, gap_cv=gap_cv, peak_rate_1s=peak,
        input_len=in_stats, output_len=out_stats, offered_input_tokens_per_s=offered_in,
        offered_output_tokens_per_s=offered_out, offered_tokens_per_s=offered,
    )


def context_fit(header: TraceHeader, input_len: np.ndarray, output_len: np.ndarray,
                max_context: int | None) -> ContextFit:
    if max_context is not None:
        context, source = max_context, "--max-context"
    elif isinstance(header.fields.get("max_context"), int):
        context, source = header.fields["max_context"], "header"
    else:
        context, source = LLAMA2_CONTEXT, "llama-2 default"
    over = int(((input_len + output_len) > context - OUTPUT_RESERVE).sum())
    return ContextFit(context, source, over, int((input_len > context - PROMPT_RESERVE).sum()))


def capacity_fit(stats: TraceStats, servers: int, gpu: str | None, cap: int | None) -> CapacityFit:
    """`stats` against `servers` servers of the built-in profile of `gpu` (None: the simulator's default, H200)."""
    from tracebench.capacity import costs_named, costs_of_gpu, offered_load, working_set_line
    from tracebench.errors import ConfigError

    costs = costs_named("llama-2-7b-h200-triton") if gpu is None else costs_of_gpu(gpu)
    if costs is None:
        raise ConfigError(f"--gpu {gpu!r}: no single built-in profile for this GPU (tracebench sim-server --help lists "
                          f"them)")
    shared = stats.prefix.shared_tokens if stats.prefix is not None else None
    load = None
    if stats.mean_rate is not None and stats.input_len is not None and stats.output_len is not None:
        load = offered_load(costs, rate=stats.mean_rate, input_mean=stats.input_len.mean,
                            output_mean=stats.output_len.mean,
                            cached_fraction=stats.prefix.reusable_fraction if stats.prefix is not None else 0.0,
                            servers=servers, cap=cap)
    room = costs.kv_tokens if load is None else load.cache_room
    return CapacityFit(profile=costs.name, accelerator=costs.accelerator, servers=servers,
                       kv_tokens_per_server=costs.kv_tokens, shared_tokens=shared,
                       working_set=None if shared is None else working_set_line(shared, room, servers),
                       load=None if load is None else load.share,
                       capacity_rate=None if load is None else load.capacity_rate,
                       batch=0 if load is None else load.batch, requests=stats.requests)


def trace_stats(path: str | os.PathLike[str], lru_tokens: tuple[int, ...] = DEFAULT_LRU_TOKENS,
                max_context: int | None = None) -> TraceStats:
    """Read (and validate) the trace and compute its statistics, the prefix structure with LRU caches of
    `lru_tokens` tokens, and how many requests fit the context `max_context` (None: the header's, else 4096).
    Raises TraceError for a broken trace."""
    header, columns = read_columns(path, with_blocks=True)
    stats = stats_from_columns(str(path), columns.arrival_s, columns.input_len, columns.output_len)
    stats = replace(stats, context=context_fit(header, columns.input_len, columns.output_len, max_context))
    if columns.blocks.size == 0:
        return stats
    assert header.block_size is not None  # the reader rejects blocks without it
    prefix = prefix_stats(columns.block_counts, columns.blocks, columns.input_len, header.block_size, lru_tokens)
    return replace(stats, prefix=prefix)


def _fmt(value: float | None, spec: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{unit}"


def format_table(stats: TraceStats) -> str:
    lines = [
        f"trace             {stats.path}",
        f"requests          {stats.requests}",
        f"duration          {_fmt(stats.duration_s, '.3f', ' s')}",
        f"mean rate         {_fmt(stats.mean_rate, '.3f', ' req/s')}",
        f"gap CV            {_fmt(stats.gap_cv, '.3f')}",
        f"peak rate (1 s)   {_fmt(stats.peak_rate_1s, 'd', ' req/s')}",
        "",
        f"{'':18}{'mean':>10}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}",
    ]
    for name, ls in (("input_len", stats.input_len), ("output_len", stats.output_len)):
        if ls is None:
            lines.append(f"{name:18}{'-':>10}{'-':>8}{'-':>8}{'-':>8}{'-':>8}")
        else:
            lines.append(f"{name:18}{ls.mean:>10.1f}{ls.p50:>8.1f}{ls.p90:>8.1f}{ls.p99:>8.1f}{ls.max:>8d}")
    lines += [
        "",
        f"offered tokens/s  {_fmt(stats.offered_tokens_per_s, '.1f')} "
        f"(input {_fmt(stats.offered_input_tokens_per_s, '.1f')}, output {_fmt(stats.offered_output_tokens_per_s, '.1f')})",
    ]
    if stats.context is not None:
        fit = stats.context
        limit = fit.max_context - OUTPUT_RESERVE
        which = {"--max-context": "--max-context", "header": "the trace's max_context",
                 "llama-2 default": "llama-2's; --max-context C for another model"}[fit.source]
        line = (f"context fit       {fit.over} requests over input_len + output_len <= {limit} (context "
                f"{fit.max_context}, {which})")
        if fit.over:
            line += ": sglang answers them short (max_new_tokens clipped to context - 1 - input_len - 1)"
        if fit.prompt_over:
            line += f"; {fit.prompt_over} prompts over {fit.max_context - PROMPT_RESERVE} tokens (refused)"
        lines += [line]
    if stats.prefix is not None:
        lines += ["", *_prefix_lines(stats.prefix)]
    if stats.capacity is not None:
        lines += ["", *_capacity_lines(stats.capacity)]
    return "\n".join(lines)


def _capacity_lines(fit: CapacityFit) -> list[str]:
    """The capacity lines, wrapped to the terminal's width under their label."""
    import textwrap

    from tracebench.termwidth import terminal_width

    width = terminal_width()
    return [wrapped for line in _capacity_text(fit)
            for wrapped in textwrap.wrap(line, width, subsequent_indent=" " * 18, break_on_hyphens=False)]


def _capacity_text(fit: CapacityFit) -> list[str]:
    from tracebench.capacity import LOAD_WARN, MIN_REQUESTS

    lines = [f"KV capacity       {fit.kv_tokens_per_server:,} tokens per server x {fit.servers} = "
             f"{fit.kv_tokens_per_server * fit.servers:,} ({fit.profile}, {fit.accelerator}; --servers, --gpu)"]
    if fit.shared_tokens is not None:
        lines.append(f"working set       {fit.shared_tokens:,} tokens of prefix blocks sent by 2+ requests: "
                     f"{fit.working_set}")
    if fit.load is not None:
        lines.append(f"offered load      {fit.load:.0%} of what {fit.servers} server(s) can serve at best: "
                     f"{fit.capacity_rate:.1f} req/s of this mix is their throughput ceiling (batch {fit.batch}, "
                     f"the ceiling's hits, servers saturated and queues growing), not a rate that meets a latency "
                     f"SLO: simulated runs queue from about {LOAD_WARN:.0%} of it; to find that rate, tracebench "
                     f"sweep (docs/sweep.md); rule: docs/trace-format.md \"Capacity\"")
        if fit.load > LOAD_WARN and fit.requests >= MIN_REQUESTS:
            lines.append(f"warning: the offered load is {fit.load:.0%} of the servers' estimated capacity, past "
                         f"{LOAD_WARN:.0%} (where simulated runs start to queue): expect queues that grow through the "
                         f"run, so latency measures the backlog; lower the rate (generate --rate) or add servers")
    return lines


def _prefix_lines(p: PrefixStats) -> list[str]:
    lines = [
        f"prefix blocks     {p.requests_with_blocks} requests with blocks of {p.block_size} tokens; {p.block_refs} "
        f"block ids, {p.distinct_blocks} distinct, {p.distinct_prefixes} distinct prefixes",
        f"reusable (ceiling) {p.reusable_fraction:.3f} of prompt tokens ({p.reusable_tokens} of {p.prompt_tokens}) with "
        f"one unbounded cache",
    ]
    for lru in p.lru:
        sampled = "" if lru.sample_rate == 1.0 else f" (estimated on a {lru.sample_rate:.1%} sample of the blocks)"
        lines.append(f"LRU {lru.cache_tokens:>10} tokens  hit rate {lru.hit_rate:.3f}{sampled}")
    return lines

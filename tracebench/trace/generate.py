"""`generate_trace`: make a trace from arguments (synthetic or from a dataset) and write it.

Deterministic: the file depends only on the arguments (and the tracebench / numpy versions, both in the header).
Nothing about when or where it was made goes in, so the same arguments give a byte-identical file.

Randomness: `np.random.SeedSequence(seed)` is split into independent streams (arrivals or session starts, input
lengths or dataset rows or question / user lengths, output lengths, group picks or think times), so changing the
lengths does not move the arrivals and vice versa.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from tracebench import __version__
from tracebench.cleanup import TEMP_TAG, StopSignals, remove_stale, temp_files
from tracebench.errors import ConfigError
from tracebench.paths import portable_path
from tracebench.trace import arrivals as arrival_mod
from tracebench.trace import workloads
from tracebench.trace.datasets import DATASET_FORMATS, Dataset, load_dataset
from tracebench.trace.format import format_request_line, format_request_lines, write_trace
from tracebench.trace.lengths import (
    OUTPUT_RESERVE, LengthDistribution, clamp_to_context, make_distribution, sample_lengths,
)

# Defaults of the arguments left out (None in GenerateArgs). They are written into the header as used.
DEFAULT_RATE = 8.0
DEFAULT_NUM_REQUESTS = 1000
DEFAULT_SEED = 0
DEFAULT_ARRIVAL = "poisson"
DEFAULT_INPUT_LEN = 512
DEFAULT_OUTPUT_LEN = 128
DEFAULT_LENGTH_DIST = "lognormal"
DEFAULT_MAX_CONTEXT = 4096
DEFAULT_DATASET_FORMAT = "auto"
DEFAULT_TRACE_DIR = Path("traces")
# Upper bounds where a larger value would exhaust memory rather than describe a trace: a context of 2^24 tokens
# (16.8M; requests' prefix blocks are lists of that order), groups as many as a zipf length table may have entries.
MAX_CONTEXT = 1 << 24
MAX_GROUPS = 1 << 22
# --workload defaults. shared-prompt: sglang bench_serving's generated-shared-prefix (64 groups, 2,048-token prompts).
DEFAULT_BLOCK_SIZE = 64
DEFAULT_GROUPS = 64
DEFAULT_PREFIX_LEN = 2048
DEFAULT_GROUP_DIST = "uniform"
DEFAULT_GROUP_ZIPF = 1.0
DEFAULT_SESSIONS = 100
DEFAULT_TURNS = 5
DEFAULT_THINK_TIME = 5.0
DEFAULT_THINK_DIST = "exponential"
_SHARED_PROMPT_ARGS = ("groups", "prefix_len", "group_dist", "group_zipf")
_MULTI_TURN_ARGS = ("sessions", "turns", "think_time", "think_dist", "closed_loop")


@dataclass(frozen=True)
class GenerateArgs:
    """The arguments of `tracebench generate`. None (or False) = not given: a default applies where one exists, and
    giving an argument that does not apply (e.g. --rate with --keep-timestamps) is a ConfigError."""

    rate: float | None = None
    num_requests: int | None = None
    duration: float | None = None
    seed: int | None = None
    arrival: str | None = None
    burstiness: float | None = None
    input_len: int | None = None
    output_len: int | None = None
    length_dist: str | None = None
    length_spread: float | None = None
    max_context: int | None = None
    dataset: str | None = None
    dataset_format: str | None = None
    keep_timestamps: bool = False
    time_scale: float | None = None
    in_order: bool = False
    window_start: float | None = None
    window_end: float | None = None
    busiest: float | None = None
    workload: str | None = None
    block_size: int | None = None
    groups: int | None = None
    prefix_len: int | None = None
    group_dist: str | None = None
    group_zipf: float | None = None
    sessions: int | None = None
    turns: int | None = None
    think_time: float | None = None
    think_dist: str | None = None
    closed_loop: bool = False


@dataclass(frozen=True)
class GeneratedTrace:
    """What generate_trace wrote: the path, the header (as written) and the numbers the CLI prints; temporary files
    of earlier writers of this path found beside it: removed (their process had ended: killed) or left (running)."""

    path: Path
    header: dict[str, Any]
    input_mean: float
    output_mean: float
    stale_removed: list[tuple[Path, int]] = field(default_factory=list)
    temps_of_running: list[tuple[Path, int]] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    """The arguments with defaults applied, validated; None where an argument does not apply."""

    rate: float | None
    num_requests: int | None
    duration: float | None
    seed: int | None
    arrival: str | None
    burstiness: float | None
    input_len: int | None
    output_len: int | None
    length_dist: str | None
    length_spread: float | None
    max_context: int
    dataset: str | None
    dataset_format: str | None
    keep_timestamps: bool
    time_scale: float | None
    in_order: bool
    window_start: float | None
    window_end: float | None
    busiest: float | None
    workload: str | None
    block_size: int | None
    groups: int | None
    prefix_len: int | None
    group_dist: str | None
    group_zipf: float | None
    sessions: int | None
    turns: int | None
    think_time: float | None
    think_dist: str | None
    closed_loop: bool


def _given(args: GenerateArgs, *names: str) -> list[str]:
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name) not in (None, False)]


def _listing(flags: list[str], negated: bool = False) -> str:
    """"--a applies" / "--a, --b apply" (or "does not apply" / "do not apply")."""
    verb = ("does not apply" if negated else "applies") if len(flags) == 1 else ("do not apply" if negated else "apply")
    return f"{', '.join(flags)} {verb}"


def plan(args: GenerateArgs) -> _Plan:
    """Check the arguments for contradictions and ranges; apply defaults. Raises ConfigError."""
    _check_exclusions(args)
    max_context = _check_ranges(args)
    synthetic_arrivals = not args.keep_timestamps
    rate = (DEFAULT_RATE if args.rate is None else args.rate) if synthetic_arrivals else None
    arrival = (args.arrival or DEFAULT_ARRIVAL) if synthetic_arrivals else None
    if synthetic_arrivals:
        arrival_mod.check_arrival(arrival, rate, args.burstiness)  # type: ignore[arg-type]
    # Without a count or a span: the default count, except where the dataset's rows are taken in order (all of them).
    takes_all_rows = args.dataset is not None and (args.keep_timestamps or args.in_order)
    num_requests = args.num_requests
    if num_requests is None and args.duration is None and not takes_all_rows and args.workload != "multi-turn":
        num_requests = DEFAULT_NUM_REQUESTS

    input_len, output_len, length_dist, length_spread = _synthetic_lengths(args, max_context)
    shared_prompt, multi_turn = args.workload == "shared-prompt", args.workload == "multi-turn"
    group_dist = (args.group_dist or DEFAULT_GROUP_DIST) if shared_prompt else None
    return _Plan(
        rate=rate, num_requests=num_requests, duration=args.duration,
        seed=None if args.keep_timestamps else (DEFAULT_SEED if args.seed is None else args.seed),
        arrival=arrival, burstiness=args.burstiness, input_len=input_len, output_len=output_len,
        length_dist=length_dist, length_spread=length_spread, max_context=max_context, dataset=args.dataset,
        dataset_format=None if args.dataset is None else (args.dataset_format or DEFAULT_DATASET_FORMAT),
        keep_timestamps=args.keep_timestamps,
        time_scale=(1.0 if args.time_scale is None else args.time_scale) if args.keep_timestamps else None,
        in_order=args.in_order,
        window_start=args.window_start, window_end=args.window_end, busiest=args.busiest,
        workload=args.workload,
        block_size=(DEFAULT_BLOCK_SIZE if args.block_size is None else args.block_size) if args.workload else None,
        groups=(DEFAULT_GROUPS if args.groups is None else args.groups) if shared_prompt else None,
        prefix_len=(DEFAULT_PREFIX_LEN if args.prefix_len is None else args.prefix_len) if shared_prompt else None,
        group_dist=group_dist,
        group_zipf=(DEFAULT_GROUP_ZIPF if args.group_zipf is None else args.group_zipf) if group_dist == "zipf" else None,
        sessions=(DEFAULT_SESSIONS if args.sessions is None else args.sessions) if multi_turn else None,
        turns=(DEFAULT_TURNS if args.turns is None else args.turns) if multi_turn else None,
        think_time=(DEFAULT_THINK_TIME if args.think_time is None else args.think_time) if multi_turn else None,
        think_dist=(args.think_dist or DEFAULT_THINK_DIST) if multi_turn else None,
        closed_loop=args.closed_loop,
    )


def _check_exclusions(args: GenerateArgs) -> None:
    """Options that contradict each other, or that apply only with another (--dataset, --keep-timestamps, gamma)."""
    if args.num_requests is not None and args.duration is not None:
        raise ConfigError("--num-requests and --duration exclude each other: give a request count or a time span")
    if args.dataset is None:
        stray = _given(args, "keep_timestamps", "time_scale", "in_order", "dataset_format", "window_start",
                       "window_end", "busiest")
        if stray:
            raise ConfigError(f"{_listing(stray)} only with --dataset")
    else:
        stray = _given(args, "input_len", "output_len", "length_dist", "length_spread")
        if stray:
            raise ConfigError(f"{_listing(stray, negated=True)} with --dataset: the dataset supplies the lengths")
    if args.time_scale is not None and not args.keep_timestamps:
        raise ConfigError("--time-scale only applies with --keep-timestamps (it divides the dataset's own gaps)")
    if args.keep_timestamps:
        if args.in_order:
            raise ConfigError("--in-order is implied by --keep-timestamps (the rows are replayed in file order): drop it")
        stray = _given(args, "rate", "arrival", "burstiness", "seed")
        if stray:
            raise ConfigError(f"{_listing(stray, negated=True)} with --keep-timestamps: the dataset's own timestamps "
                              f"are the arrivals and nothing is random")
    _check_workload(args)
    _check_window(args)
    if args.burstiness is not None and args.arrival != "gamma":
        raise ConfigError(f"--burstiness only applies to --arrival gamma (got --arrival {args.arrival or DEFAULT_ARRIVAL})")


def _check_ranges(args: GenerateArgs) -> int:
    """Each number in its range; returns --max-context (its default applied)."""
    if args.num_requests is not None and not 1 <= args.num_requests <= arrival_mod.MAX_REQUESTS:
        raise ConfigError(f"--num-requests must be between 1 and {arrival_mod.MAX_REQUESTS}, got {args.num_requests}")
    if args.duration is not None and \
            not (math.isfinite(args.duration) and 0 < args.duration <= arrival_mod.MAX_ARRIVAL_S):
        raise ConfigError(f"--duration must be a number of seconds > 0 and at most {arrival_mod.MAX_ARRIVAL_S:,.0f}, "
                          f"got {args.duration}")
    if args.seed is not None and args.seed < 0:
        raise ConfigError(f"--seed must be an integer >= 0, got {args.seed}")
    if args.time_scale is not None and not (math.isfinite(args.time_scale) and args.time_scale > 0):
        raise ConfigError(f"--time-scale must be a number > 0, got {args.time_scale}")
    if args.dataset_format is not None and args.dataset_format not in DATASET_FORMATS:
        raise ConfigError(f"--dataset-format must be one of {', '.join(DATASET_FORMATS)}, got {args.dataset_format!r}")
    max_context = DEFAULT_MAX_CONTEXT if args.max_context is None else args.max_context
    if not 2 <= max_context <= MAX_CONTEXT:
        raise ConfigError(f"--max-context must be at least 2 (one input and one output token) and at most "
                          f"{MAX_CONTEXT} (2^24), got {max_context}")
    return max_context


def _synthetic_lengths(args: GenerateArgs, max_context: int
                       ) -> tuple[int | None, int | None, str | None, float | None]:
    """(input_len, output_len, length_dist, length_spread) of a trace without --dataset (all None with one: the
    dataset supplies the lengths); the mean request, its shared prefix included, must fit in the context."""
    if args.dataset is not None:
        return None, None, None, None
    input_len = DEFAULT_INPUT_LEN if args.input_len is None else args.input_len
    output_len = DEFAULT_OUTPUT_LEN if args.output_len is None else args.output_len
    length_dist = args.length_dist or DEFAULT_LENGTH_DIST
    length_spread = _input_dist(args, input_len, length_dist).spread
    make_distribution(length_dist, output_len, args.length_spread, "--output-len")
    shared = (DEFAULT_PREFIX_LEN if args.prefix_len is None else args.prefix_len) \
        if args.workload == "shared-prompt" else 0
    if shared + input_len + output_len > max_context - OUTPUT_RESERVE:
        with_prefix = f"--prefix-len {shared} + " if shared else ""
        raise ConfigError(f"{with_prefix}--input-len {input_len} + --output-len {output_len} exceed --max-context "
                          f"{max_context} - {OUTPUT_RESERVE} = {max_context - OUTPUT_RESERVE} (sglang generates the "
                          f"whole answer only up to context_len - 2): the mean request does not fit in the context")
    return input_len, output_len, length_dist, length_spread


def _check_window(args: GenerateArgs) -> None:
    """--window-start / --window-end (a window of the dataset's own time) or --busiest (its busiest window)."""
    if args.busiest is not None:
        stray = _given(args, "window_start", "window_end")
        if stray:
            raise ConfigError(f"{_listing(stray, negated=True)} with --busiest: it picks the window itself")
        if not (math.isfinite(args.busiest) and args.busiest > 0):
            raise ConfigError(f"--busiest must be a number of seconds > 0, got {args.busiest}")
    for flag, value in (("--window-start", args.window_start), ("--window-end", args.window_end)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{flag} must be a number of seconds >= 0 (since the dataset's first row), got {value}")
    if args.window_start is not None and args.window_end is not None and args.window_end <= args.window_start:
        raise ConfigError(f"--window-end {_num(args.window_end)} must be after --window-start "
                          f"{_num(args.window_start)}")


def _windowed(p: _Plan, dataset: Dataset) -> tuple[Dataset, dict[str, Any] | None]:
    """The dataset cut to the asked window of its own time, and the header's `source.window` (None: no window)."""
    if p.window_start is None and p.window_end is None and p.busiest is None:
        return dataset, None
    if dataset.extras is not None and any(e is not None and "after" in e for e in dataset.extras):
        raise ConfigError(f"--dataset {p.dataset} is closed loop (requests sent after others finished): a window would "
                          f"cut requests from the ones they follow")
    span = dataset.span_s
    spans = f"the dataset {p.dataset} spans {span:.3f} s (its first usable row is at 0)"
    if p.busiest is not None:
        if p.busiest > span:
            raise ConfigError(f"--busiest {_num(p.busiest)} s: {spans}; ask for a shorter window")
        start = dataset.busiest_start(p.busiest)
        end = start + p.busiest
    else:
        start = 0.0 if p.window_start is None else p.window_start
        if start >= span:
            raise ConfigError(f"--window-start {_num(start)} s: {spans}")
        if p.window_end is not None and p.window_end > span:
            raise ConfigError(f"--window-end {_num(p.window_end)} s: {spans}; leave --window-end out to take it to "
                              f"the end")
        end = math.inf if p.window_end is None else p.window_end
    cut = dataset.window(start, end)
    if cut.usable_rows == 0:
        raise ConfigError(f"--window-start {_num(start)} / --window-end {_num(end)}: no usable row of {p.dataset} "
                          f"arrives in that window")
    info: dict[str, Any] = {"start_s": start, "end_s": None if math.isinf(end) else end, "rows": cut.usable_rows}
    if p.busiest is not None:
        info["busiest_s"] = p.busiest
    return cut, info


def _check_workload(args: GenerateArgs) -> None:
    """The --workload arguments: each only with its workload, in range; a workload excludes --dataset."""
    if args.workload is None:
        stray = _given(args, "block_size", *_SHARED_PROMPT_ARGS, *_MULTI_TURN_ARGS)
        if stray:
            raise ConfigError(f"{_listing(stray)} only with --workload (shared-prompt or multi-turn)")
        return
    if args.workload not in workloads.WORKLOADS:
        raise ConfigError(f"--workload must be one of {', '.join(workloads.WORKLOADS)}, got {args.workload!r}")
    if args.dataset is not None:
        raise ConfigError(f"--workload {args.workload} does not apply with --dataset (a dataset brings its own prompts)")
    other = _MULTI_TURN_ARGS if args.workload == "shared-prompt" else _SHARED_PROMPT_ARGS
    stray = _given(args, *other)
    if stray:
        raise ConfigError(f"{_listing(stray, negated=True)} to --workload {args.workload}")
    if args.block_size is not None and args.block_size < 1:
        raise ConfigError(f"--block-size must be an integer >= 1 (tokens per prefix block), got {args.block_size}")
    if args.workload == "shared-prompt":
        if args.groups is not None and not 1 <= args.groups <= MAX_GROUPS:
            raise ConfigError(f"--groups must be an integer >= 1 and at most {MAX_GROUPS} (2^22), got {args.groups}")
        if args.prefix_len is not None and args.prefix_len < 1:
            raise ConfigError(f"--prefix-len must be an integer >= 1 (tokens), got {args.prefix_len}")
        prefix_len = DEFAULT_PREFIX_LEN if args.prefix_len is None else args.prefix_len
        block_size = DEFAULT_BLOCK_SIZE if args.block_size is None else args.block_size
        if prefix_len < block_size:
            raise ConfigError(f"--prefix-len {prefix_len} is shorter than one block (--block-size {block_size}): only "
                              f"whole blocks are shared, so nothing would be")
        if args.group_dist is not None and args.group_dist not in workloads.GROUP_DISTS:
            raise ConfigError(f"--group-dist must be one of {', '.join(workloads.GROUP_DISTS)}, got {args.group_dist!r}")
        if args.group_zipf is not None:
            if args.group_dist != "zipf":
                raise ConfigError("--group-zipf only applies to --group-dist zipf")
            if not (math.isfinite(args.group_zipf) and args.group_zipf > 0):
                raise ConfigError(f"--group-zipf must be a number > 0 (the zipf exponent), got {args.group_zipf}")
        return
    stray = _given(args, "num_requests", "duration")
    if stray:
        raise ConfigError(f"{_listing(stray, negated=True)} to --workload multi-turn: it makes --sessions x --turns "
                          f"requests")
    if args.sessions is not None and not 1 <= args.sessions <= arrival_mod.MAX_REQUESTS:
        raise ConfigError(f"--sessions must be between 1 and {arrival_mod.MAX_REQUESTS}, got {args.sessions}")
    if args.turns is not None and args.turns < 1:
        raise ConfigError(f"--turns must be an integer >= 1, got {args.turns}")
    sessions = DEFAULT_SESSIONS if args.sessions is None else args.sessions
    turns = DEFAULT_TURNS if args.turns is None else args.turns
    if sessions * turns > arrival_mod.MAX_REQUESTS:
        raise ConfigError(f"--sessions {sessions} x --turns {turns} is more than {arrival_mod.MAX_REQUESTS} requests")
    workloads.check_think(args.think_dist or DEFAULT_THINK_DIST,
                          DEFAULT_THINK_TIME if args.think_time is None else args.think_time)


def _input_dist(args: GenerateArgs, input_len: int, length_dist: str) -> LengthDistribution:
    return make_distribution(length_dist, input_len, args.length_spread, "--input-len")


def _num(value: float) -> str:
    return f"{value:g}".replace("+", "")


def default_output_path(p: _Plan) -> Path:
    """traces/<name>.jsonl, the name built from the arguments that shape the trace."""
    parts: list[str] = []
    if p.dataset is not None:
        parts.append(re.sub(r"[^A-Za-z0-9._-]+", "_", Path(p.dataset).stem) or "dataset")
        if p.busiest is not None:
            parts.append(f"busiest{_num(p.busiest)}s")
        elif p.window_start is not None or p.window_end is not None:
            parts.append(f"w{_num(p.window_start or 0)}-{'end' if p.window_end is None else _num(p.window_end)}s")
        if p.keep_timestamps:
            parts.append("timestamps" + ("" if p.time_scale == 1.0 else f"-x{_num(p.time_scale)}"))  # type: ignore[arg-type]
    if p.arrival is not None:
        parts.append(p.arrival + (f"{_num(p.burstiness)}" if p.burstiness is not None else ""))
        parts.append(f"r{_num(p.rate)}")  # type: ignore[arg-type]
    if p.num_requests is not None:
        parts.append(f"n{p.num_requests}")
    if p.duration is not None:
        parts.append(f"d{_num(p.duration)}s")
    if p.dataset is None:
        spread = "" if p.length_spread is None else _num(p.length_spread)
        parts += [f"in{p.input_len}", f"out{p.output_len}", f"{p.length_dist}{spread}"]
    elif not p.keep_timestamps:
        parts.append("inorder" if p.in_order else "sampled")
    if p.workload == "shared-prompt":
        zipf = "" if p.group_zipf is None else _num(p.group_zipf)
        parts.append(f"shared-g{p.groups}-L{p.prefix_len}-{p.group_dist}{zipf}")
    elif p.workload == "multi-turn":
        parts.append(f"multiturn-S{p.sessions}-T{p.turns}-think{_num(p.think_time)}{p.think_dist}"  # type: ignore[arg-type]
                     + ("-closed" if p.closed_loop else ""))
    if p.block_size is not None:
        parts.append(f"b{p.block_size}")
    if p.max_context != DEFAULT_MAX_CONTEXT:
        parts.append(f"ctx{p.max_context}")
    if p.seed is not None:
        parts.append(f"s{p.seed}")
    return DEFAULT_TRACE_DIR / ("-".join(parts) + ".jsonl")


def generate_trace(args: GenerateArgs, output: str | Path | None = None,
                   stop: StopSignals | None = None) -> GeneratedTrace:
    """Make the trace the arguments describe and write it (atomically) to `output`, or to `default_output_path`.
    Raises ConfigError (arguments), DatasetError / TraceError (the dataset); nothing is written then. `stop`: the
    command's stop signals, deferred from the moment the last line is written (the trace is then complete)."""
    p = plan(args)
    # spawn(4)'s first three children are spawn(3)'s: traces without a workload are what they were
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(p.seed or 0).spawn(4)]
    arrival_rng, input_rng, output_rng, workload_rng = streams
    dataset = load_dataset(p.dataset, p.dataset_format) if p.dataset is not None else None  # type: ignore[arg-type]
    whole, window = dataset, None
    if dataset is not None:
        dataset, window = _windowed(p, dataset)

    extras: list[dict[str, Any] | None] | None = None
    workload_info: dict[str, Any] | None = None
    if p.workload is not None:
        made, lengths_info = _workload_requests(p, arrival_rng, input_rng, output_rng, workload_rng)
        arrivals, extras, workload_info = made.arrivals, list(made.extras), made.info
    elif dataset is None:
        arrivals, input_len, output_len, lengths_info = _synthetic_requests(p, arrival_rng, input_rng, output_rng)
    else:
        arrivals, input_len, output_len, extras, lengths_info = _dataset_requests(p, dataset, arrival_rng, input_rng)

    if p.workload is not None:  # clamped as they were made (the blocks depend on it)
        clamp = made.lengths
    else:
        clamp = clamp_to_context(input_len, output_len, p.max_context)
    if dataset is not None and extras is not None and clamp.input_cut:
        extras = _cut_prefix_blocks(extras, clamp.input_cut_mask, clamp.input_len, dataset.block_size)  # type: ignore[union-attr,arg-type]

    count = len(arrivals)
    _check_span(p, float(arrivals[-1]))
    duration_s = float("%.6f" % arrivals[-1])  # as written in the last line
    header: dict[str, Any] = {
        "num_requests": count,
        "duration_s": duration_s,
        "generator": {"tool": "tracebench generate", "tracebench": __version__, "numpy": np.__version__},
        # the dataset's path as a shared file records it (docs/run-format.md, "Paths"): its sha256 identifies it
        "args": {**asdict(p), "dataset": None if p.dataset is None else portable_path(p.dataset)},
        "arrivals": _arrivals_info(p),
        "lengths": lengths_info,
        "max_context": p.max_context,
        "clamped_requests": clamp.clamped,
        "clamped_input_requests": clamp.input_cut,
    }
    if workload_info is not None:
        header["workload"] = {"kind": p.workload, **workload_info}
        header["block_size"] = p.block_size
    elif extras is not None and any(e is not None and "prefix_blocks" in e for e in extras):
        header["block_size"] = dataset.block_size  # type: ignore[union-attr]
    if whole is not None:
        header["source"] = {
            "path": portable_path(whole.path), "format": whole.format, "detected": p.dataset_format == "auto",
            "sha256": whole.sha256, "rows": whole.rows, "dropped_zero_tokens": whole.dropped_zero_tokens,
            "usable_rows": whole.usable_rows,
        }
        if window is not None:
            header["source"]["window"] = window
    path = Path(output) if output is not None else default_output_path(p)
    if path.is_dir():
        raise ConfigError(f"-o {path}: is a directory (give the trace file's path)")
    if extras is None:
        lines = format_request_lines(0, arrivals, clamp.input_len, clamp.output_len)
    else:
        lines = _lines_with_extras(arrivals, clamp.input_len, clamp.output_len, extras)
    try:
        # a generate killed (SIGKILL) while writing this path left its temporary file: never reused, removed here
        stale, running = remove_stale(temp_files(path.parent, f".{path.name}", TEMP_TAG))
        write_trace(path, header, _then(lines, stop.defer) if stop is not None else lines)
    except OSError as err:  # write_trace removed its temporary file; the message names the path
        raise ConfigError(f"-o {path}: cannot write: {err.strerror or err}") from None
    return GeneratedTrace(path=path, header=header, input_mean=float(clamp.input_len.mean()),
                          output_mean=float(clamp.output_len.mean()), stale_removed=stale, temps_of_running=running)


def _synthetic_requests(p: _Plan, arrival_rng: np.random.Generator, input_rng: np.random.Generator,
                        output_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
    """Arrivals and lengths drawn from the plan's distributions: (arrivals, input_len, output_len, header lengths)."""
    arrivals = _synthetic_arrivals(p, arrival_rng)
    in_dist = make_distribution(p.length_dist, p.input_len, p.length_spread, "--input-len")  # type: ignore[arg-type]
    out_dist = make_distribution(p.length_dist, p.output_len, p.length_spread, "--output-len")  # type: ignore[arg-type]
    input_len = sample_lengths(in_dist, len(arrivals), input_rng)
    output_len = sample_lengths(out_dist, len(arrivals), output_rng)
    return arrivals, input_len, output_len, {"input": in_dist.describe(), "output": out_dist.describe()}


def _dataset_requests(p: _Plan, dataset: Dataset, arrival_rng: np.random.Generator, input_rng: np.random.Generator
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any] | None] | None, dict[str, Any]]:
    """The dataset's rows the plan takes (sampled, in order, or at their timestamps): (arrivals, input_len,
    output_len, each row's extras or None, header lengths). A closed-loop dataset is taken in order only."""
    arrivals, rows = _dataset_rows(p, dataset, arrival_rng, input_rng)
    input_len, output_len = dataset.input_len[rows], dataset.output_len[rows]
    if dataset.extras is not None and not (p.keep_timestamps or p.in_order) and \
            any(e is not None and "after" in e for e in dataset.extras):
        raise ConfigError(f"--dataset {dataset.path} is closed loop (requests sent after others finished): sampled "
                          f"rows would lose the requests they follow; take them in order (--keep-timestamps or "
                          f"--in-order)")
    extras = [dataset.extras[i] for i in rows.tolist()] if dataset.extras is not None else None
    selection = "timestamps" if p.keep_timestamps else ("in order" if p.in_order else "sampled with replacement")
    return arrivals, input_len, output_len, extras, {"from": "dataset", "rows": selection}


def _then(lines: Iterator[bytes], done: Callable[[], None]) -> Iterator[bytes]:
    """The lines, then `done()` once the last one is written."""
    yield from lines
    done()


def _check_span(p: _Plan, last_arrival: float) -> None:
    """Refuse a trace whose last arrival cannot be written sensibly (arrival_mod.MAX_ARRIVAL_S): a tiny --rate,
    --time-scale or a huge --think-time would otherwise write times of hundreds of digits."""
    if last_arrival <= arrival_mod.MAX_ARRIVAL_S:
        return
    if p.keep_timestamps:
        cause = f"the dataset's timestamps divided by --time-scale {_num(p.time_scale)}"  # type: ignore[arg-type]
    elif p.workload == "multi-turn":
        cause = (f"--rate {_num(p.rate)} session starts/s and "  # type: ignore[arg-type]
                 f"--think-time {_num(p.think_time)} s")  # type: ignore[arg-type]
    else:
        cause = f"--rate {_num(p.rate)} req/s"  # type: ignore[arg-type]
    raise ConfigError(f"{cause} put the last arrival at {last_arrival:.3g} s: a trace's arrivals must lie within "
                      f"{arrival_mod.MAX_ARRIVAL_S:,.0f} s (31.7 years; they are written to the microsecond)")


def _workload_requests(p: _Plan, arrival_rng: np.random.Generator, input_rng: np.random.Generator,
                       output_rng: np.random.Generator,
                       workload_rng: np.random.Generator) -> tuple[workloads.WorkloadRequests, dict[str, Any]]:
    """The workload's requests and the header's `lengths` (what the length distributions were used for)."""
    in_dist = make_distribution(p.length_dist, p.input_len, p.length_spread, "--input-len")  # type: ignore[arg-type]
    out_dist = make_distribution(p.length_dist, p.output_len, p.length_spread, "--output-len")  # type: ignore[arg-type]
    if p.workload == "shared-prompt":
        arrivals = _synthetic_arrivals(p, arrival_rng)
        count = len(arrivals)
        group = workloads.pick_groups(p.groups, p.group_dist, p.group_zipf, count, workload_rng)  # type: ignore[arg-type]
        made = workloads.shared_prompt(arrivals, sample_lengths(in_dist, count, input_rng),
                                       sample_lengths(out_dist, count, output_rng), group, p.groups,  # type: ignore[arg-type]
                                       p.prefix_len, p.block_size, p.max_context)  # type: ignore[arg-type]
        lengths = {"question": in_dist.describe(), "output": out_dist.describe()}
    else:
        sessions, turns = p.sessions, p.turns
        starts = arrival_mod.arrivals_by_count(p.arrival, p.rate, sessions, arrival_rng, p.burstiness)  # type: ignore[arg-type]
        user = sample_lengths(in_dist, sessions * turns, input_rng).reshape(sessions, turns)  # type: ignore[operator]
        answer = sample_lengths(out_dist, sessions * turns, output_rng).reshape(sessions, turns)  # type: ignore[operator]
        think = workloads.think_times(p.think_dist, p.think_time, (sessions, turns - 1), workload_rng)  # type: ignore[arg-type,operator]
        made = workloads.multi_turn(starts, user, answer, think, p.block_size, p.max_context, p.closed_loop)  # type: ignore[arg-type]
        lengths = {"user": in_dist.describe(), "output": out_dist.describe()}
    return made, lengths


def _synthetic_arrivals(p: _Plan, rng: np.random.Generator) -> np.ndarray:
    assert p.arrival is not None and p.rate is not None
    if p.duration is not None:
        return arrival_mod.arrivals_by_duration(p.arrival, p.rate, p.duration, rng, p.burstiness)
    assert p.num_requests is not None
    return arrival_mod.arrivals_by_count(p.arrival, p.rate, p.num_requests, rng, p.burstiness)


def _dataset_rows(p: _Plan, dataset: Dataset, arrival_rng: np.random.Generator,
                  row_rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times and the dataset rows (indices) that supply each request's lengths."""
    usable = dataset.usable_rows
    where = f"the dataset {dataset.path} has {usable} usable rows" + (
        " in the window" if p.window_start is not None or p.window_end is not None or p.busiest is not None else "")
    if p.keep_timestamps:
        dataset.check_time_order()
        times = dataset.time_s / p.time_scale  # type: ignore[operator]
        if p.num_requests is not None:
            if p.num_requests > usable:
                raise ConfigError(f"--num-requests {p.num_requests}: {where}")
            count = p.num_requests
        elif p.duration is not None:
            if p.duration > times[-1]:
                raise ConfigError(f"--duration {_num(p.duration)} s: {where}, spanning only {times[-1]:.3f} s "
                                  f"(after --time-scale {_num(p.time_scale)})")  # type: ignore[arg-type]
            count = int(np.searchsorted(times, p.duration, side="left"))
        else:
            count = usable
        return times[:count].copy(), np.arange(count)
    if p.num_requests is None and p.duration is None:  # --in-order without a cut: every row once
        arrivals = arrival_mod.arrivals_by_count(p.arrival, p.rate, usable, arrival_rng, p.burstiness)  # type: ignore[arg-type]
    else:
        arrivals = _synthetic_arrivals(p, arrival_rng)
    count = len(arrivals)
    if p.in_order:
        if count > usable:
            asked = f"--num-requests {count}" if p.num_requests is not None else \
                f"--duration {_num(p.duration)} s at --rate {_num(p.rate)} makes {count} requests"  # type: ignore[arg-type]
            raise ConfigError(f"{asked}, but with --in-order each row is used once and {where}")
        return arrivals, np.arange(count)
    return arrivals, row_rng.integers(0, usable, count)


def _arrivals_info(p: _Plan) -> dict[str, Any]:
    if p.keep_timestamps:
        return {"process": "dataset timestamps", "time_scale": p.time_scale}
    info = {"process": p.arrival, "rate": p.rate, "burstiness": p.burstiness}
    if p.workload == "multi-turn":
        info["of"] = "session starts"
    return info


def _cut_prefix_blocks(extras: list[dict[str, Any] | None], cut_mask: np.ndarray,
                       input_len: np.ndarray, block_size: int) -> list[dict[str, Any] | None]:
    """A prompt cut by the clamp keeps only the prefix blocks that still lie inside it."""
    out = list(extras)
    for i in np.flatnonzero(cut_mask).tolist():
        extra = out[i]
        if extra is not None and "prefix_blocks" in extra:
            keep = -(-int(input_len[i]) // block_size)
            out[i] = {**extra, "prefix_blocks": extra["prefix_blocks"][:keep]}
    return out


def _lines_with_extras(arrivals: np.ndarray, input_len: np.ndarray, output_len: np.ndarray,
                       extras: list[dict[str, Any] | None]):
    for rid, (arrival, ilen, olen, extra) in enumerate(zip(arrivals.tolist(), input_len.tolist(),
                                                           output_len.tolist(), extras)):
        yield format_request_line(rid, arrival, ilen, olen, extra)

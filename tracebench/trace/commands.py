"""`tracebench generate` and `tracebench inspect`. Light at import time (`tracebench --help` imports every commands
module): numpy and the generators are imported inside the commands."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from tracebench.options import FINITE, INT, SEED

if TYPE_CHECKING:
    from tracebench.trace.generate import GeneratedTrace

# The same tuples as arrivals.ARRIVAL_KINDS, lengths.LENGTH_DISTS, datasets.DATASET_FORMATS (a test checks), repeated
# here so that building the CLI does not import numpy.
_ARRIVALS = ("poisson", "gamma", "constant")
_LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal", "zipf")
_DATASET_FORMATS = ("auto", "azure", "mooncake", "tracebench")
# The same as workloads.WORKLOADS, GROUP_DISTS, THINK_DISTS (the test checks these too).
_WORKLOADS = ("shared-prompt", "multi-turn")
_GROUP_DISTS = ("uniform", "zipf")
_THINK_DISTS = ("exponential", "fixed", "uniform")

_GENERATE_HELP = """Make a request trace (JSONL, trace format v1) and print its path and a one-line summary.

\b
Synthetic:     tracebench generate --rate 8 --num-requests 1000 --arrival gamma --burstiness 4
From a file:   tracebench generate --dataset AzureLLMInferenceTrace_conv.csv --keep-timestamps --time-scale 2
               tracebench generate --dataset mooncake_trace.jsonl --rate 4 --duration 600
               tracebench generate --dataset AzureLLMInferenceTrace_code.csv --keep-timestamps --busiest 60
Shared prefixes:
               tracebench generate --workload shared-prompt --groups 16 --prefix-len 2048 --group-dist zipf
               tracebench generate --workload multi-turn --sessions 200 --turns 6 --think-time 10 --closed-loop

\b
The same arguments give a byte-identical file (nothing about when or where it was made goes in); the header
records every argument, the seed and, for a dataset, its path and sha256.

\b
Length distributions (--length-dist; --input-len / --output-len are the means, always honoured):
  fixed      every length is the mean; --length-spread does not apply
  uniform    spread = std/mean (default 0.5): integers uniform on mean +- round(sqrt(3)*spread*mean)
  normal     spread = std/mean of the normal (default 0.5, at most 1); redrawn below 1, recentred so the
             mean stays the asked one
  lognormal  spread = std/mean (default 0.5); sigma_log = sqrt(ln(1+spread^2)) (the default)
  zipf       spread = longest length / mean (default 8, >= 2); P(k) ~ k^-a for k = 1..spread*mean,
             the exponent a solved so that the mean is the asked one

\b
Context clamp (--max-context C, the model's context length): no request has input_len + output_len >
C - 2 (4094 for 4096): sglang 0.5.17 answers up to C but clips max_new_tokens to C - 1 - input_len - 1
(scheduler.py L2132-2141), so only then does it generate the whole answer. The prompt is kept and the answer
shortened (output_len = C - 2 - input_len); a prompt longer than C - 7 is cut to C - 7 (sglang 0.5.17
refuses longer ones) with output_len at most 5 (its prefix_blocks cut to match). Applied to every source
(synthetic lengths, datasets, workloads). The count is kept in the header, and printed on stderr only when
the clamp changed a request.

\b
Datasets (--dataset PATH; --dataset-format auto detects from the content):
  azure       CSV TIMESTAMP,ContextTokens,GeneratedTokens (the Azure LLM inference traces)
  mooncake    JSONL {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}
              (hash_ids are carried as prefix_blocks, block_size 512)
  tracebench  a tracebench trace (re-time or re-sample it; its optional fields are carried, closed-loop
              after/delay_s only with the rows in order: --keep-timestamps or --in-order)
A window of the dataset's own time (seconds since its first usable row, before --time-scale): --window-start /
--window-end, or --busiest S (the S seconds with the most arrivals); only its rows are used, their times shifted
so the window starts at 0. With --keep-timestamps the dataset's own arrivals are replayed (shifted to start at 0; --time-scale K divides
the gaps by K), every row by default. Without it arrivals are generated at --rate and the dataset supplies the
lengths: rows sampled with the seed (1000 by default), or with --in-order taken in file order (every row by
default). Rows with zero input or output tokens are dropped and counted.

\b
Workloads with shared prompt prefixes (--workload; requests carry prefix_blocks of --block-size tokens;
equal block ids = equal tokens, so requests whose leading ids agree share that prompt prefix):
  shared-prompt  --groups G system prompts of --prefix-len L tokens; each request picks one (--group-dist
                 uniform, or zipf: P(g) ~ (g+1)^-A with --group-zipf A) and adds its own question of
                 --input-len tokens (mean; --length-dist). Only the whole blocks of a group's prompt
                 (L // block size of them) are shared: make L a multiple of --block-size.
  multi-turn     --sessions S of --turns T turns; sessions start at --rate (the arrival process). Turn k's
                 prompt is all of turn k-1 (prompt + answer) plus --input-len new user tokens; --output-len
                 answer tokens. Turn k arrives --think-time seconds (mean; --think-dist) after turn k-1 arrived
                 (open loop). With --closed-loop, turn k carries after = turn k-1's id and delay_s = the think
                 time: replay sends it delay_s after turn k-1 finished. A session ends early when a turn's
                 prompt would not fit in --max-context. A server's cache can serve turn k at most turn k-1's
                 prompt: the answer in turn k's prompt is the trace's tokens, not what the server generated.

\b
Arguments that do not apply to what was asked (e.g. --burstiness without --arrival gamma, --rate with
--keep-timestamps) are errors, as are --num-requests with --duration: nothing is written then."""


@click.command("generate", help=_GENERATE_HELP, context_settings={"max_content_width": 110})
@click.option("--rate", type=FINITE, default=None, metavar="R",
              help="Mean arrival rate in requests/s (--workload multi-turn: session starts/s).  [default: 8; not with "
                   "--keep-timestamps]")
@click.option("--num-requests", type=INT, default=None, metavar="N",
              help="Number of requests (excludes --duration).  [default: 1000; with --keep-timestamps or --in-order: "
                   "every dataset row]")
@click.option("--duration", type=FINITE, default=None, metavar="S",
              help="Instead of a count: every request arriving in the first S seconds (excludes --num-requests).")
@click.option("--seed", type=SEED, default=None, metavar="SEED",
              help="Seed of every random draw (arrivals, lengths, dataset rows).  [default: 0; not with "
                   "--keep-timestamps]")
@click.option("--arrival", type=click.Choice(_ARRIVALS), default=None,
              help="Arrival process: poisson (exponential gaps), gamma (gaps with CV = --burstiness), constant "
                   "(every gap 1/R).  [default: poisson]")
@click.option("--burstiness", type=FINITE, default=None, metavar="B",
              help="With --arrival gamma (required there): the coefficient of variation of the inter-arrival gaps; "
                   "1 is Poisson, 4 is very bursty, < 1 more regular (gamma shape k = 1/B^2).")
@click.option("--input-len", type=INT, default=None, metavar="TOKENS",
              help="Mean prompt length in tokens (shared-prompt: of the question after the system prompt; "
                   "multi-turn: of each turn's new user tokens).  [default: 512; not with --dataset]")
@click.option("--output-len", type=INT, default=None, metavar="TOKENS",
              help="Mean answer length in tokens.  [default: 128; not with --dataset]")
@click.option("--length-dist", type=click.Choice(_LENGTH_DISTS), default=None,
              help="Distribution of both lengths (see above).  [default: lognormal; not with --dataset]")
@click.option("--length-spread", type=FINITE, default=None, metavar="X",
              help="Width of --length-dist; its meaning depends on the distribution (see above).  "
                   "[default: 0.5 (uniform, normal, lognormal), 8 (zipf)]")
@click.option("--max-context", type=INT, default=None, metavar="C",
              help="The model's context length: no request has input_len + output_len > C - 2 (sglang's rule: the "
                   "whole answer only up to context_len - 2); longer ones are clamped (see above). Set it to your "
                   "model's (its config.json max_position_embeddings).  [default: 4096, llama-2's: at most 4094]")
@click.option("--dataset", type=str, default=None, metavar="PATH",
              help="Take lengths (and with --keep-timestamps arrivals) from this file.")
@click.option("--dataset-format", type=click.Choice(_DATASET_FORMATS), default=None,
              help="Format of --dataset.  [default: auto (detected from the content)]")
@click.option("--keep-timestamps", is_flag=True, default=False,
              help="Replay the dataset's own arrival times (shifted to start at 0).")
@click.option("--time-scale", type=FINITE, default=None, metavar="K",
              help="With --keep-timestamps: divide the dataset's gaps by K (2 = twice as fast).  [default: 1]")
@click.option("--in-order", is_flag=True, default=False,
              help="Take the dataset's rows in file order, each once, instead of sampling them with the seed.")
@click.option("--window-start", type=FINITE, default=None, metavar="S",
              help="Take only the dataset rows from S seconds of its own time on (0 = its first row; before "
                   "--time-scale); their times shifted so S is 0.  [default: 0]")
@click.option("--window-end", type=FINITE, default=None, metavar="S",
              help="Take only the dataset rows before S seconds of its own time.  [default: its last row]")
@click.option("--busiest", type=FINITE, default=None, metavar="S",
              help="Take the dataset's busiest S seconds: the window [t, t+S) of its own time with the most arrivals "
                   "(t a row's time, the earliest on a tie), shifted to start at 0; the header's source.window "
                   "says where it was.")
@click.option("--workload", type=click.Choice(_WORKLOADS), default=None,
              help="Requests with shared prompt prefixes (see above).  [default: none: independent prompts]")
@click.option("--block-size", type=INT, default=None, metavar="TOKENS",
              help="With --workload: tokens per prefix block (the sharing granularity).  [default: 64]")
@click.option("--groups", type=INT, default=None, metavar="G",
              help="shared-prompt: number of system prompts.  [default: 64]")
@click.option("--prefix-len", type=INT, default=None, metavar="TOKENS",
              help="shared-prompt: tokens of each system prompt.  [default: 2048]")
@click.option("--group-dist", type=click.Choice(_GROUP_DISTS), default=None,
              help="shared-prompt: how a request picks its group.  [default: uniform]")
@click.option("--group-zipf", type=FINITE, default=None, metavar="A",
              help="With --group-dist zipf: the exponent A, P(group g) ~ (g+1)^-A.  [default: 1]")
@click.option("--sessions", type=INT, default=None, metavar="S",
              help="multi-turn: number of sessions (replaces --num-requests / --duration).  [default: 100]")
@click.option("--turns", type=INT, default=None, metavar="T",
              help="multi-turn: turns per session.  [default: 5]")
@click.option("--think-time", type=FINITE, default=None, metavar="SECONDS",
              help="multi-turn: mean time between a turn and the next.  [default: 5]")
@click.option("--think-dist", type=click.Choice(_THINK_DISTS), default=None,
              help="multi-turn: distribution of the think time; uniform is on [0, 2 x mean].  [default: exponential]")
@click.option("--closed-loop", is_flag=True, default=False,
              help="multi-turn: each turn after the first is sent think time after the previous one finished "
                   "(fields after, delay_s) instead of at its trace arrival.")
@click.option("-o", "--output", type=str, default=None, metavar="PATH",
              help="Where to write the trace (replaced atomically).  [default: traces/<name from the arguments>.jsonl]")
def generate(**options: object) -> None:
    from tracebench.cleanup import StopSignals
    from tracebench.trace.generate import GenerateArgs, generate_trace
    from tracebench.trace.lengths import OUTPUT_RESERVE

    output = options.pop("output")
    default_context = options["max_context"] is None
    # SIGINT/SIGTERM while generating: the temporary file is removed, nothing written, exit 130/143
    with StopSignals("generate stopped by {signal}: nothing was written (no temporary file left)") as stop:
        result = generate_trace(GenerateArgs(**options), output, stop)  # type: ignore[arg-type]
        _report_generated(result, default_context, options["dataset"])  # type: ignore[arg-type]
        stop.check(f"{result.path} was being put in place: it is complete")


def _report_generated(result: GeneratedTrace, default_context: bool, dataset: str | None) -> None:
    from tracebench.trace.lengths import OUTPUT_RESERVE

    for path, pid in result.stale_removed:
        click.echo(f"tracebench: removed {path}, the temporary file of an earlier generate (pid {pid}, no longer "
                   f"running: killed) of the same trace", err=True)
    for path, pid in result.temps_of_running:
        click.echo(f"tracebench: left {path} alone: its writer (pid {pid}) is running (another generate of the same "
                   f"trace?)", err=True)
    header = result.header
    clamped = header["clamped_requests"]
    if clamped:  # said only when it happened; the default suits llama-2 only, so say when it was the default
        which = ", the default, llama-2's: give your model's with --max-context" if default_context else ""
        click.echo(
            f"tracebench: {clamped} of {header['num_requests']} requests clamped to input_len + output_len <= "
            f"{header['max_context'] - OUTPUT_RESERVE}: sglang generates the whole answer only up to its context length "
            f"- 2 (--max-context {header['max_context']}{which}); {header['clamped_input_requests']} of them with the "
            f"prompt cut", err=True)
    workload = header.get("workload")
    if workload is not None and workload["kind"] == "shared-prompt" and \
            workload["shared_tokens_per_group"] < workload["prefix_len"]:
        click.echo(f"tracebench: only {workload['shared_tokens_per_group']} of the {workload['prefix_len']} tokens of "
                   f"each system prompt are shared (whole blocks of {header['block_size']}): make --prefix-len a "
                   f"multiple of --block-size to share all", err=True)
    if workload is not None and workload["kind"] == "multi-turn" and workload["sessions_cut_short"]:
        click.echo(f"tracebench: {workload['sessions_cut_short']} of {workload['sessions']} sessions ended early "
                   f"({workload['turns_dropped']} turns dropped): the prompt outgrew --max-context", err=True)
    source = header.get("source")
    if source is not None:
        click.echo(f"tracebench: dataset {dataset} ({source['format']}): {source['rows']} rows, "
                   f"{source['dropped_zero_tokens']} dropped for zero tokens, {source['usable_rows']} usable", err=True)
        window = source.get("window")
        if window is not None:
            end = "its end" if window["end_s"] is None else f"{window['end_s']:.3f} s"
            which = f"its busiest {window['busiest_s']:g} s: " if "busiest_s" in window else ""
            click.echo(f"tracebench: window: {which}{window['start_s']:.3f} s to {end} of the dataset's own time, "
                       f"{window['rows']} rows", err=True)
    click.echo(str(result.path))
    count, duration = header["num_requests"], header["duration_s"]
    rate = f"{(count - 1) / duration:.2f} req/s" if count > 1 and duration > 0 else "- req/s"
    arrivals = header["arrivals"]
    how = arrivals["process"] + (f" (burstiness {arrivals['burstiness']:g})" if arrivals.get("burstiness") else "")
    lengths = (f"mean input {result.input_mean:.1f} / output {result.output_mean:.1f} tokens"
               + (f"; {clamped} clamped" if clamped else ""))
    if workload is not None and workload.get("closed_loop"):
        # no arrival schedule: only the sessions' starts are; the rest follows the servers (replay --help)
        args = header["args"]
        click.echo(f"{count} requests, closed loop: {workload['sessions']} sessions starting at {arrivals['rate']:g}/s "
                   f"({how}), each later turn sent {args['think_time']:g} s ({args['think_dist']}, mean) after the "
                   f"previous one finished, so the request rate depends on the servers (the arrival_s written, "
                   f"{duration:.1f} s in all, is only an open-loop estimate); {lengths}")
        return
    click.echo(f"{count} requests over {duration:.1f} s ({rate}, {how}); {lengths}")


@click.command("inspect", context_settings={"max_content_width": 110})
@click.argument("trace", type=str, metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the statistics as one JSON object.")
@click.option("--lru-tokens", type=str, default=None, metavar="N[,N...]",
              help="Sizes in tokens of the LRU caches whose hit rate is reported for a trace with prefix blocks.  "
                   "[default: 65536,231818,927272 (231,818: llama-2-7b's KV pool on one H200 under sglang 0.5.17)]")
@click.option("--max-context", type=INT, default=None, metavar="C",
              help="The model's context length the trace is checked against (context fit).  [default: the trace "
                   "header's max_context, else 4096, llama-2's]")
@click.option("--servers", type=INT, default=1, show_default=True, metavar="N",
              help="Servers the trace is weighed against (KV capacity, offered load).")
@click.option("--gpu", type=str, default=None, metavar="NAME",
              help="The GPU of those servers: a built-in simulator profile's (H200, H100), for its KV capacity and "
                   "step costs.  [default: H200]")
@click.option("--max-running-requests", "cap", type=INT, default=None, metavar="N",
              help="The per-server cap the replay will use (the largest batch in the load estimate).  [default: "
                   "what the KV holds]")
def inspect_cmd(trace: str, as_json: bool, lru_tokens: str | None, max_context: int | None, servers: int,
                gpu: str | None, cap: int | None) -> None:
    """Statistics of a trace: requests, duration, mean rate, CV of the inter-arrival gaps, peak rate over 1 s windows,
    input/output length mean/p50/p90/p99/max and offered tokens/s, and, where requests carry prefix_blocks, the
    prefix structure. The whole trace is validated while it is read: a broken trace is an error naming the line and
    field.

    \b
    duration            last arrival - first arrival
    mean rate           (requests - 1) / duration = 1 / mean gap
    gap CV              std / mean of the gaps between arrivals (1 Poisson, 0 constant)
    peak rate (1 s)     the most requests arriving within any 1-second interval
    p50/p90/p99         percentiles by linear interpolation (numpy's default), as tracebench report's
    offered tokens/s    mean rate x mean length
    context fit         requests with input_len + output_len > C - 2 (4094 for a 4096 context): sglang
                        0.5.17 answers them 200 but generates only C - 2 - input_len tokens (replay
                        records them as mismatch); and prompts over C - 7 tokens (refused)

    \b
    Prefix structure (requests taken one after another in trace order, as by one server):
    requests with blocks, block ids (all, distinct), distinct prefixes (distinct leading runs of ids)
    reusable (ceiling)  prompt tokens one unbounded prefix cache holds when the request comes, / all prompt
                        tokens: the leading run of blocks an earlier request sent, capped at input_len - 1
                        per request (sglang always computes one prompt token)
    LRU N tokens        the same with one LRU cache of N tokens holding whole blocks; estimated on a
                        spatial sample of the blocks above 1,000,000 block ids (the sample rate is shown)

    \b
    Against --servers N servers of --gpu (docs/trace-format.md "Capacity"):
    KV capacity         each server's KV pool in tokens (the simulator's profile: sglang 0.5.17, llama-2-7b)
    working set         tokens of the prefix blocks two or more requests send; if they fit in one server's KV
                        every server can hold them (routing by prefix saves little); if they need several
                        servers' KV, routing by prefix (cache_aware, prefix_hash) is what lets them fit
    offered load        rate x (prefill + decode) GPU time per request / N, from the profile's step costs at
                        the largest batch, the prompt's cacheable share (the ceiling) taken as cached: the
                        share of the servers' throughput ceiling (saturated servers, queues growing) the
                        trace asks for. A bound on throughput, not a rate that meets a latency SLO: from
                        75% simulated runs start to queue, and it is said as a warning (replay and report
                        say it too); over 100% more arrives than the servers can do. The rate that meets
                        an SLO: tracebench sweep --find-max-rate
    """
    from tracebench.errors import ConfigError
    from tracebench.trace.inspect import format_table, trace_stats
    from tracebench.trace.prefix import DEFAULT_LRU_TOKENS

    sizes = DEFAULT_LRU_TOKENS
    if lru_tokens is not None:
        try:
            sizes = tuple(int(part) for part in lru_tokens.split(","))
        except ValueError:
            raise ConfigError(f"--lru-tokens must be integers separated by commas, got {lru_tokens!r}") from None
        if not sizes or min(sizes) < 1:
            raise ConfigError(f"--lru-tokens must be sizes >= 1 token, got {lru_tokens!r}")
    if max_context is not None and max_context <= 7:
        raise ConfigError(f"--max-context must be more than 7 (sglang keeps 6 positions of the context from the "
                          f"prompt), got {max_context}")
    if servers < 1 or (cap is not None and cap < 1):
        raise ConfigError("--servers and --max-running-requests must be >= 1")
    from dataclasses import replace

    from tracebench.trace.inspect import capacity_fit

    stats = trace_stats(trace, sizes, max_context)
    stats = replace(stats, capacity=capacity_fit(stats, servers, gpu, cap))
    if as_json:
        import orjson

        click.echo(orjson.dumps(stats.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(format_table(stats))

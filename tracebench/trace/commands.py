"""`tracebench generate` and `tracebench inspect`. Light at import time (`tracebench --help` imports every commands
module): numpy and the generators are imported inside the commands."""

from __future__ import annotations

import click

# The same tuples as arrivals.ARRIVAL_KINDS, lengths.LENGTH_DISTS, datasets.DATASET_FORMATS (a test checks), repeated
# here so that building the CLI does not import numpy.
_ARRIVALS = ("poisson", "gamma", "constant")
_LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal", "zipf")
_DATASET_FORMATS = ("auto", "azure", "mooncake", "tracebench")

_GENERATE_HELP = """Make a request trace (JSONL, trace format v1) and print its path and a one-line summary.

\b
Synthetic:     tracebench generate --rate 8 --num-requests 1000 --arrival gamma --burstiness 4
From a file:   tracebench generate --dataset AzureLLMInferenceTrace_conv.csv --keep-timestamps --time-scale 2
               tracebench generate --dataset mooncake_trace.jsonl --rate 4 --duration 600

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
Context clamp (--max-context C): no request has input_len + output_len > C. The prompt is kept and the
answer shortened (output_len = C - input_len); a prompt longer than C - 7 is cut to C - 7 (sglang 0.5.17
refuses longer ones) with output_len at most 7 (its prefix_blocks cut to match). The count is kept in the header, and printed on stderr when not 0.

\b
Datasets (--dataset PATH; --dataset-format auto detects from the content):
  azure       CSV TIMESTAMP,ContextTokens,GeneratedTokens (the Azure LLM inference traces)
  mooncake    JSONL {"timestamp": ms, "input_length", "output_length", "hash_ids": [...]}
              (hash_ids are carried as prefix_blocks)
  tracebench  a tracebench trace (re-time or re-sample it)
With --keep-timestamps the dataset's own arrivals are replayed (shifted to start at 0; --time-scale K divides
the gaps by K), every row by default. Without it arrivals are generated at --rate and the dataset supplies the
lengths: rows sampled with the seed (1000 by default), or with --in-order taken in file order (every row by
default). Rows with zero input or output tokens are dropped and counted.

\b
Arguments that do not apply to what was asked (e.g. --burstiness without --arrival gamma, --rate with
--keep-timestamps) are errors, as are --num-requests with --duration: nothing is written then."""


@click.command("generate", help=_GENERATE_HELP, context_settings={"max_content_width": 110})
@click.option("--rate", type=float, default=None, metavar="R",
              help="Mean arrival rate in requests/s.  [default: 8; not with --keep-timestamps]")
@click.option("--num-requests", type=int, default=None, metavar="N",
              help="Number of requests (excludes --duration).  [default: 1000; with --keep-timestamps or --in-order: "
                   "every dataset row]")
@click.option("--duration", type=float, default=None, metavar="S",
              help="Instead of a count: every request arriving in the first S seconds (excludes --num-requests).")
@click.option("--seed", type=int, default=None, metavar="SEED",
              help="Seed of every random draw (arrivals, lengths, dataset rows).  [default: 0; not with "
                   "--keep-timestamps]")
@click.option("--arrival", type=click.Choice(_ARRIVALS), default=None,
              help="Arrival process: poisson (exponential gaps), gamma (gaps with CV = --burstiness), constant "
                   "(every gap 1/R).  [default: poisson]")
@click.option("--burstiness", type=float, default=None, metavar="B",
              help="With --arrival gamma (required there): the coefficient of variation of the inter-arrival gaps; "
                   "1 is Poisson, 4 is very bursty, < 1 more regular (gamma shape k = 1/B^2).")
@click.option("--input-len", type=int, default=None, metavar="TOKENS",
              help="Mean prompt length in tokens.  [default: 512; not with --dataset]")
@click.option("--output-len", type=int, default=None, metavar="TOKENS",
              help="Mean answer length in tokens.  [default: 128; not with --dataset]")
@click.option("--length-dist", type=click.Choice(_LENGTH_DISTS), default=None,
              help="Distribution of both lengths (see above).  [default: lognormal; not with --dataset]")
@click.option("--length-spread", type=float, default=None, metavar="X",
              help="Width of --length-dist; its meaning depends on the distribution (see above).  "
                   "[default: 0.5 (uniform, normal, lognormal), 8 (zipf)]")
@click.option("--max-context", type=int, default=None, metavar="C",
              help="No request has input_len + output_len > C; longer ones are clamped (see above). Set it to your "
                   "model's context length (its config.json max_position_embeddings).  [default: 4096, llama-2's]")
@click.option("--dataset", type=str, default=None, metavar="PATH",
              help="Take lengths (and with --keep-timestamps arrivals) from this file.")
@click.option("--dataset-format", type=click.Choice(_DATASET_FORMATS), default=None,
              help="Format of --dataset.  [default: auto (detected from the content)]")
@click.option("--keep-timestamps", is_flag=True, default=False,
              help="Replay the dataset's own arrival times (shifted to start at 0).")
@click.option("--time-scale", type=float, default=None, metavar="K",
              help="With --keep-timestamps: divide the dataset's gaps by K (2 = twice as fast).  [default: 1]")
@click.option("--in-order", is_flag=True, default=False,
              help="Take the dataset's rows in file order, each once, instead of sampling them with the seed.")
@click.option("-o", "--output", type=str, default=None, metavar="PATH",
              help="Where to write the trace (replaced atomically).  [default: traces/<name from the arguments>.jsonl]")
def generate(**options: object) -> None:
    from tracebench.trace.generate import GenerateArgs, generate_trace

    output = options.pop("output")
    default_context = options["max_context"] is None
    result = generate_trace(GenerateArgs(**options), output)  # type: ignore[arg-type]
    header = result.header
    clamped = header["clamped_requests"]
    if clamped:  # said only when it happened; the default suits llama-2 only, so say when it was the default
        which = " (the default, llama-2's context length: give your model's with --max-context)" if default_context else ""
        click.echo(
            f"tracebench: {clamped} of {header['num_requests']} requests clamped to --max-context "
            f"{header['max_context']}{which}; {header['clamped_input_requests']} of them with the prompt cut", err=True)
    source = header.get("source")
    if source is not None:
        click.echo(f"tracebench: dataset {source['path']} ({source['format']}): {source['rows']} rows, "
                   f"{source['dropped_zero_tokens']} dropped for zero tokens, {source['usable_rows']} usable", err=True)
    click.echo(str(result.path))
    count, duration = header["num_requests"], header["duration_s"]
    rate = f"{(count - 1) / duration:.2f} req/s" if count > 1 and duration > 0 else "- req/s"
    arrivals = header["arrivals"]
    how = arrivals["process"] + (f" (burstiness {arrivals['burstiness']:g})" if arrivals.get("burstiness") else "")
    click.echo(f"{count} requests over {duration:.1f} s ({rate}, {how}); mean input {result.input_mean:.1f} / "
               f"output {result.output_mean:.1f} tokens" + (f"; {clamped} clamped" if clamped else ""))


@click.command("inspect", context_settings={"max_content_width": 110})
@click.argument("trace", type=str, metavar="TRACE")
@click.option("--json", "as_json", is_flag=True, default=False, help="Print the statistics as one JSON object.")
def inspect_cmd(trace: str, as_json: bool) -> None:
    """Statistics of a trace: requests, duration, mean rate, CV of the inter-arrival gaps, peak rate over 1 s windows,
    input/output length mean/p50/p90/p99/max and offered tokens/s. The whole trace is validated while it is read: a
    broken trace is an error naming the line and field.

    \b
    duration            last arrival - first arrival
    mean rate           (requests - 1) / duration = 1 / mean gap
    gap CV              std / mean of the gaps between arrivals (1 Poisson, 0 constant)
    peak rate (1 s)     the most requests arriving within any 1-second interval
    p50/p90/p99         nearest-rank percentiles (values that occur in the trace)
    offered tokens/s    mean rate x mean length
    """
    from tracebench.trace.inspect import format_table, trace_stats

    stats = trace_stats(trace)
    if as_json:
        import orjson

        click.echo(orjson.dumps(stats.to_dict(), option=orjson.OPT_INDENT_2).decode())
    else:
        click.echo(format_table(stats))

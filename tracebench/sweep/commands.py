"""`tracebench sweep`. Light at import time: the replay and the report load inside the command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tracebench.errors import ConfigError
from tracebench.options import FINITE, INT, INT64_MAX, INT64_MIN
from tracebench.replay.commands import replay_config, replay_options


def _floats(name: str, text: str | None) -> tuple[float, ...]:
    if text is None:
        return ()
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"{name} {text!r}: expected numbers separated by commas, e.g. 5,10,20,40") from None


def _ints(name: str, text: str | None) -> tuple[int, ...]:
    if text is None:
        return ()
    try:
        values = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise ConfigError(f"{name} {text!r}: expected integers separated by commas, e.g. 1,4,16,64") from None
    for value in values:  # what run.json and summary.json can hold (orjson: 64-bit)
        if not INT64_MIN <= value <= INT64_MAX:
            raise ConfigError(f"{name}: {value} is out of range (at most 2^63-1)")
    return values


_GPUS = click.option(
    "--gpus", default=None, metavar="N[,N...]",
    help="Servers per point, or a list (a dimension: 1,2,4 runs every point, or searches, with 1, 2 and 4). "
         "Launched once: the largest N servers; a point with fewer uses the first N (with --attach: the first N "
         "URLs). [default: 1, or every --attach URL]")
_POLICY = click.option(
    "--policy", default="random", show_default=True, metavar="NAME[,NAME...]",
    help="Routing policy, or a list (a dimension: every point, or search, once per policy). Each as replay's "
         "--policy: a built-in (`tracebench policies`), path/to/file.py:ClassName, or NAME for policies/NAME.py.")
_PD = click.option(
    "--pd", default=None, metavar="P:D[,P:D...]",
    help="PD disaggregation, a ratio or a list (a dimension: --pd 1:3,2:2,3:1 runs every point, or search, once per "
         "ratio): P prefill and D decode servers, launched anew for each point (the roles differ from one ratio to "
         "the next; replay --pd's servers, --kv-link's link with --backend sim). Not with --gpus.")
_SATURATION = click.option(
    "--saturation-window", type=FINITE, default=10.0, show_default=True, metavar="S",
    help="Stop a point early when it is over-saturated (requests arrive faster than the servers finish them: the "
         "outstanding count grows with a significant slope, leaving >= 15% of two windows' arrivals behind; "
         "docs/sweep.md), judged over windows of S trace seconds; the summary marks it saturated instead of "
         "reporting its latency. 0: never stop a point.")


_RAY = click.option(
    "--ray", default=None, metavar="ADDRESS",
    help="Run the points as Ray tasks on the cluster at ADDRESS (its head's host:port, or auto), in parallel "
         "wherever it has room: each task replays its point on its node with servers of its own (in process with "
         "--clock virtual, the cheapest; sim-server or sglang processes there otherwise; it holds 1 CPU, or a CPU "
         "per simulated server + 1, or a GPU per sglang server), and sends its run folder back; the summary is the "
         "one a point-by-point sweep writes (summary.json ray names each point's node). Every point runs; the "
         "first that failed or had a fault (in point order) then stops the sweep. Not with --find-max-rate, "
         "--attach or --jobs. Needs pip install 'tracebench[ray]' and tracebench on every node (docs/ray.md).")


# The PD options are hidden from --help: a sweep does not run PD points (issue 33 item 18: --help listed them). They
# are still parsed, so that a sweep given one says why it refuses it (Sweep._check_options), not "no such option".
_HIDDEN_PD = {  # refused by sweep (it launches each ratio's PD servers itself: --pd): parsed, so the refusal explains
    "attach_prefill": click.option("--attach-prefill", multiple=True, hidden=True),
    "attach_decode": click.option("--attach-decode", multiple=True, hidden=True),
}


@click.command("sweep")
@click.argument("trace", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--rates", default=None, metavar="R,R,...",
              help="A rate sweep: one point per rate (requests/s), the trace's arrivals rescaled to it (the same "
                   "requests in the same order, the gaps' shape kept).")
@click.option("--concurrency", default=None, metavar="N,N,...",
              help="A concurrency sweep (closed loop): one point per N, every request released at once behind the "
                   "replay's --max-concurrency N (at most N in flight).")
@click.option("--find-max-rate", is_flag=True,
              help="A capacity search: the highest rate meeting every --slo limit at --slo-percentile (bracket, "
                   "then bisect; docs/sweep.md). Needs --slo.")
@click.option("--slo", default=None, metavar="SPEC",
              help="Objectives, the report's syntax (`tracebench report --help`): 'ttft=500ms,tpot=50ms' (keys ttft, "
                   "total, tpot, server, wait, itl; seconds, or with ms/s). Every point gets goodput and an SLO check; "
                   "--find-max-rate searches against them.")
@click.option("--slo-percentile", type=FINITE, default=99.0, show_default=True, metavar="P",
              help="The SLO check holds the P-th percentile of each key to its limit (its 95% interval's upper end "
                   "must be within it).")
@click.option("--start-rate", type=FINITE, default=None, metavar="R",
              help="--find-max-rate: the first rate tried (x N/min(--gpus) for N servers). [default: the trace's own "
                   "rate, as `tracebench inspect` gives it]")
@click.option("--rate-tolerance", type=FINITE, default=0.05, show_default=True, metavar="F",
              help="--find-max-rate: stop bisecting when the bracket (hi - lo) / lo is at most F.")
@click.option("--max-points", type=INT, default=12, show_default=True, metavar="N",
              help="--find-max-rate: at most N points per search.")
@click.option("--point-duration", type=FINITE, default=None, metavar="S",
              help="Rate points: each point offers its rate over a window of S trace seconds: the first round(rate "
                   "x S) + 1 requests of the trace, in order, their arrivals rescaled so they span S at exactly "
                   "that rate, whatever that slice's own rate in the trace (docs/sweep.md). [default: the whole "
                   "trace, rescaled to the rate]")
@click.option("--warmup", type=FINITE, default=0.0, show_default=True, metavar="S",
              help="Leave out of each point's figures the requests arriving in its first S trace seconds (the "
                   "report's --warmup).")
@click.option("--bootstrap", type=INT, default=1000, show_default=True, metavar="N",
              help="Bootstrap resamples of each percentile's 95% interval (seed 0).")
@click.option("--name", default=None, metavar="NAME",
              help="Sweep folder name, under --out-dir. [default: sweep-<trace>-<rate|concurrency|capacity>-"
                   "<YYYYmmdd-HHMMSS>]")
@click.option("--jobs", type=INT, default=None, metavar="N",
              help="--clock virtual: run N independent parts at once, each in its own process (every point of a "
                   "rate or concurrency sweep; each setup and policy's search of --find-max-rate). Every part runs "
                   "as it would alone: the same run folders and summary as --jobs 1. [default on the virtual clock: one "
                   "per usable core for a search of several setups or policies, or points of 10,000 requests in "
                   "all; else 1 (a worker costs ~1 s to start). On the real clock: 1, the only choice]")
@replay_options(skip=("run_name", "pin_cpus"), replace={"gpus": _GPUS, "policy": _POLICY, "saturation_window": _SATURATION,
                                             "pd": _PD, "ray": _RAY, **_HIDDEN_PD})
@click.pass_context
def sweep(ctx: click.Context, trace: Path, rates: str | None, concurrency: str | None, find_max_rate: bool,
          slo: str | None, slo_percentile: float, start_rate: float | None, rate_tolerance: float, max_points: int,
          point_duration: float | None, warmup: float, bootstrap: int, name: str | None, jobs: int | None,
          **options: Any) -> None:
    """Replay TRACE at several loads, or find the highest rate that meets SLOs: one run folder per point.

    \b
    tracebench sweep t.jsonl --rates 5,10,20,40 --backend sim --speed 10
    tracebench sweep t.jsonl --concurrency 1,4,16,64 --backend sim --speed 10
    tracebench sweep t.jsonl --find-max-rate --slo ttft=500ms,tpot=50ms --backend sim --speed 10 \\
        --gpus 1,2,4 --policy round_robin,sjf
    tracebench sweep t.jsonl --rates 2,4,6,8 --attach http://127.0.0.1:30000 --model models/llama-2-7b-hf
    tracebench sweep t.jsonl --rates 2,4 --clock virtual --pd 1:3,2:2,3:1 --kv-link rdma-400g
    \b
    Servers are launched once for the whole sweep (--backend sim or sglang; each point's run.json says the sweep
    launched them, with their launch commands); each point flushes their prefix cache first (--flush-cache) and is
    an ordinary replay of its own trace (written to traces/ in the sweep folder): every replay option applies to
    each point. The folder <out-dir>/<name>/ holds summary.csv and summary.json (per point: rate or concurrency,
    throughput, goodput, TTFT/TPOT/ITL/total p50 and p99 with 95% bootstrap intervals, the SLO check),
    load-latency.html and .png, traces/, servers/ (their logs) and one run folder per point. A point that is
    over-saturated is stopped (--saturation-window) and marked saturated. docs/sweep.md has every rule.
    \b
    Capacity search (--find-max-rate): a rate meets the SLO when every key's --slo-percentile has its 95%
    interval's upper end within the limit; bracket (x2 / /2) from --start-rate, then bisect, until the bracket is
    within --rate-tolerance, two bisection points in a row are uncertain, or --max-points. Reported: the highest
    rate that met, and the lowest that did not.
    """
    from tracebench.sweep.run import SweepConfig, run_sweep

    gpus = _ints("--gpus", options.pop("gpus"))
    pd_text = options.pop("pd")
    ratios = () if pd_text is None else tuple(part.strip() for part in pd_text.split(","))
    policies = tuple(p.strip() for p in options.pop("policy").split(","))
    ray_address = options.pop("ray")
    window = options.pop("saturation_window")
    if window < 0:
        raise ConfigError(f"--saturation-window must be >= 0 (0: never stop), got {window:g}")
    base = replay_config(ctx, trace, {**options, "gpus": None, "policy": policies[0], "run_name": None,
                                      "saturation_window": window or None, "pd": ratios[0] if ratios else None,
                                      "ray": None})
    cfg = SweepConfig(
        base=base, rates=_floats("--rates", rates), concurrency=_ints("--concurrency", concurrency),
        find_max_rate=find_max_rate, gpus=gpus, policies=policies, slo_spec=slo, slo_percentile=slo_percentile,
        warmup=warmup, bootstrap=bootstrap, name=name, start_rate=start_rate, rate_tolerance=rate_tolerance,
        max_points=max_points, point_duration=point_duration, pd=ratios, jobs=jobs, ray=ray_address,
    )
    folder = run_sweep(cfg, sys.stdout, sys.stderr)  # the streams of the call (not bound at import)
    click.echo(folder)

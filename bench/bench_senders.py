"""Where is one host's limit, and how far do sender processes move it? For 1, 2, 4 and 8 senders (`tracebench replay
--senders N`, replay/senders.py) at rising request rates: the release lag (t_released - t_arrival) and tracebench's
own time before the wire (t_written - t_arrival: no cap, no gate, so no wait the run asked for), and per sender count
the highest rate at which release lag p99 < 1 ms and own time p50 < 1 ms (issue 34, item 3).

    .venv/bin/python bench/bench_senders.py                                   # this machine (2 cores: 2 sim-servers)
    .venv/bin/python bench/bench_senders.py --rates 200,400 --senders 1,2 --repeat 3
    # a many-core machine (the GPU host's CPUs; sim-servers need no GPU), issue 34's goal:
    .venv/bin/python bench/bench_senders.py --servers 32 --rates 500,1000,2000,4000 --senders 1,2,4,8 --goal-ms 2 \
        --own-quantile 99

Each point is one `tracebench replay --attach ...` (a real process, as a user runs it) of a Poisson trace of 128 /
16-token requests (`--input-len`, `--output-len`) against sim-servers started once for the whole bench (`--speed 50`
by default, so the servers are not the bottleneck), round robin, uncapped. The sender counts run one after the other
at each rate (and each repeat), so they share the machine's load of that moment; with `--repeat` > 1 the medians
decide. Everything shares this machine's CPUs: the figures are for the machine and the load they were taken on
(the load average is printed before and after). The last lines compare 2 senders with 1 at every rate (the issue's
acceptance on 2 cores: never slower), beside the spread of the 1-sender runs themselves (the noise of the machine).
The router hands requests to its sender processes only while it falls behind and the host has a spare core
(docs/replay.md, "Parallel senders"); the `handed` column says how many it did.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replay import start_sim  # noqa: E402  (a sim-server process on a free port, once healthy)

from tracebench.trace.format import format_request_line, write_trace  # noqa: E402

GOAL_MS = 1.0  # release lag p99 and own time before the wire p50, each under this


def make_trace(path: Path, rate: float, seconds: float, seed: int, input_len: int, output_len: int) -> int:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    lines = [format_request_line(i, float(arrivals[i]), input_len, output_len) for i in range(n)]
    write_trace(path, {"num_requests": n, "duration_s": float(arrivals[-1])}, lines)
    return n


def figures(run_dir: Path) -> dict[str, float]:
    """Milliseconds: release lag p50/p99, own time before the wire p50/p99; ok: requests ok; n: records."""
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    lag = np.array([r["t_released"] - r["t_arrival"] for r in records if r["t_released"] is not None]) * 1e3
    own = np.array([r["t_written"] - r["t_arrival"] for r in records if r["t_written"] is not None]) * 1e3
    lag50, lag99 = np.percentile(lag, [50, 99]) if lag.size else (np.nan, np.nan)
    own50, own99 = np.percentile(own, [50, 99]) if own.size else (np.nan, np.nan)
    senders = json.loads((run_dir / "run.json").read_text())["senders"]
    handed = sum(senders.get("carried_by_process", [])) / max(len(records), 1)
    return {"lag50": float(lag50), "lag99": float(lag99), "own50": float(own50), "own99": float(own99),
            "ok": sum(r["status"] == "ok" for r in records), "n": len(records), "handed": handed}


COLUMNS = ("lag50", "lag99", "own50", "own99")


def line(rate: float, senders: int, f: dict[str, float], note: str = "") -> str:
    return (f"{rate:8.0f} {senders:8d} " + " ".join(f"{f[c]:9.3f}" for c in COLUMNS)
            + f" {f['ok']:7.0f}/{f['n']:<7.0f} {f['handed']:7.0%}{note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,200,400,600,800", help="request rates (req/s), comma-separated")
    parser.add_argument("--senders", default="1,2,4,8", help="sender counts (--senders N), comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds of Poisson arrivals per point")
    parser.add_argument("--servers", type=int, default=2, help="sim-servers (a many-core host: 32)")
    parser.add_argument("--speed", type=float, default=50.0, help="the sim-servers' --speed")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=1, help="runs per point; the medians decide")
    parser.add_argument("--goal-ms", type=float, default=GOAL_MS,
                        help="the bound on release lag p99 and on own time (the GPU host's goal: 2 ms)")
    parser.add_argument("--own-quantile", type=int, choices=(50, 99), default=50,
                        help="the own time's quantile held to the bound (the GPU host's goal: 99)")
    parser.add_argument("--replay-args", default="", help="more `tracebench replay` arguments, split like a shell, "
                        "e.g. '--router-sends-under 0' (every request through the sender processes)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    counts = [int(s) for s in args.senders.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-senders-"))
    sims = [start_sim(work / f"sim-{i}.log", "--speed", str(args.speed)) for i in range(args.servers)]
    attach = [a for _, url in sims for a in ("--attach", url)]
    print(f"machine: {os.cpu_count()} CPUs; {args.servers} sim-server(s) at --speed {args.speed:g}; {args.seconds:g} s "
          f"of Poisson arrivals of {args.input_len} / {args.output_len}-token requests per point; run folders in {work}")
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{'rate':>8} {'senders':>8} " + " ".join(f"{h:>9}" for h in ("lag p50", "lag p99", "own p50", "own p99"))
          + "      ok/n     handed   (ms; lag = t_released - t_arrival, own = t_written - t_arrival; handed: "
          "the share of requests the router handed to sender processes, run.json senders)")
    medians: dict[tuple[float, int], dict[str, float]] = {}
    spreads: dict[float, list[dict[str, float]]] = {}  # the 1-sender runs of each rate
    try:
        for rate in rates:
            trace = work / f"trace-{rate:g}.jsonl"
            n = make_trace(trace, rate, args.seconds, int(rate), args.input_len, args.output_len)
            points: dict[int, list[dict[str, float]]] = {s: [] for s in counts}
            for rep in range(args.repeat):
                for senders in counts:  # one after the other: they share the load of this moment
                    name = f"rate-{rate:g}-s{senders}-{rep}"
                    result = subprocess.run(
                        [sys.executable, "-m", "tracebench", "replay", str(trace), *attach, "--policy", "round_robin",
                         "--senders", str(senders), "--run-name", name, "--out-dir", str(work), "--quiet",
                         *shlex.split(args.replay_args)],
                        capture_output=True, text=True,
                    )
                    if result.returncode != 0:
                        raise SystemExit(f"replay at {rate:g} req/s with {senders} sender(s) failed:\n{result.stderr}")
                    points[senders].append(figures(work / name))
                    print(line(rate, senders, points[senders][-1]), flush=True)
            spreads[rate] = points.get(1, [])
            for senders in counts:
                runs = points[senders]
                med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                medians[rate, senders] = med
                if args.repeat > 1:
                    print(line(rate, senders, med, "   (medians)"), flush=True)
            del n
    finally:
        for proc, _ in sims:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
    print(f"load average after: {os.getloadavg()[0]:.2f} (1 min)")
    goal, q = args.goal_ms, args.own_quantile
    for senders in counts:
        kept = [rate for rate in rates if (f := medians[rate, senders])["lag99"] < goal and f[f"own{q}"] < goal
                and f["ok"] == f["n"]]
        verdict = "none of the rates tried" if not kept else f"{max(kept):g} req/s"
        print(f"--senders {senders}: highest rate with release lag p99 < {goal:g} ms and own time p{q} < {goal:g} ms: "
              f"{verdict}")
    if 1 in counts and 2 in counts:
        print("2 senders against 1 (medians; + = 2 senders slower; [the 1-sender runs' own spread, min..max])")
        for rate in rates:
            one, two = medians[rate, 1], medians[rate, 2]
            runs = spreads[rate]

            def spread(key: str) -> str:
                return f"[{min(r[key] for r in runs):.3f}..{max(r[key] for r in runs):.3f}]"

            print(f"  {rate:6.0f} req/s: release lag p99 {two['lag99'] - one['lag99']:+.3f} ms {spread('lag99')}, "
                  f"own time p50 {two['own50'] - one['own50']:+.3f} ms {spread('own50')}, "
                  f"own time p99 {two['own99'] - one['own99']:+.3f} ms {spread('own99')}, "
                  f"handed over {two['handed']:.0%}")


if __name__ == "__main__":
    main()

"""Where is one host's limit, and how far do sender processes move it? For 1, 2, 4 and 8 senders (`tracebench replay
--senders N`, replay/senders.py) at rising request rates: the release lag (t_released - t_arrival) and tracebench's
own time before the wire (t_written - t_arrival: no cap, no gate, so no wait the run asked for), and per sender count
the highest rate at which release lag p99 < 1 ms and own time p50 < 1 ms (issue 34, item 3).

    .venv/bin/python bench/bench_senders.py                                   # this machine (2 cores: 2 sim-servers)
    .venv/bin/python bench/bench_senders.py --rates 200,400 --senders 1,2 --repeat 3
    # a many-core machine (the GPU host's CPUs; sim-servers need no GPU), issue 34's goal:
    .venv/bin/python bench/bench_senders.py --servers 32 --rates 500,1000,2000,4000 --senders 1,2,4,8 --goal-ms 2 \
        --own-quantile 99
    # what held there (docs/overhead.md, 16 cores): the router alone on its core, every request handed over
    .venv/bin/python bench/bench_senders.py --servers 32 --rates 2000,4000 --senders 8 --goal-ms 2 --own-quantile 99 \
        --pin --repeat 3 --replay-args "--router-sends-under 0"

Figures of that last command (2026-11-29, the nvidia-h200 machine's 16 cores, Python 3.12, no GPU used, the host
otherwise idle: load 2.6-3.7 before, 3.8-4.7 after, the sim-servers' own), medians of 3 runs, ms:

    rate  release lag p50 / p99  arrival -> written p50 / p99  router CPU per request
    2000  0.09 / 0.56            0.68 / 1.61                   0.26
    4000  0.08 / 0.61            0.63 / 1.86                   0.18      (before the router's cut: 0.13 / 1.2-1.7,
                                                                          0.84 / 2.8-3.2, ~0.25, its core 98-99% busy)

--senders 8: highest rate with release lag p99 < 2 ms and own time p99 < 2 ms: 4000 req/s (issue 34 item 1).
On the merged main (same machine, 3 runs, load 0.2 before): 4,000 req/s release lag p99 0.35-0.57 ms, arrival ->
written p99 1.25-1.62 ms, router CPU 0.14-0.18 ms per request.

Two cores, quiet (the same machine's CPUs under `taskset -c 0,1 python3 bench/bench_senders.py --rates
100,200,400,600,800 --senders 1,2 --repeat 3`, then `--rates 100,200 --repeat 8`): no 2-sender median outside the
1-sender runs' own spread at any rate (issue 34 item 2); the tables are in docs/overhead.md.

Each point is one `tracebench replay --attach ...` (a real process, as a user runs it) of a Poisson trace of 128 /
16-token requests (`--input-len`, `--output-len`) against sim-servers started once for the whole bench (`--speed 50`
by default, so the servers are not the bottleneck), round robin, uncapped. The sender counts run one after the other
at each rate (and each repeat, in reverse order every other repeat), so they share the machine's load of that moment; with `--repeat` > 1 the medians
decide. Everything shares this machine's CPUs: the figures are for the machine and the load they were taken on
(the load average is printed before and after). The last lines compare 2 senders with 1 at every rate (the issue's
acceptance on 2 cores: never slower), beside the spread of the 1-sender runs themselves (the noise of the machine).
The router hands requests to its sender processes only while it falls behind and the host has a spare core
(docs/replay.md, "Parallel senders"); the `handed` column says how many it did, and `router CPU` the router
process's CPU per request over the run (run.json `senders.router_cpu_s`; none with 1 sender).

`--pin` places the processes (Linux): the router alone on CPU 0, the sender processes on CPUs 1..S (S the largest
sender count asked for; `replay --pin-cpus`), the sim-servers on the CPUs left. Without it the kernel places them all.
Each point also prints where its time went at the 99th percentile: `hop` (t_assigned -> t_built: the hand-over to
a sender process and its wait for its loop) and `write` (t_dispatch -> t_written). `--probe` runs every replay with
bench/loop_probe/ on PYTHONPATH (garbage-collector pauses, slow callbacks and long loop turns of the router and of
each sender process, inside the run's window) and prints them per point.
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
from concurrent.futures import ThreadPoolExecutor
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


def p99(records: list[dict], start: str, end: str) -> float:
    gaps = np.array([r[end] - r[start] for r in records if r[start] is not None and r[end] is not None]) * 1e3
    return float(np.percentile(gaps, 99)) if gaps.size else float("nan")


def figures(run_dir: Path) -> dict[str, float]:
    """Milliseconds: release lag p50/p99, own time before the wire p50/p99, the hop's and the write's p99; ok:
    requests ok; n: records."""
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    lag = np.array([r["t_released"] - r["t_arrival"] for r in records if r["t_released"] is not None]) * 1e3
    own = np.array([r["t_written"] - r["t_arrival"] for r in records if r["t_written"] is not None]) * 1e3
    lag50, lag99 = np.percentile(lag, [50, 99]) if lag.size else (np.nan, np.nan)
    own50, own99 = np.percentile(own, [50, 99]) if own.size else (np.nan, np.nan)
    senders = json.loads((run_dir / "run.json").read_text())["senders"]
    handed = sum(senders.get("carried_by_process", [])) / max(len(records), 1)
    cpu = senders.get("router_cpu_s")  # --senders 1 has none
    return {"lag50": float(lag50), "lag99": float(lag99), "own50": float(own50), "own99": float(own99),
            "hop99": p99(records, "t_assigned", "t_built"), "write99": p99(records, "t_dispatch", "t_written"),
            "ok": sum(r["status"] == "ok" for r in records), "n": len(records), "handed": handed,
            "cpu_ms": float("nan") if cpu is None else cpu * 1e3 / max(len(records), 1)}


def probe_lines(run_dir: Path, probe_dir: Path) -> list[str]:
    """What bench/loop_probe/ saw inside the run's window, one line per process (router first)."""
    run = json.loads((run_dir / "run.json").read_text())
    t0 = run["wall_clock_start"]
    t1 = t0 + run["t_end"]
    out = []
    for path in sorted(probe_dir.glob("probe-*.json"), key=lambda p: "replay" not in p.read_text()[:200]):
        probe = json.loads(path.read_text())

        def inside(events: list[list]) -> list[list]:
            return [e for e in events if t0 <= e[0] <= t1]

        gcs, slow, turns = inside(probe["gc"]), inside(probe["slow_callbacks"]), inside(probe["long_turns"])
        cpu = inside(probe["cpu"])
        busy = (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]) if len(cpu) > 1 else float("nan")
        who = "router" if "replay" in probe["argv"] else "sender"
        worst = sorted(slow, key=lambda e: -e[1])[:2]
        out.append(f"      {who} {probe['pid']}: CPU {busy:.0%} of a core; loop turns {probe['turns']}, busy > 1/2/5 ms: "
                   f"{sum(t[1] > 1 for t in turns)}/{sum(t[1] > 2 for t in turns)}/{sum(t[1] > 5 for t in turns)}; "
                   f"gc pauses {len(gcs)} (gen2 {sum(g[2] == 2 for g in gcs)}), max {max((g[1] for g in gcs), default=0):.2f}"
                   f" ms; callbacks > 1 ms: {len(slow)}" + "".join(f"; {e[1]:.1f} ms {e[2][:60]}" for e in worst))
    return out


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of process `pid` onto `cpus` (sched_setaffinity acts on one thread)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cpus)


COLUMNS = ("lag50", "lag99", "own50", "own99", "hop99", "write99")


def line(rate: float, senders: int, f: dict[str, float], note: str = "") -> str:
    return (f"{rate:8.0f} {senders:8d} " + " ".join(f"{f[c]:9.3f}" for c in COLUMNS)
            + f" {f['ok']:7.0f}/{f['n']:<7.0f} {f['handed']:7.0%} {f['cpu_ms']:9.3f}{note}")


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
    parser.add_argument("--pin", action="store_true", help="router on CPU 0 alone, sender processes on 1..S, "
                        "sim-servers on the rest (replay --pin-cpus; Linux)")
    parser.add_argument("--probe", action="store_true", help="run the replays with bench/loop_probe/ (GC pauses, "
                        "slow callbacks, long loop turns) and print what it saw per point")
    parser.add_argument("--replay-args", default="", help="more `tracebench replay` arguments, split like a shell, "
                        "e.g. '--router-sends-under 0' (every request through the sender processes)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    counts = [int(s) for s in args.senders.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-senders-"))
    cpus = sorted(os.sched_getaffinity(0))
    top = max(counts)
    if args.pin and len(cpus) < top + 2:
        raise SystemExit(f"--pin: {len(cpus)} CPUs, too few for the router, {top} sender processes and servers")
    with ThreadPoolExecutor(8) as pool:  # started together: each takes a second of imports
        sims = list(pool.map(lambda i: start_sim(work / f"sim-{i}.log", "--speed", str(args.speed)),
                             range(args.servers)))
    attach = [a for _, url in sims for a in ("--attach", url)]
    print(f"machine: {os.cpu_count()} CPUs; {args.servers} sim-server(s) at --speed {args.speed:g}; {args.seconds:g} s "
          f"of Poisson arrivals of {args.input_len} / {args.output_len}-token requests per point; run folders in {work}")
    try:
        env = dict(os.environ)
        if args.probe:
            probe_path = str(Path(__file__).resolve().parent / "loop_probe")
            env["PYTHONPATH"] = os.pathsep.join(p for p in (probe_path, env.get("PYTHONPATH")) if p)
        pin_cpus: dict[int, str] = {}
        if args.pin:
            for senders in counts:
                pin_cpus[senders] = (str(cpus[0]) if senders == 1
                                     else ",".join(str(c) for c in cpus[:top + 1]))
            for proc, _ in sims:
                pin_process(proc.pid, set(cpus[top + 1:]))
            print(f"pinned: router on CPU {cpus[0]}, sender processes on CPUs {cpus[1]}-{cpus[top]}, sim-servers on "
                  f"CPUs {cpus[top + 1]}-{cpus[-1]}")
        print(f"load average before: {os.getloadavg()[0]:.2f} (1 min)")
        print(f"{'rate':>8} {'senders':>8} " + " ".join(f"{h:>9}" for h in ("lag p50", "lag p99", "own p50", "own p99",
                                                                                "hop p99", "write p99"))
              + "      ok/n     handed  router CPU   (ms; lag = t_released - t_arrival, own = t_written - t_arrival, "
              "hop = t_built - t_assigned, write = t_written - t_dispatch; handed: the share of requests the router "
              "handed to sender processes; router CPU: the router process's CPU per request, ms, run.json "
              "senders.router_cpu_s / requests)")
        medians: dict[tuple[float, int], dict[str, float]] = {}
        spreads: dict[float, list[dict[str, float]]] = {}  # the 1-sender runs of each rate
        for rate in rates:
            trace = work / f"trace-{rate:g}.jsonl"
            n = make_trace(trace, rate, args.seconds, int(rate), args.input_len, args.output_len)
            points: dict[int, list[dict[str, float]]] = {s: [] for s in counts}
            for rep in range(args.repeat):
                # one after the other: they share the load of this moment; the order reversed every other repeat,
                # so that no sender count always runs first
                for senders in (counts if rep % 2 == 0 else counts[::-1]):
                    name = f"rate-{rate:g}-s{senders}-{rep}"
                    pin = ["--pin-cpus", pin_cpus[senders]] if args.pin else []
                    probe_dir = work / f"probe-{name}"
                    if args.probe:
                        probe_dir.mkdir()
                        env["TB_PROBE_DIR"] = str(probe_dir)
                    result = subprocess.run(
                        [sys.executable, "-m", "tracebench", "replay", str(trace), *attach, "--policy", "round_robin",
                         "--senders", str(senders), "--run-name", name, "--out-dir", str(work), "--quiet", *pin,
                         *shlex.split(args.replay_args)],
                        capture_output=True, text=True, env=env,
                    )
                    if result.returncode != 0:  # said, and the bench goes on (one failed point spoils no other)
                        print(f"{rate:8.0f} {senders:8d} replay failed (exit {result.returncode}): "
                              f"{result.stderr.strip().splitlines()[-1] if result.stderr.strip() else ''}", flush=True)
                        if not (work / name / "requests.jsonl").is_file():
                            continue
                    points[senders].append(figures(work / name))
                    print(line(rate, senders, points[senders][-1]), flush=True)
                    if args.probe:
                        print("\n".join(probe_lines(work / name, probe_dir)), flush=True)
            spreads[rate] = points.get(1, [])
            for senders in counts:
                runs = points[senders]
                if not runs:
                    raise SystemExit(f"every replay at {rate:g} req/s with {senders} sender(s) failed")
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

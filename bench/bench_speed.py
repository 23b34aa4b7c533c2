"""Does `--speed K` give the figures of `--speed 1`? (issue 24; first asked in issue 15)

    .venv/bin/python bench/bench_speed.py [--speeds 1,2,4] [--repeat N] [--hog] [--policy round_robin] [--out DIR]
    .venv/bin/python bench/bench_speed.py --speeds 1,2,4adapt,4adapt+hog*1 --repeat 3   # issue 24's table (~7 min)
    .venv/bin/python bench/bench_speed.py --requests 200 --speeds 1,2,4adapt --repeat 2    # a quick check (~1.5 min)

Replays one trace on simulated servers at each speed (default: the issue's workload, reports/examples/sim4-routing/
azure4.jsonl on 4 servers with cap 24, round_robin), one run after another, and prints one line per run: TTFT p50/p99,
total p50/p99 and router wait p99 against the real four-H200 run of the same trace and policy
(reports/examples/h200x4-routing/<policy>, via bench/sim_vs_real.py's figures), the same four against the median of
the speed-1 runs (the issue's target: within 2%), TTFT's mean split into host time, router wait and the simulators'
model time (which of them a speed moved), the simulators' lag (p99, wall ms, and x K: what the report bounds; its
warning past LAG_BOUND), the client's release lag p99, the CPU seconds the servers and the replay used, the wall time
and the load average (`uptime`) before each run.

One run per speed cannot show "within 2%": speed 1 against itself moves its p99s by 3-4% (docs/sim-server.md). So
`--repeat N` makes every speed N times, interleaved (round r runs each speed once, the order rotated by r: a slow
drift of the machine falls on every speed alike), and a second table gives per speed the median over its runs of each
figure against speed 1's median, with a verdict: `ok` (within 2%), `noise` (further, but within speed 1's own spread:
the largest distance of a speed-1 run from the speed-1 median, shown on speed 1's row), `OUT` (outside both). With
two speed-1 runs or more it also pools each speed's requests over its runs (p99 of 3x the requests is steadier).

`--hog` adds every speed again beside a CPU-bound process (one busy Python loop, started before the run and killed
after). A speed may carry its own suffixes instead: `4+hog` (this run beside the hog), `4adapt` (replay
--adapt-speed: the row shows the speed asked for -> the speed the run was kept at), `*N` (N runs of it instead of
--repeat's; `4adapt+hog*1`: one). `--requests N` replays only the trace's first N requests (no real run to compare
with). Each run folder stays in --out (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_vs_real import QUANTILES, figures  # noqa: E402

from tracebench.report.load import COMPLETED_STATUSES, load_run  # noqa: E402
from tracebench.report.metrics.definitions import latency_expr  # noqa: E402
from tracebench.report.metrics.lag import LAG_BOUND, lag_stats  # noqa: E402
from tracebench.report.speed import output_delays  # noqa: E402

KEYS = (("ttft", "p50"), ("ttft", "p99"), ("total", "p50"), ("total", "p99"))
TARGET = 0.02   # issue 24: a sped-up run within 2% of speed 1 on each of KEYS


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process (/proc/PID/stat), seconds (not its children's)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def replay(args: argparse.Namespace, speed: float, name: str, adapt: bool) -> tuple[Path, float, float, float]:
    """One run; returns its folder, wall seconds, the replay's and the servers' CPU seconds (sampled until the end)."""
    cmd = [sys.executable, "-m", "tracebench", "replay", str(args.trace), "--backend", "sim", "--gpus", str(args.gpus),
           "--policy", args.policy, "--run-name", name, "--out-dir", str(args.out), "--quiet"]
    if args.cap:
        cmd += ["--max-running-requests", str(args.cap)]
    if speed != 1:
        cmd += ["--speed", f"{speed:g}"]
    if adapt:
        cmd += ["--adapt-speed"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    servers: dict[int, float] = {}
    replay_cpu = 0.0
    while proc.poll() is None:
        try:
            replay_cpu = cpu_seconds(proc.pid)
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            for child in children:
                servers[int(child)] = cpu_seconds(int(child))
        except (FileNotFoundError, ProcessLookupError):
            pass
        time.sleep(0.2)
    if proc.returncode:
        raise SystemExit(f"replay at speed {speed:g} failed ({proc.returncode})")
    return args.out / name, time.monotonic() - t0, replay_cpu, sum(servers.values())


def load_average() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


@dataclass(frozen=True)
class Item:
    """One entry of --speeds: the speed asked for, --adapt-speed or not, beside the hog or not, how many runs."""

    speed: float
    adapt: bool
    hog: bool
    count: int

    @property
    def label(self) -> str:
        return f"{self.speed:g}{' adapt' if self.adapt else ''}{' + hog' if self.hog else ''}"

    @property
    def is_base(self) -> bool:
        return self.speed == 1 and not self.adapt and not self.hog


@dataclass
class Result:
    """One finished run: the figures the tables show."""

    item: Item
    used: float                      # the speed the kept run ran at (an adapted run's may be lower than asked)
    load: str
    fig: dict
    values: dict                     # "ttft"/"total" -> the completed requests' latencies (simulated seconds)
    parts: dict                      # TTFT's mean split: "host", "router wait", "in sim" (simulated seconds)
    cells: list[str]                 # the per-run table's columns after the "vs speed 1" ones


def parse_items(speeds: str, repeat: int, hog_too: bool) -> list[Item]:
    items = []
    for word in speeds.split(","):
        word, _, count = word.partition("*")
        hog = word.endswith("+hog")
        word = word.removesuffix("+hog")
        adapt = word.endswith("adapt")
        n = int(count) if count else repeat
        if n < 1:
            raise SystemExit(f"--speeds {speeds} --repeat {repeat}: {word or '?'} would run {n} times (at least 1)")
        items.append(Item(float(word.removesuffix("adapt")), adapt, hog, n))
    if hog_too:
        items += [dataclasses.replace(item, hog=True) for item in items if not item.hog]
    return items


def interleave(items: list[Item]) -> list[Item]:
    """Round r runs every item with more than r runs, the order rotated by r: a slow drift of the machine (others'
    load, thermal) falls on every speed alike, and no speed always follows the same one."""
    order = []
    for r in range(max(item.count for item in items)):
        ring = [item for item in items if item.count > r]
        shift = r % len(ring)
        order += ring[shift:] + ring[:shift]
    return order


def slice_trace(trace: Path, requests: int, out: Path) -> Path:
    """The trace's first `requests` requests, as a trace of their own (header counts and duration fixed)."""
    lines = trace.read_text().splitlines()
    header, body = orjson.loads(lines[0]), lines[1:requests + 1]
    if len(body) < requests:
        raise SystemExit(f"{trace}: --requests {requests}, the trace has {len(body)}")
    header["num_requests"] = requests
    header["duration_s"] = orjson.loads(body[-1])["arrival_s"]
    path = out / f"{trace.stem}-first{requests}.jsonl"
    path.write_text("\n".join([orjson.dumps(header).decode(), *body]) + "\n")
    return path


def run_one(args: argparse.Namespace, item: Item, index: int) -> Result:
    tag = f"{item.speed:g}{'adapt' if item.adapt else ''}{'-hog' if item.hog else ''}"
    name = f"{args.policy}-speed{tag}-{index:02d}-{time.strftime('%H%M%S')}"
    load = load_average()
    hogger = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if item.hog else None
    try:
        folder, wall, replay_cpu, server_cpu = replay(args, item.speed, name, item.adapt)
    finally:
        if hogger is not None:
            hogger.kill()
            hogger.wait()
    run = load_run(folder)
    ok = run.requests.filter(pl.col("status").is_in(COMPLETED_STATUSES))
    values = {key: ok.select(latency_expr(key).alias("v"))["v"].drop_nulls().to_numpy() for key in ("ttft", "total")}
    lag = lag_stats(ok, run.speed)
    parts = ttft_parts(ok, run.meta)
    release = ok.select((pl.col("t_released") - pl.col("t_arrival")).alias("v"))["v"].to_numpy()
    if lag is None:
        lag_cell = "-"
    else:
        worst = max(lag.shares.values())
        lag_cell = (f"{lag.sim_p99 * 1e3:.2f} / {lag.could_p99 * 1e3:.1f} "
                    f"({worst:.1%}{' WARNED' if worst > LAG_BOUND else ''})")
    cells = [lag_cell, f"{np.quantile(release, 0.99) * 1e3:.2f}", f"{server_cpu:.1f} + {replay_cpu:.1f}", f"{wall:.1f}"]
    cells.insert(0, " / ".join(f"{parts[name] * 1e3:.2f}" for name in PARTS))
    result = Result(item, run.speed or 1.0, load, figures(run), values, parts, cells)
    print(f"run {index + 1}: {item.label} -> speed {result.used:g}, load {load}, wall {wall:.0f} s, "
          + ", ".join(f"{m} {s} {result.fig[(m, s)] * 1e3:.1f} ms" for m, s in KEYS), file=sys.stderr)
    return result


def ttft_parts(ok: pl.DataFrame, meta: dict) -> dict[str, float]:
    """Where a run's TTFT goes, as means over its streamed completed requests (means add up; quantiles do not), in
    simulated seconds: "in sim" the simulator's model time (received -> prefill finished, x K, plus its profile's
    token hand-out delay), "router wait" (dispatch - release: host time, or a slot's wait with a cap), "host" the rest
    (release lag, the HTTP hop to the simulator, its late hand-out and the hop back: host time, counted once at any
    K, report/speed.py). What moves between speeds shows which it is: the model's schedule or the host's load."""
    delays = output_delays(meta)
    if delays is None:
        raise SystemExit("bench_speed: the simulators did not report output_s (a run from before it existed?)")
    c = pl.col
    out_delay = pl.lit(0.0)
    for i, value in enumerate(delays):
        out_delay = pl.when(c("server") == i).then(pl.lit(value)).otherwise(out_delay)
    frame = ok.filter(c("t_first_token").is_not_null() & c("server_prefill_finished").is_not_null()).select(
        ttft=c("t_first_token") - c("t_arrival"),
        wait=c("t_dispatch") - c("t_released"),
        sim=c("server_prefill_finished") - c("server_received") + out_delay)
    ttft, wait, sim = (float(frame[name].mean()) for name in ("ttft", "wait", "sim"))
    return {"host": ttft - wait - sim, "router wait": wait, "in sim": sim}


PARTS = ("host", "router wait", "in sim")


def pct(value: float) -> str:
    return f"{value:+.1%}"


def verdict(change: float, band: float) -> str:
    """Within issue 24's 2%, else within speed 1's own run-to-run spread, else outside both."""
    if abs(change) <= TARGET:
        return "ok"
    return "noise" if abs(change) <= band else "OUT"


def summary(results: list[Result], pooled: bool) -> list[str]:
    """Per item: the median over its runs of each figure against speed 1's median, speed 1's spread (its noise band:
    each speed-1 run against the speed-1 median), a verdict per figure; with `pooled`, the same figures over all its
    runs' requests together (p99 of 3x the requests is steadier than any one run's)."""
    base = [r for r in results if r.item.is_base]
    if not base:
        return ["(no plain speed-1 run: nothing to compare with)"]
    base_med = {key: float(np.median([r.fig[key] for r in base])) for key in KEYS}
    spread = {key: [r.fig[key] / base_med[key] - 1 for r in base] for key in KEYS}
    band = {key: max(abs(v) for v in spread[key]) for key in KEYS}
    base_pool = {key: pooled_figure(base, key) for key in KEYS}
    base_parts = {name: float(np.median([r.parts[name] for r in base])) for name in PARTS}
    head = ["speed (kept at)", "runs", *(f"{m.upper() if m == 'ttft' else m} {s}" for m, s in KEYS),
            "TTFT mean ms: host / router wait / in sim"]
    if pooled:
        head += [f"pooled {m.upper() if m == 'ttft' else m} {s}" for m, s in KEYS]
    lines = [f"medians over repeats against speed 1's median (ok: within {TARGET:.0%}; noise: within speed 1's own "
             "spread; OUT: outside both); speed 1's row: its spread, min…max of each run against its median; TTFT "
             "mean's parts: medians over repeats, the others' as ms against speed 1's",
             "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    items = list(dict.fromkeys(r.item for r in results))
    for item in items:
        runs = [r for r in results if r.item == item]
        used = ",".join(f"{r.used:g}" for r in runs)
        cells = [f"{item.label} ({used})" if item.adapt else item.label, str(len(runs))]
        if item.is_base:
            cells += [f"{base_med[key] * 1e3:,.1f} ms (±{band[key]:.1%}: {pct(min(spread[key]))}…{pct(max(spread[key]))})"
                      for key in KEYS]
            cells.append(" / ".join(f"{base_parts[name] * 1e3:.2f}" for name in PARTS))
            if pooled:
                cells += [f"{base_pool[key] * 1e3:,.1f} ms" for key in KEYS]
        else:
            for key in KEYS:
                change = float(np.median([r.fig[key] for r in runs])) / base_med[key] - 1
                cells.append(f"{pct(change)} {verdict(change, band[key])}")
            cells.append(" / ".join(f"{(float(np.median([r.parts[name] for r in runs])) - base_parts[name]) * 1e3:+.2f}"
                                    for name in PARTS))
            if pooled:
                for key in KEYS:
                    change = pooled_figure(runs, key) / base_pool[key] - 1
                    cells.append(f"{pct(change)}{'' if abs(change) <= TARGET else ' (>2%)'}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def pooled_figure(runs: list[Result], key: tuple[str, str]) -> float:
    metric, stat = key
    return float(np.quantile(np.concatenate([r.values[metric] for r in runs]), QUANTILES[stat]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # the committed trace is reports/examples/sim4-routing/azure4.jsonl.xz: `xz -dk` it first
    ap.add_argument("--trace", type=Path, default=REPO / "reports/examples/sim4-routing/azure4.jsonl")
    ap.add_argument("--requests", type=int, default=None,
                    help="replay only the trace's first N requests (a quick check; no comparison with the real run)")
    ap.add_argument("--real", type=Path, default=REPO / "reports/examples/h200x4-routing",
                    help="folder of the real runs (one per policy); --no-real: none")
    ap.add_argument("--no-real", dest="real", action="store_const", const=None)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--cap", type=int, default=24)
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--speeds", default="1,2,4",
                    help="comma-separated: K, Kadapt (--adapt-speed), a suffix +hog (beside a CPU-bound process), "
                         "*N (this many runs instead of --repeat)")
    ap.add_argument("--repeat", type=int, default=1, help="runs of each speed, interleaved (default 1)")
    ap.add_argument("--hog", action="store_true", help="also every speed with a CPU-bound process beside it")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    items = parse_items(args.speeds, args.repeat, args.hog)
    args.out = args.out or Path(tempfile.mkdtemp(prefix="bench-speed-"))
    args.out.mkdir(parents=True, exist_ok=True)
    if args.requests is not None:
        args.trace = slice_trace(args.trace, args.requests, args.out)
        args.real = None
    real = figures(load_run(args.real / args.policy)) if args.real is not None else None
    t0 = time.monotonic()
    results = [run_one(args, item, i) for i, item in enumerate(interleave(items))]
    base = [r for r in results if r.item.is_base]
    base_med = {key: float(np.median([r.fig[key] for r in base])) for key in KEYS} if base else None
    head = ["speed", "load avg", "TTFT p50 ms (vs real)", "TTFT p99", "total p50", "total p99", "router wait p99",
            "vs speed-1 median: TTFT p50", "TTFT p99", "total p50", "total p99",
            "TTFT mean ms: host / router wait / in sim", "sim lag p99 wall ms / x K (largest share)", "release lag p99 ms", "CPU s servers + replay", "wall s"]
    print(f"{args.trace.name}: {args.gpus} simulated servers, cap {args.cap}, {args.policy}; real: "
          f"{'-' if args.real is None else args.real / args.policy}; {len(results)} runs in "
          f"{time.monotonic() - t0:.0f} s, in {args.out}")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for r in results:
        used = f"{r.item.speed:g}" if not r.item.adapt else f"{r.item.speed:g} adapt -> {r.used:g}"
        cells = [f"{used}{' + hog' if r.item.hog else ''}", r.load]
        for key in (*KEYS, ("router_wait", "p99")):
            cells.append(f"{r.fig[key] * 1e3:,.1f}" + ("" if real is None else f" ({pct(r.fig[key] / real[key] - 1)})"))
        cells += ["-" if base_med is None else pct(r.fig[key] / base_med[key] - 1) for key in KEYS]
        print("| " + " | ".join(cells + r.cells) + " |")
    print()
    for line in summary(results, pooled=len(base) > 1):
        print(line)


if __name__ == "__main__":
    main()

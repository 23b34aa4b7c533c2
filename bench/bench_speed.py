"""Does `--speed K` give the figures of `--speed 1`? (issue 24; first asked in issue 15)

    .venv/bin/python bench/bench_speed.py [--speeds 1,2,4] [--hog] [--policy round_robin] [--out DIR]
    .venv/bin/python bench/bench_speed.py --speeds 1,4,4,4+hog,4adapt,4adapt+hog     # issue 24's table (~4-6 min)

Replays one trace on simulated servers at each speed (default: the issue's workload, reports/examples/sim4-routing/
azure4.jsonl on 4 servers with cap 24, round_robin), one run after another, and prints one line per run: TTFT p50/p99,
total p50/p99 and router wait p99 against the real four-H200 run of the same trace and policy
(reports/examples/h200x4-routing/<policy>, via bench/sim_vs_real.py's figures), the same four against the speed-1 run
(the issue's target: within 2%), the simulators' lag (p99, wall ms, and x K: what the report bounds; its warning
past 2%), the client's release lag p99, the CPU seconds the servers and the replay used, the wall time and the load
average (`uptime`) before each run. `--hog` repeats every run with a CPU-bound process beside it (one busy Python
loop, started before the run and killed after). A speed may carry its own suffixes instead: `4+hog` (this run beside
the hog), `4adapt` (replay --adapt-speed: the row shows the speed asked for -> the speed the run was kept at). Each run
folder stays in --out (a temporary folder by default).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_vs_real import figures  # noqa: E402

from tracebench.report.load import COMPLETED_STATUSES, load_run  # noqa: E402
from tracebench.report.metrics.lag import LAG_BOUND, lag_stats  # noqa: E402

KEYS = (("ttft", "p50"), ("ttft", "p99"), ("total", "p50"), ("total", "p99"))


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", type=Path, default=REPO / "reports/examples/sim4-routing/azure4.jsonl")
    ap.add_argument("--real", type=Path, default=REPO / "reports/examples/h200x4-routing",
                    help="folder of the real runs (one per policy); --no-real: none")
    ap.add_argument("--no-real", dest="real", action="store_const", const=None)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--cap", type=int, default=24)
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--speeds", default="1,2,4")
    ap.add_argument("--hog", action="store_true", help="also every speed with a CPU-bound process beside it")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.out = args.out or Path(tempfile.mkdtemp(prefix="bench-speed-"))
    args.out.mkdir(parents=True, exist_ok=True)
    real = figures(load_run(args.real / args.policy)) if args.real is not None else None
    plan = []
    for item in args.speeds.split(","):
        hog = item.endswith("+hog")
        item = item.removesuffix("+hog")
        adapt = item.endswith("adapt")
        plan.append((float(item.removesuffix("adapt")), adapt, hog))
    if args.hog:
        plan += [(speed, adapt, True) for speed, adapt, hog in plan if not hog]
    rows = []
    base: dict | None = None
    for speed, adapt, hog in plan:
        name = f"{args.policy}-speed{speed:g}{'adapt' if adapt else ''}{'-hog' if hog else ''}-{time.strftime('%H%M%S')}"
        load = load_average()
        hogger = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if hog else None
        try:
            folder, wall, replay_cpu, server_cpu = replay(args, speed, name, adapt)
        finally:
            if hogger is not None:
                hogger.kill()
                hogger.wait()
        run = load_run(folder)
        fig = figures(run)
        if speed == 1 and not hog and not adapt:
            base = fig
        ok = run.requests.filter(pl.col("status").is_in(COMPLETED_STATUSES))
        lag = lag_stats(ok, run.speed)
        release = ok.select((pl.col("t_released") - pl.col("t_arrival")).alias("v"))["v"].to_numpy()
        used = f"{speed:g}" if not adapt else f"{speed:g} adapt -> {run.speed or 1:g}"
        cells = [f"{used}{' + hog' if hog else ''}", load]
        for key in (*KEYS, ("router_wait", "p99")):
            cells.append(f"{fig[key] * 1e3:,.1f}" + ("" if real is None else f" ({fig[key] / real[key] - 1:+.1%})"))
        cells += ["-" if base is None else f"{fig[key] / base[key] - 1:+.1%}" for key in KEYS]
        if lag is None:
            cells.append("-")
        else:
            worst = max(lag.shares.values())
            cells.append(f"{lag.sim_p99 * 1e3:.2f} / {lag.could_p99 * 1e3:.1f} ({worst:.1%}{' WARNED' if worst > LAG_BOUND else ''})")
        cells += [f"{np.quantile(release, 0.99) * 1e3:.2f}", f"{server_cpu:.1f} + {replay_cpu:.1f}", f"{wall:.1f}"]
        rows.append(cells)
        print(" | ".join(cells), file=sys.stderr)
    head = ["speed", "load avg", "TTFT p50 ms (vs real)", "TTFT p99", "total p50", "total p99", "router wait p99",
            "vs speed 1: TTFT p50", "TTFT p99", "total p50", "total p99",
            "sim lag p99 wall ms / x K (largest share)", "release lag p99 ms", "CPU s servers + replay", "wall s"]
    print(f"{args.trace.name}: {args.gpus} simulated servers, cap {args.cap}, {args.policy}; real: "
          f"{'-' if args.real is None else args.real / args.policy}; "
          f"runs in {args.out}")
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for cells in rows:
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

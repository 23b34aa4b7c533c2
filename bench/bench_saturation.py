"""Where the over-saturation rule fires (tracebench/replay/saturation.py; docs/sweep.md "When a point is
over-saturated"): replays Poisson traces at fractions of one simulated server's capacity without the rule, then
applies the rule to each run's recorded counts (requests released and finished, sampled as the live watcher samples
them) for each window, and prints when it first fired (or "-").

    .venv/bin/python bench/bench_saturation.py [--capacity 30.7] [--loads 0.7,0.8,0.9,0.95,1.07,1.15,1.5]
        [--seeds 1,2] [--windows 5,10] [--speed 10] [--out reports/bench-saturation]

The capacity is one server's throughput under overload on the default profile with this trace shape (512 in / 128
out, lognormal): measure it with --measure (a run at 3x the given capacity; its ok requests per second of its
window). A run takes about 40 trace seconds / --speed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from tracebench.replay.saturation import SaturationWatch


def tracebench(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "tracebench", *args], check=True, capture_output=True)


def first_fired(run: Path, window_run_s: float, speed: float) -> float | None:
    records = [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]
    released = np.sort([r["t_released"] for r in records if r["t_released"] is not None])
    finished = np.sort([r["t_finish"] for r in records if r["t_finish"] is not None])
    watch = SaturationWatch(window_run_s)
    t = watch.interval
    while t < finished[-1]:
        arrived = int(np.searchsorted(released, t, "right"))
        done = int(np.searchsorted(finished, t, "right"))
        if watch.sample(t, arrived, done) is not None:
            return t * speed
        t += watch.interval
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=float, default=30.7)
    parser.add_argument("--loads", default="0.7,0.8,0.9,0.95,1.07,1.15,1.5")
    parser.add_argument("--seeds", default="1,2")
    parser.add_argument("--windows", default="5,10", help="trace seconds")
    parser.add_argument("--speed", type=float, default=10.0)
    parser.add_argument("--duration", type=float, default=40.0, help="trace seconds of arrivals per run")
    parser.add_argument("--out", type=Path, default=Path("reports/bench-saturation"))
    parser.add_argument("--measure", action="store_true", help="measure the capacity first (a run at 3x --capacity)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    capacity = args.capacity
    if args.measure:
        rate = 3 * capacity
        trace = args.out / "measure.jsonl"
        tracebench("generate", "--rate", f"{rate:g}", "--num-requests", str(int(rate * args.duration)), "--seed", "0",
                   "-o", str(trace))
        run = args.out / "measure"
        tracebench("replay", str(trace), "--backend", "sim", "--speed", f"{args.speed:g}", "--out-dir", str(args.out),
                   "--run-name", run.name, "--quiet")
        done = subprocess.run([sys.executable, "-m", "tracebench", "report", str(run), "--format", "json"],
                              check=True, capture_output=True, text=True)
        capacity = json.loads(done.stdout)["runs"][0]["throughput"]["requests_per_s"]
        print(f"capacity (ok req/s at 3x): {capacity:.2f}")
    windows = [float(w) for w in args.windows.split(",")]
    print(f"{'load':>6} {'seed':>4} " + " ".join(f"{f'W={w:g}s':>8}" for w in windows))
    for load in (float(x) for x in args.loads.split(",")):
        for seed in args.seeds.split(","):
            rate = load * capacity
            name = f"load{load:g}-seed{seed}"
            trace = args.out / f"{name}.jsonl"
            tracebench("generate", "--rate", f"{rate:g}", "--num-requests", str(int(rate * args.duration)), "--seed",
                       seed, "-o", str(trace))
            run = args.out / name
            if not run.exists():
                tracebench("replay", str(trace), "--backend", "sim", "--speed", f"{args.speed:g}", "--out-dir",
                           str(args.out), "--run-name", name, "--quiet")
            fired = [first_fired(run, w / args.speed, args.speed) for w in windows]
            print(f"{load:>6g} {seed:>4} " + " ".join(f"{'-' if f is None else f'{f:.1f}s':>8}" for f in fired))


if __name__ == "__main__":
    main()

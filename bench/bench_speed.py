"""--speed K against speed 1 (issue 15): the same trace on the simulated cluster (4 GPUs, no cap) at speed 1 and at
speed K, and what the report shows for the millisecond-scale metrics (p50 TTFT from arrival, router wait, release
lag), as the report converts them now and as it did before (every run-clock time x K). Usage: python bench/bench_speed.py [--requests 400] [--rate 20] [--speed 4] [--out DIR] (default: a new temporary
folder)"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import polars as pl

from tracebench.report.load import load_run
from tracebench.report.metrics import latency_expr


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--rate", type=float, default=20)
    ap.add_argument("--speed", type=float, default=4)
    ap.add_argument("--gpus", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="tracebench-speed-"))
    args.out.mkdir(parents=True, exist_ok=True)
    trace = args.out / f"t-{args.requests}-{args.rate:g}-{args.input_len}-{args.output_len}.jsonl"
    tb = [sys.executable, "-m", "tracebench"]
    subprocess.run([*tb, "generate", "--rate", str(args.rate), "--num-requests", str(args.requests), "--seed", "0",
                    "--input-len", str(args.input_len), "--output-len", str(args.output_len), "-o", str(trace)], check=True, capture_output=True)
    rows = []
    for speed in (1.0, args.speed):
        name = f"speed{speed:g}-{len(list(args.out.iterdir()))}"
        subprocess.run([*tb, "replay", str(trace), "--backend", "sim", "--gpus", str(args.gpus), "--speed", f"{speed:g}",
                        "--policy", "round_robin", "--run-name", name, "--out-dir", str(args.out), "--quiet"],
                       check=True, capture_output=True)
        ok = load_run(args.out / name).requests.filter(status="ok")
        p50 = {key: ok.select(latency_expr(key).median()).item() * 1000
               for key in ("ttft", "ttft_dispatch", "router_wait", "release_lag", "total")}
        rows.append((f"{speed:g}", p50))
        if speed != 1.0:  # the same run as the report converted it before: every run-clock time x K
            raw = pl.read_ndjson(args.out / name / "requests.jsonl").filter(status="ok")
            rows.append((f"{speed:g} xK", {key: raw.select(latency_expr(key).median()).item() * 1000 * speed
                                           for key in p50}))
    keys = list(rows[0][1])
    print(f"{args.requests} requests at {args.rate:g} req/s, {args.input_len} in / {args.output_len} out, "
          f"{args.gpus} simulated GPUs, no cap; 'K xK' = the same speed-K run with every run-clock time x K (before)")
    print("speed  " + "  ".join(f"{k + ' p50 ms':>22}" for k in keys))
    base = rows[0][1]
    for speed, p50 in rows:
        print(f"{speed:>5}  " + "  ".join(f"{p50[k]:22.2f}" for k in keys))
        if p50 is not base:
            print(f"{'diff%':>5}  " + "  ".join(f"{100 * (p50[k] / base[k] - 1):22.1f}" for k in keys))


if __name__ == "__main__":
    main()

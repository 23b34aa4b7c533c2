"""How fast the virtual clock runs (issue #32, "Fast"): whole `tracebench replay --clock virtual` processes, timed.

    .venv/bin/python bench/bench_virtual.py [--out DIR (default reports/bench-virtual)] [--big N] [--only NAME ...]

Cases (each trace generated first, not timed):
- mooncake4:  a Mooncake-like workload (shared-prompt: 64 system prompts of 2,048 tokens by zipf popularity, ~700 more
              tokens of its own, ~100 out; mean input ~2,740) at 14 req/s, 20,000 requests, 4 servers, cache_aware;
- azure4:     the Azure conversation lengths at 30 req/s, 1,350 requests, 4 servers, cap 24, random (the sim4-routing
              example's trace);
- uniform4:   lognormal lengths (512 in / 128 out) at 40 req/s, 20,000 requests, 4 servers, round_robin;
- big64:      --big requests (default 200,000; the issue asks 1,000,000) at 600 req/s, 64 servers, round_robin;
- wide1024:   20,000 requests at 2,000 req/s on 1,024 servers, round_robin (does it complete).
Per case: requests, simulated seconds (run.json t_end), wall seconds of the process, simulated requests per wall
second (over the whole process, start-up included), how many times faster than real time, and the process's peak
RSS. Prints a Markdown table with the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

CASES = {
    "mooncake4": (["--workload", "shared-prompt", "--groups", "64", "--prefix-len", "2048", "--group-dist", "zipf",
                   "--input-len", "700", "--output-len", "100", "--rate", "14", "--num-requests", "20000"],
                  ["--gpus", "4", "--policy", "cache_aware"]),
    "azure4": (["--dataset", "tests/data/AzureLLMInferenceTrace_conv.csv.xz", "--rate", "30", "--num-requests", "1350"],
               ["--gpus", "4", "--max-running-requests", "24", "--policy", "random"]),
    "uniform4": (["--rate", "40", "--num-requests", "20000"], ["--gpus", "4", "--policy", "round_robin"]),
    "big64": (["--rate", "600", "--num-requests", "{big}"], ["--gpus", "64", "--policy", "round_robin"]),
    "wide1024": (["--rate", "2000", "--num-requests", "20000"], ["--gpus", "1024", "--policy", "round_robin"]),
}


def run(cmd: list[str]) -> tuple[float, int, int]:
    """(wall seconds, peak RSS in MiB, exit status) of one process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr.read().decode() if proc.stderr else "")
    return wall, usage.ru_maxrss // 1024, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports/bench-virtual"))
    parser.add_argument("--big", type=int, default=200_000, help="requests of the big64 case")
    parser.add_argument("--only", nargs="*", default=None, choices=sorted(CASES))
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "tracebench"]
    rows = []
    for name, (gen, replay) in CASES.items():
        if opts.only and name not in opts.only:
            continue
        trace = opts.out / f"{name}.jsonl"
        gen = [a.format(big=opts.big) for a in gen]
        subprocess.run([*py, "generate", *gen, "--seed", "0", "-o", str(trace)], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run_dir = opts.out / f"{name}-run"
        if run_dir.exists():
            subprocess.run(["rm", "-rf", str(run_dir)], check=True)
        wall, rss, code = run([*py, "replay", str(trace), "--clock", "virtual", *replay, "--run-name", run_dir.name,
                               "--out-dir", str(opts.out), "--quiet"])
        if code != 0:
            rows.append(f"| {name} | failed (exit {code}) | | | | | |")
            continue
        meta = json.loads((run_dir / "run.json").read_text())
        n = meta["trace"]["num_requests"]
        sim_s = meta["t_end"]
        rows.append(f"| {name} | {n:,} on {len(meta['servers'])} | {sim_s:,.1f} | {wall:,.1f} | {n / wall:,.0f} | "
                    f"{sim_s / wall:,.0f}x | {rss:,} |")
        print(rows[-1], file=sys.stderr)
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"Machine: {os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, load "
          f"{os.getloadavg()[0]:.1f} at the end\n")
    print("| case | requests | simulated s | wall s | requests / wall s | x real time | peak RSS MiB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()

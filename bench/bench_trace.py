"""Speed of `tracebench generate` and `tracebench inspect` on 1,000,000 requests, timed as real processes (wall time
of the whole command, interpreter start included). Targets: generate < 3 s, inspect < 2 s. Prints the figures.

Then the same for a prefix trace (issue 12): 1,000,000 requests of ~14 prefix blocks of 512 tokens (shared-prompt
workload: 4,096-token system prompts of 1,000 groups + ~2,800-token questions), whose inspect also computes the
prefix structure (tree, ceiling, three LRU caches). Target: inspect < 10 s; generate is reported without a target.

    .venv/bin/python bench/bench_trace.py [--requests 1000000] [--repeat 3] [--keep DIR]

Each figure is the best of --repeat runs (the least disturbed by other work on the machine); all runs are printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_GENERATE_S = 3.0
TARGET_INSPECT_S = 2.0
TARGET_PREFIX_INSPECT_S = 10.0


def timed(cmd: list[str]) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall seconds, CPU seconds (user + system of the command) and the finished process. The CPU time says what the
    command costs when the machine is shared (other work stretches the wall time, not the CPU time)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu, proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="write the trace here and keep it")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench_trace-"))
    trace = args.keep if args.keep is not None else workdir / "trace.jsonl"
    tracebench = [sys.executable, "-m", "tracebench"]
    generate = [*tracebench, "generate", "--rate", "100", "--num-requests", str(args.requests), "--length-dist",
                "lognormal", "--seed", "0", "-o", str(trace)]
    prefix_trace = workdir / "prefix.jsonl"
    generate_prefix = [*tracebench, "generate", "--workload", "shared-prompt", "--block-size", "512", "--groups",
                       "1000", "--prefix-len", "4096", "--input-len", "2800", "--max-context", "16384", "--rate",
                       "100", "--num-requests", str(args.requests), "--seed", "0", "-o", str(prefix_trace)]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    try:
        for label, gen, path, inspect_target in (
                ("plain", generate, trace, TARGET_INSPECT_S),
                ("prefix", generate_prefix, prefix_trace, TARGET_PREFIX_INSPECT_S)):
            print(f"\n[{label}] generate: {' '.join(gen[1:])}")
            generate_runs = [timed(gen)[:2] for _ in range(args.repeat)]
            size_mb = path.stat().st_size / 1e6
            inspect_runs = []
            for _ in range(args.repeat):
                elapsed, cpu, proc = timed([*tracebench, "inspect", str(path)])
                inspect_runs.append((elapsed, cpu))
            print(f"trace: {args.requests} requests, {size_mb:.1f} MB; load average before: "
                  f"{os.getloadavg()[0]:.1f}")
            generate_target = TARGET_GENERATE_S if label == "plain" else None
            for name, runs, target in (("generate", generate_runs, generate_target),
                                       ("inspect", inspect_runs, inspect_target)):
                best = min(wall for wall, _ in runs)
                verdict = "no target" if target is None else \
                    f"target < {target:.0f} s: {'OK' if best < target else 'OVER TARGET'}"
                print(f"{name:9} best {best:.2f} s ({verdict}); runs (wall / CPU s): "
                      + ", ".join(f"{wall:.2f} / {cpu:.2f}" for wall, cpu in runs)
                      + f"; {args.requests / best / 1e6:.2f} M requests/s")
            print("inspect output:")
            print(proc.stdout)
    finally:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()

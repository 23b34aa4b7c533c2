"""Peak memory of the replay's copy of a trace whose requests carry many prefix blocks (issue 20): the old way (one
TraceRequest per request, `load_trace` + a second read for the sha256) against the replay's way now
(`load_trace_table`: numpy columns + one flat array of block ids, hashed while parsed, the file read once).

    .venv/bin/python bench/bench_trace_memory.py [--requests 20000] [--block-size 16] [--keep DIR]

The trace: `tracebench generate --workload shared-prompt` with 16-token blocks (64 groups of 4,096-token system
prompts plus ~4,000-token questions: ~500 block ids a request). Each way runs in its own process; the figure is that
process's peak RSS (ru_maxrss) minus the same process's RSS before loading (the interpreter and numpy), next to the
file's size; "held" is what stays after loading (for the whole run). The "+ prefix ceiling" rows add what the
replay's start also computes from the trace (run.json trace.prefix: the prefix tree, temporary). Prints one table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURE = r"""
import json, resource, sys
import numpy  # imported by both ways: counted in the baseline
from tracebench.trace import format as f
def rss_mb():
    for line in open('/proc/self/status'):
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024
path, way = sys.argv[1], sys.argv[2]
base = rss_mb()
if way.startswith('objects'):
    header, requests = f.load_trace(path)
    sha = f.sha256_file(path)
    count = len(requests)
    if way.endswith('+prefix'):  # what the replay's start also computed (run.json trace.prefix)
        from tracebench.trace.prefix import reusable_tokens
        reusable_tokens([r.prefix_blocks for r in requests], [r.input_len for r in requests], header.block_size)
else:
    header, table, sha = f.load_trace_table(path)
    count = len(table)
    if way.endswith('+prefix'):
        from tracebench.replay.run import trace_prefix
        trace_prefix(header, table)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"requests": count, "baseline_mb": base, "peak_mb": peak, "held_mb": rss_mb() - base}))
"""


def measure(trace: Path, way: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(trace), way], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{way}: failed\n{proc.stderr}")
    return json.loads(proc.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--keep", type=Path, default=None, help="write the trace here (default: a temp folder)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-trace-memory-"))
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "prefix-blocks.jsonl"
    try:
        gen = subprocess.run(
            [sys.executable, "-m", "tracebench", "generate", "--workload", "shared-prompt", "--groups", "64",
             "--prefix-len", "4096", "--block-size", str(args.block_size), "--input-len", "4000",
             "--max-context", "16384", "--num-requests", str(args.requests), "--rate", "50", "--seed", "0",
             "-o", str(trace)],
            capture_output=True, text=True)
        if gen.returncode != 0:
            sys.exit(f"generate failed:\n{gen.stderr}")
        size_mb = trace.stat().st_size / 1e6
        print(f"trace: {args.requests} requests, {size_mb:.1f} MB ({trace})")
        print(f"{'way':<28} {'peak RSS - baseline':>20} {'x file':>8} {'held after load':>16}")
        for way, label in (("objects", "TraceRequest objects (old)"), ("table", "TraceTable (replay now)"),
                           ("objects+prefix", "old + prefix ceiling"), ("table+prefix", "now + prefix ceiling")):
            got = measure(trace, way)
            extra = got["peak_mb"] - got["baseline_mb"]
            print(f"{label:<28} {extra:>17.0f} MB {extra / size_mb:>7.1f}x {got['held_mb']:>13.0f} MB")
    finally:
        if args.keep is None:
            shutil.rmtree(folder)


if __name__ == "__main__":
    main()

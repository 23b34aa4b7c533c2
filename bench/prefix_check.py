"""Check a run's cached_tokens against its trace's prefix blocks, request by request.

For a run whose requests went one at a time to one server (no two prefills in one batch, a cache big enough to keep
everything), sglang's `cached_tokens` must equal the leading tokens of the prompt already sent before, never the
whole prompt (sglang always computes the last token): tracebench's block-to-token mapping then makes the radix cache
hit exactly as the trace says. Prints one summary line and every mismatch; exit 1 when any.

    python bench/prefix_check.py reports/RUN [--trace TRACE]   # TRACE: default run.json's trace path (relative to
                                                               # the working folder; give it when run.json says …/name)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tracebench.trace.format import load_trace
from tracebench.trace.prefix import leading_seen_tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--trace", type=Path, default=None)
    args = ap.parse_args()
    run = json.loads((args.run / "run.json").read_text())
    header, requests = load_trace(args.trace or run["trace"]["path"])
    records = {r["id"]: r for r in map(json.loads, (args.run / "requests.jsonl").read_text().splitlines())}
    order = sorted(requests, key=lambda r: records[r.id]["t_dispatch"])  # what the server saw first came first
    want = leading_seen_tokens([r.prefix_blocks for r in order], [r.input_len for r in order], header.block_size)
    mismatches = []
    for req, expected in zip(order, want.tolist()):
        got = records[req.id]["cached_tokens"]
        if got != expected:
            mismatches.append(f"request {req.id}: cached_tokens {got}, expected {expected} (input_len {req.input_len})")
    total = sum(records[r.id]["cached_tokens"] for r in order)
    print(f"{args.run}: {len(order)} requests, {total} cached tokens, {len(mismatches)} mismatches")
    for line in mismatches:
        print("  " + line)
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())

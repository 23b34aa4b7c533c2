"""What the prefix-aware policies cost and what they would reuse, on a trace with prefix blocks, without servers.

    tracebench generate --dataset traces/mooncake_synthetic_trace.jsonl --keep-timestamps -o traces/mc.jsonl
    .venv/bin/python bench/bench_policies_prefix.py traces/mc.jsonl [--servers 4] [--in-flight 32]

(Mooncake's synthetic trace: github.com/kvcache-ai/Mooncake, FAST25-release/traces/synthetic_trace.jsonl, 3,993
rows, sha256 bd070915…, downloaded into the ignored traces/; its last 1,000 rows are in the repository as
tests/data/mooncake_synthetic_trace_last1000.jsonl.)

Each policy routes the trace's requests one `assign` call each, in order, on N servers. A request stays in flight
for the next `--in-flight` decisions (a stand-in for service time, so the loads move). Printed per policy:
- microseconds per decision (the `assign` call, one request, this machine);
- reuse: prompt tokens whose leading blocks the chosen server was already sent, over all prompt tokens (what a
  server with an unbounded prefix cache could skip: an upper bound of the hit rate, for routing comparison only),
  beside the trace's ceiling with one unbounded cache;
- the largest per-server share of requests (1/N is even);
- the Python memory the policy holds at the end (tracemalloc; cache_aware: its trees).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc
from collections import deque
from pathlib import Path

import numpy as np

from tracebench.policies import UNCAPPED, QueuedRequest, ServerView
from tracebench.policies.cache_aware import BlockTree, block_tokens
from tracebench.policies.registry import load_policy
from tracebench.trace.format import load_trace


def run(spec: str, requests: list[QueuedRequest], servers: int, window: int, memory: bool = False) -> dict[str, float]:
    """Route `requests`; with `memory`, the Python memory the policy holds at the end (timings are then slower)."""
    if memory:
        tracemalloc.start()
    policy = load_policy(spec, np.random.default_rng(0), {})
    sent = [BlockTree() for _ in range(servers)]  # what each server was sent, unbounded
    in_flight, finishing = [0] * servers, deque()
    reused = total = 0
    counts = [0] * servers
    elapsed = 0.0
    for req in requests:
        views = [ServerView(i, f"s{i}", True, in_flight[i], UNCAPPED, 0.0, None, None, None, None) for i in range(servers)]
        start = time.perf_counter()
        [(_, chosen)] = policy.assign([req], views)
        elapsed += time.perf_counter() - start
        index = chosen.index
        tokens = block_tokens(req)
        reused += sent[index].match(req.prefix_blocks, tokens)  # type: ignore[arg-type]
        total += req.input_len
        sent[index].insert(req.prefix_blocks, tokens)  # type: ignore[arg-type]
        counts[index] += 1
        in_flight[index] += 1
        finishing.append(index)
        if len(finishing) > window:
            in_flight[finishing.popleft()] -= 1
    held = 0.0
    if memory:
        del sent, finishing
        gc.collect()  # tree nodes point to their parents: cycles
        held = tracemalloc.get_traced_memory()[0] / 2**20
        tracemalloc.stop()
    return {"us_per_decision": elapsed / len(requests) * 1e6, "reuse": reused / total,
            "max_share": max(counts) / len(requests), "memory_mb": held}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=32, help="a request finishes after this many more decisions")
    args = parser.parse_args()
    header, trace = load_trace(args.trace)
    requests = [QueuedRequest(r.id, r.input_len, r.output_len, r.arrival_s, r.arrival_s, r.prefix_blocks, header.block_size)
                for r in trace if r.prefix_blocks is not None]
    if not requests:
        sys.exit(f"{args.trace}: no request has prefix_blocks")
    ceiling = run("round_robin", requests, 1, args.in_flight)["reuse"]
    print(f"{len(requests)} requests with blocks (block_size {header.block_size}), {args.servers} servers, "
          f"{args.in_flight} in flight; ceiling (one unbounded cache): {ceiling:.3f}")
    print(f"{'policy':<18}{'us/decision':>12}{'reuse':>8}{'max share':>11}{'memory MB':>11}")
    for spec in ("round_robin", "least_outstanding", "prefix_hash", "cache_aware"):
        row = run(spec, requests, args.servers, args.in_flight)
        row["memory_mb"] = run(spec, requests, args.servers, args.in_flight, memory=True)["memory_mb"]
        print(f"{spec:<18}{row['us_per_decision']:>12.1f}{row['reuse']:>8.3f}{row['max_share']:>11.3f}{row['memory_mb']:>11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Which requests share a prefill step, real sglang vs the simulator's model, without replaying anything.

    .venv/bin/python bench/sim_steps.py RUN_REAL [TRACE] [--sim-profile NAME] [--top N]
    .venv/bin/python bench/sim_steps.py reports/examples/h100-sim-vs-real/routing-mooncake-round_robin \
        reports/examples/h100-sim-vs-real/mooncake-routing.jsonl.xz

Each server's completed requests of a real run go through the simulator's model (`tracebench.sim.model.simulate`, a
virtual clock) at the moments that server received them (sglang's `request_received_ts`), with the lengths it
answered and, from TRACE, the same input ids the replay sent (so the prefix cache hits as on the GPU). Nothing runs on
the wall clock, so the result does not drift with the host's load, unlike `bench/sim_vs_real.py --replay` (which
also carries the client's and the router's timing). Printed:
- the prefill steps: pairs of requests prefilled in one step (the same `forward_entry_time`, stamped once per batch:
  scheduler.py L3288 / req_time_stats.py L1232-1245) in both, only in the real run, only in the simulator, each
  differing pair with its stamps;
- received -> prefill finished (the server's part of TTFT) p50 / p99, real vs sim, and the per-request difference;
- the `--top` largest of it (what sets the p99), real vs sim.
The simulator's prefill-finished is its step's end; sglang stamps it when the scheduler has processed the step's
result (about a millisecond later). The simulator stamps forward entry at its step's start, sglang when it planned
the batch (with the overlap scheduler, while the step before still ran): compare groups, not those times.

TRACE (a trace file, or xz of one; its sha256 must be the real run's) is required when the trace has prefix blocks
(its header names a block_size); without them every prompt is unique and TRACE may be left out. The profile is the
built-in one for the run's accelerator unless --sim-profile names one.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import sys
from pathlib import Path

import numpy as np
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.report.load import COMPLETED_STATUSES, load_run  # noqa: E402
from tracebench.replay.tokens import InputIds  # noqa: E402
from tracebench.sim.catalog import profile_for_gpu  # noqa: E402
from tracebench.profiles import load_profile  # noqa: E402
from tracebench.sim.model import Limits, resolve_max_running_requests, simulate  # noqa: E402

SAME_STEP_S = 2e-5   # stamps of one batch are one perf_counter value; the run's clock conversion leaves < 1 us


def trace_blocks(path: Path, sha256: str) -> dict[int, list[int] | None]:
    """Each request's prefix_blocks from the trace the real run replayed."""
    data = path.read_bytes()
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{path}: not the trace the real run replayed (sha256 differs from its run.json)")
    lines = data.splitlines()
    return {obj["id"]: obj.get("prefix_blocks") for obj in map(orjson.loads, lines[1:]) if obj}


def step_groups(ids: list[int], stamps: list[float]) -> set[tuple[int, int]]:
    """Pairs (a < b) of requests whose forward-entry stamps are one batch's."""
    order = sorted(range(len(ids)), key=lambda i: stamps[i])
    pairs, group = set(), [order[0]] if order else []
    for prev, cur in zip(order, order[1:]):
        if stamps[cur] - stamps[prev] < SAME_STEP_S:
            group.append(cur)
            continue
        pairs |= {(min(ids[a], ids[b]), max(ids[a], ids[b])) for a in group for b in group if a != b}
        group = [cur]
    pairs |= {(min(ids[a], ids[b]), max(ids[a], ids[b])) for a in group for b in group if a != b}
    return pairs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a real run folder (tracebench replay --backend attach/launch)")
    ap.add_argument("trace", type=Path, nargs="?", help="the trace it replayed (needed when it has prefix blocks)")
    ap.add_argument("--sim-profile", help="profile name or JSON path (default: the run's accelerator's)")
    ap.add_argument("--top", type=int, default=8, help="how many of the largest received -> prefill finished to list")
    args = ap.parse_args(argv)

    run = load_run(args.run)
    meta = run.meta
    servers = meta["servers"]
    if any(s.get("simulated") for s in servers):
        raise SystemExit(f"{args.run}: a simulated run; give a real one")
    accelerators = {s["accelerator"] for s in servers}
    if args.sim_profile:
        profile = load_profile(args.sim_profile)
    elif len(accelerators) == 1:
        profile = profile_for_gpu(accelerators.pop(), "the run's accelerator")
    else:
        raise SystemExit(f"{args.run}: servers on different GPUs ({sorted(accelerators)}): name --sim-profile")
    header = meta["trace"]["header"]
    blocks: dict[int, list[int] | None] = {}
    input_ids = None
    if header.get("block_size") is not None:
        if args.trace is None:
            raise SystemExit(f"{args.run}: its trace has prefix blocks (block_size {header['block_size']}): give TRACE")
        blocks = trace_blocks(args.trace, meta["trace"]["sha256"])
        input_ids = InputIds(meta["trace"]["sha256"], int(meta["vocab_size"]), int(header["block_size"]))
    elif args.trace is not None:
        trace_blocks(args.trace, meta["trace"]["sha256"])   # at least check it is the run's

    done = run.requests.filter(run.requests["status"].is_in(list(COMPLETED_STATUSES))).sort("server_received")
    both = real_only = sim_only = 0
    differing: list[str] = []
    per_request: list[tuple[int, int, int, float, float]] = []   # id, server, input_len, real ms, sim ms
    for index in sorted(set(done["server"].to_list())):
        rows = done.filter(done["server"] == index).to_dicts()
        info = servers[index]["server_info"]
        if info["disable_overlap_schedule"] or info["page_size"] != 1:
            raise SystemExit(f"{args.run}: server {index} runs without the overlap scheduler or with page size "
                             f"{info['page_size']}: the model follows sglang's defaults only")
        limits = Limits(max_running_requests=resolve_max_running_requests(
                            info["max_running_requests"], info["max_total_num_tokens"], profile.context_length),
                        max_total_num_tokens=int(info["max_total_num_tokens"]),
                        chunked_prefill_size=int(info["chunked_prefill_size"]),
                        radix_cache=not info["disable_radix_cache"])
        workload = []
        for r in rows:
            if input_ids is None:
                workload.append((r["server_received"], r["input_len"], r["completion_tokens"]))
                continue
            b = blocks[r["id"]]
            ids = (input_ids.ids(r["id"], r["input_len"]) if b is None
                   else input_ids.block_ids(tuple(b), r["input_len"]))
            workload.append((r["server_received"], r["input_len"], r["completion_tokens"], ids.tolist()))
        outs = simulate(profile, limits, workload)
        ids_ = [r["id"] for r in rows]
        real = step_groups(ids_, [r["server_forward_entry"] for r in rows])
        sim = step_groups(ids_, [o.t_forward_entry for o in outs])
        both, real_only, sim_only = both + len(real & sim), real_only + len(real - sim), sim_only + len(sim - real)
        by_id = {r["id"]: (r, o) for r, o in zip(rows, outs)}
        for label, pairs in (("real only", real - sim), ("sim only", sim - real)):
            for a, b in sorted(pairs):
                (ra, oa), (rb, ob) = by_id[a], by_id[b]
                differing.append(
                    f"| {index} | {a}, {b} | {label} | {ra['input_len']:,} + {rb['input_len']:,} "
                    f"| {ra['cached_tokens']} / {oa.cached_tokens}, {rb['cached_tokens']} / {ob.cached_tokens} "
                    f"| {ra['server_received']:.4f}, {rb['server_received']:.4f} "
                    f"| {ra['server_forward_entry']:.4f}, {rb['server_forward_entry']:.4f} "
                    f"| {oa.t_forward_entry:.4f}, {ob.t_forward_entry:.4f} |")
        per_request += [(r["id"], index, r["input_len"], (r["server_prefill_finished"] - r["server_received"]) * 1e3,
                         (o.t_prefill_finished - r["server_received"]) * 1e3) for r, o in zip(rows, outs)]

    print(f"## {run.label}: prefill steps, real vs `{profile.name}` at the real arrival times\n")
    print(f"{len(done)} completed requests on {len(servers)} server(s); pairs prefilled in one step: {both} in both, "
          f"{real_only} only real, {sim_only} only sim\n")
    if differing:
        print("| server | ids | grouped | input | cached real / sim | received (s) | real forward entry | "
              "sim step start |\n| ---: | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(differing) + "\n")
    real_ms = np.array([p[3] for p in per_request])
    sim_ms = np.array([p[4] for p in per_request])
    diff = sim_ms - real_ms
    print("| received -> prefill finished | real ms | sim ms | sim − real |\n| --- | ---: | ---: | ---: |")
    for q in (50, 99):
        a, b = np.percentile(real_ms, q), np.percentile(sim_ms, q)
        print(f"| p{q} | {a:.1f} | {b:.1f} | {(b - a) / a * 100:+.1f}% |")
    p10, p50, p90 = np.percentile(diff, [10, 50, 90])
    print(f"\nper request, sim − real: p10 {p10:+.1f} ms, p50 {p50:+.1f} ms, p90 {p90:+.1f} ms\n")
    print(f"largest {args.top} (id, server, input: real ms / sim ms):")
    for label, key in (("real", 3), ("sim", 4)):
        top = sorted(per_request, key=lambda p: -p[key])[:args.top]
        print(f"- by {label}: " + ", ".join(f"{p[0]} (s{p[1]}, {p[2]}): {p[3]:.0f} / {p[4]:.0f}" for p in top))


if __name__ == "__main__":
    main()

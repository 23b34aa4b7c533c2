"""Issue 22, what runs beside the load, checked on a finished run folder (written or packed): the /metrics scrapes
agree with the records, the GPU samples come once a second per GPU (not in bursts: nvidia-smi writes each sample
into the pipe as it takes it) and are mapped to the launched servers, and the timeline opens as Trace Event Format.

    python bench/gpu/check_telemetry.py RUN_DIR [--expect-gpus N] [--trace-out FILE]

Prints one line per check (PASS/FAIL and the figures) and exits 1 when one failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tracebench.report import load  # noqa: E402  (reads a run folder as written or packed)
from tracebench.report.render.perfetto import render_perfetto  # noqa: E402

failed = 0


def check(ok: bool, what: str) -> None:
    global failed
    failed += not ok
    print(f"{'PASS' if ok else 'FAIL'}  {what}", flush=True)


def check_server_metrics(run: load.Run) -> None:
    meta, records = run.meta, run.requests
    info = meta.get("server_metrics")
    frame = load.read_beside(run.path, meta, "server_metrics.jsonl")
    check(frame is not None, f"server_metrics: {info}" if frame is None else
          f"server_metrics: {frame.height} rows, every {info['interval_s']} s, {info['failed']} failed")
    if frame is None:
        return
    t_end = meta["t_end"] / (run.speed or 1.0)  # the run clock, as the rows are
    for server in info["servers"]:
        i = server["server"]
        rows = frame.filter(pl.col("server") == i).sort("t")
        good = rows.filter(pl.col("error").is_null())
        expected = t_end / info["interval_s"]
        check(good.height >= 0.9 * expected, f"server {i}: {good.height} good scrapes for a {t_end:.1f} s run "
              f"(~{expected:.0f} expected), scrape time p50 {good['scrape_s'].median() * 1e3:.1f} ms, "
              f"max {good['scrape_s'].max() * 1e3:.1f} ms")
        mine = records.filter(pl.col("server") == i)
        ok = mine.filter(pl.col("status") == "ok")
        # counters over the run: the last scrape less the first (taken before any request finished), because a
        # launched sglang server has already counted its own warm-up request (3 prompt and 8 generated tokens)
        first, end = good.row(0, named=True), good.row(-1, named=True)
        last = {key: (end[key] or 0.0) - (first[key] or 0.0) for key in
                ("num_requests_total", "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total")}
        check(last["num_requests_total"] == ok.height,
              f"server {i}: sglang counted {last['num_requests_total']} finished requests, the records {ok.height} ok")
        check(last["prompt_tokens_total"] == mine["input_len"].sum(),
              f"server {i}: prompt tokens counted {last['prompt_tokens_total']}, trace {mine['input_len'].sum()}")
        counted = last["generation_tokens_total"]
        check(counted == ok["completion_tokens"].sum(),
              f"server {i}: generation tokens counted {counted}, records {ok['completion_tokens'].sum()}")
        cached = last["cached_tokens_total"]
        check(cached == (ok["cached_tokens"].sum() or 0), f"server {i}: cached tokens counted {cached}, records "
              f"{ok['cached_tokens'].sum()}")
        busy = good.filter(pl.col("num_running_reqs") > 0)
        check(busy.height > 0, f"server {i}: running requests seen in {busy.height} scrapes (max "
              f"{good['num_running_reqs'].max()}), token usage max {good['token_usage'].max()}, gen throughput max "
              f"{good['gen_throughput'].max()} tok/s")
        check(bool(server["start"]) and bool(server["end"]) and server["end_error"] is None,
              f"server {i}: whole text kept: {server['start']}, {server['end']} ({server['end_error'] or 'no error'})")


def check_gpus(run: load.Run, expect: int | None) -> None:
    info = run.meta.get("gpu_telemetry")
    frame = load.read_beside(run.path, run.meta, "gpu.jsonl")
    check(frame is not None and info.get("error") is None, f"gpu_telemetry: {json.dumps(info)[:600]}")
    if frame is None:
        return
    gpus = info["gpus"]
    print(f"      {len(gpus)} GPU(s): " + "; ".join(f"{g['index']} {g['name']} -> server {g['server']}" for g in gpus))
    if expect is not None:
        mapped = sorted(g["server"] for g in gpus if g["server"] is not None)
        check(mapped == list(range(expect)), f"GPU -> server map covers servers 0..{expect - 1}: {mapped}")
    for (gpu,), rows in frame.group_by("gpu", maintain_order=True):
        t = np.sort(rows["t"].to_numpy())
        gaps = np.diff(t)
        bursts = float(np.mean(gaps < 0.3)) if gaps.size else 1.0
        check(gaps.size > 0 and 0.9 <= float(np.median(gaps)) <= 1.1 and bursts < 0.05,
              f"GPU {gpu}: {rows.height} samples, gap p50 {np.median(gaps):.3f} s, min {gaps.min():.3f} s, "
              f"max {gaps.max():.3f} s, {bursts:.1%} under 0.3 s (bursts would mean a buffered pipe)")
        server = rows["server"][0]
        if server is not None:
            check(rows["util_pct"].max() > 0, f"GPU {gpu} (server {server}): util max {rows['util_pct'].max()}%, "
                  f"mean {rows['util_pct'].mean():.1f}%; memory used max {rows['mem_used_mib'].max()} MiB of "
                  f"{rows['mem_total_mib'].max()}; power max {rows['power_w'].max()} W")


def check_timeline(run: load.Run, out: Path | None) -> None:
    data = render_perfetto([run])
    doc = json.loads(data)
    events = doc["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    ids = {e["args"]["id"] for e in slices if e["cat"] == "request"}
    ok = set(run.requests.filter(pl.col("status") == "ok")["id"].to_list())
    check(ok <= ids and all(e["dur"] >= 0 for e in slices),
          f"timeline: {len(events)} events, {len(ids)} requests drawn ({len(ok)} ok), {len(data) / 1e6:.1f} MB")
    if out is not None:
        out.write_bytes(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--expect-gpus", type=int, default=None,
                        help="servers launched by tracebench on GPUs 0..N-1: each must be mapped to its GPU")
    parser.add_argument("--trace-out", type=Path, default=None, help="also write the Perfetto timeline there")
    args = parser.parse_args()
    run = load.load_run(args.run_dir)
    print(f"{args.run_dir}: {run.meta['status']}, t_end {run.meta['t_end']:.1f} s, {run.requests.height} records")
    check_server_metrics(run)
    check_gpus(run, args.expect_gpus)
    check_timeline(run, args.trace_out)
    print(f"{failed} check(s) failed")
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()

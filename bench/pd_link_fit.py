"""The simulator's two-figure KV link (`--kv-transfer-bandwidth` R, `--kv-transfer-latency` L) from the per-transfer
stamps of real PD runs.

    .venv/bin/python bench/pd_link_fit.py RUN_DIR...       -> JSON on stdout

Each request's transfer runs from the prefill server's `prefill_finished_time` (`prefill_done`) to the decode
server's KV arrival (its `forward_entry_time - queue_time`), its bytes input_len x 524,288 (llama-2-7b fp16). In
every run folder, in the order the prefills ended (the real transfers finish in that order: one at a time, first come
first served; checked, and refused if not):
- **back to back** (the previous transfer had not arrived when this prefill ended): the link was busy between the two
  arrivals, so R = the bytes of these transfers over the time between their arrivals (all pairs of all runs summed).
- **lone** (the link idle when the prefill ended): L = what the transfer took beyond its bytes at R, median.
A run folder without prefill stamps (sglang-router's PD mode hides the prefill answer) has no transfers to give.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import polars as pl

KV_BYTES_PER_TOKEN = 32 * 32 * 128 * 2 * 2   # llama-2-7b fp16 (.DUCUMENT/pd-disaggregation.md section 6)
GIB = 2**30


def transfers(run_dir: Path) -> list[tuple[float, float, float]]:
    """(GiB, prefill done, KV arrival) of each completed transfer of a run, in the order the prefills ended."""
    df = pl.read_parquet(run_dir / "requests.parquet").with_columns(
        arrival=pl.col("server_forward_entry") - pl.col("server_queue_time"))
    rows = df.filter(pl.col("prefill_done").is_not_null() & pl.col("arrival").is_not_null()).sort("prefill_done")
    out = [(n * KV_BYTES_PER_TOKEN / GIB, done, arr)
           for n, done, arr in rows.select("input_len", "prefill_done", "arrival").iter_rows()]
    for prev, cur in zip(out, out[1:]):
        if cur[2] < prev[2]:
            raise SystemExit(f"{run_dir}: a transfer overtook another (arrivals {prev[2]:.3f} > {cur[2]:.3f}): "
                             "not one link, first come first served; this fit does not apply")
    return out


def main(run_dirs: list[Path]) -> dict:
    busy_gib = busy_s = 0.0
    lone: list[tuple[float, float]] = []   # (GiB, seconds from prefill done to arrival)
    per_run = []
    for run_dir in run_dirs:
        rows = transfers(run_dir)
        run_gib = run_s = 0.0
        n_busy = n_lone = 0
        for i, (gib, done, arr) in enumerate(rows):
            if i > 0 and rows[i - 1][2] >= done:
                run_gib, run_s, n_busy = run_gib + gib, run_s + arr - rows[i - 1][2], n_busy + 1
            else:
                lone.append((gib, arr - done))
                n_lone += 1
        busy_gib, busy_s = busy_gib + run_gib, busy_s + run_s
        per_run.append({"run": run_dir.name, "transfers": len(rows), "back_to_back": n_busy, "lone": n_lone,
                        "gib_s_back_to_back": run_gib / run_s if run_s > 0 else None})
    if busy_s <= 0 or not lone:
        raise SystemExit("need back-to-back and lone transfers (a loaded PD run and a sequential one)")
    rate = busy_gib / busy_s
    excess_ms = [(s - gib / rate) * 1000 for gib, s in lone]
    return {"runs": per_run, "bandwidth_gib_s": rate, "latency_ms_median": statistics.median(excess_ms),
            "latency_ms_quartiles": statistics.quantiles(excess_ms, n=4), "lone_transfers": len(lone),
            "back_to_back_transfers": sum(r["back_to_back"] for r in per_run)}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    print(json.dumps(main([Path(p) for p in sys.argv[1:]]), indent=2))

"""The KV-transfer bandwidth of a PD run (bench/gpu/pd.sh stage bw): what the simulator's --kv-transfer-bandwidth
default should be.

    python3 bench/gpu/pd_bandwidth.py RUN_DIR        -> JSON on stdout

Two measures, both from the run folder of a `tracebench replay --attach-prefill/--attach-decode` run whose requests
went one at a time (so no transfer shared the link):
- sglang's own: the prefill servers' `sglang:kv_transfer_total_mb` and `sglang:kv_transfer_latency_ms` over the run
  (run.json pd.server_metrics delta): GiB/s = (MB / 1024) / (ms / 1000); and the mean of its per-transfer
  `sglang:kv_transfer_speed_gb_s`.
- tracebench's stamps, per request: KV bytes (input_len x 524,288 for llama-2-7b) over the time from the prefill
  server's prefill_finished_time to the decode server's KV arrival (its forward_entry_time - queue_time), median.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

KV_BYTES_PER_TOKEN = 32 * 32 * 128 * 2 * 2   # llama-2-7b fp16 (.DUCUMENT/pd-disaggregation.md section 6)


def main(run_dir: Path) -> dict:
    run = json.loads((run_dir / "run.json").read_text())
    pd = run.get("pd")
    if not pd:
        raise SystemExit(f"{run_dir}: not a PD run (run.json has no pd section)")
    out: dict = {"run": run_dir.name, "servers": []}
    for row in pd["server_metrics"]:
        if row["role"] != "prefill":
            continue
        delta = row.get("delta") or {}
        mb, ms, n = (delta.get(k, 0.0) for k in ("kv_transfer_total_mb_sum", "kv_transfer_latency_ms_sum",
                                                    "kv_transfer_latency_ms_count"))
        speed_sum, speed_n = delta.get("kv_transfer_speed_gb_s_sum", 0.0), delta.get("kv_transfer_speed_gb_s_count", 0.0)
        out["servers"].append({
            "server": row["server"], "transfers": int(n), "total_mb": mb, "latency_ms_sum": ms,
            "gib_s_aggregate": (mb / 1024) / (ms / 1000) if ms > 0 else None,
            "gib_s_mean_per_transfer": speed_sum / speed_n if speed_n else None,
            "mean_latency_ms": ms / n if n else None, "error": row.get("error"),
        })
    speeds = []
    with (run_dir / "requests.jsonl").open() as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["status"] not in ("ok", "mismatch"):
                continue
            done, entry, queue = rec.get("prefill_done"), rec.get("server_forward_entry"), rec.get("server_queue_time")
            if None in (done, entry, queue):
                continue
            seconds = entry - queue - done
            if seconds > 0:
                speeds.append(rec["input_len"] * KV_BYTES_PER_TOKEN / 2**30 / seconds)
    out["stamps"] = {"requests": len(speeds), "gib_s_median": statistics.median(speeds) if speeds else None,
                     "note": "prefill done -> KV at the decode server: includes the decode's poll and the status hop"}
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    print(json.dumps(main(Path(sys.argv[1])), indent=2))

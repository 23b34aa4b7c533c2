"""Trim a packed run folder (`tracebench pack --shareable`) to what the committed examples keep, for the repository's
8 MiB (tests/test_repo_size.py): run.json.xz and requests.parquet only.

    .venv/bin/python bench/trim_example_run.py RUN_DIR [RUN_DIR ...]

Dropped, and said so in run.json (`server_metrics.dropped`, `gpu_telemetry.dropped`, `trimmed`): telemetry, the
/metrics scrapes and snapshots, nvidia-smi's samples, logs; each server's `server_info` cut to the keys tracebench
and a reader of the run use (version, KV pool, scheduler limits, CUDA-graph buckets, PD role and port). Every record
of requests.parquet and run.json's `pd.server_metrics` (the PD counters' deltas) stay: `tracebench report` gives the
same tables except the load plots and the /metrics-based rows.
"""

from __future__ import annotations

import lzma
import sys
from pathlib import Path

import orjson

KEEP_FILES = {"run.json.xz", "requests.parquet"}
KEEP_INFO = ("version", "max_total_num_tokens", "max_req_input_len", "context_length", "chunked_prefill_size",
             "max_prefill_tokens", "max_running_requests", "schedule_policy", "page_size", "disable_radix_cache",
             "disable_overlap_schedule", "enable_metrics", "enable_cache_report", "attention_backend",
             "skip_tokenizer_init", "mem_fraction_static", "cuda_graph_config", "load_balance_method",
             "disaggregation_mode", "disaggregation_bootstrap_port", "disaggregation_transfer_backend",
             "tracebench_sim")
NOTE = "dropped for the repository's size (bench/trim_example_run.py)"


def trim(folder: Path) -> None:
    if not (folder / "run.json.xz").is_file() or not (folder / "requests.parquet").is_file():
        raise SystemExit(f"{folder}: not a packed run folder (run `tracebench pack --shareable` first)")
    meta = orjson.loads(lzma.decompress((folder / "run.json.xz").read_bytes()))
    for key in ("server_metrics", "gpu_telemetry"):
        if meta.get(key) and meta[key].get("file") is not None:
            meta[key] = {**meta[key], "file": None, "dropped": f"{meta[key]['file']}: {NOTE}"}
    for server in meta["servers"]:
        info = server.get("server_info")
        if info:
            server["server_info"] = {k: info[k] for k in KEEP_INFO if k in info}
    dropped = sorted(p.name for p in folder.iterdir() if p.name not in KEEP_FILES)
    meta["trimmed"] = {"files": dropped, "server_info": f"cut to {len(KEEP_INFO)} keys", "why": NOTE}
    (folder / "run.json.xz").write_bytes(lzma.compress(orjson.dumps(meta, option=orjson.OPT_INDENT_2),
                                                       preset=9 | lzma.PRESET_EXTREME))
    for name in dropped:
        (folder / name).unlink()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    for arg in sys.argv[1:]:
        trim(Path(arg))

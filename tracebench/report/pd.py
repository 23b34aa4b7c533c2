"""The PD part of the report: for a run through PD servers (run.json `pd`), TTFT split into its stages, the KV
transfers (time, bytes, bandwidth) and a per-pool, per-server table. Facts behind the split:
.DUCUMENT/pd-disaggregation.md sections 3 and 4.

The split of one request's TTFT (dispatch -> first token), from sglang's own stamps of both servers (run clock):
- prefill queue: dispatch -> the prefill server's forward entry. Its part `bootstrap` is the prefill server's
  received -> waiting queue (forward entry - queue_time): the wait for the decode server's pre-allocation;
- prefill: forward entry -> prefill_finished_time (prefill server);
- KV transfer: prefill finished -> the KV's arrival at the decode server (its forward_entry_time - queue_time: the
  decode server's waiting queue starts when the KV is in, decode.py L1943);
- decode first step: KV arrival -> the first token at the client (decode waiting queue, the prebuilt step, the
  detokenizer and the HTTP hop).
The four add up to TTFT from dispatch. A run through sglang-router's PD mode has no prefill stamps per request (the
client sees only the decode answer): its stages come from the servers' own counters (`per_stage_req_latency_seconds`,
`kv_transfer_*`) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

KV_BYTES_PER_TOKEN = 32 * 32 * 128 * 2 * 2   # llama-2-7b fp16 (.DUCUMENT/pd-disaggregation.md section 6)

# (key, label): the TTFT stages, in order
STAGES = (
    ("prefill_queue", "prefill queue (dispatch -> prefill forward)"),
    ("bootstrap", "  of which bootstrap (waiting for the decode's pre-allocation)"),
    ("prefill", "prefill (forward)"),
    ("kv_transfer", "KV transfer (prefill done -> KV at decode)"),
    ("decode_first", "decode first step (KV at decode -> first token)"),
)
# sglang's per-stage histogram stages, per role (req_time_stats.py L101-221), as the servers counted them
SERVER_STAGES = {"prefill": ("prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache"),
                 "decode": ("decode_prepare", "decode_bootstrap", "decode_transferred", "decode_waiting")}


def stage_exprs() -> dict[str, pl.Expr]:
    c = pl.col
    kv_arrival = c("server_forward_entry") - c("server_queue_time")
    return {
        "prefill_queue": c("prefill_forward_entry") - c("t_dispatch"),
        "bootstrap": (c("prefill_forward_entry") - c("prefill_queue_time")) - c("prefill_received"),
        "prefill": c("prefill_done") - c("prefill_forward_entry"),
        "kv_transfer": kv_arrival - c("prefill_done"),
        "decode_first": c("t_first_token") - kv_arrival,
    }


def is_pd(meta: dict[str, Any]) -> bool:
    return bool(meta.get("pd"))


@dataclass
class StageStats:
    key: str
    label: str
    n: int
    mean: float | None
    p50: float | None
    p90: float | None


@dataclass
class PdServerRow:
    server: int
    role: str
    url: str
    requests: int | None           # requests of the run's kept completed records it served (None: not known)
    prompt_tokens: int | None      # of those requests (prefill pool)
    kv_transfers: int | None       # the server's sglang:kv_transfer_latency_ms count over the run (prefill pool)
    kv_mib: float | None           # sglang:kv_transfer_total_mb sum
    kv_ms_mean: float | None       # mean transfer latency, ms
    kv_gib_s: float | None         # total / latency sum
    stages: dict[str, float | None]  # sglang's per-stage mean (s) over the run, by stage name
    error: str | None


@dataclass
class PdRunStats:
    ratio: str                     # "P:D"
    routing: str                   # who chose the pairs: "prefill round_robin, decode round_robin" / sglang-router ...
    stages: list[StageStats]       # empty when the records carry no prefill stamps (sglang-router)
    kv_mib_per_request: float | None
    servers: list[PdServerRow]
    link: str = "not recorded"     # the KV link: run.json pd.kv_link (simulated servers), the hardware's, or not recorded


def _stats(values: np.ndarray) -> tuple[int, float | None, float | None, float | None]:
    values = values[~np.isnan(values)]
    if values.size == 0:
        return 0, None, None, None
    p50, p90 = np.percentile(values, [50, 90])  # one partition for both
    return int(values.size), float(values.mean()), float(p50), float(p90)


def pd_stats(meta: dict[str, Any], ok: pl.DataFrame) -> PdRunStats | None:
    """The PD figures of one run (`ok`: its kept completed records), None for a run without PD servers."""
    pd = meta.get("pd")
    if not pd:
        return None
    pools = pd["pools"]
    ratio = f"{len(pools['prefill'])}:{len(pools['decode'])}"
    ext = meta.get("external_router")
    if ext:
        routing = f"sglang-router {ext.get('version')} --pd-disaggregation --policy {ext.get('policy')}"
    else:
        policies = pd["policies"]
        routing = f"prefill {policies['prefill']['name']}, decode {policies['decode']['name']}"
    stages: list[StageStats] = []
    if "prefill_done" in ok.columns and ok["prefill_done"].null_count() < ok.height:
        frame = ok.select([e.alias(k) for k, e in stage_exprs().items()]).fill_null(np.nan)
        for key, label in STAGES:
            n, mean, p50, p90 = _stats(frame[key].to_numpy().astype(float))
            stages.append(StageStats(key, label, n, mean, p50, p90))
    kv_mib = float(ok["input_len"].mean() * KV_BYTES_PER_TOKEN / 2**20) if ok.height else None
    rows: list[PdServerRow] = []
    metrics = {row["server"]: row for row in pd.get("server_metrics") or []}
    # the servers' own durations at --speed K are K times compressed (the records are converted on loading)
    k = meta.get("speed") or 1.0
    servers = meta["servers"]
    for role in ("prefill", "decode"):
        for index in pools[role]:
            column = "prefill_server" if role == "prefill" else "server"
            served = ok.select(column, "input_len").filter(pl.col(column) == index) if column in ok.columns else None
            known = served is not None and not ext
            row = metrics.get(index) or {}
            delta = row.get("delta") or {}
            n = delta.get("kv_transfer_latency_ms_count")
            mb, ms = delta.get("kv_transfer_total_mb_sum"), delta.get("kv_transfer_latency_ms_sum")
            stage_means = {}
            for stage in SERVER_STAGES[role]:
                count = delta.get(f"stage:{stage}_count")
                stage_means[stage] = delta[f"stage:{stage}_sum"] / count * k if count else None
            rows.append(PdServerRow(
                server=index, role=role, url=servers[index]["url"],
                requests=served.height if known else None,
                prompt_tokens=int(served["input_len"].sum()) if known and role == "prefill" else None,
                kv_transfers=int(n) if n is not None and role == "prefill" else None,
                kv_mib=mb if role == "prefill" else None,
                kv_ms_mean=ms / n * k if n and ms is not None and role == "prefill" else None,
                kv_gib_s=(mb / 1024) / (ms * k / 1000) if mb and ms and role == "prefill" else None,
                stages=stage_means, error=row.get("error"),
            ))
    return PdRunStats(ratio, routing, stages, kv_mib, rows, _link(meta))


def _link(meta: dict[str, Any]) -> str:
    """Which KV link the run assumed: a simulated run's pd.kv_link; real servers': their hardware's; a simulated run
    made before tracebench recorded the link: said so, not guessed."""
    pd = meta["pd"]
    if meta.get("backend") != "sim":
        return "the servers' own (real hardware)"
    if "kv_link" not in pd:
        return "not recorded (run made before run.json pd.kv_link)"
    link = pd["kv_link"]
    if link is None:
        return "not recorded"
    return (f"KV link {link['name']}: {link['bandwidth_gib_s']:g} GiB/s + {link['latency_s'] * 1000:g} ms a transfer "
            f"({link['source']})")

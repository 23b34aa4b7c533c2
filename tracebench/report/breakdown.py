"""Where a request's time went: its life cut at every stamp the record has (replay/records.py; docs/overhead.md), each
stage with whose time it is (tracebench's, sglang's, or both: the wire and each end's I/O), so a reader sees how much
of a latency is the server's.

The main stages follow one another, from the arrival to the complete record (they add up, in the mean):

    t_arrival -> t_released -> t_admitted -> t_assigned -> t_built -> t_written -> server_received
    -> server_dispatched -> server_forward_entry -> server_prefill_finished -> server_finished -> t_last_chunk
    -> t_finish -> t_parsed

and two more run beside them, on the way to the first token: server_prefill_finished -> server_first_sent ->
t_first_token. sglang's stamps are its time.time() on the run clock (same host: RunClock.from_wall); records without
them (OpenAI APIs, sglang without --enable-metrics, runs recorded before the breakdown) leave those stages out, and
the span "written -> last chunk" still shows the server and the wire as the client saw them.

t_admitted -> t_assigned is cut in two by the record's `slot_wait_s` (replay/router.py): the wait for a free slot
(no server could take the request: the run's router cap, whose wait it is) and the rest, the router's and the
policy's (tracebench's). Runs recorded before `slot_wait_s` keep the whole span as "router and policy".

t_assigned -> t_built is cut likewise by `batch_wait_s`: in static mode (--mode static) the wait in the server's forming
batch until the router sent it (the run's static batching, whose wait it is), then the request body (tracebench's).
Continuous runs record 0.0 (nothing to wait for), runs recorded before it none: "request body" is the whole span.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

OURS = "tracebench"
SGLANG = "sglang"
BOTH = "both"  # the wire and both ends' I/O: not split further by the stamps
GATE = "--max-concurrency"  # the run's own client limit: a wait it asked for
CAP = "router cap"  # the run's per-server cap at the router (or its static batches): a wait it asked for
STATIC = "static batching"  # the run's --mode static: the wait for its batch to be sent, which it asked for


@dataclass(frozen=True)
class Stage:
    key: str
    label: str
    start: str  # the record's stamp it starts at
    end: str  # and ends at
    whose: str
    what: str  # what happens there (docs/overhead.md says more)
    # the span start -> end is cut by the record's duration field `part`: "in" (this stage is that part of the
    # span) or "less" (the span without it); None: the whole span
    part: tuple[str, str] | None = None

    @property
    def expr(self) -> pl.Expr:
        return pl.col(self.end) - pl.col(self.start)

    @property
    def span(self) -> str:
        """Where it lies, as the report's tables say it."""
        whole = f"{self.start} -> {self.end}"
        if self.part is None:
            return whole
        how, field = self.part
        return f"{field} (in {whole})" if how == "in" else f"{whole} less {field}"


STAGES: tuple[Stage, ...] = (
    Stage("release_lag", "release lag", "t_arrival", "t_released", OURS,
          "the engine wakes for the arrival and releases the request into the router"),
    Stage("client_gate", "client gate", "t_released", "t_admitted", GATE,
          "held by --max-concurrency until fewer than N requests are in flight"),
    Stage("slot_wait", "wait for a free slot", "t_admitted", "t_assigned", CAP,
          "in the router queue while no server could take it: every one at its router cap (--max-running-requests, "
          "--cap-schedule, the control endpoint; static mode: running its batch) or out of routing",
          part=("in", "slot_wait_s")),
    Stage("assign", "router and policy", "t_admitted", "t_assigned", OURS,
          "the router queue while a slot was free: the loop's wake-up for the arrival or the freed slot, and the "
          "policy's assign() (and requests it chose first while a slot was free)", part=("less", "slot_wait_s")),
    Stage("batch_wait", "wait for the batch to fill", "t_assigned", "t_built", STATIC,
          "static mode: in its server's forming batch until the router sent the batch (it held --batch-size requests, "
          "--batch-timeout passed, or the trace had nothing more)", part=("in", "batch_wait_s")),
    Stage("build", "request body", "t_assigned", "t_built", OURS,
          "the request's task starts; its input ids and JSON body are made (or taken ready-made); static mode: from "
          "its batch's send, after the members sent before it", part=("less", "batch_wait_s")),
    Stage("send", "request written", "t_built", "t_written", OURS,
          "aiohttp makes the HTTP request and takes a kept-alive connection; the socket takes the headers and body "
          "(the kernel's send, which on loopback also delivers them)"),
    Stage("intake", "sglang HTTP intake", "t_written", "server_received", SGLANG,
          "sglang's HTTP server wakes, reads and parses the request (uvicorn, FastAPI, JSON, pydantic) until its "
          "tokenizer manager takes it (request_received_ts); on loopback the server may start while tracebench's send "
          "returns, so a fast server can show a slightly negative intake"),
    Stage("to_scheduler", "sglang to its scheduler", "server_received", "server_dispatched", SGLANG,
          "the tokenizer manager hands the request to the scheduler (api_server_dispatch_finish_ts)"),
    Stage("queue", "sglang queue", "server_dispatched", "server_forward_entry", SGLANG,
          "the scheduler's waiting queue, until the request's first forward pass"),
    Stage("prefill", "prefill", "server_forward_entry", "server_prefill_finished", SGLANG, "the prompt's forward passes"),
    Stage("decode", "decode", "server_prefill_finished", "server_finished", SGLANG,
          "the output tokens, until sglang's tokenizer manager has the last one (request_finished_ts)"),
    Stage("last_in", "last chunk in", "server_finished", "t_last_chunk", BOTH,
          "the answer's last data: sglang's HTTP write, the loopback hop, tracebench's read"),
    Stage("end", "end of answer", "t_last_chunk", "t_finish", BOTH,
          "the stream's data: [DONE] (sglang's last write) and the final event's parse"),
    Stage("record", "answer checked", "t_finish", "t_parsed", OURS,
          "meta_info read, the answer checked against the trace: the record is complete"),
    # beside the main line: the first token's way out
    Stage("first_out", "first token out of sglang", "server_prefill_finished", "server_first_sent", SGLANG,
          "detokenizer and tokenizer manager, until the stream's first chunk leaves (response_sent_to_client_ts)"),
    Stage("first_in", "first token in", "server_first_sent", "t_first_token", BOTH,
          "the first chunk's way: the loopback hop, tracebench's read and parse up to the first token"),
    # spans over several stages
    Stage("server_seen", "written -> last chunk", "t_written", "t_last_chunk", BOTH,
          "the server and the wire as the client saw them (also without sglang's stamps)"),
)
# tracebench's own time, per request: from the arrival until the request is on the wire (without the client gate's
# wait, the wait for a free slot and the wait for a static batch, which the run asked for), and from the answer's last
# data until the record is complete
OWN_BEFORE = Stage("own_before", "tracebench before the wire", "t_arrival", "t_written", OURS,
                   "release lag + router and policy + body + request written (the client gate's wait, the wait for "
                   "a free slot and the wait for the batch taken out)")
OWN_AFTER = Stage("own_after", "tracebench after the last chunk", "t_last_chunk", "t_parsed", OURS,
                  "end of answer + answer checked")
ALL_STAGES: tuple[Stage, ...] = (*STAGES, OWN_BEFORE, OWN_AFTER)
BY_KEY = {stage.key: stage for stage in ALL_STAGES}
STATS = ("p50", "p99", "mean")


def stage_expr(stage: Stage) -> pl.Expr:
    # runs recorded before slot_wait_s (batch_wait_s) have none: their router and policy (request body) stage still
    # holds that wait
    slot_wait = pl.col("slot_wait_s").fill_null(0.0)
    batch_wait = pl.col("batch_wait_s").fill_null(0.0)
    if stage is OWN_BEFORE:
        gate = (pl.col("t_admitted") - pl.col("t_released")).fill_null(0.0)
        return pl.col("t_written") - pl.col("t_arrival") - gate - slot_wait - batch_wait
    if stage.part is not None:
        how, field = stage.part
        return pl.col(field) if how == "in" else stage.expr - pl.col(field).fill_null(0.0)
    if stage.key == "first_out":  # not streamed, response_sent_to_client_ts is the whole answer's: no first token
        return pl.when(pl.col("t_first_token").is_not_null()).then(stage.expr)
    return stage.expr


@dataclass
class StageStats:
    key: str
    n: int  # requests with both stamps
    p50: float | None
    p99: float | None
    mean: float | None


def breakdown_stats(ok: pl.DataFrame) -> dict[str, StageStats]:
    """Each stage's statistics (seconds) over the given records (a run's kept completed ones); a column the records
    lack counts as null."""
    parts = {stage.part[1] for stage in ALL_STAGES if stage.part is not None}  # slot_wait_s, batch_wait_s
    missing = {name for stage in ALL_STAGES for name in (stage.start, stage.end, "t_admitted", "t_released", *parts)
               if name not in ok.columns}
    frame = ok.with_columns([pl.lit(None, dtype=pl.Float64).alias(name) for name in sorted(missing)])
    # a stage whose start or end stamp is null in every record has no value: not computed (a run recorded without
    # the breakdown's stamps would otherwise pay a million-row column per stage for nothing)
    stamped = {name for name in frame.columns if frame[name].null_count() < frame.height}
    measured = [stage for stage in ALL_STAGES if stage.start in stamped and stage.end in stamped
                and (stage.part is None or stage.part[0] == "less" or stage.part[1] in stamped)]
    values = frame.select([stage_expr(stage).alias(stage.key) for stage in measured])
    out = {}
    for stage in ALL_STAGES:
        v = values[stage.key].drop_nulls().to_numpy().astype(float) if stage in measured else np.empty(0)
        if v.size == 0:
            out[stage.key] = StageStats(stage.key, 0, None, None, None)
        else:
            p50, p99 = np.percentile(v, [50, 99])
            out[stage.key] = StageStats(stage.key, int(v.size), float(p50), float(p99), float(v.mean()))
    return out

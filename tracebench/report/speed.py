"""A run replayed at `--speed K`, turned into simulated seconds without multiplying the host's own time by K.

At --speed K the simulated GPUs run K times faster, but tracebench's own work (the engine's release, the router's
dispatch, the HTTP hop to the simulator and back, the event loops) takes the same real time as at speed 1.
Multiplying every run-clock time by K inflates those real overheads K times (a 0.5 ms release lag reads 2 ms at
speed 4). So each request's stamps are rebuilt on the simulated timeline, part by part:

- arrival: `K * t_arrival` (exact: the engine released the trace at `arrival_s / K`);
- release lag `t_released - t_arrival`: host time, kept as measured;
- router wait `t_dispatch - t_released`: host time when the run had no cap, no --max-concurrency and continuous
  batching (a request is dispatched at once); with a cap, the client gate or static batching it is mostly waiting
  for a slot, which is simulated time, so the dispatch is `K * t_dispatch` (the router wait from arrival x K, its
  host part of ~1 ms included: docs/report.md). Anything finer would let a request start before the slot it waited
  for was freed. `t_admitted` (it entered the router queue): as measured after the release without the client gate
  (it is the release), `K * t_admitted` with it (waiting for a slot, at least the release);
- dispatch -> the simulator's `request_received_ts`: the HTTP hop, host time, but for the simulator's modelled
  intake (its `request_hop_s` / K after the client sent the request, `tracebench_sim.request_hop_s`: simulated time);
- inside the simulator (received -> forward entry -> prefill finished -> finished): the simulator's own model
  clock, exact simulated time / K, so multiplied by K;
- the first token leaves the simulator `output_s` (its profile, in run.json `tracebench_sim.output_s`) after the
  prefill step; from then to `t_first_token`: host time; from `request_finished_ts` to `t_finish`: host time, but for
  the simulator's modelled answer's end (it sends it `answer_end_s` / K after, `tracebench_sim.answer_end_s`:
  simulated time).
- the breakdown's stamps (records.py): the client's own steps stay host time around the stamp they follow or
  precede (t_assigned and t_built before the dispatch, t_written after it; t_headers after the dispatch when the
  answer streams, before the finish when it does not; t_last_chunk before and t_parsed after the finish), the
  simulator's `api_server_dispatch_finish_ts` is its model clock (x K from the received stamp) and its
  `response_sent_to_client_ts` host time before the first token (the whole answer's, before the finish, when not
  streamed).
- the wait for a free slot (`slot_wait_s`, a part of t_admitted -> t_assigned): what the converted span holds beyond
  the rest of it, the router's and the policy's host time, kept as measured (`t_assigned - t_admitted - slot_wait_s`
  of the run clock). The slot wait is mostly waiting for a simulated request's finish (simulated time), and the two
  parts still add up to the converted span. Without a cap it stays as recorded (0, or a wait for a server to come
  back into routing: host time either way, as the span is then).
- static mode's wait for the batch (`batch_wait_s`, a part of t_assigned -> t_built): its end, the batch's send
  (`t_assigned + batch_wait_s` of the run clock), is host time before the dispatch like the body after it; the wait is
  simulated time (for later arrivals, x K, --batch-timeout, in trace seconds, or the previous batch's finish). So the
  converted span admitted -> send, less the router's host time, is the two waits together, shared between the slot
  wait and the batch wait as the run clock measured them; the converted `t_assigned` lies between them. Continuous
  runs record 0: everything above stays as it was (the slot wait is the whole rest).

A PD run (two servers per request, run.json `pd`) is converted the simple way, every time x K (its prefill side
too): the decode server's stamps depend on the prefill server's, which this per-part rebuild does not follow.

A record without the simulator's stamps (refused, timed out or cancelled before an answer) falls back to
`K * t` for the stamps that depend on them, as does every stamp of a run whose simulators did not report
`output_s` (recorded before this existed); `speed_conversion` says which applies.
"""

from __future__ import annotations

import bisect
import heapq
from typing import Any

import numpy as np
import polars as pl

from tracebench.replay.summary import modelled_hops

SERVER_SPAN = ("server_forward_entry", "server_prefill_finished", "server_finished")
BREAKDOWN_STAMPS = ("t_assigned", "t_built", "t_written", "t_headers", "t_last_chunk", "t_parsed", "server_dispatched",
                    "server_first_sent")
# a PD run's prefill side (records.py): stamps, then the two durations
PD_STAMPS = ("t_prefill_answer", "prefill_received", "prefill_forward_entry", "prefill_done", "prefill_finished")
PD_DURATIONS = ("prefill_queue_time", "prefill_e2e_latency")


def output_delays(meta: dict[str, Any]) -> list[float] | None:
    """Each server's token hand-out delay (simulated seconds) as its /server_info reported it; None if one did not."""
    delays = []
    for server in meta["servers"]:
        sim = (server.get("server_info") or {}).get("tracebench_sim")
        value = sim.get("output_s") if isinstance(sim, dict) else None
        if not isinstance(value, (int, float)):
            return None
        delays.append(float(value))
    return delays


def uncapped(meta: dict[str, Any]) -> bool:
    """No router cap at any time, no client gate (--max-concurrency; absent from runs recorded before it) and
    continuous batching: the router dispatches every request when released."""
    caps = meta["caps"]
    return (meta["mode"] == "continuous" and all(c is None for c in caps["initial"])
            and not caps["changes"] and meta.get("max_concurrency") is None)


def to_simulated_times(requests: pl.DataFrame, meta: dict[str, Any], speed: float) -> tuple[pl.DataFrame, str]:
    """The records with every time in simulated seconds (module docstring), and a line saying how."""
    c = pl.col
    k = speed
    # the simulator's own durations, and the inter-token gaps (decode steps; their histogram is scaled in metrics)
    durations = [pl.col("server_e2e_latency") * k, pl.col("server_queue_time") * k, pl.col("itl_max") * k]
    delays = output_delays(meta)
    if delays is None or meta.get("pd"):
        scaled = [c(name) * k for name in ("t_arrival", "t_released", "t_admitted", "t_dispatch", "t_first_token",
                                           "t_finish", "server_received", *SERVER_SPAN, *PD_STAMPS, *PD_DURATIONS,
                                           *BREAKDOWN_STAMPS, "slot_wait_s", "batch_wait_s")]
        why = "a PD run" if meta.get("pd") else "the simulators did not report output_s"
        return requests.with_columns(scaled + durations), (
            f"every time x{k:g} ({why}: host overheads are multiplied too)")
    host_wait = uncapped(meta)  # the router wait is host time (else: waiting for a slot, simulated time)
    arrival = c("t_arrival") * k
    released = arrival + (c("t_released") - c("t_arrival"))
    # admitted into the router queue: at the release without the client gate (host time); with it, after waiting for
    # a slot (simulated time, like a capped dispatch)
    admitted = (released + (c("t_admitted") - c("t_released")) if meta.get("max_concurrency") is None
                else pl.when(c("t_admitted").is_not_null()).then(pl.max_horizontal(released, c("t_admitted") * k)))
    intake = _intake(meta, k)
    requests, dispatch = _dispatch(requests, meta, k, host_wait, released, admitted, intake)
    received = dispatch + intake

    def inside(name: str) -> pl.Expr:  # a simulator stamp: its model clock, K times compressed
        return received + (c(name) - c("server_received")) * k

    out_delay = pl.lit(0.0)
    for i, value in enumerate(delays):  # one profile per server (usually all the same): a short when-chain
        out_delay = pl.when(c("server") == i).then(pl.lit(value)).otherwise(out_delay)
    first_visible_run = c("server_prefill_finished") + out_delay / k
    first = inside("server_prefill_finished") + out_delay + (c("t_first_token") - first_visible_run)
    finish = inside("server_finished") + _answer_end(meta, k)
    has_stamps = c("server_received").is_not_null() & c("server_finished").is_not_null()
    dispatched_k = dispatch + (c("t_first_token") - c("t_dispatch")) * k  # no simulator stamps: K x after dispatch
    finish_k = (pl.when(has_stamps).then(finish)
                .when(c("t_dispatch").is_not_null()).then(dispatch + (c("t_finish") - c("t_dispatch")) * k)
                .when(c("t_released").is_not_null() & host_wait).then(released + (c("t_finish") - c("t_released")))
                .otherwise(c("t_finish") * k))
    first_k = pl.when(has_stamps & c("server_prefill_finished").is_not_null()).then(first).otherwise(dispatched_k)
    columns = [
        arrival.alias("t_arrival"),
        released.alias("t_released"),
        admitted.alias("t_admitted"),
        dispatch.alias("t_dispatch"),
        first_k.alias("t_first_token"),
        finish_k.alias("t_finish"),
        received.alias("server_received"),
        *(inside(name).alias(name) for name in SERVER_SPAN),
        *durations,
        inside("server_dispatched").alias("server_dispatched"),
        *_breakdown_columns(admitted, dispatch, first_k, finish_k),
    ]
    how = ("simulator time x{k:g}, host time as measured (release lag, HTTP hops{wait})"
           .format(k=k, wait=", router wait" if host_wait else (
               ", the router's dispatch after the release or freed slot it waited for"
               if meta["mode"] == "continuous" else "")))
    return requests.with_columns(columns).drop("_dispatch_sim", strict=False), how


def _intake(meta: dict[str, Any], k: float) -> pl.Expr:
    """dispatch -> the simulator's receipt in simulated seconds (null without the stamp): the simulator's modelled
    intake (the part of the run-clock hop up to its request_hop_s / K, simulated time: x K) and what the host took
    beyond it (as measured). A hop below 0 (a simulator on a host whose clock is behind) holds no modelled part: as
    measured, as for a simulator that does not report request_hop_s."""
    return _modelled_hop(meta, k, "intake", pl.col("server_received") - pl.col("t_dispatch"))


def _answer_end(meta: dict[str, Any], k: float) -> pl.Expr:
    """the simulator's finish -> the client's read of the answer's end in simulated seconds, as `_intake` for the
    simulator's modelled answer's end (answer_end_s / K after request_finished_ts, simulated time: x K)."""
    return _modelled_hop(meta, k, "end", pl.col("t_finish") - pl.col("server_finished"))


def _modelled_hop(meta: dict[str, Any], k: float, part: str, hop: pl.Expr) -> pl.Expr:
    """`hop` (run clock) in simulated seconds: the part each server models (its ModelledHops `part` / K) x K, the
    rest as measured; null where `hop` is."""
    paced = pl.lit(0.0)
    for i, hops in enumerate(modelled_hops([server.get("server_info") for server in meta["servers"]])):
        paced = pl.when(pl.col("server") == i).then(pl.lit(getattr(hops, part) / k)).otherwise(paced)
    modelled = pl.min_horizontal(pl.max_horizontal(hop, pl.lit(0.0)), paced)
    # (min/max_horizontal skip nulls: a request without the stamp has no hop)
    return pl.when(hop.is_not_null()).then(hop + modelled * (k - 1.0))


def _dispatch(requests: pl.DataFrame, meta: dict[str, Any], k: float, host_wait: bool, released: pl.Expr,
              admitted: pl.Expr, intake: pl.Expr) -> tuple[pl.DataFrame, pl.Expr]:
    """The simulated dispatch (module docstring), as an expression over the records returned with it (which then may
    hold a helper column, `_dispatch_sim`, that to_simulated_times drops)."""
    c = pl.col
    if host_wait:
        return requests, released + (c("t_dispatch") - c("t_released"))
    if meta["mode"] == "continuous":
        # with a cap (or the client gate) a request is dispatched at its release or admission, or when a slot frees:
        # after the event that let it go (simulated time) by the router's own host time
        admitted_sim = requests.select(admitted.alias("v"))["v"].to_numpy()
        intake_sim = requests.select(intake.alias("v"))["v"].to_numpy()
        end_sim = requests.select(_answer_end(meta, k).alias("v"))["v"].to_numpy()
        # (never dispatched: NaN from numpy, null here, like the t_dispatch it stands for)
        requests = requests.with_columns(pl.Series("_dispatch_sim", capped_dispatch(
            requests, meta, k, admitted_sim, intake_sim, end_sim)).fill_nan(None))
        return requests, c("_dispatch_sim")
    # static batches: K x the run-clock dispatch keeps it after the finish that completed the previous batch
    return requests, c("t_dispatch") * k


def _breakdown_columns(admitted: pl.Expr, dispatch: pl.Expr, first_k: pl.Expr, finish_k: pl.Expr) -> list[pl.Expr]:
    """The breakdown's stamps and the two waits (module docstring), from the converted admission, dispatch, first
    token and finish."""
    c = pl.col
    streamed = c("t_first_token").is_not_null()

    def near(anchor: pl.Expr, anchor_stamp: str, name: str) -> pl.Expr:
        """A host-time stamp: as far from its converted anchor as it was from the anchor's own stamp."""
        return anchor + (c(name) - c(anchor_stamp))

    # static mode: the batch went at t_assigned + batch_wait_s, host time before the dispatch (0 in continuous mode:
    # at the assignment; runs recorded before batch_wait_s the same)
    batch_wait_run = c("batch_wait_s").fill_null(0.0)
    sent = dispatch + (c("t_assigned") + batch_wait_run - c("t_dispatch"))
    # the router's own host time within t_admitted -> t_assigned stays as measured; the two waits are the rest of the
    # converted span admitted -> sent (never below 0: static mode at K < 1 can shorten a span below its host part),
    # shared as the run clock measured them (each is simulated time); without a batch wait the slot wait is all of it
    router_host = c("t_assigned") - c("t_admitted") - c("slot_wait_s").fill_null(0.0)
    waits = pl.max_horizontal(sent - admitted - router_host, pl.lit(0.0))
    batch_wait = (pl.when(batch_wait_run > 0)
                  .then(waits * batch_wait_run / (c("slot_wait_s").fill_null(0.0) + batch_wait_run))
                  .otherwise(pl.lit(0.0)))
    slot_wait = waits - batch_wait
    assigned = sent - batch_wait
    return [
        assigned.alias("t_assigned"),
        near(dispatch, "t_dispatch", "t_built").alias("t_built"),
        near(dispatch, "t_dispatch", "t_written").alias("t_written"),
        pl.when(streamed).then(near(dispatch, "t_dispatch", "t_headers"))
        .otherwise(near(finish_k, "t_finish", "t_headers")).alias("t_headers"),
        near(finish_k, "t_finish", "t_last_chunk").alias("t_last_chunk"),
        near(finish_k, "t_finish", "t_parsed").alias("t_parsed"),
        pl.when(streamed).then(near(first_k, "t_first_token", "server_first_sent"))
        .otherwise(near(finish_k, "t_finish", "server_first_sent")).alias("server_first_sent"),
        pl.when(c("slot_wait_s").is_not_null()).then(slot_wait).alias("slot_wait_s"),
        pl.when(c("batch_wait_s").is_not_null()).then(batch_wait).alias("batch_wait_s"),
    ]


def capped_dispatch(requests: pl.DataFrame, meta: dict[str, Any], k: float, admitted_sim: np.ndarray,
                    intake_sim: np.ndarray, end_sim: np.ndarray) -> np.ndarray:
    """Each request's dispatch in simulated seconds, for a continuous run with caps: the router sends a request when
    it is released or when a slot frees (a request finishes, or a cap changes), at once. So the dispatch is the last
    such event before it, on the simulated timeline, plus the host time since (run clock): the release at
    K * t_arrival + release lag, a finish as that request's own converted finish (which needs its dispatch: requests
    are taken in dispatch order, and whatever finished before a dispatch was dispatched before it), a cap change at
    K * t; and its admission through the client gate (`admitted_sim`, already converted; without the gate, the
    release; `intake_sim`, dispatch -> the simulator's receipt converted, `_intake`; `end_sim`, the simulator's finish
    -> the client's read converted, `_answer_end`). The latest of the candidates, so
    the dispatch never comes before the release or admission it followed nor before the finish it waited for. K * t_dispatch instead would count the router's host time K times
    (docs/report.md)."""
    t_arr = requests["t_arrival"].to_numpy()
    t_rel = requests["t_released"].to_numpy()
    t_adm = requests["t_admitted"].to_numpy()
    t_dis = requests["t_dispatch"].to_numpy()
    t_fin = requests["t_finish"].to_numpy()
    s_rec = requests["server_received"].to_numpy()
    s_fin = requests["server_finished"].to_numpy()
    changes = sorted(float(change["t"]) for change in meta["caps"]["changes"])
    out = np.full(t_dis.shape, np.nan)
    pending: list[tuple[float, float]] = []   # (run-clock finish, simulated finish) of requests taken so far
    last_run = last_sim = -np.inf              # the latest finish at or before the current dispatch, and the latest
    #                                            simulated finish among those (dispatches come in ascending order)
    for i in np.argsort(np.where(np.isnan(t_dis), np.inf, t_dis), kind="stable"):
        d = t_dis[i]
        if np.isnan(d):
            break   # never dispatched (and everything after it in this order)
        while pending and pending[0][0] <= d:
            run, sim = heapq.heappop(pending)
            last_run, last_sim = max(last_run, run), max(last_sim, sim)
        candidates = [k * t_arr[i] + (t_rel[i] - t_arr[i]) + (d - t_rel[i])]
        if not (np.isnan(admitted_sim[i]) or np.isnan(t_adm[i])):
            candidates.append(admitted_sim[i] + (d - t_adm[i]))
        if last_run > -np.inf:
            candidates.append(last_sim + (d - last_run))
        c = bisect.bisect_right(changes, d)
        if c:
            candidates.append(k * changes[c - 1] + (d - changes[c - 1]))
        out[i] = dispatch = max(candidates)
        if not np.isnan(t_fin[i]):   # its finish (or failure) frees its slot
            if not (np.isnan(s_rec[i]) or np.isnan(s_fin[i])):
                finish = dispatch + intake_sim[i] + (s_fin[i] - s_rec[i]) * k + end_sim[i]
            else:   # no simulator stamps: K x after dispatch, like the other fallbacks
                finish = dispatch + (t_fin[i] - d) * k
            heapq.heappush(pending, (float(t_fin[i]), float(finish)))
    return out


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
- dispatch -> the simulator's `request_received_ts`: the HTTP hop, host time;
- inside the simulator (received -> forward entry -> prefill finished -> finished): the simulator's own model
  clock, exact simulated time / K, so multiplied by K;
- the first token leaves the simulator `output_s` (its profile, in run.json `tracebench_sim.output_s`) after the
  prefill step; from then to `t_first_token`, and from `request_finished_ts` to `t_finish`: host time.

A PD run (two servers per request, run.json `pd`) is converted the simple way, every time x K (its prefill side
too): the decode server's stamps depend on the prefill server's, which this per-part rebuild does not follow.

A record without the simulator's stamps (refused, timed out or cancelled before an answer) falls back to
`K * t` for the stamps that depend on them, as does every stamp of a run whose simulators did not report
`output_s` (recorded before this existed); `speed_conversion` says which applies.
"""

from __future__ import annotations

from typing import Any

import polars as pl

SERVER_SPAN = ("server_forward_entry", "server_prefill_finished", "server_finished")
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
                                           "t_finish", "server_received", *SERVER_SPAN, *PD_STAMPS, *PD_DURATIONS)]
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
    # with a cap a request is dispatched when another one's slot frees: K x its run-clock dispatch keeps it after
    # that finish on the simulated timeline too (which keeps host time out of the finish, so it only comes earlier)
    dispatch = released + (c("t_dispatch") - c("t_released")) if host_wait else c("t_dispatch") * k
    received = dispatch + (c("server_received") - c("t_dispatch"))

    def inside(name: str) -> pl.Expr:  # a simulator stamp: its model clock, K times compressed
        return received + (c(name) - c("server_received")) * k

    out_delay = pl.lit(0.0)
    for i, value in enumerate(delays):  # one profile per server (usually all the same): a short when-chain
        out_delay = pl.when(c("server") == i).then(pl.lit(value)).otherwise(out_delay)
    first_visible_run = c("server_prefill_finished") + out_delay / k
    first = inside("server_prefill_finished") + out_delay + (c("t_first_token") - first_visible_run)
    finish = inside("server_finished") + (c("t_finish") - c("server_finished"))
    has_stamps = c("server_received").is_not_null() & c("server_finished").is_not_null()
    dispatched_k = dispatch + (c("t_first_token") - c("t_dispatch")) * k  # no simulator stamps: K x after dispatch
    columns = [
        arrival.alias("t_arrival"),
        released.alias("t_released"),
        admitted.alias("t_admitted"),
        dispatch.alias("t_dispatch"),
        pl.when(has_stamps & c("server_prefill_finished").is_not_null()).then(first)
        .otherwise(dispatched_k).alias("t_first_token"),
        pl.when(has_stamps).then(finish)
        .when(c("t_dispatch").is_not_null()).then(dispatch + (c("t_finish") - c("t_dispatch")) * k)
        .when(c("t_released").is_not_null() & host_wait).then(released + (c("t_finish") - c("t_released")))
        .otherwise(c("t_finish") * k).alias("t_finish"),
        received.alias("server_received"),
        *(inside(name).alias(name) for name in SERVER_SPAN),
        *durations,
    ]
    how = ("simulator time x{k:g}, host time as measured (release lag, HTTP hops{wait})"
           .format(k=k, wait=", router wait" if host_wait else ""))
    return requests.with_columns(columns), how

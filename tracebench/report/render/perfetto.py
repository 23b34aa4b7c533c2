"""`tracebench report RUN --format perfetto`: a run's timeline as Chrome-trace JSON (the Trace Event Format), opened
in the Perfetto UI (ui.perfetto.dev: Open trace file) or chrome://tracing.

Layout, per run:
- a process per server ("<run> · server i"): each request a slice from its arrival to its finish, split into the
  parts its record's stamps allow: `router wait` (arrival → dispatch), then sglang's own `server queue` (received →
  forward entry), `prefill` (forward entry → prefill finished) and `decode` (prefill finished → finished); without
  sglang's stamps (OpenAI APIs, a server without --enable-metrics) `to first token` (dispatch → first token) and
  `decode` (first token → finish). The gaps between the parts are the HTTP hops. Records with the breakdown's
  stamps (report/breakdown.py) split the router wait into tracebench's own steps — `release lag`, `router` (queue,
  client gate and policy, and the wait for a free slot under a cap: its seconds, from `t_admitted`, are the slice's
  `slot_wait_s` arg, not a slice of their own), in static mode `wait
  for the batch` (assigned → its batch sent: `t_assigned + batch_wait_s`), `request body`, `request written` — then
  `sglang HTTP intake` (written → received),
  and end with `last chunk in` (sglang's finish → the answer's last data here). A server runs many requests at
  once, and slices on one track must nest, so a server's requests are spread over lanes (its threads: "lane k"),
  each request in the lowest lane free at its arrival;
- the requests without a server (never dispatched, or sent through sglang-router, which does not say where) in a
  process of their own;
- cap changes and server events (run.json `caps.changes`, `events`) as instant markers on the server's process
  (on every process for an event of no server);
- counters per server: in flight and the router cap (telemetry.jsonl), sglang's running and queued requests and
  its token usage (server_metrics.jsonl), the GPU's utilisation, memory and power (gpu.jsonl), where recorded; the
  router queue on the unrouted process.

Times are integer microseconds on the run clock (simulated seconds for a run at --speed K, as every figure of the
report): integers, so a part clamped into its request never ends a rounding error after it. A part whose stamps
disagree by the clock skew between sglang's time.time() and tracebench's monotonic clock is clamped into its request
and after the part before it (the record's exact stamps are in the slice's args); prefill and decode, from sglang's
own stamps, are clamped into the request only: a host part before them that runs past their start is cut there.
"""

from __future__ import annotations

import heapq
from typing import Any

import orjson
import polars as pl

from tracebench.report.load import Run, read_beside, read_telemetry, run_file

# (part, start stamp, end stamp): with sglang's stamps, and without them
SERVER_PARTS = (("server queue", "server_received", "server_forward_entry"),
                ("prefill", "server_forward_entry", "server_prefill_finished"),
                ("decode", "server_prefill_finished", "server_finished"))
EXACT_PARTS = frozenset({"prefill", "decode"})  # of SERVER_PARTS: drawn where sglang's stamps put them
CLIENT_PARTS = (("to first token", "t_dispatch", "t_first_token"), ("decode", "t_first_token", "t_finish"))
# before the dispatch, with the breakdown's stamps: tracebench's own steps
# (BATCH_SENT: t_assigned + batch_wait_s, when its static batch was sent; = t_assigned in continuous mode)
BATCH_SENT = "t_batch_sent"
OWN_PARTS = (("release lag", "t_arrival", "t_released"), ("router", "t_released", "t_assigned"),
             ("wait for the batch", "t_assigned", BATCH_SENT), ("request body", BATCH_SENT, "t_built"),
             ("request written", "t_built", "t_written"))
ARGS = ("id", "status", "input_len", "output_len", "completion_tokens", "prompt_tokens", "cached_tokens", "error",
        "t_arrival", "t_released", "t_admitted", "t_assigned", "t_built", "t_dispatch", "t_written", "t_headers",
        "t_first_token", "t_last_chunk", "t_finish", "t_parsed", "server_received", "server_dispatched",
        "server_forward_entry", "server_prefill_finished", "server_first_sent", "server_finished", "slot_wait_s",
        "batch_wait_s")


def _us(t: float) -> int:
    return round(t * 1e6)


def request_slices(rec: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(name, start µs, end µs) of one record: the request first, then its parts in order, each inside the request
    and after the part before it. Empty for a record that never reached a finish (nothing to draw)."""
    if rec["t_finish"] is None:
        return []
    start, end = _us(rec["t_arrival"]), _us(rec["t_finish"])
    end = max(end, start)
    name = f"req {rec['id']}" + ("" if rec["status"] == "ok" else f" ({rec['status']})")
    out = [(name, start, end)]
    parts: list[tuple[str, str, str]] = []
    exact: frozenset[str] = frozenset()  # parts drawn from sglang's own stamps, which win over the host parts before
    if rec["t_dispatch"] is not None:
        breakdown = rec.get("t_written") is not None
        parts.extend(OWN_PARTS if breakdown else [("router wait", "t_arrival", "t_dispatch")])
        if breakdown and rec.get("t_assigned") is not None:  # (null batch_wait_s, a run before it: none drawn)
            rec = {**rec, BATCH_SENT: rec["t_assigned"] + (rec.get("batch_wait_s") or 0.0)}
        has_server = all(rec[a] is not None and rec[b] is not None for _, a, b in SERVER_PARTS)
        if has_server and breakdown:
            parts.append(("sglang HTTP intake", "t_written", "server_received"))
        parts.extend(SERVER_PARTS if has_server else CLIENT_PARTS)
        exact = EXACT_PARTS if has_server else frozenset()
        if has_server and breakdown:
            parts.append(("last chunk in", "server_finished", "t_last_chunk"))
    else:
        parts.append(("router wait", "t_arrival", "t_finish"))  # never sent: it waited until the run let it go
    cursor = start
    for part, a, b in parts:
        if rec.get(a) is None or rec.get(b) is None:
            continue
        lo = min(max(_us(rec[a]), cursor), end)
        if part in exact:
            # prefill and decode come from the simulator's (sglang's) own stamps: a host part before them that ran
            # past their start (a loaded host stamps t_written late) is cut back to it, not they dropped (issue 33
            # item 19: on a loaded machine a request's prefill or decode was missing from its slice)
            lo = min(max(_us(rec[a]), start, out[-1][2] if out[-1][0] in exact else start), end)
            while len(out) > 1 and out[-1][0] not in exact and out[-1][1] >= lo:
                out.pop()
            if len(out) > 1 and out[-1][0] not in exact and out[-1][2] > lo:
                out[-1] = (out[-1][0], out[-1][1], lo)
        hi = min(max(_us(rec[b]), lo), end)
        if hi > lo:  # a part that took no time (not queued) is not drawn
            out.append((part, lo, hi))
            cursor = hi
    return out


def assign_lanes(spans: list[tuple[int, int]]) -> list[int]:
    """For (start, end) spans, a lane each (1, 2, ...) such that the spans of one lane do not overlap: each span in
    the lowest lane free at its start (a span ending at t frees its lane for one starting at t)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    lanes = [0] * len(spans)
    busy: list[tuple[int, int]] = []  # (end, lane)
    free: list[int] = []
    count = 0
    for i in order:
        start, end = spans[i]
        while busy and busy[0][0] <= start:
            heapq.heappush(free, heapq.heappop(busy)[1])
        if free:
            lane = heapq.heappop(free)
        else:
            count += 1
            lane = count
        lanes[i] = lane
        heapq.heappush(busy, (end, lane))
    return lanes


class _Trace:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.next_pid = 1

    def process(self, name: str) -> int:
        pid = self.next_pid
        self.next_pid += 1
        self.events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
        self.events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        return pid

    def thread(self, pid: int, tid: int, name: str) -> None:
        self.events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        self.events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}})

    def counter(self, pid: int, name: str, ts: list[int], values: dict[str, list[float | None]]) -> None:
        for k, t in enumerate(ts):
            args = {key: column[k] for key, column in values.items() if column[k] is not None}
            if args:
                self.events.append({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": t, "args": args})


def _requests(trace: _Trace, run: Run, pids: dict[int | None, int]) -> None:
    records = run.requests.select(list(ARGS) + ["server"]).to_dicts()
    by_pid: dict[int, list[tuple[list[tuple[str, int, int]], dict[str, Any]]]] = {}
    for rec in records:
        slices = request_slices(rec)
        if slices:
            by_pid.setdefault(pids[rec["server"]], []).append((slices, rec))
    for pid, items in by_pid.items():
        lanes = assign_lanes([(s[0][1], s[0][2]) for s, _ in items])
        for lane in range(1, max(lanes) + 1):
            trace.thread(pid, lane, f"lane {lane}")
        for (slices, rec), lane in zip(items, lanes):
            args = {k: rec[k] for k in ARGS if rec[k] is not None}
            for n, (name, lo, hi) in enumerate(slices):
                event = {"ph": "X", "name": name, "cat": "request" if n == 0 else "part", "pid": pid, "tid": lane,
                         "ts": lo, "dur": hi - lo}
                if n == 0:
                    event["args"] = args
                trace.events.append(event)


def _markers(trace: _Trace, run: Run, pids: dict[int | None, int]) -> None:
    every = sorted(set(pids.values()))
    for change in run.meta["caps"]["changes"]:
        server = change.get("server")
        name = f"cap {change['cap']}" + (f" ({change['source']})" if change.get("source") else "")
        for pid in ([pids[server]] if server in pids else every):
            trace.events.append({"ph": "i", "s": "p", "name": name, "cat": "cap", "pid": pid, "tid": 0,
                                 "ts": _us(change["t"]), "args": dict(change)})
    for event in run.meta["events"]:
        server = event.get("server")
        name = str(event.get("kind", "event"))
        for pid in ([pids[server]] if server in pids else every):
            trace.events.append({"ph": "i", "s": "p", "name": name, "cat": "server event", "pid": pid, "tid": 0,
                                 "ts": _us(event["t"]), "args": dict(event)})


def _columns(frame: pl.DataFrame, names: tuple[str, ...]) -> dict[str, list[Any]]:
    return {name: frame[name].to_list() for name in names}


def _counters(trace: _Trace, run: Run, pids: dict[int | None, int]) -> None:
    """The run's telemetry files as counter tracks (run clock ×speed: the requests' timeline)."""
    k = run.speed or 1.0
    folder = run.path
    if run_file(folder, "telemetry.jsonl").is_file():
        tele = read_telemetry(folder)
        for server, group in tele.group_by("server", maintain_order=True):
            pid = pids.get(server[0])
            if pid is None:
                continue
            ts = [_us(t * k) for t in group["t"]]
            trace.counter(pid, "in flight", ts, _columns(group, ("in_flight", "cap")))
        first = tele.filter(pl.col("server") == tele["server"].min())
        trace.counter(pids[None], "router queue", [_us(t * k) for t in first["t"]], _columns(first, ("router_queue",)))
    metrics = read_beside(folder, run.meta, "server_metrics.jsonl")
    if metrics is not None:
        metrics = metrics.filter(pl.col("error").is_null())
        for server, group in metrics.group_by("server", maintain_order=True):
            pid = pids[server[0]]
            ts = [_us(t * k) for t in group["t"]]
            trace.counter(pid, "sglang requests", ts, {"running": group["num_running_reqs"].to_list(),
                                                        "queued": group["num_queue_reqs"].to_list()})
            trace.counter(pid, "sglang token usage", ts, _columns(group, ("token_usage",)))
    gpus = read_beside(folder, run.meta, "gpu.jsonl")
    if gpus is not None and gpus.height:
        unmapped: int | None = None
        for gpu, group in gpus.group_by("gpu", maintain_order=True):
            server = group["server"][0]
            if server in pids and server is not None:
                pid = pids[server]
            else:
                if unmapped is None:
                    unmapped = trace.process(f"{run.label} · GPUs of this host (no server known)")
                pid = unmapped
            ts = [_us(t * k) for t in group["t"]]
            trace.counter(pid, f"GPU {gpu[0]} util %", ts, _columns(group, ("util_pct",)))
            trace.counter(pid, f"GPU {gpu[0]} memory MiB", ts, _columns(group, ("mem_used_mib",)))
            trace.counter(pid, f"GPU {gpu[0]} power W", ts, _columns(group, ("power_w",)))


def render_perfetto(runs: list[Run]) -> bytes:
    """Every run's timeline in one Trace Event Format document (JSON object form)."""
    trace = _Trace()
    for run in runs:
        pids: dict[int | None, int] = {}
        for i, server in enumerate(run.meta["servers"]):
            pids[i] = trace.process(f"{run.label} · server {i} ({server['url']})")
        unrouted = ("sent through sglang-router (server not recorded), or never sent" if run.via_router
                    else "never sent to a server")
        pids[None] = trace.process(f"{run.label} · requests {unrouted}")
        _requests(trace, run, pids)
        _markers(trace, run, pids)
        _counters(trace, run, pids)
    doc = {
        "traceEvents": trace.events,
        "displayTimeUnit": "ms",
        "otherData": {
            "generator": "tracebench report --format perfetto",
            "runs": [{"label": r.label, "path": str(r.path), "speed": r.speed,
                      "clock": "simulated seconds (run clock x speed)" if r.speed else "run clock"} for r in runs],
        },
    }
    return orjson.dumps(doc) + b"\n"

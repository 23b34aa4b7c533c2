"""The router: the queue between the engine and the servers, per-server caps, the policy, and the three timestamps.

Flow: the engine calls `release()` at each request's arrival (timestamp 1, `t_released`, stamped here); the policy
is asked for assignments when a request arrives, when a slot frees and after a cap change; each assignment starts
`_serve()`, the one coroutine per request: its sender (`flight.py`: HTTP to a server, or a direct call into an
in-process simulated server on the virtual clock) stamps `t_dispatch` (timestamp 2), `t_first_token` and `t_finish`
(timestamp 3) as the answer comes; the router reads the answer and writes the record, exactly once, when it ends.
The router never speaks HTTP and reads no clock but the run's (`clock`, real or virtual).

The wait for a free slot (a record's `slot_wait_s`, docs/overhead.md): the router knows when requests are queued and
no server can take one (`_full`: every server at its cap, running a static batch, or out of routing; a PD pair:
no free slot in a pool), from when it finds that (the policy's return that took the last slot, or a round that found
none free) until the moment a slot frees (a finish, a cap raised, a server back): that moment ends a "full spell"
(counted, and its time kept). A request's slot wait runs from its admission to the end of the last full spell before
its assignment (none ended meanwhile: 0): through the spells and through the moments between them, when a freed slot
went to a request ahead of it, the cap is what kept it waiting; after that last moment, its own assignment is the
router's time. O(1) per request, nothing per queued request, and nothing at all while the servers have free slots (a
run without a cap).

Static batching (`mode="static"`) runs through the same path: a server takes assignments only while it has nothing
in flight (its effective cap is the batch size then, 0 while its batch runs); what the policy gives an idle server
forms its next batch, sent all at once when it holds `batch_size` requests, when `batch_timeout` has passed since its
first member arrived, or when the trace has nothing more to release. Each member's record keeps how long it waited in
its forming batch (`batch_wait_s`: from its `t_assigned` until the router sent the batch, one moment for the whole
batch): the static batching the run chose, not tracebench's time (docs/overhead.md).
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import math
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from functools import partial
from itertools import islice
from typing import Any

import numpy as np

from tracebench.errors import PolicyError, RunFailed, ServerProtocolError
from tracebench.policies.base import (
    UNCAPPED, Policy, QueuedRequest, ReportedLoad, ServerView, free_slots_text, slots_left,
)
from tracebench.replay.answer_check import ContextLimits, check_answer, mismatch_reason
from tracebench.replay.client import METAINFO_READ, Answer, Fetched
from tracebench.replay.clock import RunClock, run_seconds
from tracebench.replay.flight import Sender
from tracebench.replay.gate import ConcurrencyGate
from tracebench.replay.policy_time import PolicyTime
from tracebench.replay.records import COMPLETED, STATUSES, RecordWriter, RequestRecord
from tracebench.replay.stall import StallBounds
from tracebench.replay.summary import ModelledHops, SimulatedSpan
from tracebench.trace.format import TraceRequest

OBSERVED_WINDOW_S = 10.0  # ServerView's observed figures cover this much recent run time...
OBSERVED_MAX = 256  # ...and at most this many recent completions
OBSERVED_REFRESH_S = 0.1  # recomputed at most this often (policies may be asked hundreds of times a second)
NOT_OBSERVED = (0.0, None, None, None)  # a view's observed figures when no policy of the run reads them
POLLS_FAILED_TO_SUSPECT = 2  # /v1/loads polls in a row without an answer: stop routing there, probe it
PREPARE_AFTER_S = 0.001  # the next arrival's body is made this long after the engine starts waiting (or halfway)

# meta_info stamp (time.time() on the server) -> record field on the run clock
_STAMPS = (
    ("request_received_ts", "server_received"),
    ("forward_entry_time", "server_forward_entry"),
    ("prefill_finished_time", "server_prefill_finished"),
    ("request_finished_ts", "server_finished"),
)
# meta_info stamps taken when the server sends them (the breakdown's; docs/overhead.md): sglang's HTTP server handed
# the request to its scheduler, and its first stream chunk (or its whole answer) left
_OPTIONAL_STAMPS = (
    ("api_server_dispatch_finish_ts", "server_dispatched"),
    ("response_sent_to_client_ts", "server_first_sent"),
)

_READ = {"completion_tokens", "prompt_tokens", "cached_tokens", "e2e_latency", "queue_time", "tracebench_sim_lag",
         *(key for key, _ in _STAMPS + _OPTIONAL_STAMPS)}
if not _READ <= set(METAINFO_READ):  # a sender process would drop a key read here (client.METAINFO_READ)
    raise ImportError(f"client.METAINFO_READ lacks {sorted(_READ - set(METAINFO_READ))}, which the router reads")

HealthCheck = Callable[[int], Awaitable["str | None"]]  # server index -> None if healthy, else why not
# Python 3.12+ can start a task at once (eager_start): a dispatched request runs up to its first wait (its bytes are on
# the wire by then) instead of on the loop's next turn
_EAGER = sys.version_info >= (3, 12)
_ROUND_DUE = object()  # Router._assign_handle: a round is due and the engine runs it (assign_now), not the loop


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class RecentCompletions:
    """A server's last OBSERVED_MAX completions (t_finish, latency, ttft), with the latencies and TTFTs of those that
    finished since a moment (`expire`) kept sorted as completions come and go: a ServerView's observed figures are
    read off them instead of filtering and sorting the window for every view (a virtual-clock run asks for views at
    every assignment). Exact: the same figures as filtering the last OBSERVED_MAX by t_finish >= since."""

    __slots__ = ("entries", "by_time", "live", "latencies", "ttfts", "_seq")

    def __init__(self) -> None:
        self.entries: deque[tuple[int, float, float, float | None]] = deque()  # (seq, t_finish, latency, ttft)
        self.by_time: list[tuple[float, int]] = []  # heap of (t_finish, seq) of the live ones
        self.live: dict[int, tuple[int, float, float, float | None]] = {}  # seq -> entry: last MAX, not expired
        self.latencies: list[float] = []  # sorted, of the live ones
        self.ttfts: list[float] = []  # sorted, of the live ones with a first token
        self._seq = 0

    def add(self, t_finish: float, latency: float, ttft: float | None) -> None:
        if len(self.entries) == OBSERVED_MAX:
            old = self.entries.popleft()
            if self.live.pop(old[0], None) is not None:
                self._forget(old)
        entry = (self._seq, t_finish, latency, ttft)
        self._seq += 1
        self.entries.append(entry)
        self.live[entry[0]] = entry
        heapq.heappush(self.by_time, (t_finish, entry[0]))
        bisect.insort(self.latencies, latency)
        if ttft is not None:
            bisect.insort(self.ttfts, ttft)

    def expire(self, since: float) -> None:
        """Drop the completions that finished before `since`."""
        by_time = self.by_time
        while by_time and by_time[0][0] < since:
            _, seq = heapq.heappop(by_time)
            entry = self.live.pop(seq, None)
            if entry is not None:
                self._forget(entry)

    def first_t(self) -> float:
        """t_finish of the oldest live completion in arrival order (there is one)."""
        live = self.live
        return next(e[1] for e in self.entries if e[0] in live)

    def _forget(self, entry: tuple[int, float, float, float | None]) -> None:
        del self.latencies[bisect.bisect_left(self.latencies, entry[2])]
        if entry[3] is not None:
            del self.ttfts[bisect.bisect_left(self.ttfts, entry[3])]


class ServerState:
    """The router's own state of one server. `state`: `up` (routable), `probing` (a request or a poll lost its
    connection, or polls went unanswered; nothing is routed there until the health check answers), `down` (for the
    rest of the run). `t_heard`: its last progress: a stream event or an answer from it, or a /v1/loads answer
    showing its scheduler at work (`report_load`)."""

    __slots__ = (
        "index", "url", "generate_url", "require_stamps", "launch_cap", "_state", "_cap", "_in_flight", "forming",
        "batch_seq", "batch_timer", "recent", "_reported", "reported_t", "_observed", "_observed_t", "limits", "t_heard",
        "polls_failed", "suspected_silent", "load_stamps", "wall_offset", "changed",
    )

    def __init__(self, index: int, url: str, cap: int | None, require_stamps: bool, launch_cap: int | None = None,
                 api_path: str = "/generate", limits: ContextLimits | None = None, wall_offset: float = 0.0) -> None:
        self.index = index
        # seconds its wall clock is ahead of this host's (a server on another node: replay/ray_fleet.py), taken off its
        # meta_info stamps before they are converted to the run clock
        self.wall_offset = wall_offset
        self.url = url
        self.generate_url = f"{url}{api_path}"  # the request path of the run's --api (client.Api.path)
        self.require_stamps = require_stamps  # the server runs with --enable-metrics: every stamp must be there
        self.launch_cap = launch_cap  # --max-running-requests the server was launched with (None: its default)
        # the indices of servers whose ServerView may have changed (the router's view cache, Router._views: it hands
        # every server its own set); written by the setters of what a view shows
        self.changed: set[int] = set()
        self.state = "up"
        self.cap = UNCAPPED if cap is None else cap
        self.in_flight = 0  # dispatched, not finished
        self.forming: list[RequestRecord] = []  # static mode: assigned, waiting for the batch to be sent
        self.batch_seq = 0  # static mode: number of the next batch
        self.batch_timer: asyncio.TimerHandle | None = None
        self.recent = RecentCompletions()
        self.reported = None  # last /v1/loads: (running, waiting, token usage, throughput)
        self.reported_t = 0.0
        self._observed: tuple[float, float | None, float | None, float | None] = (0.0, None, None, None)
        self._observed_t = -OBSERVED_REFRESH_S
        # sglang's context limits there (/server_info): what its answers are checked against (answer_check.py); None:
        # not known (behind sglang-router, servers whose limits differ)
        self.limits = limits
        self.t_heard = 0.0
        self.polls_failed = 0  # /v1/loads polls in a row that got no answer
        self.suspected_silent = False  # probing because it stopped answering (not because a connection was lost)
        self.load_stamps: tuple[float, ...] | None = None  # the last /v1/loads answer's snapshot timestamps

    # What a ServerView shows, as properties: a change marks the server's view stale (Router._views).
    @property
    def state(self) -> str:
        return self._state

    @state.setter
    def state(self, value: str) -> None:
        self._state = value
        self.changed.add(self.index)

    @property
    def cap(self) -> int:
        return self._cap

    @cap.setter
    def cap(self, value: int) -> None:
        self._cap = value
        self.changed.add(self.index)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @in_flight.setter
    def in_flight(self, value: int) -> None:
        self._in_flight = value
        self.changed.add(self.index)

    @property
    def reported(self) -> tuple[int, int, float, float] | None:
        return self._reported

    @reported.setter
    def reported(self, value: tuple[int, int, float, float] | None) -> None:
        self._reported = value
        self.changed.add(self.index)

    def observed(self, now: float) -> tuple[float, float | None, float | None, float | None]:
        """(completed_per_s, latency_p50, latency_p90, ttft_p50) over the recent window (cached briefly)."""
        if now - self._observed_t >= OBSERVED_REFRESH_S:
            self._observed_t = now
            recent = self.recent
            recent.expire(now - OBSERVED_WINDOW_S)
            count = len(recent.live)
            if not count:
                self._observed = (0.0, None, None, None)
            else:
                # a full window of OBSERVED_MAX may cover less time than OBSERVED_WINDOW_S: rate over the span it does
                span = now - recent.first_t() if count == OBSERVED_MAX else min(OBSERVED_WINDOW_S, now)
                latencies = recent.latencies
                ttfts = recent.ttfts
                self._observed = (
                    count / span if span > 0 else 0.0,
                    _quantile(latencies, 0.5),
                    _quantile(latencies, 0.9),
                    _quantile(ttfts, 0.5) if ttfts else None,
                )
        return self._observed


class _Flight:
    """One dispatched request until its record is written. `t_progress`: its last progress (dispatch, a stream
    event). `end_status`/`end_reason`: set when the router ends it (stalled, its server down) before cancelling it.
    `other`: a second server it occupies (a PD run's prefill server), or None; `other_done`: that server's part is
    over (the prefill answer came); `server_done`: its server's answer is whole while `other`'s is still to come."""

    __slots__ = ("rec", "server", "other", "other_done", "server_done", "task", "t_progress", "end_status",
                 "end_reason", "cancelling")

    def __init__(self, rec: RequestRecord, server: ServerState, t: float, other: ServerState | None = None) -> None:
        self.rec = rec
        self.server = server
        self.other = other
        self.other_done = False
        self.server_done = False
        self.task: asyncio.Task[None] | None = None
        self.t_progress = t
        self.end_status: str | None = None
        self.end_reason: str | None = None
        # a flight its sender took over (no task: Sender.take_over) that the router asked the sender to cancel
        self.cancelling = False

    def waits_on(self) -> ServerState:
        """The server whose progress this request waits for now: a PD pair's prefill server until its answer or the
        first token came (the decode server only waits for the KV meanwhile), and again once the decode's answer is
        whole while the prefill's is not (the pair ends with both: a prefill server stopped after handing over the KV
        was blamed on the decode server, which had nothing left to send), else its server."""
        if self.other is not None and not self.other_done and (self.rec.t_first_token is None or self.server_done):
            return self.other
        return self.server

    def uses(self, state: ServerState) -> bool:
        """It still needs `state`: its server, or its PD prefill server before that one's answer came."""
        return self.server is state or (self.other is state and not self.other_done)



def check_picks(name: str, picks: Any, queued: dict[int, Any], view_of: Callable[[Any], ServerView | None]
                ) -> set[int]:
    """The ids of what policy `name` assigned (`picks`, what its assign() returned), once every pair is checked
    against the rules of docs/policies.md: a PolicyError names the first one broken. `queued`: the queue it was
    given, by request id; `view_of(index)`: the view it was given of that server, None if none (the router's whole
    fleet, or a PD pool)."""
    if not isinstance(picks, list):
        raise PolicyError(f"policy {name}: assign() must return a list of (request, server) pairs, got {type(picks).__name__}")
    per_server: dict[int, int] = {}
    chosen: set[int] = set()
    for pair in picks:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise PolicyError(f"policy {name}: assign() returned {pair!r}, not a (request, server) pair")
        req, view = pair
        rid = getattr(req, "id", None)
        if not isinstance(rid, int) or queued.get(rid) is not req:
            raise PolicyError(f"policy {name} assigned request {rid!r}, which is not in the queue it was given")
        if rid in chosen:
            raise PolicyError(f"policy {name} assigned request {rid} twice in one call")
        chosen.add(rid)
        index = getattr(view, "index", None)
        given = view_of(index)
        if given is None:
            raise PolicyError(f"policy {name} assigned request {rid} to {view!r}, not one of the servers it was given")
        if not given.healthy:
            raise PolicyError(f"policy {name} assigned request {rid} to server {index}, which is not healthy")
        sent = per_server[index] = per_server.get(index, 0) + 1
        if sent > given.free_slots:
            raise PolicyError(f"policy {name} assigned {sent} requests to server {index}, which had "
                              f"{given.free_slots} free slot(s)")
    return chosen

class Router:
    def __init__(
        self,
        *,
        clock: RunClock,
        servers: list[ServerState],
        policy: Policy,
        sender: Sender,
        writer: RecordWriter,
        total: int,
        health_check: HealthCheck,
        modelled_hops: Sequence[ModelledHops],
        batch_size: int | None = None,
        batch_timeout: float | None = None,
        speed: float = 1.0,
        block_size: int | None = None,
        max_concurrency: int | None = None,
        stall: StallBounds | None = None,
        decode_answers: bool = False,
    ) -> None:
        """`decode_answers`: the answers are a PD decode server's (through tracebench's PD router or sglang-router's
        PD mode), whose `prefill_finished_time` is not its own (below). `batch_timeout` is in run seconds; `speed` (--speed K, 1.0 when not sped up) turns the trace's arrival
        times into run seconds (`run_seconds`); `block_size` is the trace header's (tokens per prefix block);
        `max_concurrency`: --max-concurrency N, the client's gate before the router queue (gate.py); `stall`: the
        run's stall bounds (replay/stall.py; None: the watchdog does nothing); `modelled_hops`: what each server
        models of the HTTP hops (summary.SimulatedSpan)."""
        self.clock = clock
        self.speed = speed
        self.modelled_hops = modelled_hops
        # the meta_info stamps this run's answers carry as their own: a PD decode server's prefill_finished_time is
        # one stale value in every answer (sglang 0.5.17, seen on 2x H200: .DUCUMENT/pd-disaggregation.md section 3),
        # not the request's; the prefill server's own is the record's prefill_done
        self._stamps = tuple(pair for pair in _STAMPS if not (decode_answers and pair[1] == "server_prefill_finished"))
        self.servers = servers
        self.policy = policy
        self.sender = sender
        self.writer = writer
        self.total = total
        self.static = batch_size is not None
        self.batch_size = batch_size if batch_size is not None else 0
        self.batch_timeout = batch_timeout
        self.block_size = block_size
        self._health_check = health_check
        self.stall = stall
        self._loop = asyncio.get_running_loop()
        self._init_queue(max_concurrency)
        self._init_view_cache()
        self.policy_time = PolicyTime(policy.name, in_run_time=not clock.virtual)
        # the views' report ages are made anew at every round only for a policy that reads them (_views)
        self.refresh_report_ages = policy.reads_report_age
        self._observe(policy.reads_observed)
        self._init_slot_waits()
        self._init_tallies(total)
        writer.on_failure = self.fail  # the disk is full: the run stops (records.AppendFile)
        # called with a request's id once its record is written (the engine releases closed-loop followers)
        self.on_finished: Callable[[int], None] | None = None
        self.ended = asyncio.Event()  # every record written, or the run must stop (failure set, or a stop rule met)
        if total == 0:
            self.ended.set()

    def _observe(self, read: bool) -> None:
        """Whether the run's policies read the views' observed figures (Policy.reads_observed): if not, no server
        keeps its completions for them and no view is remade for them every OBSERVED_REFRESH_S."""
        self.observed_read = read
        self._refresh_s = OBSERVED_REFRESH_S if read else math.inf  # the first round makes every view all the same

    def _init_queue(self, max_concurrency: int | None) -> None:
        """The requests between their release and their record: the client gate, the router queue, the flights."""
        self._queue: list[QueuedRequest] = []  # the router queue, oldest first (what the policy sees)
        self._queued: dict[int, QueuedRequest] = {}
        self._pending: dict[int, RequestRecord] = {}  # released, record not written yet
        # prefix blocks of the released requests that have them, until written (a static batch put back in the queue
        # needs them again)
        self._prefix_blocks: dict[int, tuple[int, ...]] = {}
        # one _serve per dispatched request -> its flight; ordered: close() cancels them (and their records are written)
        # in dispatch order, the same from run to run (a set's order follows the tasks' addresses)
        self._tasks: dict[asyncio.Task[None], _Flight] = {}
        self._flights: dict[int, _Flight] = {}  # the dispatched requests whose record is not written yet
        self._probes: dict[asyncio.Task[None], None] = {}  # ordered, as _tasks
        # a scheduled assignment round (_kick), or _ROUND_DUE: one that the engine runs itself (assign_now)
        self._assign_handle: asyncio.Handle | object | None = None
        self._engine_done = False  # nothing more will enter the router queue (every request released and admitted)
        self._all_released = False  # the engine released every request (some may still wait at the client gate)
        # --max-concurrency: requests released but not admitted wait here, before the router queue
        self.gate: ConcurrencyGate[TraceRequest] | None = None if max_concurrency is None else ConcurrencyGate(max_concurrency)
        self._closing = False
        self._cancel_reason = "cancelled"

    def _init_view_cache(self) -> None:
        """The servers' views as the last round made them (_views); every server starts stale."""
        n = len(self.servers)
        self._view_cache: list[ServerView | None] = [None] * n  # the first round makes them all (_observed_t)
        self._free_cache: list[int] = [0] * n
        self._changed_views: set[int] = set()
        self._reporting: set[int] = set()  # servers with a load report: made every round (its age)
        self._observed_t = -math.inf  # the observed figures' last refresh (all servers at once)
        for s in self.servers:
            s.changed = self._changed_views

    def _init_slot_waits(self) -> None:
        """What the slot wait of each request and the stall rule for a policy that assigns nothing are made from."""
        # since when the policy has left requests queued while servers had free slots (None: it has not)
        self._idle_since: float | None = None
        # whether requests wait at the router with no free slot now (a full spell); how many such spells have ended,
        # and when the last one did (module docstring); per queued request: the count at its admission (or its return
        # to the queue), that moment, and its slot wait before it (a static batch sent back)
        self._full = False
        self._full_spells_ended = 0
        self._last_full_end = 0.0
        self._slot_marks: dict[int, tuple[int, float, float]] = {}
        self.pending_wakeups = 0  # scheduled events to come that ask the policy again (cap schedule changes)
        # /v1/loads is polled (telemetry.poll_loads): a live server is heard even while its answers are not streamed
        self.polled = False

    def _init_tallies(self, total: int) -> None:
        """The run's counts and what run.json and the summary report of it."""
        self.span = SimulatedSpan(self.speed, self.modelled_hops)
        self.released = 0
        self.finished = 0
        self.counts = dict.fromkeys(STATUSES, 0)
        self.completed = 0  # ok + mismatch: answers that finished
        self.e2e_ok = np.empty(max(total, 1))  # t_finish - t_arrival of completed requests, in finishing order
        self.mismatch_reasons: dict[str, int] = {}  # a mismatch's reason (answer_check.py) -> how many
        self.cap_changes: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.failure: BaseException | None = None

    # ---- the engine's side -------------------------------------------------------------------------------------

    def release(self, request: TraceRequest, t_arrival: float, assign_now_after: bool = False) -> None:
        """Timestamp 1: the request enters the router queue now. `t_arrival`: its scheduled arrival on the run clock
        (`run_seconds(request.arrival_s, speed)`). `assign_now_after`: the caller (the engine) calls assign_now()
        before it gives the loop back, so no round is scheduled on the loop for this release (one it would cancel)."""
        if self._closing:
            # the engine runs on until it is cancelled after close(); close() already took this request among the
            # never-released ones and writes its record (a release now would record it twice)
            return
        t_released = self.clock.now()
        rid = request.id
        # policy_s counts from here: the policy's total so far is taken off when the record is written
        rec = self._pending[rid] = RequestRecord(rid, request.input_len, request.output_len, t_arrival, t_released,
                                                 policy_s=-self.policy_time.total)
        if request.prefix_blocks is not None:
            self._prefix_blocks[rid] = request.prefix_blocks
        self.released += 1
        if self.gate is None or self.gate.offer(request):
            self._admit(request, rec, t_released, assign_now_after)

    def prepare(self, request: TraceRequest, due: float) -> None:
        """The engine has time before `request` arrives (at `due`, run clock): its body is made meanwhile, so that its
        dispatch does not wait for it (one request ahead; `_body` takes it, or makes the body itself when this was
        another request's). Not at once: halfway to the arrival, at most PREPARE_AFTER_S from now, so the work does not
        compete with the intake of what was just sent (on a machine whose cores the servers share, it did: +0.3 ms
        from dispatch to sglang's receipt)."""
        if not self.sender.prepares_ahead:
            return
        delay = min(PREPARE_AFTER_S, (due - self.clock.now()) / 2)
        self._loop.call_later(max(delay, 0.0), self.guarded, self._make_ready, request)

    def _make_ready(self, request: TraceRequest) -> None:
        if not self._closing and request.id not in self._pending:  # not released yet (else its body is made)
            self.sender.prepare_body(request)

    def assign_now(self) -> None:
        """The engine released what was due and is about to wait: an assignment round scheduled for those releases
        runs now instead of on the loop's next turn (one hop less between a release and its dispatch)."""
        handle = self._assign_handle
        if handle is not None:
            if handle is not _ROUND_DUE:
                handle.cancel()  # type: ignore[union-attr]  # a Handle
            self.guarded(self._assign_round)

    def _admit(self, request: TraceRequest, rec: RequestRecord, t_admitted: float, assign_now_after: bool = False
               ) -> None:
        """The request enters the router queue (the policy sees it from now on)."""
        rec.t_admitted = t_admitted
        self._slot_marks[request.id] = (self._full_spells_ended, t_admitted, 0.0)  # its slot wait counts from here
        queued = QueuedRequest(request.id, request.input_len, request.output_len, rec.t_arrival, rec.t_released,  # type: ignore[arg-type]
                               request.prefix_blocks, self.block_size)
        self._queued[request.id] = queued
        self._queue.append(queued)
        self._kick(assign_now_after)

    def _gate_slot_freed(self) -> None:
        """An admitted request's record was written: the next request waiting at the client gate is admitted."""
        assert self.gate is not None
        request = self.gate.finished(admit_next=not self._closing)
        if request is None:
            return
        self._admit(request, self._pending[request.id], self.clock.now())
        if self._all_released and not self.gate.waiting:  # the last one the gate held: the trace is all in
            self._loop.call_soon(self.guarded, self._after_last_release)

    @property
    def waiting_at_client(self) -> int:
        """Released requests held by --max-concurrency's gate (not in the router queue yet)."""
        return 0 if self.gate is None else self.gate.waiting

    def engine_finished(self) -> None:
        """Every request of the trace was released: partial static batches go now, once the assignment round
        already scheduled for the last arrivals has run (call_soon keeps that order)."""
        self._all_released = True
        self._loop.call_soon(self.guarded, self._after_last_release)

    def _after_last_release(self) -> None:
        if self.gate is not None and self.gate.waiting:
            return  # some still wait at the client gate: the last one admitted calls this again
        self._engine_done = True
        if self.static:
            for server in self.servers:
                self._maybe_send_batch(server)
        self._check_ended()
        self._kick()  # the policy is asked once more: if it still assigns nothing, nothing else will ask it

    # ---- caps, health, telemetry -------------------------------------------------------------------------------

    def set_cap(self, server: int | None, cap: int, source: str) -> None:
        """Set one server's cap (or every server's, `server=None`) and record the change."""
        t = self.clock.now()
        for state in self.servers if server is None else [self.servers[server]]:
            state.cap = cap
            self.cap_changes.append({"t": t, "server": state.index, "cap": cap, "source": source})
            if state.launch_cap is not None and cap > state.launch_cap:
                self._event("cap_above_launch", state.index, f"router cap {cap} is above the --max-running-requests "
                            f"{state.launch_cap} the server was launched with: it runs at most {state.launch_cap}, "
                            "the rest wait in its own queue")
            if self.static:
                self._maybe_send_batch(state)
        self._slot_freed()
        self._kick()

    def caps(self) -> list[int | None]:
        return [None if s.cap == UNCAPPED else s.cap for s in self.servers]

    def report_load(self, server: int, load: tuple[int, int, float, float], stamps: tuple[float, ...]) -> None:
        """What the server reported (/v1/loads): num_running_reqs, num_waiting_reqs, token_usage, gen_throughput, and
        its snapshots' `timestamp`s. The answer is the server's progress (`t_heard`) only when a snapshot is new:
        sglang's scheduler rewrites it after every prefill batch, every 15 decode steps and every idle pass of its
        loop (scheduler.py L776-787, L3819, L3925-3962 of 0.5.17); the HTTP side answers from shared memory even
        when the scheduler hangs, with the same snapshot again."""
        state = self.servers[server]
        state.reported = load
        state.reported_t = now = self.clock.now()
        state.polls_failed = 0
        if stamps != state.load_stamps:
            state.load_stamps = stamps
            state.t_heard = now

    def poll_failed(self, server: int, got: Fetched) -> None:
        """A /v1/loads poll got no good answer. A lost connection is probed at once; polls that got no answer at all
        are counted, and POLLS_FAILED_TO_SUSPECT of them in a row stop routing there until the probe answers (a
        hung server keeps its connections open and answers nothing)."""
        state = self.servers[server]
        if got.connection_lost:
            self.suspect(server, f"/v1/loads: {got.error}")
        elif got.timed_out:
            state.polls_failed += 1
            if state.polls_failed >= POLLS_FAILED_TO_SUSPECT:
                self.suspect(server, f"/v1/loads: no answer to {state.polls_failed} polls in a row ({got.error})",
                             silent=True)
        # else it answered, with an error status: it is there (not suspected), but that shows no work (no t_heard)

    def suspect(self, server: int, why: str, silent: bool = False) -> None:
        """The server could not be reached (`silent`: it stopped answering): route nothing there until the health
        check says whether it is up."""
        state = self.servers[server]
        if state.state != "up" or self._closing:
            return
        state.state = "probing"
        state.suspected_silent = silent
        task = self._loop.create_task(self._probe(state, why))
        self._probes[task] = None
        task.add_done_callback(self._task_done)

    async def _probe(self, state: ServerState, why: str) -> None:
        reason = await self._health_check(state.index)
        if state.state == "down":  # the watchdog found it stalled meanwhile
            return
        if reason is None:
            state.state = "up"
            self._slot_freed()
            self._kick()
            return
        # what is still in flight there will never be answered: timed out when it stopped answering, else an error
        if state.suspected_silent:
            detail = f"stalled: {why}; then {reason}"
            self._mark_down(state, detail, "timeout", f"server {state.index} {detail}")
        else:
            self._mark_down(state, f"{why}; then {reason}", "error")

    def _mark_down(self, state: ServerState, detail: str, in_flight_status: str, in_flight_error: str | None = None) -> None:
        """The server is out for the rest of the run (event `server_down` with `detail`): its requests still in
        flight end with `in_flight_status` (error: `in_flight_error`, else "server i is down: <detail>"), an unsent
        static batch goes back to the queue."""
        state.state = "down"
        self._event("server_down", state.index, detail)
        for flight in list(self._flights.values()):
            if flight.uses(state):  # a PD pair whose prefill answer came needs only its decode server
                self._end_flight(flight, in_flight_status, in_flight_error or f"server {state.index} is down: {detail}")
        if state.forming:  # an unsent static batch goes back to the queue, in arrival order
            now = self.clock.now()
            for rec in state.forming:
                queued = QueuedRequest(rec.id, rec.input_len, rec.output_len, rec.t_arrival, rec.t_released,
                                       self._prefix_blocks.get(rec.id), self.block_size)
                self._queued[rec.id] = queued
                self._queue.append(queued)
                rec.batch = None
                # queued again: assigned anew later (its slot wait goes on from here, added to what it had), or never
                self._slot_marks[rec.id] = (self._full_spells_ended, now, rec.slot_wait_s)  # type: ignore[arg-type]
                rec.t_assigned = rec.slot_wait_s = None
            state.forming = []
            self._queue.sort(key=lambda q: (q.t_released, q.id))
        gone = self._none_left()
        if gone is not None:
            self.fail(RunFailed(f"{gone} (the last: server {state.index}, {state.url}: {detail})"))
        else:
            self._kick()

    def _none_left(self) -> str | None:
        """Why no request can be served any more (a server down: PdRouter, a whole pool), or None."""
        return "every server is down" if all(s.state == "down" for s in self.servers) else None

    def _event(self, kind: str, server: int | None, detail: str) -> None:
        self.events.append({"t": self.clock.now(), "kind": kind, "server": server, "detail": detail})

    # ---- progress figures --------------------------------------------------------------------------------------

    @property
    def queued(self) -> int:
        return len(self._queue) + sum(len(s.forming) for s in self.servers)

    @property
    def in_flight(self) -> int:
        return sum(s.in_flight for s in self.servers)

    # ---- assignment --------------------------------------------------------------------------------------------

    def _kick(self, assign_now_after: bool = False) -> None:
        # Coalesced: a burst of arrivals or completions in one loop iteration makes one call to the policy. None while
        # nothing is queued (a finish with an empty queue, most of them): a round would find nothing to do (and the
        # queue emptied only by a round that assigned, which cleared _idle_since). `assign_now_after`: the engine runs
        # the round itself (release)
        if self._assign_handle is None and not self._closing and self._queue:
            self._assign_handle = _ROUND_DUE if assign_now_after else self._loop.call_soon(self.guarded, self._assign_round)

    def _load(self, s: ServerState) -> tuple[int, int]:
        """(in flight, cap) of a server as the policy sees them: in static mode a forming batch counts in flight, and
        a server whose batch is out takes nothing."""
        if self.static:
            return s.in_flight + len(s.forming), (0 if s.in_flight else min(self.batch_size, s.cap))
        return s.in_flight, s.cap

    def _view(self, s: ServerState, now: float) -> ServerView:
        make = tuple.__new__  # the named tuples' own constructors, without their keyword handling (as _views)
        rate, p50, p90, ttft = s.observed(now) if self.observed_read else NOT_OBSERVED
        rep = s._reported
        reported = None if rep is None else make(ReportedLoad, (rep[0], rep[1], rep[2], rep[3], now - s.reported_t))
        in_flight, cap = self._load(s) if self.static else (s._in_flight, s._cap)
        return make(ServerView, (s.index, s.url, s._state == "up", in_flight, cap, rate, p50, p90, ttft, reported))

    def _views(self, now: float) -> tuple[list[ServerView], list[int]]:
        """Every server's view for the policy, and each one's free slots. Made again only where it can differ from
        the last round's (a fleet of 1,024 servers asked once per arrival spent most of its time here): a server whose
        state, cap, in-flight count or report changed (ServerState's setters mark it), a server with a load report
        (its age) unless no policy of the run reads the age (Policy.reads_report_age), and every server once per
        OBSERVED_REFRESH_S unless no policy of the run reads the observed figures (Policy.reads_observed; they are
        refreshed together, as before: this is their only reader).
        Static mode makes them all (a forming batch changes in place)."""
        cache, free, servers, changed = self._view_cache, self._free_cache, self.servers, self._changed_views
        if self.static or now - self._observed_t >= self._refresh_s:
            self._observed_t = now
            stale: Iterable[int] = range(len(servers))
        else:
            stale = changed
            if self.refresh_report_ages:
                make = tuple.__new__  # the named tuples' own constructors, without their keyword handling
                for i in self._reporting.difference(changed):  # only its report's age differs from the last round's
                    s = servers[i]
                    age = (now - s.reported_t,)
                    cache[i] = make(ServerView, cache[i][:9] + (make(ReportedLoad, s._reported + age),))  # type: ignore
        for i in stale:
            s = servers[i]
            view = cache[i] = self._view(s, now)
            free[i] = view.free_slots
            if s._reported is not None:
                self._reporting.add(i)
        changed.clear()
        # the views copied: a policy may reorder the list it is given; `free` is the router's alone
        return list(cache), free  # type: ignore[arg-type]  # all made by the first round

    def _free_slots(self) -> list[int]:
        """Each server's free slots now, as its ServerView's `free_slots` would say (without making the views)."""
        out = []
        for s in self.servers:
            in_flight, cap = self._load(s)
            out.append(slots_left(cap, in_flight, s.state == "up"))
        return out

    # ---- the wait for a free slot (module docstring) -------------------------------------------------------

    def _end_full_spell(self, now: float) -> None:
        """A slot is free at `now` after a full spell: the spell ends (module docstring)."""
        self._full = False
        self._full_spells_ended += 1
        self._last_full_end = now

    def _slot_freed(self) -> None:
        """Something may have freed a slot (a request finished, a cap rose, a server is routable again): the full
        spell ends now if one is free. Costs nothing unless requests are waiting for one."""
        if self._full and self._can_assign(self._free_slots()):
            self._end_full_spell(self.clock.now())

    def _assigned(self, rec: RequestRecord, t_assigned: float) -> None:
        """The policy assigned `rec` (its assign() returned at `t_assigned`): its slot wait is complete, up to the end
        of the last full spell since it was queued. Continuous mode sends it now (no batch to wait for: 0.0); static
        mode, when its batch goes (_maybe_send_batch)."""
        rec.t_assigned = t_assigned
        spells, t_queued, before = self._slot_marks.pop(rec.id)
        rec.slot_wait_s = before + (self._last_full_end - t_queued if self._full_spells_ended > spells else 0.0)
        if not self.static:
            rec.batch_wait_s = 0.0

    def guarded(self, callback: Callable[..., None], *args: Any) -> None:
        """Runs a loop callback. A callback has no caller to raise to: an error in one stops the run."""
        try:
            callback(*args)
        except Exception as err:
            self.fail(err)

    def _assign_round(self) -> None:
        """One assignment round (coalesced by `_kick`), and the rule that a policy which assigns nothing cannot hang
        the run: a PolicyError naming it at once when nothing can ask it again, else after the stall bound (watch).
        What is asked, and how, is `_can_assign` and `_ask` (PdRouter: a policy per pool)."""
        self._assign_handle = None
        if self._closing:
            return
        if not self._queue:
            self._idle_since = None
            return
        now = self.clock.now()
        views, free = self._views(now)
        if not self._can_assign(free):
            self._idle_since = None
            self._full = True  # requests wait, no slot is free: a full spell (goes on, or starts)
            return  # nothing can be assigned: the policy is not asked
        if self._full:  # a slot freed by a path _slot_freed did not see: the spell ends here
            self._end_full_spell(now)
        t_assigned = self._ask(now, views)
        self.sender.flush()  # what the round handed to sender processes goes now, in one write per process
        if t_assigned is not None:
            self._idle_since = None
            if self._queue and not self._can_assign(self._free_slots()):
                self._full = True  # the picks took the last free slots: the rest wait from then
            return
        if self._idle_since is None:
            self._idle_since = now
        if self._nothing_can_ask_again():
            raise PolicyError(
                f"{self._policy_label()} assigned nothing while {len(self._queue)} request(s) waited at the router "
                f"and servers had {self._free_text(views)}, and nothing can ask it again (nothing in flight, no "
                "arrival to come): the run cannot go on")

    def _can_assign(self, free: list[int]) -> bool:
        """Some assignment is possible: a server has a free slot (`free`: each server's free slots, by index). A
        request can go to any routable server, so while this is false every queued request waits for a slot."""
        return any(free)

    def _ask(self, now: float, views: list[ServerView]) -> float | None:
        """Ask the policy (timed) and carry out what it assigned: when its assign() returned, or None if it assigned
        nothing."""
        self.policy.now = now
        picks = self.policy_time.call("assign", self.policy.assign, self._queue, views)
        t_assigned = self.clock.now()
        self._apply(picks, views, t_assigned)
        return t_assigned if picks else None

    def _policy_label(self) -> str:
        """The policy as error messages name it."""
        return f"policy {self.policy.name!r}"

    def _free_text(self, views: list[ServerView]) -> str:
        return free_slots_text(views)

    def _nothing_can_ask_again(self) -> bool:
        """No event is left that would call the policy again: every request released, none in flight, no probe,
        no static batch waiting, no scheduled cap change."""
        return (self._engine_done and not self._flights and not self._probes and self.pending_wakeups == 0
                and not any(s.in_flight or s.forming or s.batch_timer is not None for s in self.servers))

    def _apply(self, picks: Any, views: list[ServerView], t_assigned: float) -> None:
        """Check every assignment against the rules (all or nothing), then carry them out (`t_assigned`: when the
        policy returned them)."""
        count = len(views)  # views[i] is server i's
        chosen = check_picks(repr(self.policy.name), picks, self._queued,
                             lambda i: views[i] if isinstance(i, int) and 0 <= i < count else None)
        if not chosen:
            return
        queue, count = self._queue, len(picks)
        if queue[0].id in chosen if count == 1 else all(q.id in chosen for q in islice(queue, count)):
            del queue[:count]  # the common case: the oldest went
        else:
            self._queue = [q for q in queue if q.id not in chosen]
        touched = set()
        for req, view in picks:
            del self._queued[req.id]
            server = self.servers[view.index]
            rec = self._pending[req.id]
            self._assigned(rec, t_assigned)
            if self.static:
                server.forming.append(rec)
                touched.add(server.index)
            else:
                self._dispatch(rec, server)
        for index in touched:
            self._maybe_send_batch(self.servers[index])
        self._send_batches_gate_blocks()

    def _gate_blocks_batches(self) -> bool:
        """Static mode under --max-concurrency: every admitted request waits in a forming batch or the router queue,
        nothing is in flight, and the gate admits no one until something finishes: no batch can grow any more."""
        return self.gate is not None and self.gate.full and self.in_flight == 0

    def _send_batches_gate_blocks(self) -> None:
        if self.static and self._gate_blocks_batches():
            for server in self.servers:
                self._maybe_send_batch(server)

    def _maybe_send_batch(self, server: ServerState) -> None:
        """Static mode: send the server's forming batch if it is idle and the batch is full, timed out, or last."""
        if not server.forming or server.in_flight:
            return
        now = self.clock.now()
        # a batch's clock starts when its first request reached the router (admitted: released, without a gate)
        deadline = None if self.batch_timeout is None else server.forming[0].t_admitted + self.batch_timeout  # type: ignore[operator]
        full = len(server.forming) >= min(self.batch_size, server.cap)
        if full or self._engine_done or self._gate_blocks_batches() or (deadline is not None and now >= deadline):
            if server.batch_timer is not None:
                server.batch_timer.cancel()
                server.batch_timer = None
            batch, server.forming = server.forming, []
            for rec in batch:
                rec.batch = server.batch_seq
                # one send moment for the whole batch: each member's wait for it ends now (the members sent before
                # it in this loop are its request body's time, tracebench's)
                rec.batch_wait_s = now - rec.t_assigned  # type: ignore[operator]
                self._dispatch(rec, server)
            server.batch_seq += 1
        elif deadline is not None and server.batch_timer is None:
            server.batch_timer = self._loop.call_later(deadline - now, self.guarded, self._batch_deadline, server)

    def _batch_deadline(self, server: ServerState) -> None:
        server.batch_timer = None
        self._maybe_send_batch(server)

    # ---- one request: the three timestamps ---------------------------------------------------------------------

    def _dispatch(self, rec: RequestRecord, server: ServerState) -> None:
        take_over = self.sender.take_over
        if take_over is None:
            self._launch(rec, server, partial(self._serve, rec, server))
            return
        # the sender carries the whole flight and calls back once, when it ended (no task, no coroutine of the
        # router's per request: senders.ProcessSender with every request handed over)
        flight = self._new_flight(rec, server, None)
        rec.server = server.index
        try:
            take_over(rec, server, flight, self._prefix_blocks.get(rec.id), partial(self._flight_ended, flight))
        except Exception as err:  # no sender left to take it (SenderDied): recorded, and the run stops with it
            self._flight_ended(flight, None, err)

    def _flight_ended(self, flight: _Flight, answer: Answer | None, err: BaseException | None) -> None:
        """A flight the sender took over ended: `answer` (None: the sender cancelled it, as the router asked), or
        `err` (its sender died, a broken answer). Read and recorded as `_serve` does for a task's."""
        rec, server = flight.rec, flight.server
        failure: BaseException | None = None
        try:
            if err is not None:
                raise err
            if flight.cancelling:  # the router ended it: recorded as the router ended it, whatever came meanwhile
                if rec.t_finish is None:
                    rec.t_finish = self.clock.now()
                self._ended_by_router(rec, flight)
            elif answer is None:
                raise RunFailed(f"the sender cancelled request {rec.id}, which the router had not cancelled")
            else:
                self._take_answer(rec, server, answer)
                if rec.status == "ok":
                    self._check_answer(rec, server)
                rec.t_parsed = self.clock.now()
        except Exception as error:  # recorded; the run stops on anything but a measurement
            if rec.t_finish is None:
                rec.t_finish = self.clock.now()
            rec.status, rec.error = "error", f"{type(error).__name__}: {error}"
            failure = error
        finally:
            self._finish(rec, server)
        if failure is not None:
            self.fail(failure)

    def _new_flight(self, rec: RequestRecord, server: ServerState, other: ServerState | None) -> _Flight:
        """One dispatched request as a flight (what the watchdog sees): `server` (and `other`, a second server it
        occupies) count it in flight from now."""
        now = self.clock.now()
        for state in (server, other):
            if state is not None and not state.in_flight:  # an idle server's silence counts from its first request
                state.t_heard = max(state.t_heard, now)
        server.in_flight += 1
        flight = _Flight(rec, server, now, other)
        self._flights[rec.id] = flight
        return flight

    def _launch(self, rec: RequestRecord, server: ServerState, serve: Callable[[_Flight], Coroutine[Any, Any, None]],
                other: ServerState | None = None) -> None:
        """Start one dispatched request as a flight with a task: `serve(flight)` sends it and ends in `_finish`."""
        flight = self._new_flight(rec, server, other)
        if _EAGER:
            flight.task = task = asyncio.Task(serve(flight), loop=self._loop, eager_start=True)
        else:
            flight.task = task = self._loop.create_task(serve(flight))
        self._tasks[task] = flight
        task.add_done_callback(self._serve_done)

    async def _serve(self, rec: RequestRecord, server: ServerState, flight: _Flight) -> None:
        """One request: the sender carries it and stamps its moments (flight.py); its answer is read here and its
        record written (`_finish`), however it ends."""
        now = self.clock.now
        rec.server = server.index
        try:
            answer = await self._carry(rec, server, flight)
            self._take_answer(rec, server, answer)
            if rec.status == "ok":
                self._check_answer(rec, server)
            rec.t_parsed = now()
        except BaseException as err:  # recorded, then re-raised: the run stops on anything but a measurement
            if rec.t_finish is None:
                rec.t_finish = now()
            if isinstance(err, asyncio.CancelledError):
                self._ended_by_router(rec, flight)
            else:
                rec.status, rec.error = "error", f"{type(err).__name__}: {err}"
            raise
        finally:
            self._finish(rec, server)

    def _carry(self, rec: RequestRecord, server: ServerState, flight: _Flight) -> Awaitable[Answer]:
        """The sender's exchange (the awaitable itself: no frame of its own on the hot path); a PD router carries a
        pair (pd_router.py)."""
        return self.sender.exchange(rec, server, flight, self._prefix_blocks.get(rec.id), self.clock.now)

    def _ended_by_router(self, rec: RequestRecord, flight: _Flight) -> None:
        """The status of a request whose task the router cancelled: what `_end_flight` said (stalled, its server
        down), else the run stopped (`cancelled`); `not_sent` if it never went out (no server then, however far its
        flight got: a task cancelled before its first step had set none, a sender's take-over had)."""
        if rec.t_dispatch is None:
            rec.status, rec.error = "not_sent", f"not sent: {flight.end_reason or self._cancel_reason}"
            rec.server = None
        elif flight.end_status is not None:
            rec.status, rec.error = flight.end_status, flight.end_reason  # type: ignore[assignment]
        else:
            rec.status, rec.error = "cancelled", self._cancel_reason

    def _end_flight(self, flight: _Flight, status: str, reason: str) -> None:
        """End one request in flight now, recorded with `status` and `reason` (its task is cancelled; a flight its
        sender took over: the sender is asked to cancel it, and calls back when it did)."""
        if flight.end_status is not None or flight.rec.id not in self._flights:
            return
        if flight.task is None:
            flight.end_status, flight.end_reason = status, reason
            self._cancel_taken(flight)
        elif not flight.task.done():
            flight.end_status, flight.end_reason = status, reason
            flight.task.cancel()

    def _cancel_taken(self, flight: _Flight) -> None:
        if not flight.cancelling:
            flight.cancelling = True
            self.sender.cancel(flight.rec.id)  # type: ignore[attr-defined]  # a sender with take_over has cancel

    def _serve_done(self, task: asyncio.Task[None]) -> None:
        flight = self._tasks.pop(task)
        if flight.rec.id in self._flights:  # cancelled before it ever ran: _serve never wrote its record
            self._ended_by_router(flight.rec, flight)
            self._finish(flight.rec, flight.server)
        elif not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    def _take_answer(self, rec: RequestRecord, server: ServerState, answer: Answer) -> None:
        rec.status = answer.status
        rec.error = answer.error
        if answer.status != "ok":
            if answer.connection_lost:
                self.suspect(server.index, f"request {rec.id}: {answer.error}")
            return
        meta = answer.meta
        assert meta is not None
        url = server.generate_url
        # /generate's meta_info always has cached_tokens; OpenAI answers only with sglang's --enable-cache-report
        required = ("completion_tokens", "prompt_tokens", "cached_tokens") if self.sender.api.server_meta else (
            "completion_tokens", "prompt_tokens")
        for key in required:
            value = meta.get(key)
            if not isinstance(value, int):
                raise ServerProtocolError(f"{url}: meta_info.{key} missing or not an integer ({value!r}), request {rec.id}")
        rec.completion_tokens = meta["completion_tokens"]
        rec.prompt_tokens = meta["prompt_tokens"]
        cached = meta.get("cached_tokens")
        if cached is not None and not isinstance(cached, int):
            raise ServerProtocolError(f"{url}: cached_tokens not an integer ({cached!r}), request {rec.id}")
        rec.cached_tokens = cached
        e2e = meta.get("e2e_latency")
        if not isinstance(e2e, (int, float)) and self.sender.api.server_meta:  # OpenAI answers have no meta_info
            raise ServerProtocolError(f"{url}: meta_info.e2e_latency missing or not a number ({e2e!r}), request {rec.id}")
        rec.server_e2e_latency = e2e
        queue_time = meta.get("queue_time")
        if queue_time is None and server.require_stamps:
            raise ServerProtocolError(f"{url}: meta_info.queue_time missing (the server runs with --enable-metrics), request {rec.id}")
        rec.server_queue_time = queue_time
        rec.sim_lag = meta.get("tracebench_sim_lag")   # a tracebench simulator says how late it ran (sim/answers.py)
        self._take_stamps(rec, server, meta, self._stamps, server.require_stamps, "meta_info")
        self._take_stamps(rec, server, meta, _OPTIONAL_STAMPS, False, "meta_info")

    def _take_stamps(self, rec: RequestRecord, server: ServerState, meta: dict[str, Any],
                     stamps: Sequence[tuple[str, str]], required: bool, what: str) -> None:
        """sglang's wall-clock stamps `(meta_info key, record field)` of `server`'s answer onto the run clock (its
        clock offset taken off: a server on another node). `required`: the server runs with --enable-metrics, so a
        missing stamp is a broken answer; else it stays null (an attached server without it)."""
        from_wall = self.clock.from_wall
        offset = server.wall_offset
        for key, field in stamps:
            stamp = meta.get(key)
            if stamp is None:
                if required:
                    raise ServerProtocolError(f"{server.generate_url}: {what}.{key} missing (the server runs with "
                                              f"--enable-metrics), request {rec.id}")
                continue
            setattr(rec, field, from_wall(stamp - offset))

    def _check_answer(self, rec: RequestRecord, server: ServerState) -> None:
        """A finished answer that differs from the trace (answer_check.py) is recorded as `mismatch`, never `ok`."""
        mismatch = check_answer(rec, server.limits, self.sender.api.name)
        if mismatch is not None:
            rec.status, rec.mismatch = "mismatch", mismatch

    def _finish(self, rec: RequestRecord, server: ServerState) -> None:
        self._flights.pop(rec.id, None)
        server.in_flight -= 1
        if not self._closing:
            self._slot_freed()
        self._write(rec)
        if rec.status in COMPLETED and self.observed_read:
            assert rec.t_finish is not None and rec.t_dispatch is not None
            ttft = None if rec.t_first_token is None else rec.t_first_token - rec.t_dispatch
            server.recent.add(rec.t_finish, rec.t_finish - rec.t_dispatch, ttft)
        if self._closing:
            return
        if self.on_finished is not None:
            self.on_finished(rec.id)
        self.policy_time.call("on_complete", self.policy.on_complete, rec.id, server.index, rec.status in COMPLETED)
        if self.static and not server.in_flight:
            self._maybe_send_batch(server)
        self._send_batches_gate_blocks()
        self._kick()

    def _write(self, rec: RequestRecord) -> None:
        del self._pending[rec.id]
        self._prefix_blocks.pop(rec.id, None)
        if rec.policy_s is not None:
            rec.policy_s += self.policy_time.total
        if rec.t_assigned is None:  # never assigned (slot_wait_s stays null): its mark, if it was queued, goes
            self._slot_marks.pop(rec.id, None)
        self.writer.write(rec)
        self.counts[rec.status] += 1
        self.span.add(rec)
        if rec.status in COMPLETED:
            self.e2e_ok[self.completed] = rec.t_finish - rec.t_arrival  # type: ignore[operator]
            self.completed += 1
        if rec.mismatch is not None:
            reason = mismatch_reason(rec.mismatch)
            self.mismatch_reasons[reason] = self.mismatch_reasons.get(reason, 0) + 1
        self.finished += 1
        if self.gate is not None and rec.t_admitted is not None:
            self._gate_slot_freed()
        self._check_ended()

    def _check_ended(self) -> None:
        if self._engine_done and self.finished == self.total:
            self.ended.set()

    # ---- the end -----------------------------------------------------------------------------------------------

    def _task_done(self, task: asyncio.Task[None]) -> None:
        # a probe's (a request's task ends in _serve_done)
        self._probes.pop(task, None)
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    def fail(self, err: BaseException) -> None:
        """Stop the run with `err` (the first error wins); the runner then closes the router."""
        if self.failure is None:
            self.failure = err
        self.ended.set()

    async def close(self, unreleased: Iterable[TraceRequest], reason: str) -> None:
        """End the run (it failed, or was interrupted: `reason` says which) and write a record for every request not
        written yet: in flight `cancelled` (its task is cancelled), every other one `not_sent` (queued, in a forming
        batch, never released; error "not sent: <reason>"). `unreleased` is what the engine had not released when
        close() was called; the engine may run on while close() waits, but a release from now on is ignored (those
        requests are in `unreleased`)."""
        self._closing = True
        self._cancel_reason = reason
        for server in self.servers:
            if server.batch_timer is not None:
                server.batch_timer.cancel()
        tasks = [*self._tasks, *self._probes]
        for task in tasks:
            task.cancel()
        taken = [f for f in self._flights.values() if f.task is None]
        for flight in taken:  # in dispatch order, as the tasks
            self._cancel_taken(flight)
        if tasks:
            await asyncio.wait(tasks)
        # the sender calls back for each (its answer to the cancel, or SenderFailed after its cancel timeout, or
        # SenderDied): a wait that ends
        while any(f.task is None for f in self._flights.values()):
            await asyncio.sleep(0.005)
        not_sent = f"not sent: {reason}"
        for rec in list(self._pending.values()):  # queued or forming
            rec.status, rec.error = "not_sent", not_sent
            self._write(rec)
        for req in unreleased:
            t_arrival = run_seconds(req.arrival_s, self.speed)
            self.writer.write(
                RequestRecord(req.id, req.input_len, req.output_len, t_arrival, status="not_sent", error=not_sent)
            )
            self.counts["not_sent"] += 1
            self.finished += 1

    async def stop_probes(self) -> None:
        """The run has ended: cancel the health probes still under way, before the client's session closes (a probe
        going out through a closed session would find a healthy server "down" and fail a finished run)."""
        self._closing = True
        probes = list(self._probes)
        for task in probes:
            task.cancel()
        if probes:
            await asyncio.wait(probes)

    # ---- the watchdog: nothing waits forever ------------------------------------------------------------------

    async def watch(self) -> None:
        """Runs beside the requests (replay/stall.py says why and what the bounds are): a server that shows no
        progress for the stall bound while requests wait on it is taken out of routing (`stalled`), its requests in
        flight `timeout`; a streamed request that got its first token and then nothing for the bound is recorded
        `timeout` (before its first token it waits in the server's own queue: only its server's silence, or
        --timeout, ends it); without streaming and polls, a request is `timeout` when nothing came from its server
        for the no-stream total; a policy that leaves requests queued while servers have free slots for the bound
        fails the run."""
        if self.stall is None:
            return
        period = min(1.0, self.stall.run_no_progress_s / 4)
        while True:
            await asyncio.sleep(period)
            self.guarded(self._watch_tick)

    def _bound_text(self, total: bool = False) -> str:
        stall = self.stall
        assert stall is not None
        trace_s, run_s = ((stall.no_stream_total_s, stall.run_no_stream_total_s) if total
                          else (stall.no_progress_s, stall.run_no_progress_s))
        given = "--stall-timeout" if stall.source == "--stall-timeout" else "the default stall bound"
        if self.speed == 1.0:
            return f"{given}: {run_s:g} s"
        return f"{given}: {trace_s:g} trace s = {run_s:g} s of run time at --speed {self.speed:g}"

    def _watch_tick(self) -> None:
        stall = self.stall
        assert stall is not None
        now = self.clock.now()
        bound = stall.run_no_progress_s
        if self._closing:
            return
        stream = self.sender.stream
        # a server's progress is seen while it works if its answers stream or its loads are polled; else (behind
        # sglang-router, not streamed) only when an answer completes: the no-stream total bound applies then
        audible = stream or self.polled
        for flight in list(self._flights.values()):
            if flight.end_status is not None:
                continue
            server = flight.waits_on()
            # the server's silence counts from this request's own last progress at the earliest (its dispatch; a PD
            # pair's prefill answer, after which it waits on its decode server)
            silent = now - max(server.t_heard, flight.t_progress)
            if audible and server.state != "down" and silent > bound:
                why = (f"stalled: nothing came from it for {silent:.1f} s while request(s) waited on it (no stream "
                       f"event, no answer, no /v1/loads snapshot showing its scheduler at work; {self._bound_text()})")
                self._mark_down(server, why, "timeout", f"server {server.index} {why}")
            elif stream and flight.rec.t_first_token is not None and now - flight.t_progress > bound:
                self._end_flight(flight, "timeout", f"no progress for {now - flight.t_progress:.1f} s after its first "
                                 f"token: nothing more came on its stream ({self._bound_text()})")
            elif not audible and silent > stall.run_no_stream_total_s:
                self._end_flight(flight, "timeout", f"no answer from its server for {silent:.1f} s, to this request "
                                 "or another (not streamed, no /v1/loads: answers are the only sign of its work; "
                                 f"{self._bound_text(total=True)})")
        if self._idle_since is not None and now - self._idle_since > bound:
            raise PolicyError(
                f"{self._policy_label()} assigned nothing for {bound:g} s of run time while {len(self._queue)} "
                f"request(s) waited at the router and servers had free slots ({self._bound_text()})")

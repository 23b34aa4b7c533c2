"""The router: the queue between the engine and the servers, per-server caps, the policy, and the three timestamps.

Flow: the engine calls `release()` at each request's arrival (timestamp 1, `t_released`, stamped here); the policy
is asked for assignments when a request arrives, when a slot frees and after a cap change; each assignment starts
`_serve()`, the one coroutine that stamps `t_dispatch` (timestamp 2), `t_first_token` and `t_finish` (timestamp 3)
while it consumes the client's answer. Every request's record is written exactly once, when it ends.

Static batching (`mode="static"`) runs through the same path: a server takes assignments only while it has nothing
in flight (its effective cap is the batch size then, 0 while its batch runs); what the policy gives an idle server
forms its next batch, sent all at once when it holds `batch_size` requests, when `batch_timeout` has passed since its
first member arrived, or when the trace has nothing more to release.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from itertools import islice
from typing import Any

import numpy as np

from tracebench.errors import PolicyError, RunFailed, ServerProtocolError
from tracebench.policies.base import UNCAPPED, Policy, QueuedRequest, ReportedLoad, ServerView
from tracebench.itl import ItlGaps
from tracebench.replay.answer_check import ContextLimits, check_answer, mismatch_reason
from tracebench.replay.client import CHUNK, FIRST_TOKEN, Answer, SglangClient
from tracebench.replay.clock import RunClock, run_seconds
from tracebench.replay.gate import ConcurrencyGate
from tracebench.replay.records import COMPLETED, STATUSES, RecordWriter, RequestRecord
from tracebench.replay.tokens import InputIds
from tracebench.trace.format import TraceRequest

OBSERVED_WINDOW_S = 10.0  # ServerView's observed figures cover this much recent run time...
OBSERVED_MAX = 256  # ...and at most this many recent completions
OBSERVED_REFRESH_S = 0.1  # recomputed at most this often (policies may be asked hundreds of times a second)

# meta_info stamp (time.time() on the server) -> record field on the run clock
_STAMPS = (
    ("request_received_ts", "server_received"),
    ("forward_entry_time", "server_forward_entry"),
    ("prefill_finished_time", "server_prefill_finished"),
    ("request_finished_ts", "server_finished"),
)

HealthCheck = Callable[[int], Awaitable["str | None"]]  # server index -> None if healthy, else why not


def _quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class ServerState:
    """The router's own state of one server. `state`: `up` (routable), `probing` (a request or a poll lost its
    connection; nothing is routed there until the health check answers), `down` (for the rest of the run)."""

    __slots__ = (
        "index", "url", "generate_url", "require_stamps", "launch_cap", "state", "cap", "in_flight", "forming", "batch_seq",
        "batch_timer", "recent", "reported", "reported_t", "_observed", "_observed_t", "limits",
    )

    def __init__(self, index: int, url: str, cap: int | None, require_stamps: bool, launch_cap: int | None = None,
                 api_path: str = "/generate", limits: ContextLimits | None = None) -> None:
        self.index = index
        self.url = url
        self.generate_url = f"{url}{api_path}"  # the request path of the run's --api (client.Api.path)
        self.require_stamps = require_stamps  # the server runs with --enable-metrics: every stamp must be there
        self.launch_cap = launch_cap  # --max-running-requests the server was launched with (None: its default)
        self.state = "up"
        self.cap = UNCAPPED if cap is None else cap
        self.in_flight = 0  # dispatched, not finished
        self.forming: list[RequestRecord] = []  # static mode: assigned, waiting for the batch to be sent
        self.batch_seq = 0  # static mode: number of the next batch
        self.batch_timer: asyncio.TimerHandle | None = None
        self.recent: deque[tuple[float, float, float | None]] = deque(maxlen=OBSERVED_MAX)  # (t_finish, latency, ttft)
        self.reported: tuple[int, int, float, float] | None = None  # last /v1/loads: running, waiting, usage, throughput
        self.reported_t = 0.0
        self._observed: tuple[float, float | None, float | None, float | None] = (0.0, None, None, None)
        self._observed_t = -OBSERVED_REFRESH_S
        # sglang's context limits there (/server_info): what its answers are checked against (answer_check.py); None:
        # not known (behind sglang-router, servers whose limits differ)
        self.limits = limits

    def observed(self, now: float) -> tuple[float, float | None, float | None, float | None]:
        """(completed_per_s, latency_p50, latency_p90, ttft_p50) over the recent window (cached briefly)."""
        if now - self._observed_t >= OBSERVED_REFRESH_S:
            self._observed_t = now
            since = now - OBSERVED_WINDOW_S
            recent = [r for r in self.recent if r[0] >= since]
            if not recent:
                self._observed = (0.0, None, None, None)
            else:
                # a full deque may cover less than the window: rate over the span it does cover
                span = now - recent[0][0] if len(recent) == OBSERVED_MAX else min(OBSERVED_WINDOW_S, now)
                latencies = sorted(r[1] for r in recent)
                ttfts = sorted(r[2] for r in recent if r[2] is not None)
                self._observed = (
                    len(recent) / span if span > 0 else 0.0,
                    _quantile(latencies, 0.5),
                    _quantile(latencies, 0.9),
                    _quantile(ttfts, 0.5) if ttfts else None,
                )
        return self._observed


class Router:
    def __init__(
        self,
        *,
        clock: RunClock,
        servers: list[ServerState],
        policy: Policy,
        client: SglangClient,
        writer: RecordWriter,
        input_ids: InputIds,
        total: int,
        health_check: HealthCheck,
        batch_size: int | None = None,
        batch_timeout: float | None = None,
        speed: float = 1.0,
        block_size: int | None = None,
        max_concurrency: int | None = None,
    ) -> None:
        """`batch_timeout` is in run seconds; `speed` (--speed K, 1.0 when not sped up) turns the trace's arrival
        times into run seconds (`run_seconds`); `block_size` is the trace header's (tokens per prefix block);
        `max_concurrency`: --max-concurrency N, the client's gate before the router queue (gate.py)."""
        self.clock = clock
        self.speed = speed
        self.servers = servers
        self.policy = policy
        self.client = client
        self.writer = writer
        self.input_ids = input_ids
        self.total = total
        self.static = batch_size is not None
        self.batch_size = batch_size if batch_size is not None else 0
        self.batch_timeout = batch_timeout
        self.block_size = block_size
        self._health_check = health_check
        self._loop = asyncio.get_running_loop()
        self._queue: list[QueuedRequest] = []  # the router queue, oldest first (what the policy sees)
        self._queued: dict[int, QueuedRequest] = {}
        self._pending: dict[int, RequestRecord] = {}  # released, record not written yet
        # prefix blocks of the released requests that have them, until written (a static batch put back in the queue
        # needs them again)
        self._prefix_blocks: dict[int, tuple[int, ...]] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # one _serve per dispatched request
        self._probes: set[asyncio.Task[None]] = set()
        self._assign_scheduled = False
        self._engine_done = False  # nothing more will enter the router queue (every request released and admitted)
        self._all_released = False  # the engine released every request (some may still wait at the client gate)
        # --max-concurrency: requests released but not admitted wait here, before the router queue
        self.gate: ConcurrencyGate[TraceRequest] | None = None if max_concurrency is None else ConcurrencyGate(max_concurrency)
        self._closing = False
        self._cancel_status = "cancelled"
        self._cancel_reason = "cancelled"
        self.released = 0
        self.finished = 0
        self.counts = dict.fromkeys(STATUSES, 0)
        self.completed = 0  # ok + mismatch: answers that finished
        self.e2e_ok = np.empty(max(total, 1))  # t_finish - t_arrival of completed requests, in finishing order
        self.mismatch_reasons: dict[str, int] = {}  # a mismatch's reason (answer_check.py) -> how many
        self.cap_changes: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.failure: BaseException | None = None
        # called with a request's id once its record is written (the engine releases closed-loop followers)
        self.on_finished: Callable[[int], None] | None = None
        self.ended = asyncio.Event()  # every record written, or the run must stop (failure set)
        if total == 0:
            self.ended.set()

    # ---- the engine's side -------------------------------------------------------------------------------------

    def release(self, request: TraceRequest, t_arrival: float) -> None:
        """Timestamp 1: the request enters the router queue now. `t_arrival`: its scheduled arrival on the run clock
        (`run_seconds(request.arrival_s, speed)`)."""
        if self._closing:
            # the engine runs on until it is cancelled after close(); close() already took this request among the
            # never-released ones and writes its record (a release now would record it twice)
            return
        t_released = self.clock.now()
        rid = request.id
        rec = self._pending[rid] = RequestRecord(rid, request.input_len, request.output_len, t_arrival, t_released)
        if request.prefix_blocks is not None:
            self._prefix_blocks[rid] = request.prefix_blocks
        self.released += 1
        if self.gate is None or self.gate.offer(request):
            self._admit(request, rec, t_released)

    def _admit(self, request: TraceRequest, rec: RequestRecord, t_admitted: float) -> None:
        """The request enters the router queue (the policy sees it from now on)."""
        rec.t_admitted = t_admitted
        queued = QueuedRequest(request.id, request.input_len, request.output_len, rec.t_arrival, rec.t_released,  # type: ignore[arg-type]
                               request.prefix_blocks, self.block_size)
        self._queued[request.id] = queued
        self._queue.append(queued)
        self._kick()

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
        self._kick()

    def caps(self) -> list[int | None]:
        return [None if s.cap == UNCAPPED else s.cap for s in self.servers]

    def report_load(self, server: int, load: tuple[int, int, float, float]) -> None:
        """What the server reported (/v1/loads): num_running_reqs, num_waiting_reqs, token_usage, gen_throughput."""
        state = self.servers[server]
        state.reported = load
        state.reported_t = self.clock.now()

    def suspect(self, server: int, why: str) -> None:
        """The server could not be reached: route nothing there until the health check says whether it is up."""
        state = self.servers[server]
        if state.state != "up" or self._closing:
            return
        state.state = "probing"
        task = self._loop.create_task(self._probe(state, why))
        self._probes.add(task)
        task.add_done_callback(self._task_done)

    async def _probe(self, state: ServerState, why: str) -> None:
        reason = await self._health_check(state.index)
        if reason is None:
            state.state = "up"
            self._kick()
            return
        state.state = "down"
        self._event("server_down", state.index, f"{why}; then {reason}")
        if state.forming:  # an unsent static batch goes back to the queue, in arrival order
            for rec in state.forming:
                queued = QueuedRequest(rec.id, rec.input_len, rec.output_len, rec.t_arrival, rec.t_released,
                                       self._prefix_blocks.get(rec.id), self.block_size)
                self._queued[rec.id] = queued
                self._queue.append(queued)
                rec.batch = None
            state.forming = []
            self._queue.sort(key=lambda q: (q.t_released, q.id))
        if all(s.state == "down" for s in self.servers):
            self.fail(RunFailed(f"every server is down (the last: server {state.index}, {state.url}: {reason})"))
        else:
            self._kick()

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

    def _kick(self) -> None:
        # Coalesced: a burst of arrivals or completions in one loop iteration makes one call to the policy.
        if not self._assign_scheduled and not self._closing:
            self._assign_scheduled = True
            self._loop.call_soon(self.guarded, self._assign_round)

    def _views(self, now: float) -> list[ServerView]:
        views = []
        for s in self.servers:
            rate, p50, p90, ttft = s.observed(now)
            rep = s.reported
            reported = None if rep is None else ReportedLoad(rep[0], rep[1], rep[2], rep[3], now - s.reported_t)
            if self.static:
                in_flight, cap = s.in_flight + len(s.forming), (0 if s.in_flight else min(self.batch_size, s.cap))
            else:
                in_flight, cap = s.in_flight, s.cap
            views.append(ServerView(s.index, s.url, s.state == "up", in_flight, cap, rate, p50, p90, ttft, reported))
        return views

    def guarded(self, callback: Callable[..., None], *args: Any) -> None:
        """Runs a loop callback. A callback has no caller to raise to: an error in one stops the run."""
        try:
            callback(*args)
        except Exception as err:
            self.fail(err)

    def _assign_round(self) -> None:
        self._assign_scheduled = False
        if self._closing or not self._queue:
            return
        now = self.clock.now()
        views = self._views(now)
        if not any(v.free_slots for v in views):
            return  # nothing can be assigned: the policy is not asked
        self.policy.now = now
        self._apply(self.policy.assign(self._queue, views), views)

    def _apply(self, picks: Any, views: list[ServerView]) -> None:
        """Check every assignment against the rules (all or nothing), then carry them out."""
        name = self.policy.name
        if not isinstance(picks, list):
            raise PolicyError(f"policy {name!r}: assign() must return a list of (request, server) pairs, got {type(picks).__name__}")
        if not picks:
            return
        per_server = [0] * len(views)
        chosen: set[int] = set()
        for pair in picks:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise PolicyError(f"policy {name!r}: assign() returned {pair!r}, not a (request, server) pair")
            req, view = pair
            rid = getattr(req, "id", None)
            if not isinstance(rid, int) or self._queued.get(rid) is not req:
                raise PolicyError(f"policy {name!r} assigned request {rid!r}, which is not in the router queue")
            if rid in chosen:
                raise PolicyError(f"policy {name!r} assigned request {rid} twice in one call")
            chosen.add(rid)
            index = getattr(view, "index", None)
            if not isinstance(index, int) or not 0 <= index < len(views):
                raise PolicyError(f"policy {name!r} assigned request {rid} to {view!r}, not one of the servers it was given")
            if not views[index].healthy:
                raise PolicyError(f"policy {name!r} assigned request {rid} to server {index}, which is not healthy")
            per_server[index] += 1
            if per_server[index] > views[index].free_slots:
                raise PolicyError(
                    f"policy {name!r} assigned {per_server[index]} requests to server {index}, which had "
                    f"{views[index].free_slots} free slot(s)"
                )
        count = len(picks)
        if all(q.id in chosen for q in islice(self._queue, count)):
            del self._queue[:count]  # the common case: the oldest went
        else:
            self._queue = [q for q in self._queue if q.id not in chosen]
        touched = set()
        for req, view in picks:
            del self._queued[req.id]
            server = self.servers[view.index]
            rec = self._pending[req.id]
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
                self._dispatch(rec, server)
            server.batch_seq += 1
        elif deadline is not None and server.batch_timer is None:
            server.batch_timer = self._loop.call_later(deadline - now, self.guarded, self._batch_deadline, server)

    def _batch_deadline(self, server: ServerState) -> None:
        server.batch_timer = None
        self._maybe_send_batch(server)

    # ---- one request: the three timestamps ---------------------------------------------------------------------

    def _dispatch(self, rec: RequestRecord, server: ServerState) -> None:
        server.in_flight += 1
        task = self._loop.create_task(self._serve(rec, server))
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _body(self, rec: RequestRecord) -> bytes:
        # the body of the run's --api (client.Api): /generate, /v1/completions or /v1/chat/completions
        blocks = self._prefix_blocks.get(rec.id)
        ids = self.input_ids.ids(rec.id, rec.input_len) if blocks is None else self.input_ids.block_ids(blocks, rec.input_len)
        return self.client.api.body(ids, rec.output_len, self.client.stream)

    async def _serve(self, rec: RequestRecord, server: ServerState) -> None:
        """Send one request and stamp t_dispatch, t_first_token and t_finish as its answer arrives (and the gaps
        between its later chunks: inter-token latency, kept as a histogram, tracebench/itl.py)."""
        now = self.clock.now
        body = self._body(rec)
        rec.server = server.index
        answer: Answer | None = None
        gaps = ItlGaps()
        t_chunk = 0.0
        try:
            rec.t_dispatch = now()
            async for item in self.client.generate(server.generate_url, body):
                if item is CHUNK:
                    t = now()
                    gaps.add(t - t_chunk)
                    t_chunk = t
                elif item is FIRST_TOKEN:
                    rec.t_first_token = t_chunk = now()
                else:
                    rec.t_finish = now()
                    answer = item  # type: ignore[assignment]
            assert answer is not None  # generate() always ends with an Answer
            rec.itl_max, rec.itl_hist = gaps.fields()
            self._take_answer(rec, server, answer)
            if rec.status == "ok":
                self._check_answer(rec, server)
        except BaseException as err:  # recorded, then re-raised: the run stops on anything but a measurement
            if rec.t_finish is None:
                rec.t_finish = now()
            if isinstance(err, asyncio.CancelledError):
                rec.status, rec.error = self._cancel_status, self._cancel_reason  # type: ignore[assignment]
            else:
                rec.status, rec.error = "error", f"{type(err).__name__}: {err}"
            raise
        finally:
            self._finish(rec, server)

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
        required = ("completion_tokens", "prompt_tokens", "cached_tokens") if self.client.api.server_meta else (
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
        if not isinstance(e2e, (int, float)) and self.client.api.server_meta:  # OpenAI answers have no meta_info
            raise ServerProtocolError(f"{url}: meta_info.e2e_latency missing or not a number ({e2e!r}), request {rec.id}")
        rec.server_e2e_latency = e2e
        queue_time = meta.get("queue_time")
        if queue_time is None and server.require_stamps:
            raise ServerProtocolError(f"{url}: meta_info.queue_time missing (the server runs with --enable-metrics), request {rec.id}")
        rec.server_queue_time = queue_time
        from_wall = self.clock.from_wall
        for key, field in _STAMPS:
            stamp = meta.get(key)
            if stamp is None:
                if server.require_stamps:
                    raise ServerProtocolError(f"{url}: meta_info.{key} missing (the server runs with --enable-metrics), request {rec.id}")
                continue  # an attached server without --enable-metrics: the stamp stays null
            setattr(rec, field, from_wall(stamp))

    def _check_answer(self, rec: RequestRecord, server: ServerState) -> None:
        """A finished answer that differs from the trace (answer_check.py) is recorded as `mismatch`, never `ok`."""
        mismatch = check_answer(rec, server.limits, self.client.api.name)
        if mismatch is not None:
            rec.status, rec.mismatch = "mismatch", mismatch

    def _finish(self, rec: RequestRecord, server: ServerState) -> None:
        server.in_flight -= 1
        self._write(rec)
        if rec.status in COMPLETED:
            assert rec.t_finish is not None and rec.t_dispatch is not None
            ttft = None if rec.t_first_token is None else rec.t_first_token - rec.t_dispatch
            server.recent.append((rec.t_finish, rec.t_finish - rec.t_dispatch, ttft))
        if self._closing:
            return
        if self.on_finished is not None:
            self.on_finished(rec.id)
        self.policy.on_complete(rec.id, server.index, rec.status in COMPLETED)
        if self.static and not server.in_flight:
            self._maybe_send_batch(server)
        self._send_batches_gate_blocks()
        self._kick()

    def _write(self, rec: RequestRecord) -> None:
        del self._pending[rec.id]
        self._prefix_blocks.pop(rec.id, None)
        self.writer.write(rec)
        self.counts[rec.status] += 1
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
        self._tasks.discard(task)
        self._probes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.fail(task.exception())  # type: ignore[arg-type]

    def fail(self, err: BaseException) -> None:
        """Stop the run with `err` (the first error wins); the runner then closes the router."""
        if self.failure is None:
            self.failure = err
        self.ended.set()

    async def close(self, unreleased: Sequence[TraceRequest], status: str, reason: str) -> None:
        """End the run: cancel what is in flight and write a record for every request not written yet (queued,
        in a forming batch, in flight, never released) with `status` and `reason`. `unreleased` is what the engine
        had not released when close() was called; the engine may run on while close() waits, but a release from
        now on is ignored (those requests are in `unreleased`)."""
        self._closing = True
        self._cancel_status, self._cancel_reason = status, reason
        for server in self.servers:
            if server.batch_timer is not None:
                server.batch_timer.cancel()
        tasks = [*self._tasks, *self._probes]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        for rec in list(self._pending.values()):  # queued, forming, or a _serve cancelled before it started
            rec.status, rec.error = status, reason  # type: ignore[assignment]
            self._write(rec)
        for req in unreleased:
            t_arrival = run_seconds(req.arrival_s, self.speed)
            self.writer.write(
                RequestRecord(req.id, req.input_len, req.output_len, t_arrival, status=status, error=reason)  # type: ignore[arg-type]
            )
            self.counts[status] += 1
            self.finished += 1

"""The sim-server's live engine: `model.BatchModel` driven on the real clock, apart from the HTTP faces.

Loop callbacks run the model on asyncio's monotonic `loop.time()`, scaled by `--speed K`: each step's end is
absolute (its start plus its duration / K) and the next step starts at that end, so sleeping late never accumulates
drift (a late loop catches up). A token sampled at a step's end becomes visible to the HTTP layer `output_s / K` later (sglang's
detokenizer and IPC hop): `_deliver` hands it to the request's `Pending` and wakes its handler. The faces submit
validated requests and release them; the engine feeds the metrics sink (`prom.SimStats`) through its hooks and
answers nothing itself.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, Protocol

from tracebench.itl import bucket_of, sure_range
from tracebench.profiles import Profile
from tracebench.sim.model import BatchModel, SimRequest, Step
from tracebench.sim.prom import SimStats
from tracebench.sim.validate import receipt_time


@dataclass(eq=False, slots=True)
class Pending:
    """One request as the HTTP layer sees it."""

    sim: SimRequest
    rid: str
    stream: bool
    ids_seed: int
    t_received: float                    # loop clock (monotonic)
    t_dispatched: float
    visible: int = 0                     # output tokens handed to the HTTP layer so far
    t_first_token: float = 0.0
    t_finished: float = 0.0
    finished: bool = False
    t_first_sent_wall: float = 0.0
    lag: float = 0.0                     # how late its first token and its end were handed out (the larger; loop s)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""                       # the word-level rendering of output_ids (grown as they are drawn)
    # an in-process caller's watcher (tracebench/sim/inprocess.py), told of each delivery instead of reading
    # `event` per token: on_token(t_visible) for every new token handed out, on_done(t_visible) at the end
    watcher: Watcher | None = None
    # the handler's wake-up, made when a handler first waits (`event`): most requests (all of an in-process caller,
    # which has a watcher) never wait on one, and setting it per token was a cost per token
    _event: asyncio.Event | None = None

    @property
    def event(self) -> asyncio.Event:
        """Set at each delivery; a handler clears it and waits for the next (as `all_finished`)."""
        if self._event is None:
            self._event = asyncio.Event()
        return self._event

    def wake(self) -> None:
        """A delivery: wake the handler waiting on `event`, if one ever did (a waiter clears it before waiting, so
        a set before the event existed would have been cleared unseen)."""
        if self._event is not None:
            self._event.set()

    @property
    def e2e(self) -> float:
        """Received to finished (loop clock; the server's e2e_latency)."""
        return self.t_finished - self.t_received

    @property
    def ttft(self) -> float | None:
        """Received to the first token handed out; None when none was."""
        return self.t_first_token - self.t_received if self.t_first_token > 0.0 else None


class Watcher(Protocol):
    def on_token(self, t_visible: float) -> None: ...

    def on_tokens(self, run: RunDelivery) -> None: ...

    def on_done(self, t_visible: float) -> None: ...


class RunDelivery:
    """The tokens of a decode run (`BatchModel.start_decode_run`), handed out together at the run's end: one per
    step to every request of the batch, each at its own step's moment (`times`, loop clock). The gaps between them
    are the same for every request: `gaps` buckets them once per clock offset (a watcher's)."""

    __slots__ = ("times", "_gaps")

    def __init__(self, times: list[float]) -> None:
        self.times = times
        self._gaps: dict[float, tuple[dict[int, int], float]] = {}

    def gaps(self, offset: float) -> tuple[dict[int, int], float]:
        """(bucket counts, largest gap) of the gaps between the tokens as a reader `offset` later sees them (each
        gap computed as one token at a time would be: (t_i + offset) - (t_(i-1) + offset))."""
        got = self._gaps.get(offset)
        if got is None:
            # ItlGaps.add's bucketing, inline (a run's ~15 gaps, once per run)
            counts: dict[int, int] = {}
            largest = 0.0
            times = self.times
            before = times[0] + offset
            bucket, lo, hi = 0, 0.0, 0.0   # gaps in (lo, hi) are in `bucket` (itl.sure_range)
            for t in times[1:]:
                after = t + offset
                gap = after - before
                before = after
                if not lo < gap < hi:
                    bucket = bucket_of(gap)
                    lo, hi = sure_range(bucket)
                counts[bucket] = counts.get(bucket, 0) + 1
                if gap > largest:
                    largest = gap
            got = self._gaps[offset] = (counts, largest)
        return got


class LiveEngine:
    """The model, the requests in it and the loop callbacks that run it on the clock."""

    def __init__(self, model: BatchModel, stats: SimStats, profile: Profile, speed: float, seed: int, *,
                 over_http: bool, fold_steps: int = 0) -> None:
        """`over_http`: its answers leave through an HTTP face (server.py), which sends an answer's end when sglang's
        would (`end_hold`); False in process, where the reader adds the whole response hop itself (replay/inprocess.py
        _Watch). `fold_steps` > 1: decode steps that nothing can change run as one (`BatchModel.start_decode_run`, at most
        that many), their tokens handed out together at the run's end. Only on a simulated clock (sim/inprocess.py):
        the run's steps and stamps are the same, but its tokens reach the reader at once."""
        self.model = model
        self.fold_steps = fold_steps
        self.stats = stats
        self.rng = random.Random(seed)   # the output ids' seeds, one draw per request in arrival order
        self.pending: dict[SimRequest, Pending] = {}
        self.rids_in_flight: set[str] = set()
        self._last_receipt = -math.inf   # the latest request receipt of the HTTP faces (`receive`)
        self._receipt_hop = profile.request_hop_s / speed   # sglang's intake, send -> receipt (loop seconds)
        # how long after the model finished a request its answer's end leaves (loop seconds): sglang's end-of-request
        # work, Profile.answer_end_s (0 in process: `over_http`)
        self.end_hold = profile.answer_end_s / speed if over_http else 0.0
        self.mono_to_wall = 0.0          # wall = mono + mono_to_wall
        self.done: asyncio.Future[None] | None = None   # the engine's end: only an error (or a cancel) ends it
        self._loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # start's
        self._resume: Callable[[], None] | None = None  # what a kick resumes (None: the loop is not waiting)
        self._t_free = 0.0                # when the GPU is free (the last step's end)
        self._step: Step | None = None    # the step under way
        self._timer: asyncio.TimerHandle | None = None  # a decode run's end
        # Scaled per-request delays (seconds of loop clock)
        self.queue_entry_delay = profile.queue_entry_s / speed
        self.dispatch_delay = profile.dispatch_s / speed
        self.output_delay = profile.output_s / speed

    def start(self, now: float, wall_now: float | None = None) -> asyncio.Task[None]:
        """Anchor the wall clock (`wall_now`, default time.time()) at loop time `now` and start the engine on the
        running loop. The task it returns ends only with the engine's error; cancelling it stops the engine."""
        self.mono_to_wall = (time.time() if wall_now is None else wall_now) - now
        self.stats.start(now)
        loop = self._loop = asyncio.get_running_loop()
        self.done = loop.create_future()
        loop.call_soon(self._begin)
        task = loop.create_task(self._lifetime())
        task.add_done_callback(self._stop)
        return task

    async def _lifetime(self) -> None:
        """The engine as a task (what its owner waits on or cancels): its callbacks hold no task themselves."""
        assert self.done is not None
        await self.done

    def _stop(self, _task: asyncio.Task[None]) -> None:
        # a task cancelled before its first step never awaits `done` (its cancel does not reach it): the callbacks
        # must stop all the same
        assert self.done is not None
        if not self.done.done():
            self.done.cancel()

    def _begin(self) -> None:
        self._t_free = self._loop.time()
        self._turn()

    def wall(self, t_loop: float) -> float:
        return t_loop + self.mono_to_wall

    def kick(self) -> None:
        """Make the loop look at the model again (new work, or a changed admission cap), one loop turn from now;
        nothing when it is not waiting (it looks again at its step's end anyway)."""
        resume = self._resume
        if resume is not None:
            self._resume = None
            self._loop.call_soon(resume)

    def receive(self, headers: Mapping[str, str], t_arrived: float, wall_arrived: float) -> float:
        """An HTTP face's request that arrived at `t_arrived` (loop time; `wall_arrived` the same moment on the wall
        clock): the moment the server takes it in (validate.receipt_time: the profile's request hop after the
        client's send, after the request before it). BadRequest for a bad send header."""
        self._last_receipt = receipt_time(headers, t_arrived, wall_arrived, self._receipt_hop, self._last_receipt)
        return self._last_receipt

    def submit(self, items: list[tuple[int, int, Sequence]], rids: list[str], stream: bool, t_received: float,
               to_model: bool = True) -> list[Pending]:
        """Hand validated requests (`validate.parse_generate`'s items and rids) to the model. `to_model` False: the
        requests are registered but the caller hands them to the model later (a PD role, `pd.py`)."""
        pendings: list[Pending] = []
        t_ready = t_received + self.queue_entry_delay
        for (input_len, max_new, tokens), rid in zip(items, rids):
            sim = SimRequest(rid=rid, input_len=input_len, max_new_tokens=max_new, t_ready=t_ready, input_ids=tokens)
            pend = Pending(sim=sim, rid=rid, stream=stream, ids_seed=self.rng.getrandbits(64),
                           t_received=t_received, t_dispatched=t_received + self.dispatch_delay)
            if to_model:
                self.model.submit(sim)
            self.pending[sim] = pend
            self.rids_in_flight.add(rid)
            pendings.append(pend)
        self.kick()
        return pendings

    def release(self, pendings: list[Pending], done: bool) -> None:
        """The handler is through with `pendings`; `done` False: the client went away (cancelled handler or failed
        write), so unfinished requests are aborted and their slots freed, like sglang."""
        for pend in pendings:
            self.rids_in_flight.discard(pend.rid)
        if not done:
            for pend in pendings:
                if not pend.finished:
                    self.pending.pop(pend.sim, None)
                    if self.model.abort(pend.sim):
                        self.stats.on_abort()
            self.kick()  # a decode run under way keeps only its started steps (_run_wake)

    async def until_answer_end(self, pendings: Sequence[Pending]) -> None:
        """Wait until the answer of the finished `pendings` may end: `end_hold` after the model finished the last of
        them (sglang's end-of-request work). An HTTP face sends an answer's end (a stream's last chunk, a whole
        answer) no sooner."""
        await _until(max(pend.t_finished for pend in pendings) + self.end_hold)

    def count_finished(self, pend: Pending) -> None:
        """A face formatted `pend`'s final answer: count it finished now (when sglang's tokenizer manager does)."""
        self.stats.on_finished(pend.stream, pend.sim, pend.e2e, pend.ttft)

    # ---- the loop: a chain of callbacks ----
    # Not a task (an Event wait, a timer and a sleep per step): that made a Future, a Task step and an Event waiter
    # per step, for nothing a callback cannot do. The callbacks set the same timers the task did, and each wake-up
    # runs one loop turn after its cause, as a task's resumption does: asyncio's timer heap, and so the order of
    # events at equal times (every server's scrape at one tick), is what it was with the task.

    def _wait(self, resume: Callable[[], None]) -> None:
        """Wait for a `kick` (or a timer that kicks): `resume` runs one loop turn after it."""
        self._resume = resume

    def _guarded(self, body: Callable[[], None]) -> None:
        """Run a piece of the loop; an error ends the engine (its future holds it, as the task's did)."""
        done = self.done
        if done is None or done.done():
            return  # cancelled (the server stops): nothing runs any more
        try:
            body()
        except Exception as err:
            done.set_exception(err)

    def _turn(self) -> None:
        self._guarded(self._plan)

    def _step_ended(self) -> None:
        self._guarded(self._finish)

    def _run_woken(self) -> None:
        self._guarded(self._run_wake)

    def _plan(self) -> None:
        """The loop's head: start the next step, or wait for work (an arrival) or for its ready time."""
        loop = self._loop
        model = self.model
        t_start = model.next_start(self._t_free)
        if t_start is None:
            model.process_results()  # sglang processes the last step's result even when nothing follows
            # no work: the GPU idles from t_free; the next request starts at its own ready time, even if this
            # loop wakes up late (catch-up, no drift)
            self._wait(self._turn)
            return
        if t_start > loop.time():
            # idle until the head of the queue is ready (an arrival may wake us earlier; a stale timer only
            # makes the loop look again)
            loop.call_at(t_start, self.kick)
            self._wait(self._turn)
            return
        step = model.start_decode_run(t_start, self.fold_steps) if self.fold_steps else model.start_step(t_start)
        if step is None:
            raise RuntimeError(f"model had work from {t_start} but planned no step")
        self._step = step
        if step.run_starts is not None:
            # a decode run: until its end, unless a request arrives (or one is aborted) meanwhile: then the run
            # keeps the steps already started and the next step is planned anew (BatchModel.cut_run)
            self._timer = loop.call_at(step.t_end, self.kick)
            self._wait(self._run_woken)
            return
        self._until_end()

    def _run_wake(self) -> None:
        """A decode run's wait ended: at its end, or early (an arrival or abort): then it is cut."""
        loop = self._loop
        step = self._step
        assert step is not None and self._timer is not None
        if loop.time() < step.t_end:
            self._timer.cancel()
            self.model.cut_run(step, loop.time())
        self._until_end()

    def _until_end(self) -> None:
        """Finish the step under way at its end: now, or one loop turn after a timer at it (asyncio.sleep's)."""
        loop = self._loop
        delay = self._step.t_end - loop.time()  # type: ignore[union-attr]
        if delay > 0:
            loop.call_later(delay, loop.call_soon, self._step_ended)
            return
        self._finish()

    def _finish(self) -> None:
        """The step under way ended: apply it, schedule its tokens' delivery, and go on with the next."""
        loop = self._loop
        step = self._step
        assert step is not None
        self._step = None
        result = self.model.finish_step(step)
        t_end = self._t_free = step.t_end
        kind = step.kind
        ends = step.step_ends if step.run_starts is not None else None   # a decode run's
        if kind == "decode":
            if ends is None:
                self.stats.on_decode(t_end, len(result.produced))
            else:
                self.stats.on_decodes(ends, len(result.produced))
        elif kind == "prefill":   # a PD decode server's "prebuilt" step computes nothing
            self.stats.on_prefill(step)
        if result.produced or result.finished:
            # each request's count now (it may decode on before the delivery)
            produced = [(req, req.output_len) for req in result.produced]
            output_delay = self.output_delay
            t_visible = t_end + output_delay
            if ends is None:
                loop.call_at(t_visible, self._deliver, produced, result.finished, t_visible)
            else:
                run = RunDelivery([end + output_delay for end in ends])
                loop.call_at(t_visible, self._deliver_run, produced, result.finished, run)
        self._plan()

    def _deliver(self, produced: list[tuple[SimRequest, int]], finished: list[SimRequest], t_visible: float) -> None:
        """Hand a step's tokens to the HTTP layer. Stamps use the simulated time `t_visible` (not when this callback
        happened to run), so they are exact model times even on a loaded machine; the answer is sent after it. How
        late the callback ran is the engine's lag: the tokens reach the client that much later than the model says
        (wall seconds; at --speed K up to K times as much simulated time). Every step's goes to /metrics; a request
        keeps the lag of its first token and of its end (what its TTFT and total latency are made of; the faces add
        their own delay in formatting them, answers.py)."""
        now = t_visible
        late = max(0.0, self._loop.time() - t_visible)
        self.stats.on_lag(late)
        pending = self.pending
        for req, count in produced:
            pend = pending.get(req)
            if pend is None:
                continue  # aborted meanwhile
            if pend.visible == 0:
                pend.t_first_token = now
                if late > pend.lag:
                    pend.lag = late
            pend.visible = count
            if pend._event is not None:   # pend.wake(), inline (per token)
                pend._event.set()
            if pend.watcher is not None:
                pend.watcher.on_token(now)
        if finished:
            self._deliver_finished(finished, now, late)

    def _deliver_finished(self, finished: list[SimRequest], now: float, late: float) -> None:
        """The requests a step finished: their end is handed out at `now` (`late` behind the model's plan)."""
        for req in finished:
            pend = self.pending.pop(req, None)
            if pend is None:
                continue
            pend.finished = True
            pend.t_finished = now
            if late > pend.lag:
                pend.lag = late
            pend.wake()
            if pend.watcher is not None:
                pend.watcher.on_done(now)

    def _deliver_run(self, produced: list[tuple[SimRequest, int]], finished: list[SimRequest],
                     run: RunDelivery) -> None:
        """A decode run's tokens (`_deliver`'s, for every step of the run at once: each request's watcher gets their
        moments; the last is now)."""
        now = run.times[-1]
        late = max(0.0, self._loop.time() - now)
        self.stats.on_lag(late)
        pending = self.pending
        for req, count in produced:
            pend = pending.get(req)
            if pend is None:
                continue  # aborted meanwhile
            pend.visible = count
            if pend._event is not None:   # pend.wake(), inline (per request of the run)
                pend._event.set()
            if pend.watcher is not None:
                pend.watcher.on_tokens(run)
        if finished:
            self._deliver_finished(finished, now, late)


async def all_finished(pendings: list[Pending]) -> None:
    """Wait until the model finished every one of `pendings` (non-streamed answers go out whole)."""
    for pend in pendings:
        while not pend.finished:
            pend.event.clear()
            await pend.event.wait()


async def until_receipt(t_received: float) -> None:
    """Wait until the server has taken in a request (`t_received`, loop time: validate.receipt_time, which may lie a
    hop ahead of its arrival). What sglang does with a request after its receipt (the tokenizer manager's and the
    scheduler's refusals, a PD role's bootstrap) comes no sooner. The timer is set at the receipt itself (a sleep's
    `now + (t - now)` rounds, ties and inverts receipts a few ulps apart): the waits end in receipt order, which
    receipt_time keeps strictly increasing, so FCFS."""
    await _until(t_received)


async def _until(t: float) -> None:
    """Wait until loop time `t`, on a timer set at `t` itself."""
    loop = asyncio.get_running_loop()
    if t <= loop.time():
        return
    due = loop.create_future()
    timer = loop.call_at(t, _wake, due)
    try:
        await due
    finally:
        timer.cancel()


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def crash(reason: object) -> NoReturn:
    """Like sglang on a device-side assert: the server dies; connections drop, nothing answers (exit 134)."""
    sys.stderr.write(f"sim-server: {reason}\n")
    sys.stderr.flush()
    os._exit(134)

"""The engine: releases the trace's requests into the router on the trace's own schedule.

The schedule is absolute: request i is released at run start + arrival_s / speed (`run_seconds`: at --speed K the
whole run is K times compressed), by sleeping until that moment on the run clock, never by sleeping the gap since
the previous request (gaps would add up every wake-up delay: drift).
Requests whose moment has passed are released at once, in order, so a late wake-up never reorders or drops them.

Closed-loop requests (trace `after` = an earlier id, `delay_s`) are not on that schedule: such a request is released
delay_s / speed after the request it follows finished (whatever its status: the next turn of a conversation comes
whether or not the previous answer was good), and that moment is its t_arrival. The trace's own `arrival_s` of a
closed-loop request is only the generator's open-loop estimate and is not used.

The trace is held as a TraceTable (numpy columns); a TraceRequest is made for each request only when it is released.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np

from tracebench.replay.clock import RunClock, run_seconds
from tracebench.replay.router import Router
from tracebench.trace.format import TraceRequest, TraceTable

YIELD_EVERY = 256  # a burst of due requests lets the loop breathe this often (answers keep being read)


class Rows:
    """Some requests of the table, by row (a snapshot): iterating makes their TraceRequests one at a time."""

    def __init__(self, table: TraceTable, rows: np.ndarray) -> None:
        self.table = table
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[TraceRequest]:
        return (self.table.request(int(i)) for i in self.rows)


class Engine:
    def __init__(self, table: TraceTable, clock: RunClock, router: Router) -> None:
        self.table = table
        self.clock = clock
        self.router = router
        self.speed = router.speed
        self._open = np.flatnonzero(table.open_loop)  # rows released on the absolute schedule
        self.next_index = 0  # self._open[next_index:] are not released yet
        # closed loop: id of the request followed -> the rows that follow it
        self._followers: dict[int, list[int]] = {}
        self._held: dict[int, int] = {}  # closed-loop requests not released yet: id -> row
        for row in np.flatnonzero(~table.open_loop).tolist():
            self._followers.setdefault(int(table.after[row]), []).append(row)
            self._held[int(table.id[row])] = row
        self._schedule_done = False
        if self._followers:
            router.on_finished = self._finished
        # the schedule runs as loop callbacks (_step), not as a coroutine: a wait is a timer that schedules the step,
        # without the future and the task of an asyncio.sleep (two per arrival: a wake-up a hair early sleeps again).
        # The step runs on the loop turn after the timer's, as a sleeping task's wake-up does: what else is due at
        # the same moment (a poll's timer) runs in the same order as before
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Future[None] | None = None  # run() returns when it is done
        self._timer: asyncio.Handle | None = None  # the next _step
        self._waiting: tuple[TraceRequest, float] | None = None  # the request made, waited for: (it, its arrival)
        self._burst = 0  # due requests released one after another without a wait

    async def run(self) -> None:
        """Release the open-loop schedule; returns once every request of it is released (cancelled: nothing more is)."""
        self._loop = loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._guarded_step()
        try:
            await self._done
        finally:
            if self._timer is not None:
                self._timer.cancel()

    def _guarded_step(self) -> None:
        """_step, whose error is run()'s (a loop callback has no caller to raise to); nothing once run() ended."""
        assert self._done is not None
        if self._done.done():
            return  # cancelled between the timer and this turn
        try:
            self._step()
        except Exception as err:
            self._done.set_exception(err)

    def _step(self) -> None:
        """Release the request waited for if its arrival has come, then every request due after it, in order; then
        wait for the next one (a timer), or let the loop breathe after YIELD_EVERY due ones in a row."""
        self._timer = None
        now, loop, router = self.clock.now, self._loop, self.router
        assert loop is not None and self._done is not None
        if self._waiting is not None:
            request, due = self._waiting
            if (delay := due - now()) > 0:  # asyncio may wake a hair early: a request is never released before its arrival
                self._timer = loop.call_later(delay, loop.call_soon, self._guarded_step)
                return
            self._waiting = None
            router.release(request, due, assign_now_after=True)
            self.next_index += 1
        release, request_at, arrivals = router.release, self.table.request, self.table.arrival_s
        rows, speed = self._open, self.speed
        for index in range(self.next_index, len(rows)):  # by index: a list of a million rows would cost tens of MB
            row = rows.item(index)  # .item(i): the Python number at once, without a numpy scalar first
            due = run_seconds(arrivals.item(row), speed)
            request = request_at(row)
            if now() < due:
                self._burst = 0
                # before waiting: what was released goes to the policy (and out) now, and this request's body is made
                router.assign_now()
                router.prepare(request, due)
                self._waiting = (request, due)
                self._timer = loop.call_later(due - now(), loop.call_soon, self._guarded_step)
                return
            self._burst += 1
            if self._burst % YIELD_EVERY == 0:
                router.assign_now()
                self._waiting = (request, due)  # released on the loop's next turn
                self._timer = loop.call_soon(self._guarded_step)
                return
            release(request, due, True)  # assign_now_after: every way out of this loop calls assign_now()
            self.next_index = index + 1
        router.assign_now()
        self._schedule_done = True
        self._maybe_done()
        self._done.set_result(None)

    def _finished(self, request_id: int) -> None:
        """The router wrote the record of `request_id`: its followers are released delay_s / speed from now."""
        followers = self._followers.pop(request_id, None)
        if followers is None:
            return
        t_done = self.clock.now()
        loop = asyncio.get_running_loop()
        for row in followers:
            request = self.table.request(row)
            delay = run_seconds(request.delay_s, self.speed)  # type: ignore[arg-type]  # the reader requires delay_s
            loop.call_later(delay, self.router.guarded, self._release_follower, request, t_done + delay)

    def _release_follower(self, request: TraceRequest, due: float) -> None:
        del self._held[request.id]
        self.router.release(request, due, assign_now_after=True)
        self.router.assign_now()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self._schedule_done and not self._held:
            self.router.engine_finished()

    @property
    def unreleased(self) -> Rows:
        """Every request not released yet, in trace order (a snapshot, taken now)."""
        rows = np.concatenate((self._open[self.next_index:], np.fromiter(self._held.values(), dtype=np.int64)))
        return Rows(self.table, np.sort(rows))

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

    async def run(self) -> None:
        now = self.clock.now
        router = self.router
        release = router.release
        request_at = self.table.request
        arrivals = self.table.arrival_s
        rows = self._open
        speed = self.speed
        burst = 0
        for index in range(len(rows)):  # by index: a list of a million rows would cost tens of MB
            row = rows[index].item()
            due = run_seconds(arrivals[row].item(), speed)
            request = request_at(row)
            if now() < due:
                burst = 0
                # before waiting: what was released goes to the policy (and out) now, and this request's body is made
                router.assign_now()
                router.prepare(request, due)
                # loop: asyncio may wake a hair early; a request is never released before its arrival
                while (delay := due - now()) > 0:
                    await asyncio.sleep(delay)
            else:
                burst += 1
                if burst % YIELD_EVERY == 0:
                    router.assign_now()
                    await asyncio.sleep(0)
            release(request, due)
            self.next_index = index + 1
        router.assign_now()
        self._schedule_done = True
        self._maybe_done()

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
        self.router.release(request, due)
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

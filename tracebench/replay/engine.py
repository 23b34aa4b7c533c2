"""The engine: releases the trace's requests into the router on the trace's own schedule.

The schedule is absolute: request i is released at run start + arrival_s / speed (`run_seconds`: at --speed K the
whole run is K times compressed), by sleeping until that moment on the run clock, never by sleeping the gap since
the previous request (gaps would add up every wake-up delay: drift).
Requests whose moment has passed are released at once, in order, so a late wake-up never reorders or drops them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from tracebench.replay.clock import RunClock, run_seconds
from tracebench.replay.router import Router
from tracebench.trace.format import TraceRequest

YIELD_EVERY = 256  # a burst of due requests lets the loop breathe this often (answers keep being read)


class Engine:
    def __init__(self, requests: Sequence[TraceRequest], clock: RunClock, router: Router) -> None:
        self.requests = requests
        self.clock = clock
        self.router = router
        self.speed = router.speed
        self.next_index = 0  # requests[next_index:] are not released yet

    async def run(self) -> None:
        now = self.clock.now
        release = self.router.release
        speed = self.speed
        burst = 0
        for index, request in enumerate(self.requests):
            due = run_seconds(request.arrival_s, speed)
            if now() < due:
                burst = 0
                # loop: asyncio may wake a hair early; a request is never released before its arrival
                while (delay := due - now()) > 0:
                    await asyncio.sleep(delay)
            else:
                burst += 1
                if burst % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            release(request, due)
            self.next_index = index + 1
        self.router.engine_finished()

    @property
    def unreleased(self) -> Sequence[TraceRequest]:
        return self.requests[self.next_index:]

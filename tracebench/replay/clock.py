"""One clock per run: monotonic seconds since the run started, plus the wall-clock anchor of that start.

sglang stamps its `meta_info` with `time.time()` on the server's machine; `from_wall` converts such a stamp to the
run's clock. That is only meaningful when the server shares this machine's wall clock (launched or attached on the
same host); the run records which servers that holds for.

At `--speed K` (simulated servers K times faster) the whole run is compressed: every time given in trace seconds
(arrivals, cap schedule, batch timeout, request timeout) happens at `run_seconds(t, K)` = t / K on this clock. The
records stay on this one clock (run seconds); `tracebench report` multiplies by K (run.json `speed`).

`--clock virtual` (`VirtualRunClock`): the run's seconds are the simulated loop's (`loop.VirtualLoop`), which moves
from event to event and never reads the host's time; the in-process servers (`replay/inprocess.py`) stamp their
answers in the loop's own seconds, so `from_wall` only takes the run's start off them. `wall_start` is still the
host's wall time at the start, for run.json alone.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator


def run_seconds(trace_seconds: float, speed: float) -> float:
    """A time given in trace (simulated) seconds, on the run clock of a run at `speed` (1.0: not sped up)."""
    return trace_seconds / speed


async def ticks(clock: RunClock, interval: float, first: int = 0, phase: float = 0.0) -> AsyncIterator[float]:
    """Wake at the run times (first + phase) x interval, (first + 1 + phase) x interval, ... (absolute ticks, so the
    work done at one does not shift the next; work that outlasts a tick skips the ticks it overran rather than
    drifting). `phase` (0 <= phase < 1) shifts them within the interval: loops that each poll one of many servers take
    different phases, so that their work is spread over the interval rather than done in one burst. Yields the run
    time it woke at; the caller's loop body is the work."""
    tick = first
    while True:
        while (delay := (tick + phase) * interval - clock.now()) > 0:
            await asyncio.sleep(delay)
        yield clock.now()
        tick = max(tick + 1, math.floor(clock.now() / interval - phase) + 1)


class RunClock:
    __slots__ = ("mono_start", "wall_start")
    virtual = False  # seconds of a simulated clock (VirtualRunClock), not the host's

    def __init__(self) -> None:
        self.start()

    def start(self) -> None:
        """The run starts now (made with the clock, and again by the replay right before its engine's first step).
        Both clocks are read back to back: their offset is the anchor for every server stamp of the run."""
        self.mono_start = time.monotonic()
        self.wall_start = time.time()

    def now(self) -> float:
        """Seconds since the run started (monotonic)."""
        return time.monotonic() - self.mono_start

    def from_wall(self, wall_ts: float) -> float:
        """A `time.time()` stamp converted to seconds since the run started."""
        return wall_ts - self.wall_start


class VirtualRunClock(RunClock):
    """The run clock of a virtual-time run: the loop's simulated seconds since the run started."""

    __slots__ = ("_loop",)
    virtual = True

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.start()

    def start(self) -> None:
        self.mono_start = self._loop.time()
        self.wall_start = time.time()  # run.json's record of when it ran; no stamp is converted with it

    def now(self) -> float:
        return self._loop.time() - self.mono_start

    def from_wall(self, wall_ts: float) -> float:
        """The in-process servers stamp the loop's own seconds (inprocess.py: their wall clock starts at loop time 0)."""
        return wall_ts - self.mono_start

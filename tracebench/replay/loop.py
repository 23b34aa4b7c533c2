"""The replay's virtual event loop (--clock virtual, docs/virtual-clock.md): `VirtualLoop`, `run_virtual`, asyncio's
loop whose clock jumps from event to event. The loop on the host's clock, the replay's and the simulated server's, is
tracebench/precise_loop.py.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import selectors
from collections.abc import Callable, Coroutine
from contextvars import copy_context
from typing import Any, TypeVar

from tracebench.precise_loop import run_on

T = TypeVar("T")

POLL_EVERY = 64  # the virtual loop's turns between two looks at its real file descriptors

# asyncio's own thresholds for sweeping cancelled timers out of the heap (base_events.py): the same sweep at the same
# moments keeps the heap, and so the order of timers due at one instant, exactly as asyncio's
_MIN_SCHEDULED_TIMER_HANDLES = 100
_MIN_CANCELLED_TIMER_HANDLES_FRACTION = 0.5
# A virtual run's objects mostly die young (handles, futures, a request's record once written); collecting the young
# ones every 700 allocations (Python's default) also moved the survivors of each turn on to the older generations,
# whose collections then walked every request in flight: 1-2% of a run. A pause costs nothing on a simulated clock.
VIRTUAL_GC_YOUNG = 20_000
_new_handle = object.__new__  # a handle without its __init__ (VirtualLoop.call_soon sets every field)
# VirtualLoop.call_soon/call_at make handles themselves only where asyncio's have exactly the fields they set
# (3.10-3.14); an asyncio whose handles have others gets its own methods (the same handles, made slower), not
# half-made ones
OWN_HANDLES = {*asyncio.Handle.__slots__, *asyncio.TimerHandle.__slots__} == {
    "_callback", "_args", "_cancelled", "_loop", "_source_traceback", "_repr", "__weakref__", "_context",
    "_scheduled", "_when"}


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a simulated clock: `time()` starts at 0 and only moves when nothing is ready to run, then
    straight to the next timer. Every coroutine, timer, Event and Task behaves as on the real loop; only the waiting
    is gone, so a run takes the host the time its callbacks take, and what they compute never depends on how fast
    the host is. Callbacks run in the order asyncio runs them (FIFO for ready ones; timers by due time, those due at
    one instant in the order asyncio's heap gives), so one program gives one order, every time.

    Its turn (`_run_once`) is asyncio's, with the waiting replaced by the jump and the timers kept as `(when, handle)`
    pairs: asyncio orders its heap with TimerHandle's `__lt__`, a Python call on every comparison (~8% of a virtual
    run); a pair compares `when` in C and, at a tie, the handles as asyncio would (neither is less), so the heap and
    every order it gives are asyncio's own."""

    def __init__(self) -> None:
        super().__init__(selectors.DefaultSelector())
        # asyncio runs a timer once `when < time() + _clock_resolution` (1 ns): the clock lands exactly on `when`
        self._now = 0.0
        self._timers: list[tuple[float, asyncio.TimerHandle]] = []  # stands for asyncio's `_scheduled`
        self._turns = 0

    def time(self) -> float:
        return self._now

    # call_soon, call_later and call_at make their handles in one frame: asyncio's take four (the method, _call_soon,
    # Handle.__init__, get_debug), for the same handle with the same fields; a virtual run makes ~25 per request. In
    # debug mode (and where asyncio's handles have other fields: OWN_HANDLES) asyncio's own methods run (their checks
    # and the handle's creation traceback). call_soon and call_at fill the same fields each, inline: a shared helper
    # costs a frame per handle (bench/bench_loop_floor.py: 18.5 -> 19.5-20.4 µs a request), the frames this saves.
    def call_soon(self, callback: Callable[..., object], *args: Any, context: Any = None) -> asyncio.Handle:
        if self._debug or not OWN_HANDLES:
            return super().call_soon(callback, *args, context=context)
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = _new_handle(asyncio.Handle)
        handle._callback = callback
        handle._args = args
        handle._cancelled = False
        handle._loop = self
        handle._context = copy_context() if context is None else context
        handle._repr = None
        handle._source_traceback = None
        self._ready.append(handle)
        return handle

    def call_later(self, delay: float, callback: Callable[..., object], *args: Any,
                   context: Any = None) -> asyncio.TimerHandle:
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(self, when: float, callback: Callable[..., object], *args: Any,
                context: Any = None) -> asyncio.TimerHandle:
        if when is None:
            raise TypeError("when cannot be None")
        if self._debug or not OWN_HANDLES:
            self._check_closed()
            timer = asyncio.TimerHandle(when, callback, args, self, context)
        else:
            if self._closed:
                raise RuntimeError("Event loop is closed")
            timer = _new_handle(asyncio.TimerHandle)
            timer._callback = callback
            timer._args = args
            timer._cancelled = False
            timer._loop = self
            timer._context = copy_context() if context is None else context
            timer._repr = None
            timer._source_traceback = None
            timer._when = when
        heapq.heappush(self._timers, (when, timer))
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        timers = self._timers
        ready = self._ready
        count = len(timers)
        if count > _MIN_SCHEDULED_TIMER_HANDLES and \
                self._timer_cancelled_count / count > _MIN_CANCELLED_TIMER_HANDLES_FRACTION:
            kept = []
            for entry in timers:
                if entry[1]._cancelled:
                    entry[1]._scheduled = False
                else:
                    kept.append(entry)
            heapq.heapify(kept)
            self._timers = timers = kept
            self._timer_cancelled_count = 0
        else:
            while timers and timers[0][1]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(timers)[1]._scheduled = False
        waits = not ready and not self._stopping
        if waits and not timers:
            # nothing scheduled, nothing ready: only a signal or another thread can come; wait for it for real
            self._process_events(self._selector.select(None))
        else:
            # what can come from outside (a signal through asyncio's wake-up pipe) is looked for every POLL_EVERY
            # turns, not on each: a system call a turn was ~7% of a run's time, and a Ctrl-C is still seen at once
            self._turns += 1
            events = self._selector.select(0) if self._turns % POLL_EVERY == 0 else None
            if events:
                self._process_events(events)
            elif waits and timers[0][0] > self._now:
                self._now = timers[0][0]  # the jump: nothing is ready, so time moves to the earliest timer
        end_time = self._now + self._clock_resolution
        while timers and timers[0][0] < end_time:
            handle = heapq.heappop(timers)[1]
            handle._scheduled = False
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()
        handle = None  # breaks a cycle through an exception's traceback, as asyncio does

    def close(self) -> None:
        self._timers.clear()
        super().close()

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:
        # a thread's work would finish at a host-dependent moment of the simulated clock
        raise RuntimeError("the virtual-clock loop runs no executor work (it would make the run depend on the host)")


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """`run(main)` on a `VirtualLoop` (the replay's --clock virtual), with the collector's youngest generation
    collected every VIRTUAL_GC_YOUNG allocations instead of Python's 700 (the thresholds are put back after)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(VIRTUAL_GC_YOUNG, *thresholds[1:])
    try:
        return run_on(VirtualLoop, main)
    finally:
        gc.set_threshold(*thresholds)

"""Where does a process's event loop stall? A diagnostic for bench/bench_senders.py --probe (issue 34): put this folder
first on PYTHONPATH and set TB_PROBE_DIR; every Python process started so (the router and its spawned sender
processes) then writes TB_PROBE_DIR/probe-<pid>.json at its exit with:
- the garbage collector's pauses (gc.callbacks): count, total, p99 and max per generation;
- the asyncio callbacks that ran longer than SLOW_S (asyncio.events.Handle._run timed): count, total, and the slowest
  with what they ran;
- the loop's turns (BaseEventLoop._run_once less its wait in the selector) that ran over 1 ms;
- the process's CPU time (time.process_time), sampled every ~50 ms of loop turns;
(and `kill -USR1 PID` prints the process's Python stacks on its stderr)
each as (wall-clock time.time() at its end, milliseconds[, what]), so that a bench can keep those inside a run's window
(run.json wall_clock_start .. + t_end). Nothing is changed but the timing around each call (a few perf_counter reads
a callback)."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

_DIR = os.environ.get("TB_PROBE_DIR")
SLOW_S = 0.001

if _DIR:
    import faulthandler
    import signal

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # kill -USR1 PID: every thread's stack on stderr
    import asyncio.base_events
    import asyncio.events
    import gc
    import selectors

    _perf = time.perf_counter
    _gc_start = [0.0]
    _wall = time.time
    _gc_pauses: list[tuple[float, float, int]] = []  # (wall at its end, ms, generation)
    _slow: list[tuple[float, float, str]] = []  # (wall, ms, what)
    _long_turns: list[tuple[float, float]] = []  # (wall, ms busy)
    _turns = [0]
    _cpu: list[tuple[float, float]] = []  # (wall, this process's CPU seconds), every ~50 ms of turns
    _process_time = time.process_time
    _waited = [0.0]
    _argv = " ".join(sys.argv[:3])

    def _on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            _gc_start[0] = _perf()
        else:
            _gc_pauses.append((_wall(), (_perf() - _gc_start[0]) * 1e3, info["generation"]))

    gc.callbacks.append(_on_gc)

    _run = asyncio.events.Handle._run

    def _what(callback: object) -> str:
        """A callback's name, without repr() of the objects it is bound to: aiohttp's ClientResponse.__repr__ reads its
        `headers`, a reify that caches None when read before the response started (every later read in that request
        then failed with AttributeError "'NoneType' object has no attribute 'getall'", seen under this probe)."""
        name = getattr(callback, "__qualname__", None)
        if name is None:
            func = getattr(callback, "__func__", None) or getattr(callback, "func", None)
            name = getattr(func, "__qualname__", type(callback).__qualname__)
        owner = getattr(callback, "__self__", None)
        if owner is not None and not isinstance(owner, type):
            name = f"{type(owner).__qualname__}.{name.rpartition('.')[2]}"
            coro = getattr(owner, "get_coro", None)
            if coro is not None:  # a task's step or wake-up: the coroutine it runs
                inner = coro()
                name += f" of {getattr(inner, '__qualname__', type(inner).__qualname__)}"
        return name

    def _timed_run(self: asyncio.events.Handle) -> None:
        t0 = _perf()
        _run(self)
        took = _perf() - t0
        if took > SLOW_S:
            _slow.append((_wall(), took * 1e3, _what(self._callback)[:160]))

    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]

    _select = selectors.EpollSelector.select

    def _timed_select(self: selectors.EpollSelector, timeout: float | None = None) -> list:
        t0 = _perf()
        try:
            return _select(self, timeout)
        finally:
            _waited[0] += _perf() - t0

    selectors.EpollSelector.select = _timed_select  # type: ignore[method-assign]
    import select as _select_module

    _select_select = _select_module.select

    def _timed_select_select(*args: object) -> tuple:  # replay/loop.py's precise wait
        t0 = _perf()
        try:
            return _select_select(*args)  # type: ignore[arg-type]
        finally:
            _waited[0] += _perf() - t0

    _select_module.select = _timed_select_select  # type: ignore[assignment]
    _run_once = asyncio.base_events.BaseEventLoop._run_once

    def _timed_run_once(self: asyncio.base_events.BaseEventLoop) -> None:
        _waited[0] = 0.0
        t0 = _perf()
        _run_once(self)
        busy = _perf() - t0 - _waited[0]
        _turns[0] += 1
        now = _wall()
        if busy > 0.001:
            _long_turns.append((now, busy * 1e3))
        if not _cpu or now - _cpu[-1][0] > 0.05:
            _cpu.append((now, _process_time()))

    asyncio.base_events.BaseEventLoop._run_once = _timed_run_once  # type: ignore[method-assign]

    def _write() -> None:
        if not _turns[0]:
            return  # a process without an event loop (a helper): nothing to say
        out = {"pid": os.getpid(), "argv": _argv, "turns": _turns[0], "gc": _gc_pauses, "slow_callbacks": _slow,
               "long_turns": _long_turns,
               "cpu": _cpu}
        with open(os.path.join(_DIR, f"probe-{os.getpid()}.json"), "w") as fh:
            json.dump(out, fh)

    atexit.register(_write)

"""asyncio's event loop with timers that wake when they are due rather than up to 1 ms later, for every process of
tracebench that keeps time on the host: the replay's client and the simulated sglang server.

asyncio sleeps in `epoll_wait`, whose timeout is whole milliseconds: Python's selector rounds every wait up to the
next millisecond (`selectors.EpollSelector.select`), so a timer due in 2.3 ms wakes after 3 ms. That put 0-1 ms of
release lag on every request (p50 ~0.5 ms, p99 ~1 ms before any other cause; seen on H100 hosts at 3 req/s:
release lag p50 0.6-0.7 ms), and as much lag on every step of the simulated server. Here the wait is `select()` on
the epoll descriptor itself, whose timeout is in microseconds (the kernel's timer slack, 50 µs by default, is what
remains); the events are then collected with a zero-timeout `epoll_wait`. A wait of a millisecond or more ends
awake: its last 0.2 ms polls (SPIN_S, below), so that the core is not asleep when the timer is due. Nothing else
changes: the same selector, the same loop, every callback, timer and transport as asyncio's. docs/overhead.md has the
figures.
"""

from __future__ import annotations

import asyncio
import os
import select
import selectors
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_FD_SETSIZE = 1024  # select() takes descriptors below this only
# The last SPIN_S of a wait of SPIN_AFTER_S or more is spent awake, polling: a core that sleeps a millisecond or more
# drops into a deep idle state and a low clock, and waking it took ~0.1 ms on each timer of a quiet 16-core host
# (2026-11-29, GPU machine's idle CPUs: the replay's release lag p50 0.157 -> 0.046 ms, the simulator's first token
# handed out 0.18 -> 0.07 ms late; beside real sglang, whose processes keep the cores awake, 0.04 ms either way). Each poll yields the core: a process that wants it gets it. Shorter waits are a
# busy loop's: its core stays awake. Only while the host has a core to spare (`spare_core`, looked at every
# LOAD_CHECK_S): on a busy one the cores do not sleep, and polls would only take CPU from the work that keeps them busy
# (the 2-core machine running the test suite, the simulated servers beside the client).
SPIN_S = 0.0002
SPIN_AFTER_S = 0.001
LOAD_CHECK_S = 1.0


def spare_core(load_1min: float, cpus: int) -> bool:
    """Whether a host with this 1-minute load average and this many usable CPUs has a core to spare (a waiting
    process's core would go to sleep)."""
    return load_1min + 1.0 <= cpus


if hasattr(selectors, "EpollSelector"):

    class PreciseEpollSelector(selectors.EpollSelector):
        """An epoll selector whose waits end within the kernel's timer slack of their timeout, not up to 1 ms later,
        awake for the last SPIN_S of a longer wait."""

        def __init__(self) -> None:
            super().__init__()
            fd = self.fileno()
            if fd >= _FD_SETSIZE:  # made with the loop, before any connection: a low number unless fds leak
                raise RuntimeError(f"the event loop's epoll descriptor is {fd}, beyond select()'s limit of "
                                   f"{_FD_SETSIZE}: too many files open before the replay started")
            self._wait_on = [fd]
            self._cpus = len(os.sched_getaffinity(0))
            self._awake_ends = False   # _ends_awake's last answer
            self._next_load_check = 0.0

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is None or timeout <= 0:
                return super().select(timeout)
            if timeout >= SPIN_AFTER_S and self._ends_awake():
                end = time.monotonic() + timeout  # the loop's clock (asyncio's loop.time())
                if not select.select(self._wait_on, (), (), timeout - SPIN_S)[0]:
                    return self.poll_until(end)
            else:
                # readable when an event is ready; PEP 475 retries an interrupted wait, and a signal wakes the loop
                # through asyncio's wake-up pipe, which is registered here like any reader
                select.select(self._wait_on, (), (), timeout)
            return super().select(0)

        def _ends_awake(self) -> bool:
            """Whether a long wait ends awake now (spare_core, looked at every LOAD_CHECK_S)."""
            now = time.monotonic()
            if now >= self._next_load_check:
                self._awake_ends = spare_core(os.getloadavg()[0], self._cpus)
                self._next_load_check = now + LOAD_CHECK_S
            return self._awake_ends

        def poll_until(self, end: float) -> list[tuple[selectors.SelectorKey, int]]:
            """The awake end of a wait (SPIN_S): the events as soon as one is ready, else none at `end` (monotonic)."""
            poll = super().select
            while True:
                events = poll(0)
                if events or time.monotonic() >= end:
                    return events
                os.sched_yield()

    def new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop(PreciseEpollSelector())

else:  # no epoll (not Linux): asyncio's own loop; tracebench's figures are for Linux hosts

    def new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the precise loop (same semantics: Ctrl-C cancels `main`, the loop is closed after)."""
    return run_on(new_loop, main)


def run_on(loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop `loop_factory` makes."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(main)
    loop = loop_factory()  # Python 3.10: asyncio.run's steps, by hand
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:
        try:
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

"""The replay's event loop: asyncio's own, with timers that wake when they are due rather than up to 1 ms later.

asyncio sleeps in `epoll_wait`, whose timeout is whole milliseconds: Python's selector rounds every wait up to the
next millisecond (`selectors.EpollSelector.select`), so a timer due in 2.3 ms wakes after 3 ms. That put 0-1 ms of
release lag on every request (p50 ~0.5 ms, p99 ~1 ms before any other cause; seen on H100 hosts at 3 req/s:
release lag p50 0.6-0.7 ms). Here the wait is `select()` on the epoll descriptor itself, whose timeout is in
microseconds (the kernel's timer slack, 50 µs by default, is what remains); the events are then collected with a
zero-timeout `epoll_wait`. One more system call per wake-up, no busy waiting, nothing else changes: the same
selector, the same loop, every callback, timer and transport as asyncio's. docs/overhead.md has the figures.
"""

from __future__ import annotations

import asyncio
import select
import selectors
import sys
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

_FD_SETSIZE = 1024  # select() takes descriptors below this only


if hasattr(selectors, "EpollSelector"):

    class PreciseEpollSelector(selectors.EpollSelector):
        """An epoll selector whose waits end within the kernel's timer slack of their timeout, not up to 1 ms later."""

        def __init__(self) -> None:
            super().__init__()
            fd = self.fileno()
            if fd >= _FD_SETSIZE:  # made with the loop, before any connection: a low number unless fds leak
                raise RuntimeError(f"the event loop's epoll descriptor is {fd}, beyond select()'s limit of "
                                   f"{_FD_SETSIZE}: too many files open before the replay started")
            self._wait_on = [fd]

        def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            if timeout is not None and timeout > 0:
                # readable when an event is ready; PEP 475 retries an interrupted wait, and a signal wakes the loop
                # through asyncio's wake-up pipe, which is registered here like any reader
                select.select(self._wait_on, (), (), timeout)
                timeout = 0
            return super().select(timeout)

    def new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.SelectorEventLoop(PreciseEpollSelector())

else:  # no epoll (not Linux): asyncio's own loop; tracebench's figures are for Linux hosts

    def new_loop() -> asyncio.AbstractEventLoop:
        return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the precise loop (same semantics: Ctrl-C cancels `main`, the loop is closed after)."""
    return _run_on(new_loop, main)


def _run_on(loop_factory: Callable[[], asyncio.AbstractEventLoop], main: Coroutine[Any, Any, T]) -> T:
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


POLL_EVERY = 64  # the virtual loop's turns between two looks at its real file descriptors


class _JumpSelector(selectors.BaseSelector):
    """The virtual loop's selector: real readiness is checked without waiting; a wait for a timer is not a wait at all:
    the loop's clock jumps to the earliest timer. Only a wait with no timer at all (nothing scheduled, nothing ready:
    a signal or another thread is all that can come) blocks for real."""

    def __init__(self, loop_ref: list[VirtualLoop]) -> None:
        self._real = selectors.DefaultSelector()
        self._loop_ref = loop_ref
        self._turns = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._real.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._real.modify(fileobj, events, data)

    def get_map(self) -> Any:
        return self._real.get_map()

    def close(self) -> None:
        self._real.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            return self._real.select(None)
        # what can come from outside (a signal through asyncio's wake-up pipe) is looked for every POLL_EVERY turns,
        # not on each: a system call a turn was ~7% of a run's time, and a Ctrl-C is still seen at once by a person
        self._turns += 1
        if self._turns % POLL_EVERY == 0 and (ready := self._real.select(0)):
            return ready
        if timeout > 0:
            self._loop_ref[0].jump()
        return []


class VirtualLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on a simulated clock: `time()` starts at 0 and only moves when nothing is ready to run, then
    straight to the next timer (asyncio's own heap of timers decides which). Every coroutine, timer, Event and Task
    behaves as on the real loop; only the waiting is gone, so a run takes the host the time its callbacks take, and
    what they compute never depends on how fast the host is. Callbacks run in the order asyncio runs them (FIFO for
    ready ones, by due time and then scheduling order for timers), so one program gives one order, every time."""

    def __init__(self) -> None:
        ref: list[VirtualLoop] = []
        super().__init__(_JumpSelector(ref))
        ref.append(self)
        # asyncio runs a timer once `when < time() + _clock_resolution` (1 ns): the clock lands exactly on `when`
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def jump(self) -> None:
        """Move the clock to the earliest live timer (called only when nothing is ready)."""
        scheduled = self._scheduled  # asyncio's heap of TimerHandles (cancelled ones at the head were dropped)
        if scheduled:
            when = scheduled[0].when()
            if when > self._now:
                self._now = when

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> Any:
        # a thread's work would finish at a host-dependent moment of the simulated clock
        raise RuntimeError("the virtual-clock loop runs no executor work (it would make the run depend on the host)")


def run_virtual(main: Coroutine[Any, Any, T]) -> T:
    """`run(main)` on a `VirtualLoop` (the replay's --clock virtual)."""
    return _run_on(VirtualLoop, main)

"""The precise loop's selector (tracebench/precise_loop.py): a wait ends at its timeout, not up to 1 ms later, or as
soon as an event is ready, whether it sleeps, ends awake (its last SPIN_S polls) or is too short to end awake."""

from __future__ import annotations

import selectors
import socket
import sys
import time
from collections.abc import Iterator

import pytest

from tracebench import precise_loop

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the precise selector is epoll's")

# waits of each length select() tells apart: too short to end awake, just long enough (awake at its end on a host with
# a core to spare), and long
TIMEOUTS = (precise_loop.SPIN_AFTER_S / 2, precise_loop.SPIN_AFTER_S + precise_loop.SPIN_S / 2, 0.02)


@pytest.fixture
def watched() -> Iterator[tuple[precise_loop.PreciseEpollSelector, selectors.SelectorKey, socket.socket]]:
    """A precise selector watching one end of a socket pair for reading: (it, the end's key, the other end)."""
    selector = precise_loop.PreciseEpollSelector()
    a, b = socket.socketpair()
    try:
        yield selector, selector.register(a, selectors.EVENT_READ), b
    finally:
        selector.close()
        a.close()
        b.close()


def test_a_wait_with_nothing_ready_ends_at_its_timeout(watched) -> None:
    selector, _, _ = watched
    for timeout in TIMEOUTS:
        start = time.monotonic()
        assert selector.select(timeout) == []
        waited = time.monotonic() - start
        assert waited >= timeout
        assert waited < timeout + 0.05  # asyncio's own selector would round it up to the next millisecond at least


def test_a_ready_event_ends_the_wait_at_once(watched) -> None:
    # ready before the wait, whatever its length (the polls of a wait that ends awake see it as the sleep does)
    selector, key, writer = watched
    writer.send(b"x")
    for timeout in (*TIMEOUTS, 10.0):
        start = time.monotonic()
        assert selector.select(timeout) == [(key, selectors.EVENT_READ)]
        assert time.monotonic() - start < 0.5


def test_the_awake_end_of_a_wait_returns_an_event_as_soon_as_it_is_ready(watched) -> None:
    selector, key, writer = watched
    start = time.monotonic()
    assert selector.poll_until(start + 0.003) == []
    assert time.monotonic() - start >= 0.003
    writer.send(b"x")
    start = time.monotonic()
    assert selector.poll_until(start + 10.0) == [(key, selectors.EVENT_READ)]
    assert time.monotonic() - start < 0.5


def test_a_long_wait_ends_awake_only_with_a_core_to_spare() -> None:
    # a host whose 1-minute load leaves a core idle: its cores sleep, so a long wait's end polls; a busy one: no polls
    # (they would take CPU from the work that keeps its cores busy)
    assert precise_loop.spare_core(0.4, 16) and precise_loop.spare_core(1.0, 2)
    assert not precise_loop.spare_core(1.2, 2) and not precise_loop.spare_core(5.0, 4)

"""Helpers shared by the built-in policies (not part of the public API)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from tracebench.policies.base import Assignment, QueuedRequest, ServerView

N = TypeVar("N", int, float)


class SlotTally:
    """Free slots and in-flight counts per server during one `assign` call, counting the call's own picks.

    A ServerView is a snapshot taken before the call; a policy that assigns several requests in one call must count
    what it already handed out, or it would overfill a server.
    """

    __slots__ = ("servers", "free", "in_flight", "_open")

    def __init__(self, servers: Sequence[ServerView]) -> None:
        self.servers = list(servers)
        self.free = {s.index: s.free_slots for s in servers}
        self.in_flight = {s.index: s.in_flight for s in servers}
        self._open: list[ServerView] | None = None  # open_servers() until a server fills up (take)

    def open_servers(self) -> list[ServerView]:
        """Servers that can take one more request now (healthy and under their cap), in the given order. The same
        list until a take() fills a server (made once per call, not once per request: a fleet's every server)."""
        if self._open is None:
            free = self.free
            self._open = [s for s in self.servers if free[s.index] > 0]
        return self._open

    def take(self, server: ServerView) -> None:
        self.free[server.index] -= 1
        self.in_flight[server.index] += 1
        if self.free[server.index] <= 0:
            self._open = None


Chooser = Callable[[QueuedRequest, list[ServerView], SlotTally], ServerView]


def assign_in_order(requests: Iterable[QueuedRequest], servers: Sequence[ServerView], choose: Chooser) -> list[Assignment]:
    """Hand out `requests` in the order given, each to `choose(request, open_servers, tally)`, until no server has a
    free slot; the rest wait at the router. The loop every built-in shares: they differ only in the order and the
    choice."""
    tally, picks = SlotTally(servers), []
    for req in requests:
        open_servers = tally.open_servers()
        if not open_servers:
            break  # the rest wait at the router
        server = choose(req, open_servers, tally)
        picks.append((req, server))
        tally.take(server)
    return picks


def least_loaded(_: QueuedRequest, open_servers: list[ServerView], tally: SlotTally) -> ServerView:
    """The open server with the fewest requests in flight (this call's picks counted); ties: lowest index."""
    return min(open_servers, key=lambda s: (tally.in_flight[s.index], s.index))


def parse_choice(*choices: str) -> Callable[[str], str]:
    """A parser accepting exactly one of `choices`."""

    def parse(raw: str) -> str:
        if raw not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return raw

    return parse


def parse_bounded(kind: Callable[[str], N], low: N, high: N | None = None) -> Callable[[str], N]:
    """A parser for a finite `kind` (int or float) within [low, high] (no upper bound when `high` is None)."""
    expected = f"expected {'an integer' if kind is int else 'a finite number'} " + (f">= {low}" if high is None else f"in [{low}, {high}]")

    def parse(raw: str) -> N:
        value = kind(raw)
        if not (math.isfinite(value) and value >= low and (high is None or value <= high)):
            raise ValueError(expected)
        return value

    return parse

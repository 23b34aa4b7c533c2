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
    what it already handed out, or it would overfill a server. Only this call's picks are kept per call (`taken`);
    `free` and `in_flight` (every server, by index) are made when first read: a policy that looks at one server
    (round_robin's turn) does not pay for a fleet's every server at every call.
    """

    __slots__ = ("servers", "taken", "_free", "_in_flight", "_open")

    def __init__(self, servers: Sequence[ServerView]) -> None:
        self.servers = servers
        self.taken: dict[int, int] = {}  # server index -> requests this call gave it
        self._free: dict[int, int] | None = None
        self._in_flight: dict[int, int] | None = None
        self._open: list[ServerView] | None = None  # open_servers() until a server fills up (take)

    @property
    def free(self) -> dict[int, int]:
        """Free slots per server index, this call's picks taken off."""
        if self._free is None:
            taken = self.taken
            self._free = {s.index: s.free_slots - taken.get(s.index, 0) for s in self.servers}
        return self._free

    @property
    def in_flight(self) -> dict[int, int]:
        """Requests in flight per server index, this call's picks counted."""
        if self._in_flight is None:
            taken = self.taken
            self._in_flight = {s.index: s.in_flight + taken.get(s.index, 0) for s in self.servers}
        return self._in_flight

    def free_of(self, server: ServerView) -> int:
        """Free slots of one server, this call's picks taken off."""
        return server.free_slots - self.taken.get(server.index, 0)

    def open_servers(self) -> list[ServerView]:
        """Servers that can take one more request now (healthy and under their cap), in the given order. The same
        list until a take() fills a server (made once per call, not once per request: a fleet's every server)."""
        if self._open is None:
            taken = self.taken
            self._open = ([s for s in self.servers if s.free_slots > 0] if not taken else
                          [s for s in self.servers if s.free_slots > taken.get(s.index, 0)])
        return self._open

    def take(self, server: ServerView) -> None:
        index = server.index
        taken = self.taken[index] = self.taken.get(index, 0) + 1
        if self._free is not None:
            self._free[index] -= 1
        if self._in_flight is not None:
            self._in_flight[index] += 1
        if server.free_slots <= taken:
            self._open = None


# (request, tally) -> the server for the request, or None when no server has a free slot
Chooser = Callable[[QueuedRequest, SlotTally], "ServerView | None"]
# (request, the open servers (never empty), tally) -> one of them
OpenChooser = Callable[[QueuedRequest, list[ServerView], SlotTally], ServerView]


def among_open(choose: OpenChooser) -> Chooser:
    """A Chooser that asks `choose` among the open servers, and None when there is none."""

    def chooser(req: QueuedRequest, tally: SlotTally) -> ServerView | None:
        open_servers = tally.open_servers()
        return choose(req, open_servers, tally) if open_servers else None

    return chooser


def assign_in_order(requests: Iterable[QueuedRequest], servers: Sequence[ServerView], choose: Chooser) -> list[Assignment]:
    """Hand out `requests` in the order given, each to `choose(request, tally)`, until it finds no server with a
    free slot (None); the rest wait at the router. The loop every built-in shares: they differ only in the order and
    the choice."""
    tally, picks = SlotTally(servers), []
    for req in requests:
        server = choose(req, tally)
        if server is None:
            break  # the rest wait at the router
        picks.append((req, server))
        tally.take(server)
    return picks


def _load(s: ServerView) -> tuple[int, int]:
    return s.in_flight, s.index


def least_loaded(_: QueuedRequest, open_servers: list[ServerView], tally: SlotTally) -> ServerView:
    """The open server with the fewest requests in flight (this call's picks counted); ties: lowest index."""
    taken = tally.taken
    if not taken:  # the call's first pick: the views' own counts
        return min(open_servers, key=_load)
    return min(open_servers, key=lambda s: (s.in_flight + taken.get(s.index, 0), s.index))


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

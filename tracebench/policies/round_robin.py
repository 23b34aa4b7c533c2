"""`round_robin`: servers in turn, skipping those that are full or unhealthy."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from tracebench.policies._common import SlotTally, assign_in_order
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


_index = attrgetter("index")


class RoundRobinPolicy(Policy):
    name = "round_robin"
    description = "servers in turn (0, 1, 2, 0, ...), skipping a full or unhealthy one"

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self._next_index = 0  # server index whose turn it is

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        return assign_in_order(queue, servers, self._next_in_turn)  # oldest first

    def _next_in_turn(self, _req: QueuedRequest, open_servers: list[ServerView], _tally: SlotTally) -> ServerView:
        # the first open server at or after the one whose turn it is, wrapping around (open_servers is in the order
        # the router gives, by index: a binary search, not a look at every server for every request)
        at = bisect_left(open_servers, self._next_index, key=_index)
        server = open_servers[at] if at < len(open_servers) else open_servers[0]
        self._next_index = server.index + 1  # past the last index: the search above wraps to the lowest
        return server

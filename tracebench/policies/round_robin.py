"""`round_robin`: servers in turn, skipping those that are full or unhealthy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracebench.policies._common import SlotTally, assign_in_order
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class RoundRobinPolicy(Policy):
    name = "round_robin"
    description = "servers in turn (0, 1, 2, 0, ...), skipping a full or unhealthy one"

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self._next_index = 0  # server index whose turn it is

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        return assign_in_order(queue, servers, self._next_in_turn)  # oldest first

    def _next_in_turn(self, _req: QueuedRequest, open_servers: list[ServerView], _tally: SlotTally) -> ServerView:
        # the open server with the lowest index at or after the one whose turn it is, else (wrapping around) the
        # lowest index of all; one pass, in whatever order the servers come (a fleet of 1,024 asks this per request)
        turn = self._next_index
        after = lowest = None
        for s in open_servers:
            index = s.index
            if index >= turn:
                if after is None or index < after.index:
                    after = s
            elif lowest is None or index < lowest.index:
                lowest = s
        server = after if after is not None else lowest
        assert server is not None  # assign_in_order asks only when a server is open
        self._next_index = server.index + 1  # past the last index: the next call wraps to the lowest
        return server

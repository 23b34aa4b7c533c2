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
        # the first open server at or after the one whose turn it is, wrapping around
        server = min(open_servers, key=lambda s: (s.index < self._next_index, s.index))
        self._next_index = server.index + 1  # past the last index: the min() above wraps to the lowest
        return server

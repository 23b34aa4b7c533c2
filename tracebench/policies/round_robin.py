"""`round_robin`: servers in turn, skipping those that are full or unhealthy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracebench.policies._common import SlotTally, assign_in_order
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class RoundRobinPolicy(Policy):
    name = "round_robin"
    description = "servers in turn (0, 1, 2, 0, ...), skipping a full or unhealthy one"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self._next_index = 0  # server index whose turn it is

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        return assign_in_order(queue, servers, self._next_in_turn)  # oldest first

    def _next_in_turn(self, _req: QueuedRequest, tally: SlotTally) -> ServerView | None:
        """The open server with the lowest index at or after the one whose turn it is, else (wrapping around) the
        lowest index of all; None when none is open."""
        turn, servers = self._next_index, tally.servers
        # the router gives the servers in index order: the one whose turn it is is usually open (no cap), and found
        # without a look at the others (a fleet of 1,024 asks this per request)
        if turn < len(servers) and (server := servers[turn]).index == turn and tally.free_of(server) > 0:
            self._next_index = turn + 1
            return server
        # one pass over the open servers, in whatever order they come
        after = lowest = None
        for s in tally.open_servers():
            index = s.index
            if index >= turn:
                if after is None or index < after.index:
                    after = s
            elif lowest is None or index < lowest.index:
                lowest = s
        server = after if after is not None else lowest
        if server is not None:
            self._next_index = server.index + 1  # past the last index: the next call wraps to the lowest
        return server

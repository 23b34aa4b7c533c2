"""`least_outstanding`: each request to the server with the fewest requests in flight."""

from __future__ import annotations

from collections.abc import Sequence

from tracebench.policies._common import SlotTally
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class LeastOutstandingPolicy(Policy):
    name = "least_outstanding"
    description = "each request to the server with the fewest requests in flight (ties: lowest index)"

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        tally, picks = SlotTally(servers), []
        for req in queue:  # oldest first
            open_servers = tally.open_servers()
            if not open_servers:
                break  # the rest wait at the router
            server = min(open_servers, key=lambda s: (tally.in_flight[s.index], s.index))
            picks.append((req, server))
            tally.take(server)
        return picks

"""`random`: each request to a server drawn uniformly from those with a free slot."""

from __future__ import annotations

from collections.abc import Sequence

from tracebench.policies._common import SlotTally
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class RandomPolicy(Policy):
    name = "random"
    description = "each request to a server drawn uniformly (seeded) among those with a free slot"

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        tally, picks = SlotTally(servers), []
        for req in queue:  # oldest first
            open_servers = tally.open_servers()
            if not open_servers:
                break  # the rest wait at the router
            server = open_servers[int(self.rng.integers(len(open_servers)))]
            picks.append((req, server))
            tally.take(server)
        return picks

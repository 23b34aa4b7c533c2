"""`random`: each request to a server drawn uniformly from those with a free slot."""

from __future__ import annotations

from collections.abc import Sequence

from tracebench.policies._common import SlotTally, among_open, assign_in_order
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class RandomPolicy(Policy):
    name = "random"
    description = "each request to a server drawn uniformly (seeded) among those with a free slot"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        return assign_in_order(queue, servers, among_open(self._draw))

    def _draw(self, _req: QueuedRequest, open_servers: list[ServerView], _tally: SlotTally) -> ServerView:
        return open_servers[int(self.rng.integers(len(open_servers)))]

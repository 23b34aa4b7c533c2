"""`least_outstanding`: each request to the server with the fewest requests in flight."""

from __future__ import annotations

from collections.abc import Sequence

from tracebench.policies._common import among_open, assign_in_order, least_loaded
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class LeastOutstandingPolicy(Policy):
    name = "least_outstanding"
    description = "each request to the server with the fewest requests in flight (ties: lowest index)"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        return assign_in_order(queue, servers, among_open(least_loaded))  # oldest first

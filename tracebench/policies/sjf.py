"""`sjf`: shortest job first. The shortest queued request goes first, to the least loaded server with a free slot.

It differs from first-come-first-served only when requests wait at the router, i.e. when the servers are at their
cap (`--max-running-requests`): with free slots everywhere every request is sent the moment it arrives.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from tracebench.policies._common import among_open, assign_in_order, least_loaded, parse_choice
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class ShortestJobFirstPolicy(Policy):
    name = "sjf"
    description = "shortest queued request first (by output_len, or input_len with key=input), to the least loaded server"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)
    options_help = {"key": "output (default): order by output_len; input: order by input_len (--sjf-key input)"}

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self.key = self.option("key", "output", parse_choice("output", "input"))

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        total_free = sum(s.free_slots for s in servers)
        if total_free == 0:
            return []  # everything waits at the router
        by_input = self.key == "input"

        def job_size(r: QueuedRequest) -> tuple[int, float, int]:
            # ties keep arrival order (oldest first), then id, so the order is total and deterministic
            return (r.input_len if by_input else r.output_len, r.t_released, r.id)

        # only the `total_free` shortest can go now; a long queue at the cap is not sorted in full on every call
        ordered = sorted(queue, key=job_size) if total_free >= len(queue) else heapq.nsmallest(total_free, queue, key=job_size)
        return assign_in_order(ordered, servers, among_open(least_loaded))

"""An example routing policy: copy this file, rename the class, change `assign`.

Run it (two simulated GPUs, each server capped at 4 running requests):

    tracebench replay trace.jsonl --gpus 2 --backend sim --max-running-requests 4 \
        --policy policies/example_least_loaded.py:LeastLoaded

(`--policy example_least_loaded` works too: a file in policies/ holding exactly one Policy subclass can be named
by its stem.) The whole API, and where every number comes from: docs/policies.md.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracebench.policies import Policy, QueuedRequest, ServerView


class LeastLoaded(Policy):
    """Each waiting request to the healthy server with the fewest requests in flight, counting the requests the
    server says are waiting in its own queue too (when it has reported them)."""

    # `name` is what runs and reports show (and the default run name uses); `description` is the line
    # `tracebench policies` prints. Both are required.
    name = "least_loaded"
    description = "fewest in flight plus the server's own reported waiting queue"

    # Options this policy accepts: `--policy-opt waiting_weight=2`. Any other key is refused when the run starts.
    options_help = {"waiting_weight": "how much a request waiting inside the server counts (default 1.0)"}

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)  # sets self.rng (seeded numpy Generator), self.options, self.now
        # self.option(key, default, parse): the parsed value, or the default when not given; a ValueError from
        # `parse` stops the run with a message naming the option.
        self.waiting_weight = self.option("waiting_weight", 1.0, float)

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[tuple[QueuedRequest, ServerView]]:
        """Called by the router when a request arrives, when a slot frees and after a cap change.

        `queue`: the requests waiting at the router, oldest first (id, input_len, output_len, t_arrival,
        t_released). Read it; do not change it.
        `servers`: one read-only ServerView per server (index, url, healthy, in_flight, cap, free_slots, observed
        latency/throughput, and `reported`: the server's last /v1/loads numbers, or None before the first one).

        Return (request, server) pairs to dispatch now. The router checks the rules and stops the run with a
        PolicyError if one is broken:
          - each request at most once, and only requests from `queue`;
          - only healthy servers;
          - never more requests to a server than its `free_slots` (cap minus in flight).
        Whatever you do not return stays queued, and you will be asked again when something changes.
        """
        # The views are a snapshot taken before this call: count what this call hands out, or a server would be
        # given more than its free slots.
        free = {s.index: s.free_slots for s in servers}  # 0 for an unhealthy or full server
        load = {s.index: self.load(s) for s in servers}
        picks: list[tuple[QueuedRequest, ServerView]] = []
        for request in queue:  # oldest first: first come, first served
            open_servers = [s for s in servers if free[s.index] > 0]
            if not open_servers:
                break  # every server is full: the rest wait at the router
            best = min(open_servers, key=lambda s: (load[s.index], s.index))  # ties: the lowest index
            picks.append((request, best))
            free[best.index] -= 1
            load[best.index] += 1
        return picks

    def load(self, server: ServerView) -> float:
        """Requests in flight, plus the server's own waiting queue when it has reported one.

        `reported` is None until the server's first load report arrived: then there is no waiting queue to add,
        and the router's in-flight count (always exact for tracebench's own requests) is all we have.
        """
        if server.reported is None:
            return float(server.in_flight)
        return server.in_flight + self.waiting_weight * server.reported.num_waiting_reqs

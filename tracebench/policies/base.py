"""The routing policy API. A policy sees the router queue and a read-only view of each server and returns
assignments; everything it does not assign stays queued. Guide: docs/policies.md.

    from tracebench.policies import Policy, QueuedRequest, ServerView

    class ShortestQueueFirst(Policy):
        name = "shortest_queue"
        description = "each waiting request to the server with the fewest requests in flight"

        def assign(self, queue, servers):
            picks, load = [], {s.index: s.in_flight for s in servers}
            for req in queue:                       # oldest first
                free = [s for s in servers if s.healthy and load[s.index] < s.cap]
                if not free:
                    break                           # the rest wait at the router
                best = min(free, key=lambda s: load[s.index])
                picks.append((req, best))
                load[best.index] += 1
            return picks
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

UNCAPPED = 1 << 30  # the cap a server has when none was set


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request waiting in the router queue (made once, when it enters). Time waited so far:
    `policy.now - req.t_released`."""

    id: int
    input_len: int
    output_len: int
    t_arrival: float  # scheduled arrival, seconds since run start
    t_released: float  # when it entered the router queue


@dataclass(frozen=True, slots=True)
class ReportedLoad:
    """What the server itself last reported (sglang `/v1/loads`), and how old that report is (seconds)."""

    num_running_reqs: int
    num_waiting_reqs: int
    token_usage: float
    gen_throughput: float
    age: float


@dataclass(frozen=True, slots=True)
class ServerView:
    """A read-only snapshot of one server, taken when `assign` is called.

    `in_flight` counts requests tracebench has sent and not yet seen finish; `cap` is the router cap in force
    (UNCAPPED when none). The observed figures are over tracebench's recent window of this server's completions
    (None until there is one). `reported` is None until the server's first load report arrived.
    """

    index: int
    url: str
    healthy: bool
    in_flight: int
    cap: int
    completed_per_s: float
    latency_p50: float | None
    latency_p90: float | None
    ttft_p50: float | None
    reported: ReportedLoad | None

    @property
    def free_slots(self) -> int:
        """How many more requests the router may send here now (0 when at or over the cap, or unhealthy)."""
        return max(0, self.cap - self.in_flight) if self.healthy else 0


Assignment = tuple[QueuedRequest, ServerView]


class Policy:
    """Base class of routing policies.

    Subclasses set `name` and `description` and implement `assign`. The router calls `assign` when a request
    arrives and when a slot frees (and after a cap change). Rules, checked by the router (a violation stops the
    run with a PolicyError naming the policy): each request at most once, only requests from `queue`, only healthy
    servers, never more requests to a server than its `free_slots`.

    `self.rng` is a numpy Generator seeded from the run's seed: a random policy makes the same choices for the
    same run. `self.options` holds the `--policy-opt key=value` options given on the command line (strings).
    `self.now` is the run clock (seconds since start) at the moment `assign` is called. `queue` is the router's
    own queue, oldest first: read it, never change it.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        self.rng = rng
        self.options: dict[str, str] = dict(options or {})
        self.now = 0.0

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        raise NotImplementedError(f"{type(self).__name__}.assign")

    def on_complete(self, request_id: int, server_index: int, ok: bool) -> None:
        """Called when a dispatched request finished (ok or not). Optional; the default does nothing."""

    def describe(self) -> dict[str, Any]:
        """What run.json records about this policy."""
        return {"name": self.name, "class": f"{type(self).__module__}.{type(self).__qualname__}", "options": self.options}

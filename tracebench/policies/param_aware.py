"""`param_aware`: each request to the server with the lowest cost, scored on what the servers report and what
tracebench observed of them. The formula (docs/policies.md has the long version):

    cost(s) = w_in_flight * in_flight(s) / max in_flight            router: requests in flight (this call counted)
            + w_running   * num_running_reqs(s) / max num_running    reported (/v1/loads)
            + w_waiting   * num_waiting_reqs(s) / max num_waiting    reported: the server's own queue
            + w_usage     * token_usage(s)                           reported: KV cache in use, already 0..1
            + w_speed     * (1 - speed(s) / max speed)               reported: speed = gen_throughput / num_running_reqs
            + w_latency   * latency(s) / max latency                 observed: latency_p50, latency_p90 or ttft_p50

Every max is over the candidates (healthy servers with a free slot), so each term lies in 0..1 (a term whose max
is 0 is 0 for all). Lowest cost wins; ties go to fewer in flight, then the lowest index.

Missing values, explicitly: a term enters a decision only when *every* candidate has a value for it. `reported is
None` (no load report yet, e.g. the first requests of a run) leaves the four reported terms out of that decision
for all candidates; an idle server (num_running_reqs = 0) has no per-request speed, which leaves the speed term
out; a server with no completion in tracebench's recent window has no latency, which leaves the latency term out.
A missing number is never read as zero: that would make the server with no report look the least loaded.

`completed_per_s` is not scored: it says how much work a server was given as much as how fast it is, and at a
given load it carries what latency carries (Little's law: in_flight ~ completed_per_s * latency).
Reported numbers are a snapshot: they do not move while one call assigns several requests; in_flight does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from tracebench.policies._common import SlotTally, among_open, assign_in_order, parse_bounded, parse_choice
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView

_LATENCY_STATS: dict[str, Callable[[ServerView], float | None]] = {
    "p50": lambda s: s.latency_p50,
    "p90": lambda s: s.latency_p90,
    "ttft": lambda s: s.ttft_p50,
}


def _speed(server: ServerView) -> float | None:
    """Decode tokens/s each running request gets; None when nothing runs (no figure to read) or no report."""
    rep = server.reported
    if rep is None or rep.num_running_reqs == 0:
        return None
    return rep.gen_throughput / rep.num_running_reqs


class ParamAwarePolicy(Policy):
    name = "param_aware"
    description = "lowest weighted cost of in-flight, reported load/usage/speed and observed latency (see docs)"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    options_help = {
        "w_in_flight": "weight of the router's in-flight count (default 1.0)",
        "w_running": "weight of reported num_running_reqs (default 0.5)",
        "w_waiting": "weight of reported num_waiting_reqs, the server's own queue (default 1.0)",
        "w_usage": "weight of reported token_usage, KV cache in use 0..1 (default 1.0)",
        "w_speed": "weight of reported decode speed per running request, gen_throughput/num_running_reqs (default 0.5)",
        "w_latency": "weight of the observed latency statistic (default 0.5)",
        "latency": "observed statistic scored: p50 (default, end-to-end), p90, or ttft (ttft_p50)",
    }

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        parse_weight = parse_bounded(float, 0.0)  # finite, >= 0
        self.w_in_flight = self.option("w_in_flight", 1.0, parse_weight)
        self.w_running = self.option("w_running", 0.5, parse_weight)
        self.w_waiting = self.option("w_waiting", 1.0, parse_weight)
        self.w_usage = self.option("w_usage", 1.0, parse_weight)
        self.w_speed = self.option("w_speed", 0.5, parse_weight)
        self.w_latency = self.option("w_latency", 0.5, parse_weight)
        self.latency_stat = _LATENCY_STATS[self.option("latency", "p50", parse_choice(*_LATENCY_STATS))]

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        def cheapest(_: QueuedRequest, candidates: list[ServerView], tally: SlotTally) -> ServerView:
            costs = self.costs(candidates, tally.in_flight)
            return min(candidates, key=lambda s: (costs[s.index], tally.in_flight[s.index], s.index))

        return assign_in_order(queue, servers, among_open(cheapest))  # oldest first

    def costs(self, candidates: Sequence[ServerView], in_flight: dict[int, int]) -> dict[int, float]:
        """Cost per candidate server index (lower is better), as in the module docstring."""
        cost = {s.index: 0.0 for s in candidates}

        def add_lower_better(weight: float, values: list[float | None]) -> None:
            if weight == 0.0 or any(v is None for v in values):
                return  # a term enters only when every candidate has a value
            top = max(values)  # type: ignore[type-var]
            if top > 0:
                for s, v in zip(candidates, values):
                    cost[s.index] += weight * v / top  # type: ignore[operator]

        add_lower_better(self.w_in_flight, [float(in_flight[s.index]) for s in candidates])
        reports = [s.reported for s in candidates]
        if all(r is not None for r in reports):
            add_lower_better(self.w_running, [float(r.num_running_reqs) for r in reports])  # type: ignore[union-attr]
            add_lower_better(self.w_waiting, [float(r.num_waiting_reqs) for r in reports])  # type: ignore[union-attr]
            for s, r in zip(candidates, reports):
                cost[s.index] += self.w_usage * r.token_usage  # type: ignore[union-attr]
            speeds = [_speed(s) for s in candidates]
            if self.w_speed > 0 and all(v is not None for v in speeds):
                fastest = max(speeds)  # type: ignore[type-var]
                if fastest > 0:
                    for s, v in zip(candidates, speeds):
                        cost[s.index] += self.w_speed * (1.0 - v / fastest)  # type: ignore[operator]
        add_lower_better(self.w_latency, [self.latency_stat(s) for s in candidates])
        return cost

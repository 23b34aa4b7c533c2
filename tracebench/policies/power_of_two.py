"""`power_of_two`: the power of two choices (as in sglang's model gateway). Draw two distinct servers with a free
slot at random and send the request to the less loaded of the pair.

"Less loaded": fewer requests in flight (the router's own count, which includes this call's earlier picks); on a
tie, the lower reported load (`num_running_reqs + num_waiting_reqs`, then `token_usage`) when *both* servers have
a report, else the first of the two draws. With only one open server there is nothing to draw: it gets the request.
With two servers in total both are always drawn, so this equals least_outstanding; it pays off with more servers.
"""

from __future__ import annotations

from collections.abc import Sequence

from tracebench.policies._common import SlotTally, among_open, assign_in_order
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


class PowerOfTwoPolicy(Policy):
    name = "power_of_two"
    description = "draw two servers with a free slot (seeded), send to the one with fewer in flight (tie: reported load)"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        return assign_in_order(queue, servers, among_open(self._pick))  # oldest first

    def _pick(self, _: QueuedRequest, open_servers: list[ServerView], tally: SlotTally) -> ServerView:
        if len(open_servers) == 1:
            return open_servers[0]
        first, second = self.rng.choice(len(open_servers), size=2, replace=False)
        return self._less_loaded(tally, open_servers[int(first)], open_servers[int(second)])

    @staticmethod
    def _less_loaded(tally: SlotTally, a: ServerView, b: ServerView) -> ServerView:
        in_flight_a, in_flight_b = tally.in_flight[a.index], tally.in_flight[b.index]
        if in_flight_a != in_flight_b:
            return a if in_flight_a < in_flight_b else b
        # reported numbers are compared only when both sides have them (a missing report is not "zero load")
        if a.reported is not None and b.reported is not None:
            load_a = (a.reported.num_running_reqs + a.reported.num_waiting_reqs, a.reported.token_usage)
            load_b = (b.reported.num_running_reqs + b.reported.num_waiting_reqs, b.reported.token_usage)
            if load_a != load_b:
                return a if load_a < load_b else b
        return a

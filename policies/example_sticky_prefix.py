"""An example routing policy that uses the requests' prefix blocks: requests that start with the same block go to the
same server, so that server's prefix cache (sglang's radix cache) can serve the shared part.

Run it on a trace with prefix blocks (docs/trace-format.md; e.g. an imported Mooncake trace):

    tracebench replay trace.jsonl --gpus 2 --backend sim --policy policies/example_sticky_prefix.py:StickyFirstBlock

The built-ins `prefix_hash` (consistent hashing of the first block) and `cache_aware` (longest prefix match, as
sglang's router) do this more carefully; this file shows the fields a policy of your own can use.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from tracebench.policies import Policy, QueuedRequest, ServerView


class StickyFirstBlock(Policy):
    """The first request with a given first block goes to the least loaded server; later ones follow it there while
    it has a free slot (else they go to the least loaded server, which does not move the sticky choice)."""

    name = "sticky_first_block"
    description = "requests sharing their first prefix block stick to one server (else least loaded)"
    options_help = {"remember": "how many first blocks to remember, least recently used forgotten (default 10000)"}

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self.remember = self.option("remember", 10_000, int)
        # first block id -> server index, least recently used first (bounded: a long trace has many first blocks)
        self.home: OrderedDict[int, int] = OrderedDict()

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[tuple[QueuedRequest, ServerView]]:
        free = {s.index: s.free_slots for s in servers}  # counted down as this call hands out requests
        load = {s.index: s.in_flight for s in servers}
        by_index = {s.index: s for s in servers}
        picks: list[tuple[QueuedRequest, ServerView]] = []
        for request in queue:  # oldest first
            open_servers = [s for s in servers if free[s.index] > 0]
            if not open_servers:
                break  # every server is full: the rest wait at the router
            least_loaded = min(open_servers, key=lambda s: (load[s.index], s.index))
            # `prefix_blocks`: the prompt as block ids (each `request.block_size` tokens, the last one possibly
            # fewer), or None when the trace gives no blocks for this request.
            if request.prefix_blocks is None:
                best = least_loaded
            else:
                first = request.prefix_blocks[0]
                home = self.home.get(first)
                best = by_index[home] if home is not None and free.get(home, 0) > 0 else least_loaded
                if home is None:
                    self.home[first] = best.index
                    if len(self.home) > self.remember:
                        self.home.popitem(last=False)
                else:
                    self.home.move_to_end(first)
            picks.append((request, best))
            free[best.index] -= 1
            load[best.index] += 1
        return picks

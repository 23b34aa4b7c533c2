"""`prefix_hash`: consistent hashing of a request's first prefix block(s) — a simple cache-locality baseline.

The ring: each server index i is placed at `virtual_nodes` points, `hash("server-{i}#{v}")` for v in
0..virtual_nodes-1 (64-bit blake2b). A request's key is the hash of its first `hash_blocks` block ids; it goes to the
first server clockwise from the key. Requests that share their first block(s) therefore land on the same server, and
adding or removing a server moves only about 1/N of the keys.

- The ring is built from server *indices*, not URLs: the same trace maps the same blocks to the same servers in every
  run, whatever ports the servers got.
- When that server has no free slot (at its cap, or unhealthy) the request goes to the next server clockwise that
  has one, like sglang's hash ring skipping an unhealthy worker. It never waits for its own server while another has
  a free slot (every built-in keeps that rule); raise the caps if strict affinity matters more than queueing.
- A request without blocks goes to the least loaded server with a free slot (fewest in flight; ties: lowest index).

It looks at nothing but the first block(s): all requests sharing a system prompt pile onto one server, whatever its
load (unlike sglang model gateway's newer `prefix_hash`, which also moves off a server loaded above 1.25x the mean).
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

import numpy as np

from tracebench.policies._common import SlotTally, among_open, assign_in_order, least_loaded, parse_bounded
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


def _hash64(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class PrefixHashPolicy(Policy):
    name = "prefix_hash"
    description = "consistent hashing (ring with virtual nodes) of the first prefix block; full server: next on the ring"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)
    options_help = {
        "virtual_nodes": "points per server on the hash ring, integer >= 1 (default 150)",
        "hash_blocks": "how many leading block ids form the key, integer >= 1 (default 1: the first block)",
    }

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self.virtual_nodes = self.option("virtual_nodes", 150, parse_bounded(int, 1))
        self.hash_blocks = self.option("hash_blocks", 1, parse_bounded(int, 1))
        self._ring_for: tuple[int, ...] = ()  # the server indices the ring was built for
        self._points: list[int] = []  # ring positions, ascending
        self._owners: list[int] = []  # server index at each position
        # how each request was routed (run.json policy.decisions): its ring server, a later one (that one had no free
        # slot), no blocks
        self.decisions = {"home": 0, "next_on_ring": 0, "no_blocks": 0}

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        indices = tuple(s.index for s in servers)
        if indices != self._ring_for:
            self._build_ring(indices)
        return assign_in_order(queue, servers, among_open(self.choose))  # oldest first

    def _build_ring(self, indices: tuple[int, ...]) -> None:
        ring = sorted((_hash64(f"server-{i}#{v}".encode()), i) for i in indices for v in range(self.virtual_nodes))
        self._points = [point for point, _ in ring]
        self._owners = [owner for _, owner in ring]
        self._ring_for = indices

    def home(self, blocks: Sequence[int]) -> int:
        """Ring position index (into the ring) where the key of `blocks` lands."""
        key = _hash64(",".join(map(str, blocks[: self.hash_blocks])).encode())
        return bisect_right(self._points, key) % len(self._points)

    def choose(self, req: QueuedRequest, open_servers: list[ServerView], tally: SlotTally) -> ServerView:
        if not req.prefix_blocks:
            self.decisions["no_blocks"] += 1
            return least_loaded(req, open_servers, tally)
        by_index = {s.index: s for s in open_servers}
        start, size = self.home(req.prefix_blocks), len(self._owners)
        for step in range(size):  # clockwise from the key to the first server with a free slot
            owner = self._owners[(start + step) % size]
            server = by_index.get(owner)
            if server is not None:
                self.decisions["home" if owner == self._owners[start] else "next_on_ring"] += 1
                return server
        raise AssertionError("an open server is always on the ring")

    def describe(self) -> dict[str, Any]:
        """The base record, plus `decisions` (counts per branch)."""
        return {**super().describe(), "decisions": dict(self.decisions)}

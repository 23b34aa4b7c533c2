"""`cache_aware`: modelled on sglang router's `cache_aware` policy (sglang-router 0.3.2, the default policy there),
working on the trace's prefix blocks instead of text. docs/policies.md has the long version.

For each request, oldest first, among the servers with a free slot:

1. **Balance check.** `load(s)` = requests in flight on healthy server s as tracebench counts them (this call's
   earlier picks included) — the router's own in-flight counter, as sglang's router counts its own. The system is
   imbalanced when `max - min > balance_abs_threshold` and `max > min * balance_rel_threshold` (over all healthy
   servers, full ones included). Imbalanced: the least loaded open server gets the request.
2. **Cache affinity** (balanced). Each server has an approximate tree of the block sequences sent there. The match of
   server s is the tokens of the request's leading blocks found in s's tree; `ratio = best match / input_len`. When
   `ratio > cache_threshold` the open server with the longest match gets it (ties: fewer in flight, then the lowest
   index); otherwise the least loaded open server (ties: the lowest index).
3. The request's blocks are then inserted into the chosen server's tree (in either branch, as sglang does).

Tokens, not blocks, weigh a match: every block counts `block_size` tokens except a request's last, partial one,
which counts only its own tokens; a block a server got only partially matches only the tokens it got (and ends the
match there). A request without blocks has ratio 0: it goes to the least loaded open server and is not recorded in
any tree (sglang's router does the same with a request that has no text).

**Bound and eviction.** Every `eviction_interval_secs` of run time (checked when `assign` is called; the first after
one interval) each server's tree is cut to at most `max_tree_size` tokens, least recently used leaves first. A path
is "used" when a request is inserted along it. `eviction_interval_secs=0` turns eviction off (as in sglang's
router): the trees then grow without bound.

Where it differs from sglang router's, on purpose:
- it matches block ids, weighted in tokens, not characters (sglang's tree holds the request's text — for a
  `/generate` with `input_ids`, the ids written out in decimal and joined by spaces — and its ratio is in characters);
- `max_tree_size` counts tokens per server (sglang: characters per worker); the default is kept (67108864);
- a server at its cap is not a candidate: the longest match is taken among open servers (sglang has no per-server
  cap); a request never waits for a particular server while another has a free slot;
- among servers tied on the longest match it takes the least loaded (sglang: one tenant of the matched tree node);
- unhealthy servers are left out of the balance check (sglang includes every worker's load);
- eviction runs on the run clock at `assign` calls (sglang: a background thread on the wall clock), and a match
  does not refresh a server's LRU times (sglang refreshes one in eight).
"""

from __future__ import annotations

from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import numpy as np

from tracebench.errors import PolicyError
from tracebench.policies._common import SlotTally, among_open, assign_in_order, least_loaded, parse_bounded
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView


# A node of a BlockTree is a list (made per new block of every request: a list is ~6x cheaper to make than an object):
# [tokens: how many of its block's tokens were sent, stamp: its last use (the tree's count of uses then, larger is
# more recent), children: {block id: node}]. The root's tokens and stamp are unused.
Node = list


class BlockTree:
    """The block sequences sent to one server, with an LRU order over its nodes and a size in tokens.

    Every insert refreshes its whole path from the leaf up to the root's child, so a node is always more recent than
    all of its descendants: the least recently used node is then always a leaf, and evicting in LRU order never cuts
    a path in the middle. The order is kept as a stamp on each node (what an insert costs: one store per block), and
    sorted only when an eviction has something to drop.
    """

    __slots__ = ("root", "size", "nodes", "_uses")

    def __init__(self) -> None:
        self.root: Node = [0, 0, {}]
        self.size = 0  # tokens held
        self.nodes = 0  # nodes held (the root not counted)
        self._uses = 0  # the last stamp given

    def match(self, blocks: Sequence[int], tokens: Sequence[int]) -> int:
        """Tokens of the leading blocks found here (`tokens[i]`: the request's tokens in block i)."""
        children, matched = self.root[2], 0
        for block, want in zip(blocks, tokens):
            child = children.get(block)
            if child is None:
                break
            got = child[0]
            if got < want:
                return matched + got  # only the first `got` tokens of this block were sent here
            matched += want
            children = child[2]
        return matched

    def insert(self, blocks: Sequence[int], tokens: Sequence[int]) -> None:
        # the path's stamps count down from the root's child: the leaf is used first, each ancestor after it (the
        # invariant in the class docstring)
        children, stamp = self.root[2], self._uses + len(blocks) + 1
        self._uses = stamp
        for block, have in zip(blocks, tokens):
            stamp -= 1
            child = children.get(block)
            if child is None:
                children[block] = child = [have, stamp, {}]
                self.size += have
                self.nodes += 1
            else:
                got = child[0]
                if have > got:
                    self.size += have - got
                    child[0] = have
                child[1] = stamp
            children = child[2]

    def evict(self, max_tokens: int) -> None:
        """Drop least recently used leaves until at most `max_tokens` tokens are held."""
        if self.size <= max_tokens:
            return
        held: list[tuple[int, int, dict[int, Node], Node]] = []  # (stamp, block id, its parent's children, node)
        todo = [self.root[2]]
        while todo:
            children = todo.pop()
            for block, node in children.items():
                held.append((node[1], block, children, node))
                todo.append(node[2])
        held.sort(key=itemgetter(0))  # stamps are distinct: one order
        for _, block, siblings, node in held:
            if self.size <= max_tokens:
                break
            assert not node[2]  # a leaf: the invariant in the class docstring
            del siblings[block]
            self.size -= node[0]
            self.nodes -= 1

    def __len__(self) -> int:
        return self.nodes


def block_tokens(req: QueuedRequest) -> list[int]:
    """The request's tokens in each of its blocks: `block_size` each, the last one the rest of `input_len`."""
    blocks, size = req.prefix_blocks, req.block_size
    assert blocks is not None
    if size is None:
        raise PolicyError(f"request {req.id} has prefix_blocks but no block_size")
    last = req.input_len - (len(blocks) - 1) * size
    if not blocks or not 1 <= last <= size:
        raise PolicyError(f"request {req.id}: {len(blocks)} block(s) of {size} tokens do not make input_len {req.input_len}")
    return [size] * (len(blocks) - 1) + [last]


class CacheAwarePolicy(Policy):
    name = "cache_aware"
    description = "sglang router's cache_aware on prefix blocks: longest match if its ratio > cache_threshold, else least loaded"
    reads_report_age = False  # no built-in reads ServerView.reported.age (Policy.reads_report_age)
    reads_observed = False  # nor its observed figures (Policy.reads_observed)
    options_help = {
        "cache_threshold": "match ratio (matched tokens / input_len) above which the longest match wins, 0..1 (default 0.3)",
        "balance_abs_threshold": "imbalanced when max - min in flight > this (and the relative test), integer >= 0 (default 64)",
        "balance_rel_threshold": "imbalanced when max in flight > min * this (and the absolute test), >= 1 (default 1.5)",
        "max_tree_size": "tokens each server's tree keeps after an eviction, integer >= 0 (default 67108864)",
        "eviction_interval_secs": "run seconds between evictions, >= 0; 0 = never evict (default 60)",
    }

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self.cache_threshold = self.option("cache_threshold", 0.3, parse_bounded(float, 0.0, 1.0))
        self.balance_abs_threshold = self.option("balance_abs_threshold", 64, parse_bounded(int, 0))
        self.balance_rel_threshold = self.option("balance_rel_threshold", 1.5, parse_bounded(float, 1.0))
        self.max_tree_size = self.option("max_tree_size", 67108864, parse_bounded(int, 0))
        self.eviction_interval = self.option("eviction_interval_secs", 60.0, parse_bounded(float, 0.0))
        self.trees: dict[int, BlockTree] = {}  # server index -> what was sent there
        self._next_eviction = self.eviction_interval
        # how each request was routed (run.json policy.decisions): a match above the threshold, a miss, the balance
        # check taking over, no blocks
        self.decisions = {"cache_hit": 0, "cache_miss": 0, "imbalanced": 0, "no_blocks": 0}

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        if self.eviction_interval > 0 and self.now >= self._next_eviction:
            for tree in self.trees.values():
                tree.evict(self.max_tree_size)
            self._next_eviction = self.now + self.eviction_interval
        return assign_in_order(queue, servers, among_open(self.choose))  # oldest first

    def choose(self, req: QueuedRequest, open_servers: list[ServerView], tally: SlotTally) -> ServerView:
        """The server for `req` among `open_servers`, recorded in that server's tree."""
        if req.prefix_blocks is None:
            self.decisions["no_blocks"] += 1
            return least_loaded(req, open_servers, tally)
        tokens = block_tokens(req)
        if self.imbalanced(tally):
            self.decisions["imbalanced"] += 1
            chosen = least_loaded(req, open_servers, tally)
        else:
            matches = {s.index: self.tree(s.index).match(req.prefix_blocks, tokens) for s in open_servers}
            best = max(matches.values())
            if best / req.input_len > self.cache_threshold:
                self.decisions["cache_hit"] += 1
                taken = tally.taken
                chosen = min((s for s in open_servers if matches[s.index] == best),
                             key=lambda s: (s.in_flight + taken.get(s.index, 0), s.index))
            else:
                self.decisions["cache_miss"] += 1
                chosen = least_loaded(req, open_servers, tally)
        self.tree(chosen.index).insert(req.prefix_blocks, tokens)
        return chosen

    def describe(self) -> dict[str, Any]:
        """The base record, plus `decisions` (counts per branch) and `tree_tokens` (each server's tree size, in
        tokens, by server index)."""
        return {**super().describe(), "decisions": dict(self.decisions),
                "tree_tokens": {str(index): self.trees[index].size for index in sorted(self.trees)}}

    def imbalanced(self, tally: SlotTally) -> bool:
        taken = tally.taken  # this call's picks (SlotTally.in_flight without its dict of every server)
        loads = [s.in_flight + taken.get(s.index, 0) for s in tally.servers if s.healthy]
        high, low = max(loads), min(loads)
        return high - low > self.balance_abs_threshold and high > low * self.balance_rel_threshold

    def tree(self, index: int) -> BlockTree:
        tree = self.trees.get(index)
        if tree is None:
            tree = self.trees[index] = BlockTree()
        return tree

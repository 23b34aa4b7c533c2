"""Prefix structure of a trace: how much of its prompts a prefix cache could serve (`tracebench inspect`, the report's
ceiling).

A request's prompt is its `prefix_blocks`, `block_size` tokens each, the last block possibly partial: it then holds the
FIRST `input_len - (n-1)*block_size` tokens of its block (docs/trace-format.md). Requests are taken one after another
in trace order, each finishing before the next starts (no two requests prefilled together).

Rule (sglang's radix cache): a request reuses the longest prefix of its prompt that an earlier request already sent.
In blocks: its leading run of block ids that an earlier request also had as a leading run (a path of the prefix tree
of block ids); a block is reused up to the tokens of it sent before (a block first sent partially gives only those
tokens). sglang never serves a whole prompt from cache (`Req._compute_max_prefix_len` in
python/sglang/srt/managers/schedule_batch.py caps the match at `input_len - 1`, one token must be computed for the
logits), so each request's reusable tokens are capped at `input_len - 1`: the ceiling is what sglang can reach.

- `reusable_tokens` (block lists) / `trace_reusable_tokens` (a trace file): the ceiling, one unbounded cache:
  (reusable prompt tokens, all prompt tokens); `reusable_per_request(build_tree(...))`: the same per request.
- `lru_hit_tokens`: the same with one LRU cache of a given size in tokens. The cache holds whole blocks (a block of the
  prefix tree takes `block_size` tokens of the cache, partial or not), touching a request's blocks leaf first so a
  block's ancestors are always more recent than it: the cache stays a set of tree paths, as sglang evicts leaves.
  Exact below `LRU_EXACT_REFS` block references; above, spatially sampled (SHARDS: the LRU of the blocks whose hash
  falls under a rate, with the capacity scaled by that rate), which keeps `inspect` fast on million-request traces.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Above this many block references the LRU hit rate is estimated on a spatial sample of the blocks of this size.
LRU_EXACT_REFS = 1_000_000
# Default LRU sizes in tokens: a small cache, one H200 and four H200s running llama-2-7b with sglang 0.5.17 (its
# max_total_num_tokens, tests/data/sglang-0.5.17/api_capture.json).
DEFAULT_LRU_TOKENS = (65_536, 231_818, 927_272)


@dataclass(frozen=True)
class PrefixTree:
    """The block references of a trace mapped onto its prefix tree.

    Flat arrays, one entry per block reference in trace order (request 0's blocks, then request 1's, ...): `request`
    (its request's index), `node` (its prefix-tree node: equal nodes = equal leading run of ids up to and including
    this block), `tokens` (its tokens in this request: `block_size`, or fewer for a partial last block), `available`
    (its tokens an earlier request already sent: 0 when the node is new). `input_len` and `has_blocks` are per request
    (all of them, with blocks or not)."""

    block_size: int
    input_len: np.ndarray
    has_blocks: np.ndarray
    request: np.ndarray
    node: np.ndarray
    tokens: np.ndarray
    available: np.ndarray
    distinct_blocks: int
    nodes: int


def build_tree(counts: np.ndarray, flat_blocks: np.ndarray, input_len: np.ndarray, block_size: int) -> PrefixTree:
    """`counts[i]` block ids of request i (0 = no blocks), all ids concatenated in `flat_blocks`. The caller has checked
    `counts[i] == ceil(input_len[i] / block_size)` for every request with blocks (the trace reader does)."""
    counts = np.asarray(counts, dtype=np.int64)
    flat = np.asarray(flat_blocks, dtype=np.int64)
    input_len = np.asarray(input_len, dtype=np.int64)
    refs = int(flat.size)
    # 32-bit where it fits: these arrays have one entry per block id of the trace (tens of millions)
    small = np.int32 if max(refs, counts.size, block_size) < 2**31 else np.int64
    request = np.repeat(np.arange(counts.size, dtype=small), counts)
    with_blocks = counts > 0
    starts = (np.cumsum(counts) - counts)[with_blocks]
    last = starts + counts[with_blocks] - 1
    tokens = np.full(refs, block_size, dtype=small)
    tokens[last] = input_len[with_blocks] - (counts[with_blocks] - 1) * block_size

    # Dense block ranks 0..width-1 (ids used directly when they are small non-negative integers).
    if refs and flat.min() >= 0 and flat.max() < 4 * refs + 1024:
        rank, width = flat, int(flat.max()) + 1
        seen = np.zeros(width, dtype=bool)
        seen[rank] = True
        distinct = int(seen.sum())
    else:
        uniq, rank = np.unique(flat, return_inverse=True)
        distinct = width = int(uniq.size)
    # The block before each reference in its request (-1 at a request's first block).
    parent = np.empty(refs, dtype=np.int32 if width < 2**31 else np.int64)
    parent[1:] = rank[:-1]
    parent[starts] = -1
    # When every id always follows the same id (Mooncake's hash_ids, tracebench's generators), an id names one path
    # of the tree by itself: it is the node. Otherwise the tree is built level by level.
    parent_of = np.full(width, -2, dtype=parent.dtype)
    parent_of[rank] = parent
    if (parent_of[rank] == parent).all():
        node, nodes = rank, width
    else:
        node, nodes = _tree_nodes(rank, width, counts, starts)
    del parent, parent_of
    position = np.arange(refs, dtype=small)
    first_ref = np.full(nodes, refs, dtype=small)
    np.minimum.at(first_ref, node, position)
    # a node appears at most once per request, so "not its first reference" is "sent by an earlier request"
    seen_before = first_ref[node] != position
    del position
    available = np.where(seen_before, tokens, 0)
    _limit_partial_firsts(available, node, tokens, request, first_ref, last, block_size, width)
    return PrefixTree(block_size=block_size, input_len=input_len, has_blocks=with_blocks, request=request, node=node,
                      tokens=tokens, available=available, distinct_blocks=distinct,
                      nodes=int((first_ref < refs).sum()))


def _limit_partial_firsts(available: np.ndarray, node: np.ndarray, tokens: np.ndarray, request: np.ndarray,
                          first_ref: np.ndarray, last: np.ndarray, block_size: int, width: int) -> None:
    """A node first sent as a partial last block (r tokens): a later request gets at most the most tokens of it sent
    before. Only last blocks are partial, so such nodes are few."""
    partial_last = last[tokens[last] < block_size]
    firsts = partial_last[first_ref[node[partial_last]] == partial_last]
    if firsts.size == 0:
        return
    marked = np.zeros(max(width, int(node.max()) + 1), dtype=bool)
    marked[node[firsts]] = True
    refs_of = np.flatnonzero(marked[node])
    refs_of = refs_of[np.lexsort((request[refs_of], node[refs_of]))]
    sent, owner = tokens[refs_of].astype(np.int64), node[refs_of]
    # running max within each node (an offset per node keeps maxima from crossing nodes), shifted by one reference
    offset = owner * (block_size + 1)
    running = np.maximum.accumulate(sent + offset) - offset
    before = np.zeros(refs_of.size, dtype=np.int64)
    before[1:] = np.where(owner[1:] == owner[:-1], running[:-1], 0)
    available[refs_of] = np.minimum(sent, before)


def _tree_nodes(rank: np.ndarray, width: int, counts: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, int]:
    """Node of each reference: (node of the reference before it, its block) numbered level by level."""
    refs = rank.size
    depth = np.arange(refs, dtype=np.int64) - np.repeat(starts, counts[counts > 0])
    order = np.argsort(depth, kind="stable")
    level_bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2))
    node = np.empty(refs, dtype=np.int64)
    nodes = 0
    for level in range(len(level_bounds) - 1):
        idx = order[level_bounds[level]:level_bounds[level + 1]]
        keys = node[idx - 1] * width + rank[idx] if level else rank[idx]
        uniq, inverse = np.unique(keys, return_inverse=True)
        node[idx] = nodes + inverse
        nodes += int(uniq.size)
    return node, nodes


def per_request(tree: PrefixTree, per_reference: np.ndarray) -> np.ndarray:
    """Sum a per-reference quantity per request, capped at input_len - 1 (sglang computes at least one token)."""
    sums = np.bincount(tree.request, weights=per_reference, minlength=tree.input_len.size).astype(np.int64)
    return np.minimum(sums, tree.input_len - 1)


def reusable_per_request(tree: PrefixTree) -> np.ndarray:
    """Per request: prompt tokens one unbounded cache holds when it arrives (0 for requests without blocks)."""
    return per_request(tree, tree.available)


def working_set(tree: PrefixTree) -> tuple[int, int]:
    """(shared tokens, distinct tokens): the tokens of the prefix blocks that two or more requests send (what a cache
    must hold for the trace's sharing to pay: the prefixes worth keeping), and of every distinct block (all the prompt
    content there is, once). A block counts with the most tokens any request sends of it."""
    if tree.node.size == 0:
        return 0, 0
    size = int(tree.node.max()) + 1
    senders = np.bincount(tree.node, minlength=size)  # a node appears at most once per request: requests sending it
    tokens = np.zeros(size, dtype=np.int64)
    np.maximum.at(tokens, tree.node, tree.tokens)
    return int(tokens[senders >= 2].sum()), int(tokens.sum())


def _tree_of(blocks_per_request: Sequence[Sequence[int] | None], input_lens: Sequence[int], block_size: int) -> PrefixTree:
    counts = np.fromiter((0 if b is None else len(b) for b in blocks_per_request), dtype=np.int64,
                         count=len(blocks_per_request))
    flat = np.fromiter((x for b in blocks_per_request if b is not None for x in b), dtype=np.int64,
                       count=int(counts.sum()))
    return build_tree(counts, flat, np.asarray(input_lens, dtype=np.int64), block_size)


def leading_seen_tokens(blocks_per_request: Sequence[Sequence[int] | None], input_lens: Sequence[int],
                        block_size: int) -> np.ndarray:
    """Per request, taken in order: the prompt tokens one unbounded prefix cache holds when it arrives (its leading
    blocks already sent, capped at input_len - 1 as sglang): the cached_tokens sglang reports when requests go one at
    a time to one server whose cache never evicts. `blocks_per_request[i]` None: no blocks, 0."""
    return reusable_per_request(_tree_of(blocks_per_request, input_lens, block_size))


def reusable_tokens(blocks_per_request: Sequence[Sequence[int] | None], input_lens: Sequence[int],
                    block_size: int) -> tuple[int, int]:
    """The trace's ceiling: (prompt tokens one unbounded prefix cache could serve, all prompt tokens), requests taken
    in order. `blocks_per_request[i]` is request i's prefix_blocks (None: no blocks, nothing reusable)."""
    tree = _tree_of(blocks_per_request, input_lens, block_size)
    return int(reusable_per_request(tree).sum()), int(tree.input_len.sum())


def trace_reusable_tokens(path: str | os.PathLike[str]) -> tuple[int, int]:
    """`reusable_tokens` of a trace file (read and validated by the columnar reader; TraceError if broken). (0, total)
    for a trace without prefix blocks."""
    from tracebench.trace.format import read_columns

    header, columns = read_columns(path, with_blocks=True)
    if columns.blocks.size == 0:
        return 0, int(columns.input_len.sum())
    tree = build_tree(columns.block_counts, columns.blocks, columns.input_len, header.block_size)  # type: ignore[arg-type]
    return int(reusable_per_request(tree).sum()), int(tree.input_len.sum())


@dataclass(frozen=True)
class LruResult:
    cache_tokens: int
    hit_tokens: int  # estimated (hit rate of the sample x all prompt tokens) when sample_rate < 1
    hit_rate: float  # hit tokens / all prompt tokens
    sample_rate: float  # 1.0: exact


def lru_hit_tokens(tree: PrefixTree, cache_tokens: Sequence[int], max_refs: int = LRU_EXACT_REFS) -> list[LruResult]:
    """Prompt tokens served by one LRU cache of each size in `cache_tokens` (whole blocks: size // block_size),
    requests in order. Exact up to `max_refs` block references, else estimated on a spatial sample of the nodes
    (SHARDS: a node is kept when a fixed hash of it falls under the rate; each cache's capacity is scaled by it)."""
    total = int(tree.input_len.sum())
    refs = int(tree.node.size)
    keep = None
    rate = 1.0
    if refs > max_refs:
        threshold = max(1, int(max_refs / refs * (1 << 24)))
        rate = threshold / (1 << 24)
        hashed = tree.node.astype(np.uint64)
        hashed *= np.uint64(0x9E3779B97F4A7C15)  # in place: this array has one entry per block id of the trace
        hashed >>= np.uint64(40)
        keep = np.flatnonzero(hashed < np.uint64(threshold))
        del hashed
    capacities = [int(size // tree.block_size * rate) for size in cache_tokens]
    # sampled: the hit rate of the sampled references' tokens (a ratio: a hot block sampled or not moves both sums)
    sampled_tokens = None if keep is None else int(tree.tokens[keep].sum())
    results = []
    for size, hits in zip(cache_tokens, _simulate_lru(tree, keep, capacities)):
        if keep is None:
            hit_tokens = int(per_request(tree, hits).sum())
        else:
            hit_tokens = int(round(hits.sum() / sampled_tokens * total)) if sampled_tokens else 0
        results.append(LruResult(cache_tokens=size, hit_tokens=hit_tokens, hit_rate=hit_tokens / total if total else 0.0,
                                 sample_rate=rate))
    return results


def _simulate_lru(tree: PrefixTree, keep: np.ndarray | None, capacities: list[int]) -> list[np.ndarray]:
    """For each capacity (in blocks): per reference (all, or those kept), the tokens an LRU of that size served.
    Each cache is a plain Python OrderedDict driven over the references (the cost of one is ~0.1 us per reference)."""
    request = tree.request if keep is None else tree.request[keep]
    nodes = tree.node if keep is None else tree.node[keep]
    available = tree.available if keep is None else tree.available[keep]
    caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in capacities]
    present: list[list[int]] = [[] for _ in capacities]
    if nodes.size:
        bounds = np.flatnonzero(np.diff(request)) + 1
        starts = [0, *bounds.tolist()]
        stops = [*bounds.tolist(), int(nodes.size)]
        node_list = nodes.tolist()
        for cache, capacity, hits in zip(caches, capacities, present):
            if capacity <= 0:
                continue
            move, evict = cache.move_to_end, cache.popitem
            for start, stop in zip(starts, stops):
                path = node_list[start:stop]
                for offset, n in enumerate(path):
                    if n in cache:
                        hits.append(start + offset)
                for n in reversed(path):  # leaf first: ancestors end up the more recent
                    if n in cache:
                        move(n)
                    else:
                        cache[n] = None
                while len(cache) > capacity:
                    evict(last=False)
    out = []
    for hits in present:
        served = np.zeros(nodes.size, dtype=np.int64)
        if hits:
            idx = np.array(hits, dtype=np.int64)
            served[idx] = available[idx]
        out.append(served)
    return out


@dataclass(frozen=True)
class PrefixStats:
    """What `tracebench inspect` reports on a trace's prefix structure (docs/trace-format.md)."""

    block_size: int
    requests_with_blocks: int
    block_refs: int  # block ids over all requests
    distinct_blocks: int  # distinct ids
    distinct_prefixes: int  # distinct leading runs of ids (nodes of the prefix tree)
    prompt_tokens: int  # all requests, with blocks or not
    reusable_tokens: int  # the ceiling: one unbounded cache
    reusable_fraction: float
    lru: tuple[LruResult, ...]
    shared_tokens: int = 0  # the working set: tokens of blocks two or more requests send (`working_set`)
    distinct_tokens: int = 0  # tokens of every distinct block


def prefix_stats(counts: np.ndarray, flat_blocks: np.ndarray, input_len: np.ndarray, block_size: int,
                 lru_tokens: Sequence[int] = DEFAULT_LRU_TOKENS) -> PrefixStats:
    tree = build_tree(counts, flat_blocks, input_len, block_size)
    total = int(tree.input_len.sum())
    reusable = int(reusable_per_request(tree).sum())
    shared, distinct = working_set(tree)
    return PrefixStats(
        block_size=block_size, requests_with_blocks=int(tree.has_blocks.sum()), block_refs=int(tree.node.size),
        distinct_blocks=tree.distinct_blocks, distinct_prefixes=tree.nodes, prompt_tokens=total,
        reusable_tokens=reusable, reusable_fraction=reusable / total if total else 0.0,
        lru=tuple(lru_hit_tokens(tree, lru_tokens)),
        shared_tokens=shared, distinct_tokens=distinct,
    )

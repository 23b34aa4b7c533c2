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

- `reusable_tokens`: the ceiling, one unbounded cache: (reusable prompt tokens, all prompt tokens).
- `lru_hit_tokens`: the same with one LRU cache of a given size in tokens. The cache holds whole blocks (a block of the
  prefix tree takes `block_size` tokens of the cache, partial or not), touching a request's blocks leaf first so a
  block's ancestors are always more recent than it: the cache stays a set of tree paths, as sglang evicts leaves.
  Exact below `LRU_EXACT_REFS` block references; above, spatially sampled (SHARDS: the LRU of the blocks whose hash
  falls under a rate, with the capacity scaled by that rate), which keeps `inspect` fast on million-request traces.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Above this many block references the LRU hit rate is estimated on a spatial sample of the blocks of this size.
LRU_EXACT_REFS = 1_500_000
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
    request = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    depth = np.arange(refs, dtype=np.int64) - np.repeat(starts, counts)
    tokens = np.full(refs, block_size, dtype=np.int64)
    with_blocks = counts > 0
    last = (starts + counts - 1)[with_blocks]
    tokens[last] = input_len[with_blocks] - (counts[with_blocks] - 1) * block_size

    # Dense block ranks (a node key is parent node x distinct blocks + rank, which must fit in 64 bits).
    if refs and flat.min() >= 0 and flat.max() < 4 * refs + 1024:
        seen = np.zeros(int(flat.max()) + 1, dtype=bool)
        seen[flat] = True
        distinct = int(seen.sum())
        rank, width = flat, int(flat.max()) + 1
    else:
        uniq, rank = np.unique(flat, return_inverse=True)
        distinct = width = int(uniq.size)
    node = np.empty(refs, dtype=np.int64)
    first_request = np.empty(refs, dtype=np.int64)  # per node: the first request that has it
    # Level by level (depth 0 first); within a level, references stay in request order (stable sort), so the first
    # index of a key is its first request.
    order = np.argsort(depth.astype(np.uint16) if refs and depth.max() < 65536 else depth, kind="stable")
    level_bounds = np.searchsorted(depth[order], np.arange(int(depth.max()) + 2 if refs else 1))
    parent_of = np.zeros(refs, dtype=np.int64)  # node of the reference one level up (same request)
    nodes = 0
    for level in range(len(level_bounds) - 1):
        idx = order[level_bounds[level]:level_bounds[level + 1]]
        if idx.size == 0:
            break
        keys = parent_of[idx] * width + rank[idx] if level else rank[idx]
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        level_nodes = nodes + inverse
        node[idx] = level_nodes
        first_request[nodes:nodes + first.size] = request[idx[first]]
        nodes += int(first.size)
        deeper = idx[depth[idx] + 1 < counts[request[idx]]]
        parent_of[deeper + 1] = node[deeper]
    first_request = first_request[:nodes]

    available = _available_tokens(request, node, tokens, first_request, block_size, nodes)
    return PrefixTree(block_size=block_size, input_len=input_len, has_blocks=with_blocks, request=request, node=node,
                      tokens=tokens, available=available, distinct_blocks=distinct, nodes=nodes)


def _available_tokens(request: np.ndarray, node: np.ndarray, tokens: np.ndarray, first_request: np.ndarray,
                      block_size: int, nodes: int) -> np.ndarray:
    """Per reference: min(its tokens, the most tokens of its node any earlier request sent)."""
    seen_before = first_request[node] < request
    available = np.where(seen_before, tokens, 0)
    full = tokens == block_size
    first_full = np.full(nodes, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_full, node[full], request[full])
    # Seen before, but never whole before: the earlier sends were all partial; take the longest of them.
    partly = np.flatnonzero(seen_before & (first_full[node] >= request))
    if partly.size:
        partial = np.flatnonzero(~full)
        span = np.int64(request.max() + 1)
        keys = node[partial] * span + request[partial]
        by_key = np.argsort(keys, kind="stable")
        keys, sent = keys[by_key], tokens[partial][by_key]
        # running max of sent tokens within each node (an offset per node keeps maxima from crossing nodes)
        offset = node[partial][by_key] * (block_size + 1)
        running = np.maximum.accumulate(sent + offset) - offset
        pos = np.searchsorted(keys, node[partly] * span + request[partly], side="left") - 1
        ok = pos >= 0
        ok[ok] = node[partial][by_key][pos[ok]] == node[partly][ok]
        best = np.where(ok, running[np.maximum(pos, 0)], 0)
        available[partly] = np.minimum(tokens[partly], best)
    return available


def per_request(tree: PrefixTree, per_reference: np.ndarray) -> np.ndarray:
    """Sum a per-reference quantity per request, capped at input_len - 1 (sglang computes at least one token)."""
    sums = np.bincount(tree.request, weights=per_reference, minlength=tree.input_len.size).astype(np.int64)
    return np.minimum(sums, tree.input_len - 1)


def reusable_per_request(tree: PrefixTree) -> np.ndarray:
    """Per request: prompt tokens one unbounded cache holds when it arrives (0 for requests without blocks)."""
    return per_request(tree, tree.available)


def reusable_tokens(blocks_per_request: Sequence[Sequence[int] | None], input_lens: Sequence[int],
                    block_size: int) -> tuple[int, int]:
    """The trace's ceiling: (prompt tokens one unbounded prefix cache could serve, all prompt tokens), requests taken
    in order. `blocks_per_request[i]` is request i's prefix_blocks (None: no blocks, nothing reusable)."""
    counts = np.fromiter((0 if b is None else len(b) for b in blocks_per_request), dtype=np.int64,
                         count=len(blocks_per_request))
    flat = np.fromiter((x for b in blocks_per_request if b is not None for x in b), dtype=np.int64,
                       count=int(counts.sum()))
    tree = build_tree(counts, flat, np.asarray(input_lens, dtype=np.int64), block_size)
    return int(reusable_per_request(tree).sum()), int(tree.input_len.sum())


@dataclass(frozen=True)
class LruResult:
    cache_tokens: int
    hit_tokens: int  # estimated (scaled up from the sample) when sample_rate < 1
    hit_rate: float  # hit tokens / all prompt tokens
    sample_rate: float  # 1.0: exact


def lru_hit_tokens(tree: PrefixTree, cache_tokens: int, max_refs: int = LRU_EXACT_REFS) -> LruResult:
    """Prompt tokens served by one LRU cache of `cache_tokens` tokens (whole blocks: cache_tokens // block_size),
    requests in order. Exact up to `max_refs` block references, else estimated on a spatial sample of the nodes."""
    capacity = cache_tokens // tree.block_size
    total = int(tree.input_len.sum())
    refs = int(tree.node.size)
    rate = 1.0 if refs <= max_refs else max_refs / refs
    if rate < 1.0:
        # a fixed multiplicative hash of the node id: the same nodes are sampled every time
        hashed = (tree.node.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(40)
        keep = np.flatnonzero(hashed < np.uint64(int(rate * (1 << 24))))
        rate = float(int(rate * (1 << 24))) / (1 << 24)
        capacity = int(capacity * rate)
    else:
        keep = None
    hits = _simulate_lru(tree, keep, capacity)
    if keep is None:
        hit_tokens = int(per_request(tree, hits).sum())
    else:
        hit_tokens = int(round(hits.sum() / rate))
    return LruResult(cache_tokens=cache_tokens, hit_tokens=hit_tokens, hit_rate=hit_tokens / total if total else 0.0,
                     sample_rate=rate)


def _simulate_lru(tree: PrefixTree, keep: np.ndarray | None, capacity: int) -> np.ndarray:
    """Per reference kept (all when keep is None): the tokens served from an LRU of `capacity` blocks."""
    request = tree.request if keep is None else tree.request[keep]
    nodes = tree.node if keep is None else tree.node[keep]
    available = tree.available if keep is None else tree.available[keep]
    hit = np.zeros(nodes.size, dtype=np.int64)
    if nodes.size == 0 or capacity <= 0:
        return hit
    cache: OrderedDict[int, None] = OrderedDict()
    bounds = np.flatnonzero(np.diff(request)) + 1
    starts = np.concatenate(([0], bounds)).tolist()
    stops = np.concatenate((bounds, [nodes.size])).tolist()
    node_list = nodes.tolist()
    present = []
    move = cache.move_to_end
    evict = cache.popitem
    for start, stop in zip(starts, stops):
        path = node_list[start:stop]
        for offset, n in enumerate(path):
            if n in cache:
                present.append(start + offset)
        for n in reversed(path):  # leaf first: ancestors end up the more recent
            if n in cache:
                move(n)
            else:
                cache[n] = None
        while len(cache) > capacity:
            evict(last=False)
    if present:
        idx = np.array(present, dtype=np.int64)
        hit[idx] = available[idx]
    return hit


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


def prefix_stats(counts: np.ndarray, flat_blocks: np.ndarray, input_len: np.ndarray, block_size: int,
                 lru_tokens: Sequence[int] = DEFAULT_LRU_TOKENS) -> PrefixStats:
    tree = build_tree(counts, flat_blocks, input_len, block_size)
    total = int(tree.input_len.sum())
    reusable = int(reusable_per_request(tree).sum())
    return PrefixStats(
        block_size=block_size, requests_with_blocks=int(tree.has_blocks.sum()), block_refs=int(tree.node.size),
        distinct_blocks=tree.distinct_blocks, distinct_prefixes=tree.nodes, prompt_tokens=total,
        reusable_tokens=reusable, reusable_fraction=reusable / total if total else 0.0,
        lru=tuple(lru_hit_tokens(tree, size) for size in lru_tokens),
    )

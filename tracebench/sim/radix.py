"""sglang's radix (prefix) cache for the simulated server: which leading tokens of a prompt already sit in KV.

What it copies from sglang 0.5.17 (`python/sglang/srt/mem_cache/radix_cache.py`, page_size 1; see
`.DUCUMENT/radix-cache.md`):
- a radix tree of token sequences; a match walks it from the root and splits a node where the match ends inside it;
- every node holds as many KV slots as it has tokens; a node used by a running request is locked (lock count on the
  path to the root) and never evicted;
- eviction frees least-recently-used unlocked leaves (a parent whose last child went becomes a candidate);
- `reset` is `/flush_cache`.

Token sequences are lists of hashable items (token ids, or words for text prompts), or `PackedTokens` (integer
tokens packed 8 bytes each: what the virtual clock's in-process servers use, ~100x cheaper to compare and to make
than a list of Python ints); one tree holds one kind. Matching compares whole node segments as slices (C speed) and
finds a mismatch inside a segment by bisection, so there is no per-token Python loop on the hot path.
"""

from __future__ import annotations

import heapq
import itertools
import struct
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any


_INT64 = struct.Struct("<q")  # one packed token


class PackedTokens:
    """Integer tokens packed as signed 64-bit little-endian words in one bytes object: a sequence with what the tree
    uses of a list (len, a token, a slice, equality, concatenation), compared with memcmp instead of item by item."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    @classmethod
    def of(cls, tokens: Iterable[int]) -> PackedTokens:
        return cls(array("q", tokens).tobytes())

    def __len__(self) -> int:
        return len(self.data) >> 3

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self.data) >> 3)
            if step != 1:
                raise ValueError("PackedTokens slices take no step")
            return PackedTokens(self.data[start << 3:stop << 3])
        if index < 0:
            index += len(self.data) >> 3
        at = index << 3
        if not 0 <= at < len(self.data):
            raise IndexError("token index out of range")
        return _INT64.unpack_from(self.data, at)[0]   # no slice made (a child's key, per node on a path)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PackedTokens) and self.data == other.data

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: PackedTokens) -> PackedTokens:
        return PackedTokens(self.data + other.data)

    def __iter__(self) -> Iterator[int]:
        return iter(array("q", self.data))

    def __repr__(self) -> str:
        return f"PackedTokens({list(self)})"


def extended(ids: Sequence, length: int, tag: int, count: int) -> Sequence:
    """`ids[:length]` followed by `count` tokens `tag`, in `ids`' own kind (a tree holds one kind of sequence)."""
    if isinstance(ids, PackedTokens):
        return PackedTokens(ids.data[:length << 3] + _INT64.pack(tag) * count)
    return [*ids[:length], *[tag] * count]


class Node:
    """One tree node: `key` is its segment of tokens (its KV slots), children are keyed by their first token."""

    __slots__ = ("key", "children", "parent", "lock", "last_access")

    def __init__(self, key: list, parent: Node | None, last_access: int) -> None:
        self.key = key
        self.children: dict = {}
        self.parent = parent
        self.lock = 0
        self.last_access = last_access


def common_prefix_len(ids: Sequence, start: int, seg: list, limit: int) -> int:
    """Length of the common prefix of `ids[start:start+limit]` and `seg[:limit]` (limit <= both lengths)."""
    if isinstance(ids, PackedTokens):
        return _packed_prefix_len(ids.data, start << 3, seg.data, limit)  # type: ignore[attr-defined]
    if ids[start:start + limit] == (seg if limit == len(seg) else seg[:limit]):  # the common case: the whole node
        return limit
    lo, hi = 0, limit  # ids and seg agree on the first lo tokens and differ within the first hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ids[start + lo:start + mid] == seg[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _packed_prefix_len(ids: bytes, at: int, seg: bytes, limit: int) -> int:
    """common_prefix_len of packed tokens, on their bytes (`at`: the start's byte), with no PackedTokens made."""
    if ids[at:at + (limit << 3)] == seg[:limit << 3]:
        return limit
    lo, hi = 0, limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ids[at + (lo << 3):at + (mid << 3)] == seg[lo << 3:mid << 3]:
            lo = mid
        else:
            hi = mid
    return lo


class RadixCache:
    """The tree, its size in tokens and the LRU order of its evictable leaves."""

    def __init__(self) -> None:
        self._clock = itertools.count(1)  # logical access time (LRU order), deterministic
        self._seq = itertools.count()     # heap tie-break
        self.reset()

    def reset(self) -> None:
        """Drop everything (sglang's tree_cache.reset on /flush_cache)."""
        self.root = Node([], None, 0)  # (its key is never compared)
        self.root.lock = 1  # never evicted
        self.total_tokens = 0        # KV slots held by the tree
        self.evictable_tokens = 0    # of which in unlocked nodes
        # (last_access when pushed, seq, node): every evictable leaf has an entry; entries of nodes that are no longer
        # evictable leaves are dropped when popped, those whose node was used since are pushed again (lazy LRU)
        self._heap: list[tuple[int, int, Node]] = []
        self.num_nodes = 0

    # ---- matching and inserting ----
    def match(self, ids: Sequence, limit: int) -> tuple[int, Node]:
        """The longest cached prefix of `ids[:limit]`: (its length, the node where it ends). Touches the path (LRU)."""
        now = next(self._clock)
        node = self.root
        pos = 0
        while pos < limit:
            child = node.children.get(ids[pos])
            if child is None:
                break
            seg = child.key
            n = common_prefix_len(ids, pos, seg, min(len(seg), limit - pos))
            child.last_access = now
            if n < len(seg):
                node = self._split(child, n)
                pos += n
                break
            node = child
            pos += n
        self._touch_leaf(node)
        return pos, node

    def insert(self, ids: Sequence, length: int) -> tuple[int, Node]:
        """Put `ids[:length]` in the tree. Returns (how many of those tokens were already there, the last node)."""
        now = next(self._clock)
        node = self.root
        pos = 0
        while pos < length:
            child = node.children.get(ids[pos])
            if child is None:
                segment = ids[pos:length]
                leaf = Node(segment if isinstance(segment, PackedTokens) else list(segment), node, now)
                node.children[ids[pos]] = leaf
                self.total_tokens += len(leaf.key)
                self.evictable_tokens += len(leaf.key)
                self.num_nodes += 1
                self._push(leaf)
                return pos, leaf
            seg = child.key
            n = common_prefix_len(ids, pos, seg, min(len(seg), length - pos))
            child.last_access = now
            if n < len(seg):
                child = self._split(child, n)
            node = child
            pos += n
        self._touch_leaf(node)
        return pos, node

    def _split(self, child: Node, n: int) -> Node:
        """Cut `child`'s segment after n tokens: a new node with the first n becomes its parent."""
        parent = child.parent
        assert parent is not None
        head = Node(child.key[:n], parent, child.last_access)
        head.lock = child.lock
        head.children[child.key[n]] = child
        parent.children[child.key[0]] = head
        child.key = child.key[n:]
        child.parent = head
        self.num_nodes += 1
        return head

    # ---- locks (requests using a prefix) ----
    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock == 0:
                self.evictable_tokens -= len(node.key)
            node.lock += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        leaf = node
        while node is not self.root:
            node.lock -= 1
            if node.lock == 0:
                self.evictable_tokens += len(node.key)
            node = node.parent  # type: ignore[assignment]
        self._touch_leaf(leaf)

    # ---- eviction ----
    def evict(self, num_tokens: int) -> int:
        """Free at least `num_tokens` KV slots from unlocked leaves, least recently used first (fewer if the tree
        has no more evictable). Returns the number freed."""
        freed = 0
        heap = self._heap
        while freed < num_tokens and heap:
            last_access, _, node = heapq.heappop(heap)
            if node.lock or node.children or node.parent is None:
                continue  # locked, grown or already evicted since it was pushed
            if node.last_access != last_access:
                heapq.heappush(heap, (node.last_access, next(self._seq), node))   # used since: its place moved
                continue
            parent = node.parent
            del parent.children[node.key[0]]
            node.parent = None
            size = len(node.key)
            freed += size
            self.total_tokens -= size
            self.evictable_tokens -= size
            self.num_nodes -= 1
            if parent is not self.root:
                self._touch_leaf(parent, refresh=False)
        return freed

    def _touch_leaf(self, node: Node, refresh: bool = True) -> None:
        """Keep the heap current for `node` when it is an evictable leaf (refresh: stamp it as used now)."""
        if node is self.root or node.lock or node.children:
            return
        if refresh:
            node.last_access = next(self._clock)
        self._push(node)

    def _push(self, node: Node) -> None:
        heap = self._heap
        heapq.heappush(heap, (node.last_access, next(self._seq), node))
        if len(heap) > 4 * self.num_nodes + 1024:
            # rebuild: one current entry per evictable leaf, so the heap stays proportional to the tree
            leaves = {id(e[2]): e[2] for e in heap if e[2].parent is not None and not e[2].lock and not e[2].children}
            self._heap = [(leaf.last_access, next(self._seq), leaf) for leaf in leaves.values()]
            heapq.heapify(self._heap)

"""The prefix-aware policies (`cache_aware`, `prefix_hash`, the sticky example) on hand-built queues and server views,
the block tree under `cache_aware`, and QueuedRequest's prefix fields."""

from __future__ import annotations

import asyncio
from collections import Counter, OrderedDict
from pathlib import Path

import numpy as np
import pytest

from tests.test_policies_e2e import SPEED, replay
from tests.test_policies_unit import check_rules, make, server
from tracebench.errors import ConfigError, PolicyError
from tracebench.policies import Policy, QueuedRequest, ServerView
from tracebench.policies.cache_aware import BlockTree, CacheAwarePolicy
from tracebench.policies.prefix_hash import PrefixHashPolicy
from tracebench.replay.client import SglangClient
from tracebench.replay.clock import RunClock
from tracebench.replay.records import RecordWriter
from tracebench.replay.flight import HttpSender
from tracebench.replay.summary import ModelledHops
from tracebench.replay.router import Router, ServerState
from tracebench.replay.tokens import InputIds
from tracebench.trace.format import TraceRequest, format_request_line, write_trace

BS = 4  # tokens per block in these tests


def req(id: int, blocks: list[int] | None, input_len: int | None = None, block_size: int | None = BS) -> QueuedRequest:
    """A request whose prompt is `blocks` (full blocks unless `input_len` says the last is partial)."""
    if input_len is None:
        input_len = BS * len(blocks) if blocks else 10
    return QueuedRequest(id, input_len, 8, float(id), float(id), None if blocks is None else tuple(blocks),
                         None if blocks is None else block_size)


def route(policy: Policy, request: QueuedRequest, servers: list[ServerView]) -> int:
    """The server index `policy` gives one request alone."""
    picks = policy.assign([request], servers)
    check_rules(picks, [request], servers)
    return picks[0][1].index


# QueuedRequest ------------------------------------------------------------------------------------------------------
def test_queued_request_prefix_fields_are_last_and_optional() -> None:
    old_style = QueuedRequest(1, 100, 10, 0.5, 0.6)  # positional, as user code written before them does
    assert old_style.prefix_blocks is None and old_style.block_size is None
    new = QueuedRequest(1, 9, 10, 0.5, 0.6, (7, 8, 9), 4)
    assert (new.prefix_blocks, new.block_size) == ((7, 8, 9), 4)
    assert list(QueuedRequest.__dataclass_fields__)[-2:] == ["prefix_blocks", "block_size"]


# the block tree -----------------------------------------------------------------------------------------------------
def test_tree_match_is_in_tokens_and_stops_at_a_partial_block() -> None:
    tree = BlockTree()
    tree.insert([1, 2], [4, 2])  # block 2 sent only partly (2 of its 4 tokens)
    assert tree.size == 6
    assert tree.match([1, 2], [4, 2]) == 6
    assert tree.match([1, 2, 3], [4, 4, 4]) == 6  # 4 + the 2 tokens of block 2 it holds; then the match ends
    assert tree.match([1, 3], [4, 4]) == 4
    assert tree.match([2, 1], [4, 4]) == 0  # a leading run only: block 1 in second place does not count
    tree.insert([1, 2, 3], [4, 4, 1])  # now all of block 2 was sent
    assert tree.size == 4 + 4 + 1
    assert tree.match([1, 2, 3], [4, 4, 4]) == 9


def test_tree_eviction_drops_least_recently_used_leaves_first() -> None:
    tree = BlockTree()
    tree.insert([1, 2, 3], [4, 4, 4])
    tree.insert([1, 9], [4, 4])  # uses block 1 again: 1 is more recent than 2 and 3
    assert tree.size == 16 and len(tree) == 4
    tree.evict(12)  # the oldest leaf: block 3
    assert tree.match([1, 2, 3], [4, 4, 4]) == 8 and tree.match([1, 9], [4, 4]) == 8
    tree.evict(4)  # then 2 (a leaf now), then 9; never 1 while it has children
    assert tree.size == 4 and len(tree) == 1
    assert tree.match([1, 2], [4, 4]) == 4 and tree.match([1, 9], [4, 4]) == 4
    tree.evict(0)
    assert tree.size == 0 and len(tree) == 0 and tree.match([1], [4]) == 0


def test_tree_eviction_keeps_the_recently_inserted_path() -> None:
    tree = BlockTree()
    for first in range(100):
        tree.insert([first, 1000 + first], [4, 4])
    tree.insert([5, 1005], [4, 4])  # refresh one old path
    tree.evict(16)  # room for two paths: the two most recently used
    assert tree.size == 16
    assert tree.match([5, 1005], [4, 4]) == 8 and tree.match([99, 1099], [4, 4]) == 8
    assert tree.match([98, 1098], [4, 4]) == 0


def test_tree_eviction_order_is_that_of_an_lru_list() -> None:
    # the reference: every node in an LRU list, each insert moving its path to the recent end leaf first (what the
    # stamps stand for); eviction pops the oldest. Both trees must hold the same blocks after every step
    rng = np.random.default_rng(5)
    tree, lru, size = BlockTree(), OrderedDict(), {}  # lru: path tuple -> None; size: path tuple -> tokens
    for step in range(600):
        path = tuple(int(b) for b in rng.integers(0, 4, size=int(rng.integers(1, 6))))
        tokens = [4] * (len(path) - 1) + [int(rng.integers(1, 5))]
        tree.insert(path, tokens)
        for depth in range(len(path), 0, -1):
            key = path[:depth]
            size[key] = max(size.get(key, 0), tokens[depth - 1])
            lru[key] = None
            lru.move_to_end(key)
        if step % 7 == 0:
            bound = int(rng.integers(0, 60))
            tree.evict(bound)
            while sum(size.values()) > bound:
                key, _ = lru.popitem(last=False)
                del size[key]
        assert tree.size == sum(size.values()) and len(tree) == len(size)
        for key, held in size.items():
            assert tree.match(key, [4] * len(key)) == sum(size[key[:d]] for d in range(1, len(key) + 1))


# cache_aware ---------------------------------------------------------------------------------------------------------
def test_cache_aware_follows_the_longest_match() -> None:
    policy = make("cache_aware")
    idle = [server(0), server(1), server(2)]
    assert route(policy, req(0, [1, 2, 3]), idle) == 0  # nothing cached anywhere: least loaded, lowest index
    assert route(policy, req(1, [7, 8, 9]), [server(0, in_flight=1), server(1), server(2)]) == 1
    busy = [server(0, in_flight=5), server(1, in_flight=9), server(2)]
    assert route(policy, req(2, [1, 2, 4]), busy) == 0  # 8 of 12 tokens cached on 0: ratio 0.67 > 0.3
    assert route(policy, req(3, [7, 8, 9, 5]), busy) == 1  # 12 of 16 on 1
    assert route(policy, req(4, [6, 2, 3]), busy) == 2  # no match: the least loaded
    # the longest match wins over a shorter one elsewhere: [1, 2, 4] is on 0 now, only [1] would not be enough
    policy.trees[2].insert([1, 2], [4, 4])
    assert route(policy, req(5, [1, 2, 4, 4]), busy) == 0
    assert policy.decisions == {"cache_hit": 3, "cache_miss": 3, "imbalanced": 0, "no_blocks": 0}
    assert policy.describe()["tree_tokens"] == {"0": 20, "1": 16, "2": 20}


def test_cache_aware_sends_sequential_requests_all_to_the_first_server() -> None:
    """What sglang's router did with 24 sequential requests from 4 prefixes (.DUCUMENT/captures/sglang-router-0.3.2-sim.txt,
    A): with nothing in flight, every miss goes to the first of the equally loaded servers and every hit follows it
    there."""
    policy = make("cache_aware")
    idle = [server(0), server(1)]
    prefixes = [[10 * p + k for k in range(3)] for p in range(4)]
    chosen = [route(policy, req(i, prefixes[i % 4] + [1000 + i]), idle) for i in range(24)]
    assert chosen == [0] * 24
    assert policy.decisions == {"cache_hit": 20, "cache_miss": 4, "imbalanced": 0, "no_blocks": 0}


def test_cache_aware_threshold_is_strict_and_an_option() -> None:
    # 10 blocks of which 3 are cached: ratio exactly 0.3 is a miss (sglang: match_rate > cache_threshold)
    cached, fresh = list(range(10)), [0, 1, 2] + list(range(100, 107))
    servers = [server(0, in_flight=3), server(1)]
    for threshold, expected in [("0.3", 1), ("0.29", 0), ("0", 0), ("1", 1)]:
        policy = make("cache_aware", cache_threshold=threshold)
        policy.tree(0).insert(cached, [BS] * 10)
        assert route(policy, req(1, fresh), servers) == expected, threshold
    # a partial last block weighs only its tokens: 4 + 4 of 9 tokens match (ratio 0.89)
    policy = make("cache_aware", cache_threshold="0.85")
    policy.tree(0).insert([1, 2, 3], [4, 4, 4])
    assert route(policy, req(1, [1, 2, 5], input_len=9), servers) == 0
    assert route(policy, req(2, [1, 2, 6], input_len=12), servers) == 1  # 8 of 12 (0.67)


@pytest.mark.parametrize(("loads", "imbalanced"), [
    ((100, 30), True),   # 70 > 64 and 100 > 45
    ((70, 0), True),     # 70 > 64 and 70 > 0
    ((100, 40), False),  # 60 is not > 64
    ((300, 210), False),  # 90 > 64 but 300 is not > 315
    ((65, 0), True),
    ((64, 0), False),
])
def test_cache_aware_load_balancing_takes_over(loads: tuple[int, int], imbalanced: bool) -> None:
    policy = make("cache_aware")
    policy.tree(0).insert([1, 2, 3], [4, 4, 4])
    servers = [server(0, in_flight=loads[0]), server(1, in_flight=loads[1])]
    assert route(policy, req(1, [1, 2, 3]), servers) == (1 if imbalanced else 0)


def test_cache_aware_thresholds_are_options_and_balancing_still_records() -> None:
    policy = make("cache_aware", balance_abs_threshold="2", balance_rel_threshold="2")
    policy.tree(0).insert([1, 2, 3], [4, 4, 4])
    assert route(policy, req(1, [1, 2, 3]), [server(0, in_flight=4), server(1, in_flight=2)]) == 0  # 4 is not > 4
    assert route(policy, req(2, [1, 2, 3]), [server(0, in_flight=5), server(1, in_flight=2)]) == 1  # 3 > 2, 5 > 4
    # the request balanced onto 1 was recorded there: with the load even again, 1 matches it as well as 0 does and
    # the tie goes to the less loaded
    assert policy.trees[1].match([1, 2, 3], [4, 4, 4]) == 12
    assert route(policy, req(3, [1, 2, 3]), [server(0, in_flight=3), server(1, in_flight=2)]) == 1


def test_cache_aware_counts_its_own_picks_within_a_call() -> None:
    policy = make("cache_aware", balance_abs_threshold="3", balance_rel_threshold="1")
    queue = [req(i, [1, 2, 3, 10 + i]) for i in range(8)]
    servers = [server(0), server(1)]
    picks = policy.assign(queue, servers)
    check_rules(picks, queue, servers)
    # the first goes to 0; the next ones follow it (ratio 0.75) until 0 is 4 ahead; then 1 gets one (imbalanced),
    # which records the prefix there too: from then on both match 12 of 16 tokens and the less loaded takes the tie
    assert [s.index for _, s in picks] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_cache_aware_respects_caps_and_health() -> None:
    policy = make("cache_aware")
    policy.tree(0).insert([1, 2, 3], [4, 4, 4])
    policy.tree(1).insert([1, 2], [4, 4])
    # the best match (0) is full: the longest match among the open ones (1) gets it
    servers = [server(0, in_flight=2, cap=2), server(1, in_flight=5), server(2)]
    assert route(policy, req(1, [1, 2, 3]), servers) == 1
    # 0 unhealthy, 1 one slot left: the first follows its match to 1, the second goes to the least loaded open one
    servers = [server(0, healthy=False), server(1, in_flight=3, cap=4), server(2, in_flight=1)]
    queue = [req(2, [1, 2, 3]), req(3, [1, 2, 3])]
    picks = policy.assign(queue, servers)
    check_rules(picks, queue, servers)
    assert [s.index for _, s in picks] == [1, 2]
    assert policy.assign(queue, [server(0, in_flight=1, cap=1), server(1, healthy=False)]) == []


def test_cache_aware_requests_without_blocks() -> None:
    policy = make("cache_aware")
    servers = [server(0, in_flight=2), server(1, in_flight=1), server(2, in_flight=1)]
    queue = [req(0, None), req(1, None), req(2, None)]
    assert [s.index for _, s in policy.assign(queue, servers)] == [1, 2, 0]  # least loaded, lowest index on a tie
    assert policy.trees == {}  # nothing recorded


def test_cache_aware_evicts_on_the_run_clock() -> None:
    policy = make("cache_aware", max_tree_size="8", eviction_interval_secs="10")
    servers = [server(0), server(1, in_flight=1)]
    assert route(policy, req(0, [1, 2]), servers) == 0
    assert route(policy, req(1, [3, 4]), servers) == 0
    assert policy.trees[0].size == 16  # over the bound until the next eviction
    policy.now = 9.9
    assert route(policy, req(2, [5, 6]), [server(0), server(1, in_flight=0)]) == 0  # [5, 6] is a miss: lowest index
    assert policy.trees[0].size == 24
    policy.now = 10.0  # eviction first: only the most recent path, [5, 6], stays on 0
    assert route(policy, req(3, [1, 2]), [server(0, in_flight=1), server(1)]) == 1  # [1, 2] was evicted from 0
    assert policy.trees[0].size == 8 and policy.trees[0].match([5, 6], [4, 4]) == 8
    policy.now = 19.9  # the next eviction is due at 20
    for i in range(4, 8):
        policy.assign([req(i, [10 + i, 20 + i])], [server(0), server(1, in_flight=1)])
    assert policy.trees[0].size == 8 + 4 * 8


def test_cache_aware_without_eviction_keeps_everything() -> None:
    policy = make("cache_aware", max_tree_size="0", eviction_interval_secs="0")
    for i in range(50):
        policy.now = 1000.0 * i
        route(policy, req(i, [i, i + 1000]), [server(0)])
    assert policy.trees[0].size == 50 * 8


PREFIX_POLICIES = [("cache_aware", {"max_tree_size": "64", "eviction_interval_secs": "5"}), ("prefix_hash", {}),
                   ("policies/example_sticky_prefix.py:StickyFirstBlock", {"remember": "3"})]


@pytest.mark.parametrize(("spec", "options"), PREFIX_POLICIES)
def test_prefix_policies_keep_the_rules_and_are_deterministic(spec: str, options: dict[str, str]) -> None:
    rng = np.random.default_rng(3)
    calls = []
    for n in range(300):
        groups = rng.integers(0, 6, size=int(rng.integers(1, 6)))
        queue = [req(10 * n + k, [int(g), int(g) + 100, int(rng.integers(1000, 1010)), 5000 + 10 * n + k])
                 for k, g in enumerate(groups)]
        queue.append(req(10 * n + 9, None))  # one without blocks in each call
        servers = [server(i, in_flight=int(rng.integers(0, 90)), cap=int(rng.choice([2, 100, 1 << 30])),
                          healthy=bool(rng.random() < 0.9)) for i in range(4)]
        calls.append((queue, servers))
    runs = []
    for seed in (0, 1):
        policy = make(spec, seed=seed, **options)
        chosen = []
        for n, (queue, servers) in enumerate(calls):
            policy.now = n * 0.1
            picks = policy.assign(queue, servers)
            check_rules(picks, queue, servers)
            chosen.append([(r.id, s.index) for r, s in picks])
        runs.append(chosen)
    assert runs[0] == runs[1]


@pytest.mark.parametrize(("key", "value"), [
    ("cache_threshold", "1.5"), ("cache_threshold", "-0.1"), ("cache_threshold", "nan"),
    ("balance_abs_threshold", "-1"), ("balance_abs_threshold", "2.5"),
    ("balance_rel_threshold", "0.9"), ("balance_rel_threshold", "inf"),
    ("max_tree_size", "-1"), ("max_tree_size", "1e9"),
    ("eviction_interval_secs", "-1"), ("eviction_interval_secs", "inf"),
])
def test_cache_aware_options_out_of_range(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"'cache_aware': option {key}="):
        make("cache_aware", **{key: value})


def test_cache_aware_settings_are_sglang_routers_defaults() -> None:
    assert make("cache_aware").describe()["settings"] == {
        "cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5,
        "max_tree_size": 67108864, "eviction_interval_secs": 60.0,
    }


def test_cache_aware_refuses_blocks_that_do_not_make_the_prompt() -> None:
    policy = make("cache_aware")
    with pytest.raises(PolicyError, match="request 1 has prefix_blocks but no block_size"):
        policy.assign([req(1, [1, 2], block_size=None)], [server(0)])
    with pytest.raises(PolicyError, match="request 2: 2 block.* do not make input_len 20"):
        policy.assign([req(2, [1, 2], input_len=20)], [server(0)])


# prefix_hash ---------------------------------------------------------------------------------------------------------
def test_prefix_hash_same_first_block_same_server_and_spread() -> None:
    policy = make("prefix_hash")
    servers = [server(i) for i in range(4)]
    homes = {}
    for first in range(400):
        chosen = {route(policy, req(first * 10 + k, [first, 50_000 + k, k]), servers) for k in range(3)}
        assert len(chosen) == 1, first  # the rest of the prompt does not matter
        homes[first] = chosen.pop()
    counts = Counter(homes.values())
    assert sorted(counts) == [0, 1, 2, 3] and min(counts.values()) > 400 / 4 * 0.6, counts


def test_prefix_hash_is_consistent_and_full_servers_pass_to_the_next_on_the_ring() -> None:
    four = [server(i) for i in range(4)]
    policy = make("prefix_hash")
    homes = {first: route(policy, req(first, [first]), four) for first in range(300)}
    for gone in range(4):
        # without server `gone` (removed, full or unhealthy): only its keys move, and they move where a ring without
        # it sends them
        without = [s for s in four if s.index != gone]
        full = [server(i, in_flight=3, cap=3) if i == gone else server(i) for i in range(4)]
        unhealthy = [server(i, healthy=False) if i == gone else server(i) for i in range(4)]
        reference = make("prefix_hash")
        for first, home in homes.items():
            moved = route(reference, req(first, [first]), without)
            assert moved == home or home == gone
            assert route(policy, req(first, [first]), full) == moved
            assert route(policy, req(first, [first]), unhealthy) == moved
    # each of the 300 keys was routed twice (full, unhealthy) with each server gone: away from its home once per
    # copy when that server was its home, at home the other three times
    assert policy.describe()["decisions"] == {"home": 300 + 2 * 3 * 300, "next_on_ring": 2 * 300, "no_blocks": 0}


def test_prefix_hash_ring_uses_indices_not_urls_and_is_seed_independent() -> None:
    a, b = make("prefix_hash", seed=1), make("prefix_hash", seed=2)
    other_urls = [ServerView(i, f"http://10.0.0.{i}:9", True, 0, 1 << 30, 0.0, None, None, None, None) for i in range(3)]
    for first in range(100):
        assert route(a, req(first, [first]), [server(i) for i in range(3)]) == route(b, req(first, [first]), other_urls)


def test_prefix_hash_options() -> None:
    servers = [server(i) for i in range(4)]
    one, two = make("prefix_hash"), make("prefix_hash", hash_blocks="2")
    by_second_one = {route(one, req(k, [7, k]), servers) for k in range(40)}
    by_second_two = {route(two, req(k, [7, k]), servers) for k in range(40)}
    assert len(by_second_one) == 1 and len(by_second_two) > 1
    assert make("prefix_hash", virtual_nodes="1").describe()["settings"] == {"virtual_nodes": 1, "hash_blocks": 1}
    for key, value in [("virtual_nodes", "0"), ("hash_blocks", "0"), ("virtual_nodes", "x")]:
        with pytest.raises(ConfigError, match=f"'prefix_hash': option {key}="):
            make("prefix_hash", **{key: value})


def test_prefix_hash_without_blocks_goes_to_the_least_loaded() -> None:
    policy = make("prefix_hash")
    servers = [server(0, in_flight=2), server(1, in_flight=1), server(2, in_flight=1)]
    assert [s.index for _, s in policy.assign([req(0, None), req(1, None), req(2, None)], servers)] == [1, 2, 0]


def test_prefix_hash_matches_its_home_function() -> None:
    policy = PrefixHashPolicy(np.random.default_rng(0), {"virtual_nodes": "7"})
    servers = [server(i) for i in range(3)]
    route(policy, req(0, [1]), servers)
    assert len(policy._points) == 21 and policy._points == sorted(policy._points)
    for first in range(50):
        assert route(policy, req(first, [first, 3]), servers) == policy._owners[policy.home([first])]


# the example --------------------------------------------------------------------------------------------------------
def test_sticky_example_follows_the_first_block() -> None:
    policy = make("policies/example_sticky_prefix.py:StickyFirstBlock", remember="2")
    servers = [server(0), server(1, in_flight=1)]
    assert route(policy, req(0, [5, 1]), servers) == 0
    assert route(policy, req(1, [6, 1]), [server(0, in_flight=1), server(1)]) == 1
    assert route(policy, req(2, [5, 2]), [server(0, in_flight=9), server(1)]) == 0  # sticks despite the load
    assert route(policy, req(3, [5, 3]), [server(0, in_flight=1, cap=1), server(1)]) == 1  # 0 full: least loaded
    assert route(policy, req(4, [5, 3]), [server(0, in_flight=9), server(1)]) == 0  # and the home did not move
    route(policy, req(5, [7]), servers)  # a third first block: 6, the least recently used, is forgotten
    assert list(policy.home) == [5, 7]  # type: ignore[attr-defined]


def test_cache_aware_class_is_the_builtin() -> None:
    assert type(make("cache_aware")) is CacheAwarePolicy


# through a real replay -----------------------------------------------------------------------------------------------
E2E_BLOCK = 16


@pytest.fixture(scope="module")
def group_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four groups of requests: each shares a 3-block prefix (48 of 64 tokens) and adds one block of its own. The
    four group leaders arrive first, 1 ms apart, with long answers (so they are all in flight together); six
    followers per group come next, interleaved."""
    rows: list[tuple[float, int, list[int]]] = [(g * 0.001, 300, group_prefix(g) + [5000 + g]) for g in range(4)]
    rows += [(0.01 + k * 0.004, 16, group_prefix(k % 4) + [6000 + k]) for k in range(24)]
    lines = [format_request_line(i, t * SPEED, 4 * E2E_BLOCK, olen, {"prefix_blocks": blocks})
             for i, (t, olen, blocks) in enumerate(rows)]
    path = tmp_path_factory.mktemp("prefix") / "groups.jsonl"
    return write_trace(path, {"num_requests": len(rows), "duration_s": rows[-1][0] * SPEED, "block_size": E2E_BLOCK}, lines)


def group_prefix(group: int) -> list[int]:
    return [1000 + 20 * group, 1001 + 20 * group, 1002 + 20 * group]  # ring homes with 2 servers: 0, 0, 1, 1


def servers_by_group(records: list[dict]) -> dict[int, set[int]]:
    groups: dict[int, set[int]] = {}
    for r in records:
        group = r["id"] if r["id"] < 4 else (r["id"] - 4) % 4  # the leaders are ids 0-3
        groups.setdefault(group, set()).add(r["server"])
    return groups


def test_replay_cache_aware_keeps_each_prefix_group_on_one_server(tmp_path: Path, group_trace: Path) -> None:
    records, run = replay(tmp_path, group_trace, "cache_aware", "--policy", "cache_aware")
    assert run["policy"]["settings"]["cache_threshold"] == 0.3
    # leaders: each a miss, to the least loaded server (0, 1, 0, 1); followers: 48/64 tokens match, loads stay
    # balanced (far below 64 apart), so each follows its leader
    assert servers_by_group(records) == {0: {0}, 1: {1}, 2: {0}, 3: {1}}
    # run.json at the end: 4 misses (the leaders), 24 hits; each server holds two groups' 3 shared blocks plus one
    # block of each of their 7 requests: 2 × (48 + 7 × 16) tokens
    assert run["policy"]["decisions"] == {"cache_hit": 24, "cache_miss": 4, "imbalanced": 0, "no_blocks": 0}
    assert run["policy"]["tree_tokens"] == {"0": 320, "1": 320}


def test_replay_prefix_hash_sends_each_first_block_to_its_ring_server(tmp_path: Path, group_trace: Path) -> None:
    records, run = replay(tmp_path, group_trace, "prefix_hash", "--policy", "prefix_hash")
    assert run["policy"]["decisions"] == {"home": 28, "next_on_ring": 0, "no_blocks": 0}
    ring = make("prefix_hash")
    idle = [server(0), server(1)]
    expected = {g: {route(ring, req(g, group_prefix(g) + [1]), idle)} for g in range(4)}
    assert set().union(*expected.values()) == {0, 1}  # the groups do not all hash to one server
    assert servers_by_group(records) == expected


class _Recorder(Policy):
    """Everything to the lowest-index server with a free slot; remembers each queue it was shown."""

    name = "recorder"

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        super().__init__(rng, options)
        self.seen: list[list[tuple[int, tuple[int, ...] | None, int | None]]] = []

    def assign(self, queue, servers):  # type: ignore[no-untyped-def]
        self.seen.append([(q.id, q.prefix_blocks, q.block_size) for q in queue])
        free = {s.index: s.free_slots for s in servers}
        picks = []
        for q in queue:
            target = next((s for s in servers if free[s.index] > 0), None)
            if target is None:
                break
            picks.append((q, target))
            free[target.index] -= 1
        return picks


def test_router_fills_the_prefix_fields_also_for_a_static_batch_put_back(tmp_path: Path) -> None:
    """release() gives the policy each request's blocks and the trace's block_size; when a server goes down with a
    static batch still forming, its requests go back to the queue with them."""
    policy = _Recorder(np.random.default_rng(0))
    requests = [TraceRequest(0, 0.0, 20, 2, prefix_blocks=(7, 8, 9)), TraceRequest(1, 0.0, 8, 2)]

    async def main() -> None:
        async def down(index: int) -> str:
            return "gone"

        client, writer = SglangClient(None, True), RecordWriter(tmp_path / "requests.jsonl")
        router = Router(clock=RunClock(), servers=[ServerState(i, f"http://127.0.0.1:{9 + i}", None, True) for i in range(2)],
                        policy=policy, sender=HttpSender(client, InputIds("0f" * 32, 32000)), writer=writer,
                        total=len(requests), health_check=down, modelled_hops=[ModelledHops(0.0, 0.0)] * 2, batch_size=4,
                        block_size=8)
        for request in requests:
            router.release(request, 0.0)
        await asyncio.sleep(0.01)  # assigned to server 0: a batch of 2 of 4 forms there (nothing is sent)
        router.suspect(0, "connection lost")
        await asyncio.sleep(0.01)  # found down: the batch goes back to the queue, then to server 1
        await router.close([], "test over")
        writer.close()
        await client.close()

    asyncio.run(main())
    expected = [(0, (7, 8, 9), 8), (1, None, 8)]
    assert policy.seen == [expected, expected]


def test_replay_runs_the_sticky_example_from_its_file(tmp_path: Path, group_trace: Path) -> None:
    records, run = replay(tmp_path, group_trace, "sticky", "--policy", "example_sticky_prefix")
    assert run["policy"]["file"].endswith("policies/example_sticky_prefix.py")
    # the leaders go to the least loaded server in turn (0, 1, 0, 1); every follower to its leader's server
    assert servers_by_group(records) == {0: {0}, 1: {1}, 2: {0}, 3: {1}}

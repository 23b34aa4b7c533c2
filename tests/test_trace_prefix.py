"""Prefix structure of traces (tracebench/trace/prefix.py and `tracebench inspect`): the ceiling against a token-level
brute force, hand-worked cases, the LRU model, and the Mooncake slice in tests/data."""

from __future__ import annotations

import lzma
import random
from collections import OrderedDict
from pathlib import Path

import numpy as np
import orjson
import pytest

from conftest import TEST_DATA, run_cli
from tracebench.trace.prefix import build_tree, lru_hit_tokens, reusable_per_request, reusable_tokens

MOONCAKE_SLICE = TEST_DATA / "mooncake_synthetic_trace_last1000.jsonl.xz"


def _tokens(blocks: list[int], input_len: int, block_size: int) -> tuple:
    """The prompt as tokens: block b holds tokens (b, 0), (b, 1), ...; a partial last block its first tokens."""
    return tuple((b, t) for b in blocks for t in range(block_size))[:input_len]


def _brute_force(requests: list[tuple[list[int] | None, int]], block_size: int) -> list[int]:
    """Per request: the longest prefix of its tokens that some earlier request's tokens start with, capped at
    input_len - 1 (what sglang's radix cache serves with no eviction)."""
    seen: list[tuple] = []
    out = []
    for blocks, input_len in requests:
        if blocks is None:
            out.append(0)
            continue
        tokens = _tokens(blocks, input_len, block_size)
        best = 0
        for other in seen:
            common = 0
            for a, b in zip(tokens, other):
                if a != b:
                    break
                common += 1
            best = max(best, common)
        out.append(min(best, input_len - 1))
        seen.append(tokens)
    return out


def _tree(requests: list[tuple[list[int] | None, int]], block_size: int):
    counts = np.array([0 if b is None else len(b) for b, _ in requests])
    flat = np.array([x for b, _ in requests if b is not None for x in b], dtype=np.int64)
    return build_tree(counts, flat, np.array([n for _, n in requests]), block_size)


def test_hand_worked_ceiling_with_partial_blocks_a_reused_id_and_no_blocks() -> None:
    bs = 4
    requests = [
        ([1, 2, 3], 10),  # block 3 partial: its first 2 tokens
        ([1, 2, 3], 12),  # 8 tokens of blocks 1, 2 + the 2 tokens of block 3 sent before = 10
        ([1, 2, 3], 12),  # the whole prompt was sent before: capped at 11 (sglang computes one token)
        ([5, 2], 8),  # block 2 after block 5 is another prefix: nothing reusable
        ([1, 2, 4], 9),  # blocks 1, 2 = 8
        (None, 7),  # no blocks: nothing
        ([5, 2], 8),  # the whole of request 3 again: capped at 7
    ]
    tree = _tree(requests, bs)
    assert reusable_per_request(tree).tolist() == [0, 10, 11, 0, 8, 0, 7] == _brute_force(requests, bs)
    assert reusable_tokens([b for b, _ in requests], [n for _, n in requests], bs) == (36, 66)
    assert tree.distinct_blocks == 5 and tree.nodes == 6  # (1) (1,2) (1,2,3) (5) (5,2) (1,2,4)


@pytest.mark.parametrize("seed", range(6))
def test_ceiling_equals_a_token_level_brute_force_on_random_trees(seed: int) -> None:
    rng = random.Random(seed)
    bs = rng.choice([1, 3, 4, 16])
    requests: list[tuple[list[int] | None, int]] = []
    for _ in range(120):
        if rng.random() < 0.1:
            requests.append((None, rng.randint(1, 40)))
            continue
        # extend an earlier request's leading blocks (or start fresh) with new or reused ids: shared prefixes, ids
        # reached along different paths, partial last blocks longer or shorter than before
        base = rng.choice([b for b, _ in requests if b is not None] or [[]])
        keep = rng.randint(0, len(base))
        blocks = base[:keep] + [rng.randint(0, 12 if seed % 2 else 10_000) for _ in range(rng.randint(0, 3))]
        if not blocks:
            blocks = [rng.randint(0, 12)]
        input_len = (len(blocks) - 1) * bs + rng.randint(1, bs)
        requests.append((blocks, input_len))
    tree = _tree(requests, bs)
    assert reusable_per_request(tree).tolist() == _brute_force(requests, bs)


def _naive_lru(requests: list[tuple[list[int], int]], bs: int, capacity_blocks: int) -> int:
    """The LRU of prefix-tree nodes the docs describe, written plainly: a node is the tuple of leading ids."""
    cache: OrderedDict[tuple, None] = OrderedDict()
    sent: dict[tuple, int] = {}  # most tokens of a node sent so far
    served = 0
    for blocks, input_len in requests:
        paths = [tuple(blocks[: i + 1]) for i in range(len(blocks))]
        hit = 0
        for i, path in enumerate(paths):
            own = min(bs, input_len - i * bs)
            if path not in cache:
                break
            hit += min(own, sent[path])
        served += min(hit, input_len - 1)
        for i, path in enumerate(paths):
            sent[path] = max(sent.get(path, 0), min(bs, input_len - i * bs))
        for path in reversed(paths):
            cache[path] = None
            cache.move_to_end(path)
        while len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return served


def test_lru_matches_a_plain_implementation_and_grows_to_the_ceiling() -> None:
    rng = random.Random(3)
    bs = 8
    prompts = [[rng.randint(0, 30) for _ in range(rng.randint(1, 6))] for _ in range(25)]  # shared system prompts
    requests = []
    for _ in range(400):
        blocks = list(rng.choice(prompts)) + [rng.randint(100, 10**6) for _ in range(rng.randint(0, 2))]
        requests.append((blocks, (len(blocks) - 1) * bs + rng.randint(1, bs)))
    tree = _tree(requests, bs)
    ceiling = int(reusable_per_request(tree).sum())
    sizes = [8, 40, 160, 800, 10**6]
    results = lru_hit_tokens(tree, [size * bs for size in sizes])
    served = [r.hit_tokens for r in results]
    assert served == [_naive_lru(requests, bs, size) for size in sizes]
    assert served == sorted(served) and served[0] < served[-1] == ceiling
    assert all(r.sample_rate == 1.0 for r in results)


def test_lru_over_the_exact_budget_is_estimated_on_a_spatial_sample() -> None:
    rng = random.Random(5)
    bs = 8
    prompts = [[rng.randint(0, 10**6) for _ in range(rng.randint(1, 6))] for _ in range(3000)]
    requests = []
    for _ in range(20000):
        blocks = list(rng.choice(prompts)) + [rng.randint(10**7, 10**9) for _ in range(rng.randint(0, 2))]
        requests.append((blocks, (len(blocks) - 1) * bs + rng.randint(1, bs)))
    tree = _tree(requests, bs)
    sizes = [500 * bs, 4000 * bs]
    exact = lru_hit_tokens(tree, sizes)
    sampled = lru_hit_tokens(tree, sizes, max_refs=tree.node.size // 4)
    assert all(r.sample_rate == 1.0 for r in exact)
    assert all(0.2 < r.sample_rate < 0.3 for r in sampled)
    for e, s in zip(exact, sampled):
        assert abs(e.hit_rate - s.hit_rate) < 0.03, (e, s)
    assert exact[0].hit_rate < exact[1].hit_rate


def test_mooncake_slice_inspect_reports_the_ceiling(tmp_path: Path) -> None:
    rows = [orjson.loads(line) for line in lzma.decompress(MOONCAKE_SLICE.read_bytes()).splitlines()]
    # the block-level leading-run rule, written plainly: the leading run of blocks an earlier request sent (a block
    # sent only partially before gives only those tokens), capped at input_len - 1 per request
    sent: dict[tuple, int] = {}
    reusable = uncapped = 0
    for row in rows:
        ids, input_len = row["hash_ids"], row["input_length"]
        own = [min(512, input_len - i * 512) for i in range(len(ids))]
        run = 0
        for i in range(len(ids)):
            if tuple(ids[: i + 1]) not in sent:
                break
            run += min(own[i], sent[tuple(ids[: i + 1])])
        uncapped += run
        reusable += min(run, input_len - 1)
        for i in range(len(ids)):
            sent[tuple(ids[: i + 1])] = max(sent.get(tuple(ids[: i + 1]), 0), own[i])
    assert uncapped > reusable  # some prompts of the slice come whole again: sglang still computes one token
    total = sum(row["input_length"] for row in rows)
    trace = tmp_path / "mooncake.jsonl"
    proc = run_cli("generate", "--dataset", str(MOONCAKE_SLICE), "--keep-timestamps", "--max-context", "1000000",
                   "-o", str(trace))
    assert proc.returncode == 0, proc.stderr
    proc = run_cli("inspect", str(trace), "--json", "--lru-tokens", "65536,1000000,100000000")
    assert proc.returncode == 0, proc.stderr
    prefix = orjson.loads(proc.stdout)["prefix"]
    assert prefix["block_size"] == 512 and prefix["requests_with_blocks"] == 1000
    assert prefix["block_refs"] == sum(len(row["hash_ids"]) for row in rows)
    assert prefix["distinct_blocks"] == len({b for row in rows for b in row["hash_ids"]})
    assert (prefix["reusable_tokens"], prefix["prompt_tokens"]) == (reusable, total)
    assert round(prefix["reusable_fraction"], 3) == 0.688
    hit_rates = [lru["hit_rate"] for lru in prefix["lru"]]
    assert [lru["cache_tokens"] for lru in prefix["lru"]] == [65536, 1000000, 100000000]
    assert hit_rates == sorted(hit_rates) and hit_rates[-1] == prefix["reusable_fraction"]
    table = run_cli("inspect", str(trace)).stdout
    assert "reusable (ceiling) 0.688 of prompt tokens" in table
    assert "LRU     231818 tokens  hit rate" in table  # the default sizes


def test_inspect_without_blocks_has_no_prefix_section_and_bad_sizes_are_errors(tmp_path: Path) -> None:
    trace = tmp_path / "plain.jsonl"
    assert run_cli("generate", "--num-requests", "50", "-o", str(trace)).returncode == 0
    proc = run_cli("inspect", str(trace), "--json")
    assert orjson.loads(proc.stdout)["prefix"] is None
    assert "reusable" not in run_cli("inspect", str(trace)).stdout
    for bad in ("0", "1,x", ""):
        proc = run_cli("inspect", str(trace), "--lru-tokens", bad)
        assert proc.returncode == 2 and proc.stderr.startswith("tracebench: error: --lru-tokens"), proc.stderr


def test_trace_reusable_tokens_reads_a_trace_file(tmp_path: Path) -> None:
    from tracebench.trace.prefix import trace_reusable_tokens

    trace = tmp_path / "t.jsonl"
    lines = ['{"tracebench_trace":1,"num_requests":3,"duration_s":2,"block_size":4}',
             '{"id":0,"arrival_s":0,"input_len":10,"output_len":1,"prefix_blocks":[1,2,3]}',
             '{"id":1,"arrival_s":1,"input_len":5,"output_len":1}',
             '{"id":2,"arrival_s":2,"input_len":12,"output_len":1,"prefix_blocks":[1,2,3]}']
    trace.write_text("\n".join(lines) + "\n")
    assert trace_reusable_tokens(trace) == (10, 27)

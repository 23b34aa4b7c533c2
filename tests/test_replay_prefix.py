"""Shared prefixes through replay: block ids become the same tokens for every request that names them, the server's
radix cache hits them (`cached_tokens` recorded), --flush-cache starts every run from an empty cache, and closed-loop
requests are released delay_s after the request they follow finished. Replays are real processes against real
sim-server processes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import run_cli
from test_replay_run import check_every_request_once, read_run
from tracebench.errors import ConfigError
from tracebench.replay.tokens import TOKEN_ID_LOW, InputIds
from tracebench.trace.format import write_trace
from tracebench.trace.prefix import leading_seen_tokens

SHA = "5e" * 32


def test_block_ids_are_the_blocks_content() -> None:
    ids = InputIds(SHA, 32000, block_size=16)
    a = ids.block_ids((7, 8, 9), 40)
    b = ids.block_ids((7, 8, 10, 11), 60)
    assert len(a) == 40 and len(b) == 60 and a.dtype == np.int64
    assert (a[:32] == b[:32]).all(), "leading blocks 7, 8 give the same 32 tokens"
    assert (a[32:40] != b[32:40]).mean() > 0.9, "block 9 and block 10 differ"
    # a partial last block holds the first tokens of its block
    assert (ids.block_ids((7,), 5) == a[:5]).all()
    assert (ids.block_ids((7, 8, 9), 48)[:40] == a).all()
    # same (trace, block) -> same ids in a fresh object; another trace -> other ids
    assert (InputIds(SHA, 32000, block_size=16).block_ids((7, 8, 9), 40) == a).all()
    assert (InputIds("77" * 32, 32000, block_size=16).block_ids((7, 8, 9), 40) != a).mean() > 0.9
    many = ids.block_ids(tuple(range(-500, 500)), 16000)
    assert many.min() >= TOKEN_ID_LOW and many.max() < 32000
    assert len(np.unique(many)) > 12000, "ids spread over the vocabulary"
    with pytest.raises(ConfigError, match="block_size"):
        InputIds(SHA, 32000).block_ids((1,), 4)


def write_prefix_trace(path: Path, rows: list[dict[str, Any]], block_size: int) -> Path:
    lines = [json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in rows]
    duration = max(r["arrival_s"] for r in rows)
    return write_trace(path, {"num_requests": len(rows), "duration_s": duration, "block_size": block_size}, lines)


def test_cached_tokens_follow_the_blocks_on_one_server(tmp_path: Path) -> None:
    """Requests one at a time (far apart) on one simulated server with a big cache: sglang's cached_tokens equals
    the leading tokens already sent, as measured on a real H200 (tests/data/sglang-0.5.17/prefix-cache-h200.json)."""
    bs = 16
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        n = int(rng.integers(20, 120))
        nblocks = -(-n // bs)
        group = int(rng.integers(0, 4))  # four "system prompts" of 3 blocks, then the request's own blocks
        blocks = [group * 10 + k for k in range(min(3, nblocks))] + [1000 + i * 10 + k for k in range(max(0, nblocks - 3))]
        rows.append({"id": i, "arrival_s": i * 0.25, "input_len": n, "output_len": 4, "prefix_blocks": blocks})
    trace = write_prefix_trace(tmp_path / "p.jsonl", rows, bs)
    # on the virtual clock: the simulator's radix cache and the record's cached_tokens are the same code under both
    # clocks (the HTTP answer's meta_info cached_tokens is read in test_flush_cache_starts_each_run_from_an_empty_cache
    # below and tests/test_sim_prefix_cache.py)
    result = run_cli("replay", str(trace), "--clock", "virtual", "--run-name", "p", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "p")
    check_every_request_once(records, len(rows))
    assert run["flush_cache"] is True
    by_id = {r["id"]: r for r in records}
    # sglang never serves a whole prompt from its cache: the last prompt token is always computed
    want = leading_seen_tokens([r["prefix_blocks"] for r in rows], [r["input_len"] for r in rows], bs).tolist()
    got = [by_id[i]["cached_tokens"] for i in range(len(rows))]
    assert got == want
    assert sum(want) > 0.3 * sum(r["input_len"] for r in rows), "the trace does share prefixes"


def test_flush_cache_starts_each_run_from_an_empty_cache(tmp_path: Path, sim_server) -> None:
    bs = 16
    rows = [{"id": i, "arrival_s": i * 0.2, "input_len": 64, "output_len": 2, "prefix_blocks": [1, 2, 3, 4 + i]}
            for i in range(3)]
    trace = write_prefix_trace(tmp_path / "p.jsonl", rows, bs)
    server = sim_server()
    cached = {}
    for name, flag in (("first", "--flush-cache"), ("again", "--no-flush-cache"), ("flushed", "--flush-cache")):
        result = run_cli("replay", str(trace), "--attach", server.url, flag, "--run-name", name,
                         "--out-dir", str(tmp_path), "--quiet")
        assert result.returncode == 0, result.stderr
        run, records = read_run(tmp_path / name)
        assert run["flush_cache"] is (flag == "--flush-cache")
        cached[name] = [r["cached_tokens"] for r in sorted(records, key=lambda r: r["id"])]
    assert cached["first"] == [0, 48, 48]
    assert cached["again"] == [63, 63, 63], "without a flush, the previous run's cache serves this one (whole prompts: input_len - 1)"
    assert cached["flushed"] == cached["first"]


def test_closed_loop_turns_follow_the_previous_answer(tmp_path: Path) -> None:
    """Two sessions of three turns: turn k+1 is released delay_s after turn k finished (its t_arrival is that
    moment, not the trace's estimate); open-loop requests keep their schedule. On the virtual clock: when a turn is
    due is the engine's rule, the same under both clocks, and no host delay blurs it there (at --speed 4 on a loaded
    machine the real clock missed the 3 ms bound)."""
    rows = []
    speed = 1.0  # the virtual clock runs the trace's own seconds
    for s in range(2):
        for k in range(3):
            rid = s * 10 + k
            row = {"id": rid, "arrival_s": 0.0, "input_len": 40 + 10 * k, "output_len": 20}
            if k:
                row.update(after=rid - 1, delay_s=0.4)
            rows.append(row)
    rows.append({"id": 100, "arrival_s": 0.3, "input_len": 30, "output_len": 8})
    for i, r in enumerate(rows):  # ids rise line by line; the estimates only have to be in order
        r["arrival_s"] = round(0.05 * i, 6)
    lines = [json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in rows]
    trace = write_trace(tmp_path / "c.jsonl", {"num_requests": len(rows), "duration_s": rows[-1]["arrival_s"]}, lines)
    result = run_cli("replay", str(trace), "--clock", "virtual", "--run-name", "c", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "c")
    assert Counter(r["status"] for r in records) == {"ok": len(rows)}
    by_id = {r["id"]: r for r in records}
    for row in rows:
        rec = by_id[row["id"]]
        if "after" in row:
            before = by_id[row["after"]]
            due = before["t_finish"] + row["delay_s"] / speed
            assert rec["t_arrival"] == pytest.approx(due, abs=0.003), (row, rec, before)
            assert rec["t_released"] >= rec["t_arrival"] and rec["t_released"] - rec["t_arrival"] < 0.02
        else:
            assert rec["t_arrival"] == pytest.approx(row["arrival_s"] / speed)

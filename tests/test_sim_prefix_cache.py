"""The sim-server's prefix (radix) cache against what real sglang 0.5.17 measured on an H200
(tests/data/sglang-0.5.17/prefix-cache-h200.json, made by its prefix_probe.py): the model on a virtual
clock (cached_tokens exact, prefill times within the tolerances stated per test), then a real sim-server process."""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from conftest import SGLANG_CAPTURES
from tracebench.profiles import load_profile
from tracebench.sim.model import BatchModel, Limits, SimRequest, simulate
from tracebench.sim.radix import RadixCache

PROFILE = load_profile("llama-2-7b-h200-triton")
BIG = Limits(max_running_requests=4096, max_total_num_tokens=PROFILE.max_total_num_tokens, chunked_prefill_size=8192)
MEASURED = json.loads((SGLANG_CAPTURES / "prefix-cache-h200.json").read_text())
OUT = 16          # the probe's max_new_tokens (8 for the Mooncake rows)
APART = 1.0       # "one after another": each request long after the previous one finished


def toks(n: int, seed: int) -> list[int]:
    """The probe's prompts: n ids in [1000, 32000) from seed."""
    return np.random.default_rng(seed).integers(1000, 32000, n).tolist()


PREFIX = toks(2048, 1)


def prefill_ms(outcome) -> float:
    return (outcome.t_prefill_finished - outcome.t_forward_entry) * 1e3


def measured_ms(series: str) -> list[float]:
    return [x["prefill_s"] * 1e3 for x in MEASURED[series]]


def one_by_one(prompts: list[list[int]], limits: Limits = BIG, out: int = OUT):
    return simulate(PROFILE, limits, [(i * APART, len(p), out, p) for i, p in enumerate(prompts)])


# ---------------------------------------------------------------- the model on a virtual clock, vs the H200

def test_shared_2048_prefix_one_after_another() -> None:
    # measured: cached 0 then 2048 x 11; prefill 52.6 ms then 10.8-11.0 ms. Tolerance: 5% per request.
    outs = one_by_one([PREFIX + toks(64, 100 + i) for i in range(12)])
    assert [o.cached_tokens for o in outs] == [x["cached"] for x in MEASURED["A_shared_prefix_seq"]]
    for sim, real in zip(map(prefill_ms, outs), measured_ms("A_shared_prefix_seq")):
        assert sim == pytest.approx(real, rel=0.05)


def test_unique_prompts_never_hit() -> None:
    # measured: cached 0, 52-56 ms (median 52.9). Tolerance: the median within 5%.
    outs = one_by_one([toks(2112, 200 + i) for i in range(12)])
    assert [o.cached_tokens for o in outs] == [0] * 12
    assert statistics.median(map(prefill_ms, outs)) == pytest.approx(
        statistics.median(measured_ms("B_unique_seq")), rel=0.05)


def test_partial_hit_of_the_first_1000_tokens() -> None:
    # measured (after series A and B on the same server): cached exactly 1000, prefill 33.5 ms (1112 new tokens).
    # Tolerance: 12% (the fitted cost is 9.5% low on this one shape; see `python -m tracebench.sim.fit`).
    prompts = [PREFIX + toks(64, 100)] + [PREFIX[:1000] + toks(1112, 300 + i) for i in range(4)]
    outs = one_by_one(prompts)[1:]
    assert [o.cached_tokens for o in outs] == [x["cached"] for x in MEASURED["C_partial"]]
    for sim, real in zip(map(prefill_ms, outs), measured_ms("C_partial")):
        assert sim == pytest.approx(real, rel=0.12)


def test_flush_empties_the_cache() -> None:
    model = BatchModel(PROFILE, BIG)
    first = SimRequest("a", 2112, 1, t_ready=0.0, input_ids=PREFIX + toks(64, 1))
    _run(model, [first])
    assert model.cache is not None and model.cache.total_tokens == 2112
    assert model.flush_cache() and model.cache.total_tokens == 0 and model.kv_reserved == 0
    again = SimRequest("b", 2112, 1, t_ready=1.0, input_ids=PREFIX + toks(64, 400))
    _run(model, [again])
    assert again.cached_tokens == MEASURED["D_after_flush"][0]["cached"] == 0


def test_flush_refused_while_busy() -> None:
    model = BatchModel(PROFILE, BIG)
    req = SimRequest("a", 100, 50, t_ready=0.0, input_ids=toks(100, 5))
    model.submit(req)
    assert not model.flush_cache()                    # waiting
    model.finish_step(model.start_step(0.0))
    assert not model.flush_cache()                    # running
    _run(model, [])
    assert model.flush_cache()


def test_burst_of_8_same_prefix_after_a_flush() -> None:
    # measured: the first runs alone; the next four are prefilled together (8192-token chunk budget: three whole and
    # one chunked) with cached 0: they were planned while the first ran, before its prefix entered the cache; the last
    # three hit 2048. Arrival spacing 0.5 ms (received stamps are not in the capture; the e2e spread says < 1 ms).
    # Tolerance: the first's prefill within 8% (the fitted cost of a fresh 2112-token prompt is 4% low and this one
    # measured 53.9 ms against 52.6-52.9 ms in series A and B), each request's e2e within 7% (sim 378-381 ms against
    # 400-406 ms measured: the 8192-token step and the 15 decode steps of 8 are each a few % short).
    outs = simulate(PROFILE, BIG, [(i * 0.0005, 2112, OUT, PREFIX + toks(64, 500 + i)) for i in range(8)])
    real = MEASURED["E_burst_same_prefix"]
    assert [o.cached_tokens for o in outs] == [x["cached"] for x in real] == [0] * 5 + [2048] * 3
    entries = [o.t_forward_entry for o in outs]
    assert entries[0] < entries[1] == entries[2] == entries[3] == entries[4] < entries[5] == entries[6] == entries[7]
    assert prefill_ms(outs[0]) == pytest.approx(real[0]["prefill_s"] * 1e3, rel=0.08)
    for sim, x in zip(outs, real):
        assert sim.server_e2e == pytest.approx(x["e2e"], rel=0.07)


def test_burst_step_times() -> None:
    # sglang stamps forward_entry_time when it plans a request into a batch, which with the overlap scheduler is while
    # the previous step still runs (the measured 235 ms of requests 1-3 span part of step 1 too); the sim stamps the
    # step's start, so single prefill times are not comparable here. Requests 1 and 4 were planned together, so the
    # difference of their prefill times is step 3: request 4's last 256 tokens and the three hits' 64 new tokens
    # each (19.5 ms measured). Tolerance: 40% (a small step near the launch-bound floor, measured once).
    outs = simulate(PROFILE, BIG, [(i * 0.0005, 2112, OUT, PREFIX + toks(64, 500 + i)) for i in range(8)])
    real = MEASURED["E_burst_same_prefix"]
    step3_measured = (real[4]["prefill_s"] - real[1]["prefill_s"]) * 1e3
    step3_sim = (outs[4].t_prefill_finished - outs[1].t_prefill_finished) * 1e3
    assert step3_sim == pytest.approx(step3_measured, rel=0.4)


def leading_shared(prompt: list[int], earlier: list[list[int]]) -> int:
    """What a radix cache that never evicts holds of `prompt`: its longest common prefix with any earlier prompt,
    at most len(prompt) - 1."""
    best = 0
    mine = np.array(prompt)
    for other in earlier:
        m = min(len(prompt), len(other))
        differ = mine[:m] != np.array(other[:m])
        best = max(best, int(differ.argmax()) if differ.any() else m)
    return min(best, len(prompt) - 1)


def mooncake_like_rows() -> list[list[int]]:
    """Block lists with the structure of the probe's 120 Mooncake rows (their hash_ids are not in the capture): row i
    has prompt_i / 512 blocks, of which the leading expected_i / 512 were seen before; the rest are new."""
    rows = []
    fresh = 1000
    f = MEASURED["F_mooncake_blocks"]
    for prompt, seen in zip(f["prompt"], f["expected_cached_if_never_evicted"]):
        n, k = prompt // 512, seen // 512
        earlier = next(r for r in rows if len(r) >= k) if k else []
        rows.append(earlier[:k] + list(range(fresh, fresh + n - k)))
        fresh += n - k
    return rows


def test_mooncake_blocks_cached_tokens_and_prefill() -> None:
    # measured: cached_tokens == the leading blocks already sent, row by row (0 mismatches, 60,928 tokens).
    # Tolerance: prefill median error within 5%, every row within 12%.
    blocks: dict[int, list[int]] = {}

    def block(h: int) -> list[int]:
        if h not in blocks:
            blocks[h] = toks(512, 10_000_000 + h)
        return blocks[h]

    f = MEASURED["F_mooncake_blocks"]
    prompts = [[t for h in row for t in block(h)] for row in mooncake_like_rows()]
    outs = one_by_one(prompts, out=8)
    cached = [o.cached_tokens for o in outs]
    # in blocks, as measured; in tokens, the leading shared tokens (a new block may start with the same token as
    # another one: 1 token more, as sglang's token-level tree would also find)
    assert [c // 512 * 512 for c in cached] == f["cached"] == f["expected_cached_if_never_evicted"]
    assert cached == [leading_shared(p, prompts[:i]) for i, p in enumerate(prompts)]
    errors = [prefill_ms(o) / (real * 1e3) - 1 for o, real in zip(outs, f["prefill_s"])]
    assert abs(statistics.median(errors)) < 0.05
    assert max(map(abs, errors)) < 0.12


# ---------------------------------------------------------------- the cache's rules

def _run(model: BatchModel, reqs: list[SimRequest], t_free: float = 0.0) -> float:
    for req in reqs:
        model.submit(req)
    while (t := model.next_start(t_free)) is not None:
        model.finish_step(model.start_step(t))
        t_free = model.last_end
        assert model.kv_reserved + (model.cache.total_tokens if model.cache else 0) <= model.limits.max_total_num_tokens
    model.process_results()
    return t_free


def test_never_the_whole_prompt_and_off_when_disabled() -> None:
    # sglang matches at most input_len - 1 tokens (schedule_batch.py _compute_max_prefix_len): one is prefilled
    ids = toks(300, 9)
    same = one_by_one([ids, ids])
    assert [o.cached_tokens for o in same] == [0, 299]
    assert prefill_ms(same[1]) == pytest.approx(PROFILE.prefill_min_s * 1e3)
    off = one_by_one([ids, ids], limits=dataclasses.replace(BIG, radix_cache=False))
    assert [o.cached_tokens for o in off] == [0, 0]
    assert prefill_ms(off[1]) == pytest.approx(prefill_ms(off[0]))


def test_chunked_prompt_is_cached_and_hit() -> None:
    ids = toks(3000, 11)
    outs = one_by_one([ids, ids[:2500] + toks(100, 12)], limits=dataclasses.replace(BIG, chunked_prefill_size=1024))
    assert [o.cached_tokens for o in outs] == [0, 2500]


def test_lru_eviction_of_unlocked_entries() -> None:
    # capacity 2600; prompts of 1000 tokens, 1 output each (the cache keeps 1000 per prompt)
    model = BatchModel(PROFILE, dataclasses.replace(BIG, max_total_num_tokens=2600))
    a, b, c = toks(1000, 21), toks(1000, 22), toks(1000, 23)
    t = 0.0
    got = []
    for i, ids in enumerate([a, b, c, b, a]):   # c evicts a (least recently used), b survives
        req = SimRequest(str(i), 1000, 1, t_ready=t, input_ids=ids)
        t = _run(model, [req], t) + 1.0
        got.append(req.cached_tokens)
        assert model.cache is not None and model.cache.total_tokens <= 2600
    assert got == [0, 0, 0, 999, 0]


def test_locked_prefix_is_not_evicted_and_the_newcomer_waits() -> None:
    # capacity 2100: a (1000 in, 500 out) holds 1500; b (1000 new tokens + 10) must wait for a to finish, then
    # evicts a's cached entries to fit
    model = BatchModel(PROFILE, dataclasses.replace(BIG, max_total_num_tokens=2100))
    a = SimRequest("a", 1000, 500, t_ready=0.0, input_ids=toks(1000, 31))
    b = SimRequest("b", 1000, 10, t_ready=0.01, input_ids=toks(1000, 32))
    _run(model, [a, b])
    assert a.t_finished is not None and b.t_forward_entry is not None and b.t_forward_entry >= a.t_finished
    assert model.kv_reserved == 0 and model.cache is not None and model.cache.evictable_tokens == model.cache.total_tokens


def test_radix_tree_match_split_insert_evict() -> None:
    cache = RadixCache()
    assert cache.insert([1, 2, 3, 4, 5], 5) == (0, cache.root.children[1])
    assert cache.match([1, 2, 3, 9], 4)[0] == 3             # splits the node after 3
    already, node = cache.insert([1, 2, 3, 9, 9], 5)
    assert already == 3 and node.key == [9, 9]
    assert cache.total_tokens == 7 and cache.num_nodes == 3
    cache.lock(node)
    assert cache.evictable_tokens == 2                       # [4, 5]: the path [1, 2, 3] + [9, 9] is locked
    assert cache.evict(100) == 2 and cache.total_tokens == 5
    cache.unlock(node)
    assert cache.evict(100) == 5 and cache.total_tokens == 0 and not cache.root.children
    assert cache.match(["w1", "w2"], 2) == (0, cache.root)


def test_packed_tokens_give_the_same_cache_as_lists() -> None:
    """The virtual clock's packed prompts (radix.PackedTokens) behave in the tree exactly as lists of the same ids:
    the same hits, splits, output tails and evictions under KV pressure, so the same outcomes."""
    from tracebench.sim.radix import PackedTokens

    rng = np.random.default_rng(7)
    heads = [toks(int(rng.integers(64, 1500)), 100 + i) for i in range(6)]
    rows = []
    for i in range(160):
        head = heads[int(rng.integers(0, len(heads)))]
        cut = int(rng.integers(1, len(head) + 1))
        prompt = head[:cut] + toks(int(rng.integers(1, 400)), 1000 + i)
        rows.append((i * 0.02, len(prompt), int(rng.integers(1, 40)), prompt))
    tight = Limits(max_running_requests=16, max_total_num_tokens=12000, chunked_prefill_size=2048)
    as_lists = simulate(PROFILE, tight, rows)
    as_packed = simulate(PROFILE, tight, [(t, n, out, PackedTokens.of(p)) for t, n, out, p in rows])
    assert as_packed == as_lists
    assert sum(o.cached_tokens for o in as_lists) > 20000  # the shared heads hit
    cache = RadixCache()
    assert cache.insert(PackedTokens.of([1, 2, 3, 4, 5]), 5)[0] == 0
    assert cache.match(PackedTokens.of([1, 2, 3, 9]), 4)[0] == 3
    already, node = cache.insert(PackedTokens.of([1, 2, 3, 9, 9]), 5)
    assert already == 3 and node.key == PackedTokens.of([9, 9]) and list(node.key) == [9, 9]
    cache.lock(node)
    assert cache.evict(100) == 2 and cache.total_tokens == 5  # [4, 5]; [1, 2, 3] + [9, 9] locked
    assert PackedTokens.of([-3, 2**62])[0] == -3 and PackedTokens.of([-3, 2**62])[-1] == 2**62


# ---------------------------------------------------------------- a real sim-server process

def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _flush(url: str, query: str = "") -> tuple[int, str]:
    req = urllib.request.Request(url + "/flush_cache" + query, data=b"", method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _stream_metas(url: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url + "/generate", data=json.dumps({**body, "stream": True}).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=30) as resp:
        lines = resp.read().decode().split("\n\n")
    return [json.loads(line[6:])["meta_info"] for line in lines if line.startswith("data: {")]




def test_http_cached_tokens_follow_shared_prefixes_and_flush_resets(sim_server) -> None:
    srv = sim_server("--speed", "50")
    blocks = {h: toks(64, 7_000 + h) for h in range(12)}
    rows = [[0, 1, 2], [0, 1, 3], [0, 4], [5], [0, 1, 2, 6], [5, 7], [0, 1]]
    prompts = [[t for h in row for t in blocks[h]] for row in rows]
    prompts.append(prompts[1][:150] + toks(40, 99))           # a hit ending inside a block
    params = {"max_new_tokens": 3, "ignore_eos": True}
    got, expected = [], []
    for i, ids in enumerate(prompts):  # one after another
        meta = _post(srv.url, {"input_ids": ids, "sampling_params": params})["meta_info"]
        got.append(meta["cached_tokens"])
        expected.append(leading_shared(ids, prompts[:i]))
        assert meta["cached_tokens_details"] == ({"device": got[-1], "host": 0} if got[-1] else None)
    assert got == expected == [0, 128, 64, 0, 192, 64, 127, 150]
    # sglang's cache_hit_rate: the last prefill batch's cached / (cached + new) tokens
    load = json.loads(urllib.request.urlopen(srv.url + "/v1/loads", timeout=5).read())["loads"][0]
    assert load["cache_hit_rate"] == round(150 / 190, 4)
    status, text = _flush(srv.url)
    assert (status, text) == (200, json.loads((SGLANG_CAPTURES / "api_capture.json").read_text())["flush_cache"]["body"])
    after = [_post(srv.url, {"input_ids": ids, "sampling_params": params})["meta_info"]["cached_tokens"]
             for ids in prompts[:2]]
    assert after == [0, 128]
    # a text prompt (the word-level tokenizer: one token per word) is matched by its words
    texts = [_post(srv.url, {"text": "w5 w6 w7 w8 w9", "sampling_params": params})["meta_info"]["cached_tokens"]
             for _ in "ab"]
    assert texts == [0, 4]


def test_http_flush_refused_while_busy_and_disabled_cache(sim_server) -> None:
    srv = sim_server("--speed", "1")
    busy = threading.Thread(target=_post, args=(srv.url, {"input_ids": toks(64, 1),
                                                          "sampling_params": {"max_new_tokens": 200}}))
    busy.start()
    try:
        for _ in range(200):   # wait until the request runs (200 decode steps: ~1 s)
            if json.loads(urllib.request.urlopen(srv.url + "/v1/loads", timeout=5).read())["loads"][0][
                    "num_running_reqs"]:
                break
            threading.Event().wait(0.01)
        assert _flush(srv.url) == (400, "Flush cache failed.\n")
        assert _flush(srv.url, "?timeout=0.05") == (400, "Timed out waiting for idle state.")
        assert _flush(srv.url, "?timeout=-1")[0] == 422
        assert _flush(srv.url, "?timeout=20")[0] == 200       # waits for the request to finish, then flushes
        busy.join(timeout=10)
        assert not busy.is_alive()
    finally:
        busy.join()
    # streamed: every chunk carries the request's cached_tokens
    _post(srv.url, {"input_ids": toks(64, 1), "sampling_params": {"max_new_tokens": 1}})
    ids = toks(64, 1) + toks(20, 2)
    metas = _stream_metas(srv.url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}})
    assert len(metas) >= 2 and [m["cached_tokens"] for m in metas] == [64] * len(metas)
    assert all(m["cached_tokens_details"] == {"device": 64, "host": 0} for m in metas)
    off = sim_server("--speed", "50", "--disable-radix-cache")
    ids = toks(100, 3)
    metas = [_post(off.url, {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})["meta_info"] for _ in "ab"]
    assert [m["cached_tokens"] for m in metas] == [0, 0]
    info = json.loads(urllib.request.urlopen(off.url + "/server_info", timeout=5).read())
    assert info["disable_radix_cache"] is True

"""The sim-server's timing model (tracebench.sim.model) on a virtual clock: no processes, no sleeping."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest

from conftest import REPO, SGLANG_CAPTURES
from tracebench.errors import ConfigError
from tracebench.sim.fit import (DECODE_MEAN_CONTEXT, RoutingRun, fit, h200_calibration, load_calibration,
                                load_decode_grid, load_routing_runs, profile_document)
from tracebench.profiles import (PROFILES_DIR, decode_attention_tokens, decode_kv_chunk, load_profile,
                                  prefill_attention_tokens)
from tracebench.sim.model import BatchModel, Limits, ReqState, SimRequest, simulate, token_ids

PROFILE = load_profile("llama-2-7b-h200-triton")
BIG = Limits(max_running_requests=4096, max_total_num_tokens=PROFILE.max_total_num_tokens, chunked_prefill_size=8192)


def limits(**kw) -> Limits:
    return dataclasses.replace(BIG, **kw)


def test_single_request_latency_is_the_profile_sum() -> None:
    p = PROFILE
    (out,) = simulate(p, BIG, [(10.0, 512, 128)])
    prefill = p.prefill_duration([(0, 512)])
    decode = sum(p.decode_duration([512 + k]) for k in range(1, 128))  # 127 decode steps, context grows
    assert out.t_forward_entry == pytest.approx(10.0 + p.queue_entry_s)
    assert out.t_first_token == pytest.approx(out.t_forward_entry + prefill + p.output_s)
    assert out.t_finished == pytest.approx(out.t_forward_entry + prefill + decode + p.output_s)
    assert out.server_e2e == pytest.approx(p.queue_entry_s + prefill + decode + p.output_s)
    assert out.e2e == pytest.approx(out.server_e2e + p.client_overhead_s)
    # ~0.64 s for 512/128 on an H200 (calibration: e2e p50 0.631 s at batch 1)
    assert 0.55 < out.e2e < 0.72


def test_speed_divides_every_duration() -> None:
    wl = [(0.0, 300, 40), (0.01, 200, 30), (0.02, 1000, 10)]
    slow = simulate(PROFILE, BIG, wl, speed=1.0)
    fast = simulate(PROFILE, BIG, [(t / 4, i, o) for t, i, o in wl], speed=4.0)
    for a, b in zip(slow, fast):
        assert b.e2e == pytest.approx(a.e2e / 4)
        assert b.ttft == pytest.approx(a.ttft / 4)
        assert b.t_finished == pytest.approx(a.t_finished / 4)


def test_never_more_than_max_running_requests() -> None:
    model = BatchModel(PROFILE, limits(max_running_requests=4), speed=1.0)
    reqs = [SimRequest(str(i), 64, 20, t_ready=0.0) for i in range(10)]
    for r in reqs:
        model.submit(r)
    t_free, peak, steps = 0.0, 0, 0
    while (t := model.next_start(t_free)) is not None:
        step = model.start_step(t)
        peak = max(peak, model.num_running)
        assert model.num_running <= 4
        if step.kind == "decode":
            assert len(step.requests) <= 4
        model.finish_step(step)
        t_free = step.t_end
        steps += 1
    assert peak == 4
    assert all(r.state is ReqState.FINISHED and r.output_len == 20 for r in reqs)
    # in the stamps: at no instant more than 4 requests between admission and finish
    events = sorted([(r.t_forward_entry, 1) for r in reqs] + [(r.t_finished, -1) for r in reqs],
                    key=lambda e: (e[0], e[1]))
    live = 0
    for _, delta in events:
        live += delta
        assert live <= 4
    # the 5th request was admitted only when one of the first four finished
    first_four_done = sorted(r.t_finished for r in reqs[:4])[0]
    assert reqs[4].t_forward_entry >= first_four_done


def test_requests_over_kv_capacity_wait() -> None:
    # each needs 400 + 300 = 700 KV tokens; capacity 1000: the second waits for the first to finish
    outs = simulate(PROFILE, limits(max_total_num_tokens=1000), [(0.0, 400, 300), (0.001, 400, 300)])
    first, second = outs
    assert second.t_forward_entry >= first.t_finished - PROFILE.output_s - 1e-12
    both = simulate(PROFILE, limits(max_total_num_tokens=1400), [(0.0, 400, 300), (0.001, 400, 300)])
    assert both[1].t_forward_entry < both[0].t_finished - PROFILE.output_s  # fits: runs alongside


def test_kv_over_capacity_request_is_refused() -> None:
    model = BatchModel(PROFILE, limits(max_total_num_tokens=100))
    with pytest.raises(ValueError, match="capacity"):
        model.submit(SimRequest("x", 80, 30, t_ready=0.0))


def _throughput(rate: float, n: int = 300) -> float:
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    outs = simulate(PROFILE, limits(max_running_requests=16), [(float(t), 256, 64) for t in arrivals])
    return n / (max(o.t_finished for o in outs) - outs[0].t_arrival)


def test_throughput_saturates_as_load_rises() -> None:
    rates = [5, 20, 80, 320, 1280]
    got = [_throughput(r) for r in rates]
    assert got[0] == pytest.approx(5, rel=0.25) and got[1] == pytest.approx(20, rel=0.25)  # keeps up at low load
    assert all(b >= a * 0.95 for a, b in zip(got, got[1:]))   # never falls as load rises
    assert got[-1] < 1.15 * got[-2]                          # saturated: 4x the load, about the same throughput
    assert got[-1] < 0.5 * rates[-1]                         # and far below what was offered


def test_chunked_prefill_splits_long_inputs() -> None:
    model = BatchModel(PROFILE, limits(chunked_prefill_size=1024))
    req = SimRequest("long", 3000, 5, t_ready=0.0)
    model.submit(req)
    kinds, t_free = [], 0.0
    while (t := model.next_start(t_free)) is not None:
        step = model.start_step(t)
        kinds.append((step.kind, step.batch_tokens))
        model.finish_step(step)
        t_free = step.t_end
    assert kinds[:3] == [("prefill", 1024), ("prefill", 1024), ("prefill", 952)]
    assert [k for k, _ in kinds[3:]] == ["decode"] * 4
    # the chunks' attention cost grows with the prefix: q * ((p + c)^2 - p^2)
    assert PROFILE.prefill_duration([(2048, 952)]) > PROFILE.prefill_duration([(0, 952)])


def test_prefill_pauses_decode_and_overlap_delays_admission_by_one_step() -> None:
    # A request arriving while a decode step runs joins one step later with sglang's overlap scheduler.
    for overlap, expected_wait in ((True, 2), (False, 1)):
        model = BatchModel(PROFILE, limits(overlap_schedule=overlap))
        model.submit(SimRequest("a", 64, 50, t_ready=0.0))
        t_free = 0.0
        for _ in range(3):  # prefill + 2 decode steps
            step = model.start_step(model.next_start(t_free))
            model.finish_step(step)
            t_free = step.t_end
        step = model.start_step(t_free)          # decode step 3 runs ...
        late = SimRequest("b", 64, 5, t_ready=(step.t_start + step.t_end) / 2)
        model.submit(late)                        # ... when b arrives
        model.finish_step(step)
        t_free, waited = step.t_end, 0
        while True:
            step = model.start_step(model.next_start(t_free))
            waited += 1
            model.finish_step(step)
            t_free = step.t_end
            if step.kind == "prefill":
                assert step.requests == [late]
                break
        assert waited == expected_wait


def test_two_4087_token_prompts_share_a_step_only_if_both_were_queued_when_it_was_planned() -> None:
    # sglang 0.5.17 takes requests into its waiting queue only when its loop polls (scheduler.py L1731-1733: a
    # non-blocking drain, request_receiver.py L104-124), once per step: with the overlap scheduler, R after the step
    # before starts. PrefillAdder puts two 4087-token prompts in one step (4087 <= chunked_prefill_size 8192 - 4087,
    # schedule_policy.py L1195-1217, L767-778) and gives a third the 18 tokens left as a chunk (L1213-1253,
    # budget_state L718-740). A prompt that reaches the queue after the poll is prefilled alone in the next step, back
    # to back: real H100 routing run, request 14 received 0.4 ms before the poll that formed request 12's step
    # (reports/examples/h100-sim-vs-real/README.md); on the other server 13 + 15 (8,174 tokens) shared one step.
    profile = load_profile("llama-2-7b-h100-triton")
    lim = Limits(4096, profile.max_total_num_tokens, profile.chunked_prefill_size)

    def steps_after_arrivals(offsets_in_r: list[float]) -> list[tuple[str, list[str], int]]:
        model = BatchModel(profile, lim)
        model.submit(SimRequest("d", 64, 200, t_ready=0.0))
        t_free = 0.0
        for _ in range(3):  # prefill + 2 decode steps
            step = model.start_step(model.next_start(t_free))
            model.finish_step(step)
            t_free = step.t_end
        step = model.start_step(t_free)          # a decode step: the next one is planned R after its start
        assert step.kind == "decode"
        for i, k in enumerate(offsets_in_r):
            model.submit(SimRequest(f"p{i}", 4087, 7, t_ready=step.t_start + k * profile.plan_lag_s))
        model.finish_step(step)
        t_free, out = step.t_end, []
        for _ in range(3):
            step = model.start_step(model.next_start(t_free))
            out.append((step.kind, [r.rid for r in step.requests], step.batch_tokens))
            model.finish_step(step)
            t_free = step.t_end
        return out

    # both queued by the poll: one step of 8,174 tokens
    assert steps_after_arrivals([0.5, 0.9])[0] == ("prefill", ["p0", "p1"], 8174)
    assert profile.prefill_duration([(0, 4087), (0, 4087)]) > 1.9 * profile.prefill_duration([(0, 4087)])
    # the second queued after the poll: two steps back to back (it was planned while the first ran)
    assert steps_after_arrivals([0.5, 1.1])[:2] == [("prefill", ["p0"], 4087), ("prefill", ["p1"], 4087)]
    # a third one queued in time: the 18 tokens left in the chunk budget, the rest in the next step
    assert steps_after_arrivals([0.2, 0.5, 0.9])[:2] == [("prefill", ["p0", "p1", "p2"], 8192),
                                                        ("prefill", ["p2"], 4087 - 18)]


def test_abort_frees_slot_and_kv() -> None:
    model = BatchModel(PROFILE, limits(max_running_requests=1))
    a, b = SimRequest("a", 64, 1000, t_ready=0.0), SimRequest("b", 64, 3, t_ready=0.0)
    model.submit(a)
    model.submit(b)
    step = model.start_step(0.0)
    model.finish_step(step)
    assert model.num_running == 1 and model.num_waiting == 1
    step = model.start_step(step.t_end)
    assert model.abort(a)                       # mid-step: freed at the step boundary
    result = model.finish_step(step)
    assert result.aborted == [a] and a.state is ReqState.ABORTED
    assert model.kv_reserved == 0 and model.num_running == 0
    step = model.start_step(step.t_end)
    assert step.kind == "prefill" and step.requests == [b]
    assert model.abort(b) and model.kv_reserved == 67        # aborted during its prefill step ...
    assert model.finish_step(step).aborted == [b]
    assert model.kv_reserved == 0 and model.next_start(step.t_end) is None   # ... freed at its end
    assert model.abort(b) is False                           # already gone


def test_zero_max_new_tokens_finishes_at_prefill() -> None:
    (out,) = simulate(PROFILE, BIG, [(0.0, 100, 0)])
    assert out.t_finished == pytest.approx(PROFILE.queue_entry_s + PROFILE.prefill_duration([(0, 100)]) + PROFILE.output_s)


def test_token_ids_are_deterministic_and_in_vocab() -> None:
    a = token_ids(12345, 50, 32000)
    assert a == token_ids(12345, 50, 32000)
    assert a != token_ids(12346, 50, 32000)
    assert all(0 <= t < 32000 for t in a) and len(set(a)) > 40


ROUTING_RUNS = REPO / "reports" / "examples" / "h200x2-routing"
H100_FIT_RUN = REPO / "reports" / "examples" / "h100-sim-vs-real" / "fit"


def test_committed_profile_is_the_fit_of_the_calibration() -> None:
    # the fit reads the sglang captures and the committed real routing runs (bench/fit_profile.py regenerates it)
    runs = load_routing_runs(ROUTING_RUNS)
    assert len(runs) >= 4 and all(len(run.records) >= 700 for run in runs)
    assert_committed(fit(h200_calibration(SGLANG_CAPTURES), runs, PROFILE.name, None))


def test_committed_h100_profile_is_the_fit_of_its_inputs() -> None:
    # the H100 calibration document (bench/gpu/calibrate.py) and the packed fit run of reports/examples/h100-sim-vs-real
    runs = load_routing_runs(H100_FIT_RUN)
    assert [run.name for run in runs] == ["fit-azure-round_robin"] and len(runs[0].records) == 720
    fitted = fit(load_calibration(SGLANG_CAPTURES / "calibration-h100.json.xz"), runs, "llama-2-7b-h100-triton", None)
    assert fitted.accelerator == "NVIDIA H100 80GB HBM3" and fitted.max_total_num_tokens == 107675
    assert_committed(fitted)


ATTENTION_PROFILE = REPO / "bench" / "profiles" / "llama-2-7b-h200-triton-attention.json"
DECODE_GRIDS = [SGLANG_CAPTURES / "decode-grid-h200.json.xz", SGLANG_CAPTURES / "decode-more-h200.json.xz",
                SGLANG_CAPTURES / "prefill-prefix-h200.json.xz"]


def test_committed_attention_candidate_is_the_fit_of_its_inputs() -> None:
    # issue 36's candidate (not the built-in profile): the H200 inputs, the decode step fitted to the two decode grids,
    # the prefill attention to the calibration's and the grid files' single prefill steps (fresh, behind a prefix)
    grid = load_decode_grid(DECODE_GRIDS)
    assert len(grid.points) == 197 and grid.left_out == ("decode-more-h200.json.xz grid 48x128",)
    assert len(grid.prefill) == 42 + 3 * (26 + 7)   # the batched `together_k` points are not single steps
    fitted = fit(h200_calibration(SGLANG_CAPTURES), load_routing_runs(ROUTING_RUNS), "llama-2-7b-h200-triton-attention",
                 grid)
    assert fitted.decode_per_kv_token_s == 0.0 and fitted.decode_attention is not None
    assert fitted.decode_attention.slots * fitted.decode_attention.heads == 640   # ~5 programs per SM of 132
    errors = [fitted.decode_duration(list(p.contexts), p.shared) / p.step_s - 1 for p in grid.points]
    assert float(np.sqrt(np.mean(np.square(errors)))) < 0.02 and max(map(abs, errors)) < 0.05
    assert fitted.prefill_per_token_sq_s == 0.0 and fitted.prefill_attention is not None
    behind: dict[tuple[int, int], list[float]] = {}   # shape (cached >= 1,024, new) -> its measured steps
    for _, cached, new, seconds in grid.prefill:
        if cached >= 1024:
            behind.setdefault((cached, new), []).append(seconds)
    assert len(behind) == 4 + 26 - 1   # 2,048 + 512 in both files
    for profile, rms in ((fitted, 0.05), (load_profile("llama-2-7b-h200-triton"), 0.15)):   # the built-in: q pairs
        errors = [profile.prefill_duration([shape]) / float(np.median(times)) - 1 for shape, times in behind.items()]
        assert (float(np.sqrt(np.mean(np.square(errors)))) < rms) == (profile is fitted)
    assert_committed(fitted, ATTENTION_PROFILE)


def test_prefill_attention_makespan_walks_the_cached_prefix() -> None:
    # 2,048 cached + 512 new: 4 blocks of 128 per head, walks 2,048 + 128 ... 2,048 + 512: 128 programs on 132 slots
    # take their longest walk; the q model of the built-in profile counts pairs and misses that one wave
    assert prefill_attention_tokens([(2048, 512)], 132, 0, 128, 64, 32) == 2560.0
    # 4,096 fresh: 32 blocks, walks 128 ... 4,096 (sum 67,584 per head) shared by 132 slots
    assert prefill_attention_tokens([(0, 4096)], 132, 0, 128, 64, 32) == pytest.approx(32 * 67584 / 132)
    # a walk rounds up to 64-token tiles; an overhead is added once per program
    assert prefill_attention_tokens([(2000, 100)], 1000, 8, 128, 64, 32) == 2048 + 128 + 8
    profile = load_profile(str(ATTENTION_PROFILE))
    assert profile.prefill_duration([(3072, 256)]) > 1.4 * profile.prefill_duration([(0, 256)])


def test_decode_attention_makespan_follows_sglangs_split_rule() -> None:
    # one request of 4,062 tokens: the graph of 1 has no padding; 132 x log2(4062 / 64) / 32 heads -> 8 splits of
    # 508 -> 512 tokens (rounded to 32): 8 programs per head, all at once on 20 slots
    assert decode_kv_chunk([4062], 8, 132, 32, (1, 2, 4, 8)) == 508
    assert decode_attention_tokens([4062], 20, 8, 8, 132, 32, (1, 2, 4, 8)) == (520, 256, 520)
    # 4 x 1,024 (a graph size, alike contexts): 528 / (4 x 32) -> 5 splits: chunk 205, programs of 224 (the last
    # 128): 20 per head, one wave
    assert decode_attention_tokens([1024] * 4, 20, 8, 8, 132, 32, (1, 2, 4, 8)) == (232, 640, 232)
    # 3 x 1,024 runs as the graph of 4, its padding row of length 1: longest / shortest splits 8 ways, 128 each:
    # 24 programs per head on 20 slots, two waves
    assert decode_kv_chunk([1024] * 3, 8, 132, 32, (1, 2, 4, 8)) == 128
    assert decode_attention_tokens([1024] * 3, 20, 8, 8, 132, 32, (1, 2, 4, 8)) == (272, 768, 136)
    # 9 requests: padded to a graph of 16 they split 8 ways; beyond the largest graph they run eager, unpadded, and
    # split 528 / (9 x 32) -> 2 ways
    assert decode_kv_chunk([1024] * 9, 8, 132, 32, (1, 2, 4, 8, 16)) == 128
    assert decode_kv_chunk([1024] * 9, 8, 132, 32, (1, 2, 4, 8)) == 512


def test_a_shared_prefix_makes_the_decode_step_cheaper_by_the_profile_saving() -> None:
    # 8 requests whose prompts start with the same 2,048 tokens, the first one alone (its prompt then sits in the
    # cache): the decode step of all 8 reads 7 x 2,048 tokens through pages another request holds too
    profile = load_profile(str(ATTENTION_PROFILE))
    model = BatchModel(profile, BIG)
    prefix = list(range(1000, 3048))
    reqs = [SimRequest(str(i), 2304, 400 if i == 0 else 40, t_ready=0.0 if i == 0 else 0.3,
                       input_ids=prefix + [5000 + 300 * i + k for k in range(256)]) for i in range(8)]
    for r in reqs:
        model.submit(r)
    t_free, full, contexts = 0.0, None, []
    while (t := model.next_start(t_free)) is not None:
        step = model.start_step(t)
        if step.kind == "decode" and len(step.requests) == 8 and full is None:
            full, contexts = step, [r.kv_used for r in step.requests]   # what each attends over in that step
        model.finish_step(step)
        t_free = step.t_end
    assert full is not None and all(r.cached_tokens == 2048 for r in reqs[1:])
    assert full.t_end - full.t_start == pytest.approx(profile.decode_duration(contexts, 7 * 2048), rel=1e-12)
    assert profile.decode_duration(contexts, 7 * 2048) < profile.decode_duration(contexts, 0)


def assert_committed(fitted, path=None) -> None:
    committed = json.loads((path or PROFILES_DIR / f"{fitted.name}.json").read_text())
    regenerated = json.loads(json.dumps(profile_document(fitted)))
    assert regenerated["source"] == committed["source"]
    for key, value in committed["params"].items():
        if isinstance(value, float):
            assert regenerated["params"][key] == pytest.approx(value, rel=1e-9), key
        else:
            assert regenerated["params"][key] == value, key


def test_fit_recovers_the_decode_cost_per_kv_token_from_a_routing_run() -> None:
    # a server whose decode costs e = 0.3 us per KV token (twice the committed value), with the calibration's c and
    # d + 576 e, serves mixed-length requests at 5 req/s (batches of ~7; a routing run caps at the router, not in the server); its stamps, fed to the fit as a routing run, must
    # give back that e, the intake and the plan lag (the estimators see only the stamps, like those of a real run)
    sglang = SGLANG_CAPTURES
    true_e = 3e-7
    slope = PROFILE.decode_per_req_s + DECODE_MEAN_CONTEXT * PROFILE.decode_per_kv_token_s
    server = dataclasses.replace(PROFILE, decode_per_kv_token_s=true_e, decode_per_req_s=slope - DECODE_MEAN_CONTEXT * true_e)
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1 / 5.0, 500))
    inputs = rng.integers(100, 3000, 500)
    outputs = rng.integers(10, 400, 500)
    # and three lone requests long after, on an idle server (the intake the fit measures)
    lone = [(float(arrivals[-1]) + 60.0 * k, 500, 20) for k in (1, 2, 3)]
    outs = simulate(server, BIG, [(float(t), int(i), int(o)) for t, i, o in zip(arrivals, inputs, outputs)] + lone)
    records = [{"server": 0, "input_len": o.input_len, "completion_tokens": o.output_len, "cached_tokens": 0,
                "server_received": o.t_arrival, "server_forward_entry": o.t_forward_entry,
                "server_prefill_finished": o.t_first_token - server.output_s,
                "server_finished": o.t_finished,
                # the client's side: 2-3 ms to sglang's receipt, 0.5-1 ms after its finish (medians 2.5 and 0.75)
                "t_dispatch": o.t_arrival - 0.002 - 0.001 * k / (len(outs) - 1),
                "t_finish": o.t_finished + 0.0005 + 0.0005 * ((k * 7) % len(outs)) / (len(outs) - 1)}
               for k, o in enumerate(outs)]
    fitted = fit(h200_calibration(sglang), [RoutingRun("synthetic", "1 x sim", records, PROFILE.prefill_token_buckets,
                                                       ())], PROFILE.name, None)
    assert fitted.decode_per_kv_token_s == pytest.approx(true_e, rel=0.05)
    assert fitted.decode_base_s == pytest.approx(PROFILE.decode_base_s, rel=1e-9)
    # and the intake of an idle server and the plan lag, from the same stamps
    assert fitted.queue_entry_s == pytest.approx(PROFILE.queue_entry_s, rel=1e-6)
    assert fitted.plan_lag_s == pytest.approx(PROFILE.plan_lag_s, abs=0.5e-3)
    # and tracebench's HTTP hops to the server (the virtual clock's), medians of the client's stamps
    assert fitted.request_hop_s == pytest.approx(0.0025, abs=1e-5)
    assert fitted.response_hop_s == pytest.approx(0.00075, abs=1e-5)


def test_fidelity_of_the_bench_serving_workload_on_the_virtual_clock() -> None:
    # real sglang (bench_serving.jsonl): E2E p50 845.7 ms, TTFT p50 25.7 ms; acceptance: within 15%
    rng = np.random.default_rng(0)
    arrivals = np.cumsum(rng.exponential(1 / 8.0, 400))
    outs = simulate(PROFILE, BIG, [(float(t), 512, 128) for t in arrivals])
    e2e = float(np.median([o.e2e for o in outs])) * 1e3
    ttft = float(np.median([o.ttft for o in outs])) * 1e3
    assert math.isclose(e2e, 845.7, rel_tol=0.15), e2e
    assert math.isclose(ttft, 25.7, rel_tol=0.15), ttft


def test_profile_errors_name_the_file_and_field(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such profile"):
        load_profile("no-such-profile")
    doc = json.loads((PROFILES_DIR / f"{PROFILE.name}.json").read_text())
    del doc["params"]["decode_base_s"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bad.json: field 'params': lacks decode_base_s"):
        load_profile(str(bad))
    doc = json.loads((PROFILES_DIR / f"{PROFILE.name}.json").read_text())
    doc["params"]["request_hop_s"] = -0.002
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bad.json: field 'params.request_hop_s': must be a finite number > 0"):
        load_profile(str(bad))
    doc["params"]["request_hop_s"] = 0.002
    doc["params"]["response_hop_s"] = 0.0001   # an answer's end sooner than a streamed token: nothing to hold
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bad.json: field 'params.response_hop_s': 0.0001 is less than a streamed "
                                          "token's hop"):
        load_profile(str(bad))
    doc = json.loads(ATTENTION_PROFILE.read_text())
    del doc["params"]["decode_attention"]["slots"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bad.json: field 'params.decode_attention': lacks slots"):
        load_profile(str(bad))
    doc["params"]["decode_attention"]["slots"] = 0
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bad.json: field 'params.decode_attention.slots': must be an integer >= 1"):
        load_profile(str(bad))
    doc["params"]["decode_attention"]["slots"] = 5
    doc["params"]["decode_attention"]["token_s"] = -1e-6
    bad.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="bad.json: field 'params.decode_attention.token_s': must be a finite number > 0"):
        load_profile(str(bad))

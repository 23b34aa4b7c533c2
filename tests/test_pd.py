"""PD disaggregation (issue 21): the simulator's prefill and decode roles (two real sim-server processes doing the
bootstrap handshake over 127.0.0.1), the transfer model, the decode admission rule, and replays through them."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.conftest import SimServer, free_port, sim_servers, wait_healthy
from tracebench.profiles import load_profile
from tracebench.sim.model import BatchModel, Limits, ReqState, SimRequest
from tracebench.sim.pd import KV_BYTES_PER_TOKEN, KvLink, transfer_seconds

SPEED = 4.0
BANDWIDTH = 0.5   # GiB/s: a 1024-token prompt (0.5 GiB of KV) takes 1 simulated second, 0.25 s at --speed 4
LATENCY = 0.2     # s a transfer takes on top of its bytes: 0.05 s at --speed 4


def test_kv_bytes_and_transfer_time_from_bandwidth() -> None:
    assert KV_BYTES_PER_TOKEN == 32 * 32 * 128 * 2 * 2 == 524_288   # llama-2-7b: layers x KV heads x dim x K,V x fp16
    assert transfer_seconds(1024, 0.5) == pytest.approx(1.0)
    assert transfer_seconds(2048, 2.0) == pytest.approx(0.5)
    link = KvLink(0.5, latency_s=0.0, speed=4.0)   # one transfer at a time, first come first served
    assert link.book(10.0, 1024) == pytest.approx((10.0, 10.25))
    assert link.book(10.1, 512) == pytest.approx((10.25, 10.375))   # waits for the first
    assert link.book(11.0, 1024) == pytest.approx((11.0, 11.25))


def test_kv_link_latency_overlaps_the_next_transfer_while_the_bytes_hold_the_link() -> None:
    # 0.5 GiB/s at --speed 4: 1024 tokens' bytes hold the link 0.25 s; the latency (0.4 s simulated) is 0.1 s
    link = KvLink(0.5, latency_s=0.4, speed=4.0)
    assert link.book(10.0, 1024) == pytest.approx((10.0, 10.35))   # bytes until 10.25, then the latency
    # ready while the first is in its latency: starts when the first's bytes are through (10.25), not at its
    # arrival (10.35); back to back, arrivals are one transfer's bytes apart (10.35 -> 10.475)
    assert link.book(10.1, 512) == pytest.approx((10.25, 10.475))
    # ready before the second's bytes are through (10.375): waits for them, the bytes hold the link
    assert link.book(10.3, 1024) == pytest.approx((10.375, 10.725))
    assert link.book(20.0, 1024) == pytest.approx((20.0, 20.35))   # alone: bytes + latency


def _decode_model(max_total: int = 10_000, max_running: int = 8) -> BatchModel:
    limits = Limits(max_running_requests=max_running, max_total_num_tokens=max_total, chunked_prefill_size=8192,
                    radix_cache=False)
    return BatchModel(load_profile("llama-2-7b-h200-triton"), limits)


def test_decode_model_admits_only_arrived_kv_with_the_first_token_given() -> None:
    model = _decode_model()
    req = SimRequest(rid="a", input_len=1000, max_new_tokens=4, t_ready=0.0)
    assert model.prealloc(req) and req.state is ReqState.PREALLOCATED
    assert model.kv_used_tokens() == 1000        # pages allocated for the KV on its way
    assert model.next_start(0.0) is None          # pre-allocated, KV not here: nothing to run
    model.arrive(req, 2.0)
    assert model.next_start(0.0) == 2.0           # not before the KV arrived
    step = model.start_step(2.0)
    assert step is not None and step.kind == "prebuilt" and step.t_end == step.t_start == 2.0   # no GPU time
    result = model.finish_step(step)
    assert result.produced == [req] and req.output_len == 1 and req.t_forward_entry == 2.0
    assert req.t_prefill_finished is None         # a decode server never prefills
    while req.state is not ReqState.FINISHED:
        t = model.next_start(step.t_end)
        step = model.start_step(t)
        assert step.kind == "decode"
        model.finish_step(step)
    assert req.output_len == 4


def test_decode_prealloc_waits_for_kv_room_fifo() -> None:
    model = _decode_model(max_total=3000)
    a = SimRequest(rid="a", input_len=2000, max_new_tokens=10, t_ready=0.0)
    b = SimRequest(rid="b", input_len=1500, max_new_tokens=10, t_ready=0.0)
    assert model.prealloc(a)
    assert not model.prealloc(b)                   # 2010 + 1510 > 3000: b waits
    assert model.abort(a) and model.kv_reserved == 0
    assert model.prealloc(b)


# ---- two sim-server processes ---------------------------------------------------------------------------------

def _pair(start: Callable[..., SimServer], *extra: str) -> tuple[SimServer, SimServer, int]:
    """A prefill and a decode sim-server (started together: the decode server meets the prefill's bootstrap server
    only when a request names it), healthy; `extra`: more options for both."""
    boot = free_port()
    common = ("--speed", str(SPEED), "--skip-tokenizer-init", "--kv-transfer-bandwidth", str(BANDWIDTH),
              "--kv-transfer-latency", str(LATENCY), *extra)
    prefill = start("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot), *common,
                    wait=False)
    decode = start("--disaggregation-mode", "decode", *common, wait=False)
    for server in (prefill, decode):
        wait_healthy(server.url, server.proc, server.log)
    return prefill, decode, boot


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimServer, SimServer, int]]:
    """One pair for the module's tests that read its answers without counting on its totals (the handshake test
    reads /metrics totals: a pair of its own)."""
    with sim_servers(tmp_path_factory.mktemp("pd-pair")) as start:
        yield _pair(start)


def _body(n: int, room: int, boot: int, out: int = 8, stream: bool = True) -> dict[str, Any]:
    return {"input_ids": [100 + i % 30000 for i in range(n)], "stream": stream,
            "sampling_params": {"max_new_tokens": out, "ignore_eos": True},
            "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": room}


async def _post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, list[dict]]:
    async with session.post(f"{url}/generate", json=body) as resp:
        if not body["stream"]:
            return resp.status, [json.loads(await resp.read())]
        events = []
        async for line in resp.content:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                events.append(json.loads(line[6:]))
        return resp.status, events


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def test_bootstrap_server_answers_like_sglangs(pair: tuple[SimServer, SimServer, int]) -> None:
    prefill, decode, boot = pair
    info = json.loads(_get(f"http://127.0.0.1:{boot}/route?prefill_dp_rank=-1&prefill_cp_rank=-1"
                           "&target_tp_rank=-1&target_pp_rank=-1"))
    assert info["dp_size"] == 1 and info["page_size"] == 1 and info["prefill_http_port"] == prefill.port
    assert _get(f"http://127.0.0.1:{boot}/health") == "OK"
    with pytest.raises(urllib.error.HTTPError) as err:
        _get(f"http://127.0.0.1:{boot}/route?prefill_dp_rank=0")
    assert err.value.code == 400
    p_info, d_info = json.loads(_get(f"{prefill.url}/server_info")), json.loads(_get(f"{decode.url}/server_info"))
    assert p_info["disaggregation_mode"] == "prefill" and p_info["disaggregation_bootstrap_port"] == boot
    assert d_info["disaggregation_mode"] == "decode" and d_info["disable_radix_cache"] is True
    assert p_info["tracebench_sim"]["kv_transfer_bandwidth_gib_s"] == BANDWIDTH
    assert p_info["tracebench_sim"]["kv_transfer_latency_s"] == LATENCY


def test_a_pair_request_goes_through_the_handshake_and_the_transfer(sim_server) -> None:
    prefill, decode, boot = _pair(sim_server)

    async def main() -> tuple:
        async with aiohttp.ClientSession() as session:
            # the decode request first: its KV destination reaches the prefill before the prefill's own request
            d = asyncio.ensure_future(_post(session, decode.url, _body(1024, 7, boot)))
            await asyncio.sleep(0.2)
            p = asyncio.ensure_future(_post(session, prefill.url, _body(1024, 7, boot)))
            return await p, await d

    (p_status, p_events), (d_status, d_events) = asyncio.run(main())
    assert p_status == d_status == 200
    (p_out,) = p_events   # the prefill server sends one chunk: its one token, after the transfer
    p_meta, d_meta = p_out["meta_info"], d_events[-1]["meta_info"]
    assert p_meta["finish_reason"] == {"type": "length", "length": 0} and p_meta["completion_tokens"] == 1
    assert d_meta["completion_tokens"] == 8 and len(d_events) > 1   # the decode server streams
    assert d_events[-1]["output_ids"][0] == p_out["output_ids"][0]   # the first token is the prefill's
    assert "prefill_finished_time" in p_meta
    # the decode server's is one stale value, before the server started (real 0.5.17's: the host's boot time)
    assert d_meta["prefill_finished_time"] < d_meta["request_received_ts"] - 1.0
    # the decode took the request in (forward_entry_time) only after the KV went over the link: bytes + latency
    transfer = (transfer_seconds(1024, BANDWIDTH) + LATENCY) / SPEED
    kv_arrival = d_meta["forward_entry_time"] - d_meta["queue_time"]
    assert kv_arrival >= p_meta["prefill_finished_time"] + transfer - 0.005
    assert p_meta["request_finished_ts"] >= p_meta["prefill_finished_time"] + transfer
    metrics = _get(f"{prefill.url}/metrics")
    assert 'sglang:kv_transfer_total_mb_sum{engine_type="prefill"' in metrics
    total_mb = next(float(line.split()[-1]) for line in metrics.splitlines()
                    if line.startswith("sglang:kv_transfer_total_mb_sum"))
    assert total_mb == 1024 * KV_BYTES_PER_TOKEN / 2**20 == 512.0
    assert 'stage="prefill_transfer_kv_cache"' in metrics
    assert "sglang:time_to_first_token_seconds_count" in metrics and \
        'sglang:time_to_first_token_seconds_count{engine_type="prefill",is_streaming="true"' in metrics
    ttft_count = [ln for ln in metrics.splitlines()
                  if ln.startswith('sglang:time_to_first_token_seconds_count{engine_type="prefill",is_streaming="true"')]
    assert ttft_count[0].endswith(" 0.0")   # not observed on a prefill server, as sglang


def test_pd_answers_end_after_the_profiles_answer_end(sim_server, tmp_path: Path) -> None:
    # the answer's end (docs/sim-server.md "Answer's end") on both roles, whole and streamed: a profile whose response
    # hop is 0.8 s holds each answer's end ~0.2 s (at --speed 4) after the model (the prefill's: after the transfer)
    # finished it, once: not skipped (it would end at once), not applied twice (0.4 s)
    from tracebench.profiles import PROFILES_DIR

    raw = json.loads((PROFILES_DIR / "llama-2-7b-h200-triton.json").read_text())
    raw["name"], raw["params"]["response_hop_s"] = "slow-answer-end", 0.8
    path = tmp_path / "slow-answer-end.json"
    path.write_text(json.dumps(raw))
    hold = load_profile(str(path)).answer_end_s / SPEED
    prefill, decode, boot = _pair(sim_server, "--profile", str(path))

    async def read(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, list[dict], float]:
        status, events = await _post(session, url, body)
        return status, events, time.time()   # the answer's end read (a stream: its last chunk)

    async def main() -> list:
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(read(session, url, _body(64, room, boot, out=2, stream=stream))
                                          for room, stream in ((21, False), (22, True))
                                          for url in (decode.url, prefill.url)))

    for status, events, t_read in asyncio.run(main()):
        assert status == 200
        meta = events[-1]["meta_info"]
        assert hold <= t_read - meta["request_finished_ts"] < 2 * hold, meta
        if len(events) == 1:  # a whole answer (or the prefill's one chunk): sent when it ended
            assert hold <= meta["response_sent_to_client_ts"] - meta["request_finished_ts"] < 2 * hold, meta


def test_decode_never_starts_a_request_before_its_kv_arrived(pair: tuple[SimServer, SimServer, int]) -> None:
    prefill, decode, boot = pair

    async def main() -> tuple:
        async with aiohttp.ClientSession() as session:
            d = asyncio.ensure_future(_post(session, decode.url, _body(512, 11, boot, out=4)))
            await asyncio.sleep(0.5)   # no prefill request yet: the KV cannot come
            metrics = await asyncio.to_thread(_get, f"{decode.url}/metrics")
            assert not d.done()
            p = asyncio.ensure_future(_post(session, prefill.url, _body(512, 11, boot, out=4)))
            return metrics, await p, await d

    metrics, _, (status, events) = asyncio.run(main())
    assert 'sglang:num_decode_transfer_queue_reqs{engine_type="decode"' in metrics
    waiting = next(ln for ln in metrics.splitlines() if ln.startswith("sglang:num_decode_transfer_queue_reqs"))
    assert waiting.endswith(" 1.0")   # pre-allocated, waiting for its KV
    assert status == 200 and events[-1]["meta_info"]["completion_tokens"] == 4


def test_a_pd_server_refuses_a_request_without_bootstrap_fields(pair: tuple[SimServer, SimServer, int]) -> None:
    _, decode, boot = pair
    body = _body(16, 1, boot, stream=False)
    del body["bootstrap_room"]
    req = urllib.request.Request(f"{decode.url}/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=5)
    assert err.value.code == 400 and "bootstrap_room" in err.value.read().decode()


# ---- replays through PD servers ---------------------------------------------------------------------------------

from importlib import metadata  # noqa: E402

import orjson  # noqa: E402

from tests.conftest import run_cli  # noqa: E402
from tracebench.errors import ConfigError, PolicyError  # noqa: E402
from tracebench.policies.base import QueuedRequest, ServerView  # noqa: E402
from tracebench.policies.registry import load_policy  # noqa: E402
from tracebench.replay.pd import assign_pairs, parse_ratio, with_bootstrap  # noqa: E402
from tracebench.replay.run import ReplayConfig  # noqa: E402


def test_body_gets_the_bootstrap_fields_after_its_own() -> None:
    body = orjson.dumps({"input_ids": [1, 2], "stream": True})
    out = with_bootstrap(body, "127.0.0.1", 8998, 2**63 - 1)
    assert list(orjson.loads(out)) == ["input_ids", "stream", "bootstrap_host", "bootstrap_port", "bootstrap_room"]
    assert orjson.loads(out)["bootstrap_room"] == 2**63 - 1
    assert parse_ratio("2:1") == (2, 1)
    with pytest.raises(ConfigError):
        parse_ratio("0:1")


def _view(index: int, cap: int = 10**9, in_flight: int = 0) -> ServerView:
    return ServerView(index, f"http://s{index}", True, in_flight, cap, 0.0, None, None, None, None)


def test_each_pool_has_its_own_policy_and_only_its_servers() -> None:
    rng = np.random.default_rng(0)
    queue = [QueuedRequest(i, 10, 5, 0.0, 0.0) for i in range(4)]
    prefill, decode = load_policy("round_robin", rng, {}), load_policy("round_robin", rng, {})
    # decode server 3 has one free slot: one request gets a pair, the rest wait in the router queue
    triples = assign_pairs(queue, prefill, decode, [_view(0), _view(1)], [_view(2), _view(3, cap=1)])
    assert [(q.id, p.index, d.index) for q, p, d in triples] == [(0, 0, 2), (1, 1, 3), (2, 0, 2), (3, 1, 2)]

    class Wrong(type(prefill)):  # picks a decode server for the prefill pool
        def assign(self, queue, servers):
            return [(queue[0], _view(2))]

    with pytest.raises(PolicyError, match="prefill pool"):
        assign_pairs(queue, Wrong(rng, {}), decode, [_view(0)], [_view(2)])


@pytest.mark.parametrize(("options", "message"), [
    (dict(pd="1:1", attach=("http://a:1",)), "--attach cannot be used with PD servers"),
    (dict(attach_prefill=("http://a:1",)), "needs both --attach-prefill URL and --attach-decode URL"),
    (dict(pd="1:1", mode="static", batch_size=2), "cannot be used with PD servers"),
    (dict(pd="1:1", api="chat"), "PD runs speak sglang's /generate"),
    (dict(pd="1:1", policy_options=(("key", "input"),)), "--prefill-policy-opt"),
    (dict(pd="1:1", server_args=("--disaggregation-mode decode",)), "tracebench sets it itself"),
])
def test_pd_options_refused(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReplayConfig(trace=Path("t.jsonl"), backend="sim", **options).resolve()


@pytest.fixture(scope="module")
def pd_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    trace = tmp_path_factory.mktemp("pd") / "t.jsonl"
    result = run_cli("generate", "--rate", "20", "--num-requests", "24", "--input-len", "600", "--output-len", "24",
                     "--seed", "1", "-o", str(trace))
    assert result.returncode == 0, result.stderr
    return trace


def test_replay_sim_1p1d_through_tracebenchs_router(tmp_path: Path, pd_trace: Path) -> None:
    trace = pd_trace
    result = run_cli("replay", str(trace), "--backend", "sim", "--pd", "1:1", "--speed", "8", "--prefill-policy",
                     "round_robin", "--decode-policy", "cache_aware", "--out-dir", str(tmp_path), "--run-name", "pd",
                     "--quiet")
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "pd" / "run.json").read_text())
    assert [s["role"] for s in run["servers"]] == ["prefill", "decode"]
    assert "--disaggregation-mode" in run["servers"][0]["launch_command"]
    assert run["pd"]["pools"] == {"prefill": [0], "decode": [1]}
    assert run["pd"]["policies"]["decode"]["name"] == "cache_aware"
    boot = run["pd"]["bootstrap"][0]
    assert boot["port"] == run["servers"][0]["server_info"]["disaggregation_bootstrap_port"]
    prefill_delta = run["pd"]["server_metrics"][0]["delta"]
    assert prefill_delta["kv_transfer_latency_ms_count"] == 24
    records = [json.loads(line) for line in (tmp_path / "pd" / "requests.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and r["server"] == 1 and r["prefill_server"] == 0 for r in records)
    assert len({r["bootstrap_room"] for r in records}) == 24 and all(0 <= r["bootstrap_room"] < 2**63 for r in records)
    for r in records:
        kv_arrival = r["server_forward_entry"] - r["server_queue_time"]
        assert r["prefill_done"] <= kv_arrival <= r["t_first_token"] + 0.01   # KV came before the first token
        assert r["t_prefill_answer"] <= r["t_finish"]
        # the breakdown's stamps are the decode request's (docs/overhead.md), in order as in a plain run
        order = ["t_arrival", "t_released", "t_admitted", "t_assigned", "t_built", "t_dispatch", "t_written",
                 "t_headers", "t_first_token", "t_last_chunk", "t_finish", "t_parsed"]
        stamps = [r[name] for name in order]
        assert None not in stamps and stamps == sorted(stamps), dict(zip(order, stamps))
        assert r["server_dispatched"] is not None and r["server_first_sent"] is not None
        # the decode server sends a stale prefill_finished_time (as real sglang 0.5.17): not recorded as the request's
        assert r["server_prefill_finished"] is None
    report = run_cli("report", str(tmp_path / "pd"), "--format", "json")
    assert report.returncode == 0, report.stderr
    doc = json.loads(report.stdout)["runs"][0]
    stages = doc["pd"]
    total = sum(stages[k]["mean"] for k in ("prefill_queue", "prefill", "kv_transfer", "decode_first"))
    assert total == pytest.approx(doc["latency"]["ttft_dispatch"]["mean"], rel=1e-6)   # the split adds up
    assert [s["role"] for s in doc["pd_detail"]["servers"]] == ["prefill", "decode"]


def test_attached_servers_must_be_of_their_pool(pair: tuple[SimServer, SimServer, int], tmp_path: Path,
                                               pd_trace: Path) -> None:
    prefill, decode, _ = pair
    result = run_cli("replay", str(pd_trace), "--attach-prefill", decode.url, "--attach-decode", prefill.url,
                     "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode != 0
    assert "was given as a prefill server but its /server_info says disaggregation_mode 'decode'" in result.stderr
    # issue 33 item 15: a PD server given with plain --attach ran to "completed, ok 0, error 100", exit 0
    for server, mode in ((prefill, "prefill"), (decode, "decode")):
        result = run_cli("replay", str(pd_trace), "--attach", server.url, "--out-dir", str(tmp_path), "--quiet",
                         "--run-name", f"plain-{mode}")
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert f"is a PD {mode} server (its /server_info says disaggregation_mode '{mode}')" in result.stderr
        run = json.loads((tmp_path / f"plain-{mode}" / "run.json").read_text())
        assert run["status"] == "not_started" and not (tmp_path / f"plain-{mode}" / "requests.jsonl").exists()


def test_a_pair_its_servers_refuse_is_recorded_not_a_crash(pair: tuple[SimServer, SimServer, int], tmp_path: Path) -> None:
    """Both servers refuse a prompt longer than their context: the pair ends with the first refusal read (the decode
    server's, mostly) before any prefill answer; recorded as an error, the run goes on (it once failed the run on an
    assertion that a pair always ends with both answers)."""
    prefill, decode, _ = pair
    trace = tmp_path / "long.jsonl"
    done = run_cli("generate", "--rate", "20", "--num-requests", "3", "--input-len", "5000", "--output-len", "4",
                   "--max-context", "8192", "--seed", "1", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    result = run_cli("replay", str(trace), "--attach-prefill", prefill.url, "--attach-decode", decode.url,
                     "--out-dir", str(tmp_path), "--run-name", "long", "--quiet")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in (tmp_path / "long" / "requests.jsonl").read_text().splitlines()]
    refused = [r for r in records if r["input_len"] >= 4096]   # the servers' context length
    assert len(records) == 3 and refused and {r["status"] for r in refused} == {"error"}
    for r in refused:
        assert r["error"].split(": ")[0] in ("decode server", "prefill server") and "context length" in r["error"]


def _router_version() -> str | None:
    try:
        return metadata.version("sglang-router")
    except metadata.PackageNotFoundError:
        return None


@pytest.mark.skipif(_router_version() != "0.3.2", reason="sglang-router 0.3.2 is not installed: pip install -e '.[router]'")
def test_replay_sim_1p1d_through_sglang_routers_pd_mode(tmp_path: Path, pd_trace: Path) -> None:
    result = run_cli("replay", str(pd_trace), "--backend", "sim", "--pd", "1:1", "--speed", "8", "--router",
                     "sglang-router", "--router-policy", "round_robin", "--out-dir", str(tmp_path), "--run-name", "r",
                     "--quiet")
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    ext = run["external_router"]
    assert ext["mode"] == "pd-disaggregation" and "PrefillDecode" in ext["startup_line"]
    port = run["pd"]["bootstrap"][0]["port"]
    assert ext["command"][-5:] == ["--prefill", run["servers"][0]["url"], str(port), "--decode", run["servers"][1]["url"]]
    records = [json.loads(line) for line in (tmp_path / "r" / "requests.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" and r["completion_tokens"] == r["output_len"] for r in records)
    assert run["pd"]["server_metrics"][0]["delta"]["kv_transfer_latency_ms_count"] == 24   # every KV went P -> D


# ---- the replay's guarantees hold for PD runs too (docs/replay.md "Guarantees") ---------------------------------

import signal  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402

from tests.conftest import tracebench_cmd, wait_served  # noqa: E402
from tracebench.trace.format import format_request_line, write_trace  # noqa: E402


def _policy_file(tmp_path: Path, name: str, assign: str, on_complete: str = "") -> str:
    """A policy `name` whose assign() gives each queued request to the first server with a free slot, after `assign`
    (lines indented 8: may return, sleep, ...); `on_complete` (indented 8) runs on every completion."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        "import time\nfrom tracebench.policies import Policy\n\n"
        "class P(Policy):\n"
        f"    name = {name!r}\n"
        "    description = 'a test policy'\n"
        "    calls = 0\n"
        "    completions = 0\n\n"
        "    def assign(self, queue, servers):\n"
        "        type(self).calls += 1\n"
        f"{assign}"
        "        picks, free = [], {s.index: s.free_slots for s in servers}\n"
        "        for req in queue:\n"
        "            s = next((s for s in servers if free[s.index] > 0), None)\n"
        "            if s is None:\n"
        "                break\n"
        "            free[s.index] -= 1\n"
        "            picks.append((req, s))\n"
        "        return picks\n\n"
        "    def on_complete(self, request_id, server, ok):\n"
        "        type(self).completions += 1\n"
        f"{on_complete or '        pass'}\n"
    )
    return f"{path}:P"


def _run(tmp_path: Path, *args: str, name: str = "g", timeout: float = 60) -> tuple[subprocess.CompletedProcess[str], dict, list[dict]]:
    """A replay that must end within `timeout` s (a hung one fails the test); its run.json and records."""
    try:
        result = subprocess.run(tracebench_cmd("replay", *args, "--out-dir", str(tmp_path), "--run-name", name, "--quiet"),
                                capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the replay hung (still running after {timeout} s)") from None
    run = json.loads((tmp_path / name / "run.json").read_text())
    records = [json.loads(line) for line in (tmp_path / name / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == list(range(len(records))) == list(range(run["trace"]["num_requests"]))
    assert sum(run["counts"].values()) == len(records)
    return result, run, records


def _trace(path: Path, lens: list[tuple[int, int]], gap: float = 0.01) -> Path:
    lines = [format_request_line(i, gap * i, n_in, n_out) for i, (n_in, n_out) in enumerate(lens)]
    return write_trace(path, {"num_requests": len(lines), "duration_s": gap * len(lines)}, lines)


def test_pd_policy_that_never_assigns_is_named(tmp_path: Path) -> None:
    trace = _trace(tmp_path / "t.jsonl", [(64, 4)] * 3)
    never = _policy_file(tmp_path, "never", "        return []\n")
    # the policy checks on the virtual clock (tests/test_replay_robust.py's too): the PD router and the policies are
    # the real-time run's, and what a policy that assigns nothing or raises does to the run is no matter of HTTP
    result, run, records = _run(tmp_path, str(trace), "--clock", "virtual", "--pd", "1:1", "--decode-policy", never,
                                timeout=40)
    assert result.returncode == 1, result.stderr
    assert ("policies 'random' (prefill pool) and 'never' (decode pool) assigned nothing" in result.stderr
            and "nothing can ask it again" in result.stderr), result.stderr
    assert ("prefill: 1 healthy uncapped server(s) (no slot limit); decode: 1 healthy uncapped server(s)"
            in result.stderr), result.stderr
    assert run["status"] == "failed" and Counter(r["status"] for r in records) == {"not_sent": 3}


def test_pd_prefill_policy_raising_on_complete_stops_the_run_with_every_request_recorded(tmp_path: Path) -> None:
    # on_complete of the prefill pool's policy raised inside the pair's clean-up: the error was lost and the request
    # recorded `cancelled`, the run went on
    trace = _trace(tmp_path / "t.jsonl", [(64, 40)] * 30)
    raiser = _policy_file(tmp_path, "raiser", "",
                          "        if type(self).completions == 3:\n            raise ValueError('bad')\n")
    result, run, records = _run(tmp_path, str(trace), "--clock", "virtual", "--pd", "1:1", "--prefill-policy", raiser,
                                "--max-running-requests", "4", timeout=40)
    assert result.returncode == 1, result.stderr
    assert "raised ValueError in on_complete: bad" in run["error"], run["error"]
    statuses = Counter(r["status"] for r in records)
    assert run["status"] == "failed" and set(statuses) <= {"ok", "cancelled", "not_sent"}, statuses
    assert statuses["ok"] >= 3 and statuses["not_sent"], statuses   # the three it was told of were recorded ok
    # never sent: no server, no pair, no room (docs/run-format.md)
    assert all(r["server"] is None and r.get("prefill_server") is None and r.get("bootstrap_room") is None
               for r in records if r["status"] == "not_sent")


def test_pd_answers_are_checked_and_the_policies_timed(tmp_path: Path) -> None:
    # request 1 asks more than sglang's context rule gives (input + output 4096 > 4094): mismatch, not ok; the
    # prefill policy's slow call (50 ms) is measured and warned about, naming both pools' policies
    trace = _trace(tmp_path / "t.jsonl", [(64, 8), (4000, 96), (64, 8), (64, 8)])
    sleepy = _policy_file(tmp_path, "sleepy", "        if type(self).calls == 1:\n            time.sleep(0.05)\n")
    result, run, records = _run(tmp_path, str(trace), "--backend", "sim", "--pd", "1:1", "--speed", "10",
                                "--prefill-policy", sleepy, timeout=40)
    assert result.returncode == 0, result.stderr
    by_id = {r["id"]: r for r in records}
    assert by_id[1]["status"] == "mismatch" and "context" in by_id[1]["mismatch"], by_id[1]
    assert all(by_id[i]["status"] == "ok" for i in (0, 2, 3))
    assert run["counts"]["mismatch"] == 1
    warning = run["policy_time"]["warning"]
    assert warning.startswith("policy 'sleepy (prefill) / random (decode)' held the replay loop"), warning
    assert max(r["policy_s"] for r in records) >= 0.05


def test_pd_hung_prefill_server_stalls_and_the_run_stops(tmp_path: Path, sim_server) -> None:
    # kill -STOP the only prefill server mid-run (no --timeout): it is stalled, the pairs waiting on it `timeout`; with
    # no prefill server left no pair can be made, so the run stops (it used to wait forever)
    boot = free_port()
    prefill = sim_server("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                         "--speed", "10", "--skip-tokenizer-init", wait=False)
    decode = sim_server("--disaggregation-mode", "decode", "--speed", "10", "--skip-tokenizer-init", wait=False)
    for server in (prefill, decode):
        wait_healthy(server.url, server.proc, server.log)
    # independent of timing: the prefill is stopped once the decode server has finished a few pairs (some `ok`,
    # however slowly the run starts); arrivals go on every 30 ms for 6 s, so some reach the stopped prefill (they
    # `timeout`) and the rest are still unreleased when the stall is seen, whenever that is (`not_sent`)
    n = 200
    trace = _trace(tmp_path / "t.jsonl", [(64, 32)] * n, gap=0.03)
    proc = subprocess.Popen(tracebench_cmd("replay", str(trace), "--attach-prefill", prefill.url, "--attach-decode",
                                           decode.url, "--stall-timeout", "1", "--poll-interval", "0.2", "--out-dir",
                                           str(tmp_path), "--run-name", "h", "--quiet", "--metrics-interval", "0"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_served([decode.url], 3)
        prefill.proc.send_signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        try:
            _, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=30)
            raise AssertionError(f"the replay hung with its only prefill server stalled:\n{stderr[-3000:]}") from None
    finally:
        prefill.proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 1, stderr
    assert time.monotonic() - t_stop < 15
    run = json.loads((tmp_path / "h" / "run.json").read_text())
    records = [json.loads(line) for line in (tmp_path / "h" / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in records) == list(range(n))
    assert run["status"] == "failed" and "every prefill server is down" in run["error"], run["error"]
    [down] = [e for e in run["events"] if e["kind"] == "server_down"]
    assert down["server"] == 0 and "stalled" in down["detail"], down
    statuses = Counter(r["status"] for r in records)
    assert statuses["timeout"] and statuses["not_sent"] and statuses["ok"], statuses
    assert set(statuses) <= {"ok", "timeout", "cancelled", "not_sent"}, statuses
    assert all("server 0 stalled" in r["error"] and r["prefill_server"] == 0 for r in records if r["status"] == "timeout")
    assert run["pd"]["server_metrics"][0]["error"] == "down during the run: not asked after it"


def test_a_pd_role_starts_on_the_requests_receipt_not_its_arrival(sim_server) -> None:
    # the simulator takes a request in request_hop_s / speed after tracebench's client sent it (41 ms at speed 0.05);
    # the decode's handshake and pre-allocation come after that receipt, as on the virtual clock (started on arrival,
    # its handshake was done a hop before the receipt)
    from tracebench.replay.client import SENT_HEADER
    boot = free_port()
    common = ("--speed", "0.05", "--skip-tokenizer-init")
    prefill = sim_server("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot), *common,
                         wait=False)
    decode = sim_server("--disaggregation-mode", "decode", *common, wait=False)
    for server in (prefill, decode):
        wait_healthy(server.url, server.proc, server.log)

    async def main() -> tuple:
        async with aiohttp.ClientSession() as session:
            async def post(url: str) -> tuple[int, list[dict]]:
                body = _body(64, 3, boot, out=2, stream=False)
                async with session.post(f"{url}/generate", json=body, headers={SENT_HEADER: repr(time.time())}) as r:
                    return r.status, [json.loads(await r.read())]

            return await asyncio.gather(post(prefill.url), post(decode.url))

    (p_status, _), (d_status, (d_out,)) = asyncio.run(main())
    assert p_status == d_status == 200 and d_out["meta_info"]["completion_tokens"] == 2
    metrics = _get(f"{decode.url}/metrics")
    bootstrap_ms = next(float(line.split()[-1]) for line in metrics.splitlines()
                        if line.startswith("sglang:kv_transfer_bootstrap_ms_sum"))
    # its handshake ended after the receipt: bootstrap time (from the entry, queue_entry_s / speed after the receipt)
    # above -queue_entry_s / speed
    assert bootstrap_ms >= -load_profile("llama-2-7b-h200-triton").queue_entry_s / 0.05 * 1000

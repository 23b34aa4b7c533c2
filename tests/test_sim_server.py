"""The sim-server as a process: timing seen over HTTP, limits visible in /v1/loads and in the stamps, start-up,
shutdown, crash and disconnect behaviour. Real processes on 127.0.0.1 (the `sim_server` fixture)."""

from __future__ import annotations

import http.client
import json
import math
import signal
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tracebench.profiles import load_profile
from tracebench.sim.model import Limits, simulate

PROFILE = load_profile("llama-2-7b-h200-triton")


def post(url: str, body: dict, timeout: float = 30) -> dict:
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def get(url: str, path: str) -> dict:
    with urllib.request.urlopen(url + path, timeout=10) as resp:
        return json.loads(resp.read())


def gen(ilen: int, olen: int) -> dict:
    return {"input_ids": [7] * ilen, "sampling_params": {"max_new_tokens": olen, "ignore_eos": True}}


def test_single_request_latency_matches_the_profile(sim_server) -> None:
    speed = 4.0
    srv = sim_server("--speed", str(speed))
    (expected,) = simulate(PROFILE, Limits(4096, PROFILE.max_total_num_tokens, 8192), [(0.0, 256, 64)], speed=speed)
    t0 = time.monotonic()
    meta = post(srv.url, gen(256, 64))["meta_info"]
    client = time.monotonic() - t0
    # the server's stamps are the model's times: exact up to float rounding of wall-clock seconds
    assert meta["e2e_latency"] == pytest.approx(expected.server_e2e, abs=2e-3)
    prefill = PROFILE.prefill_duration([(0, 256)]) / speed
    assert meta["prefill_finished_time"] - meta["forward_entry_time"] == pytest.approx(prefill, abs=1e-5)
    assert meta["queue_time"] < 0.002
    assert expected.server_e2e <= client < expected.server_e2e + 0.25   # plus real HTTP, generous on a loaded box


def test_speed_divides_latency(sim_server) -> None:
    slow, fast = sim_server("--speed", "2"), sim_server("--speed", "8")
    e2e_slow = post(slow.url, gen(128, 40))["meta_info"]["e2e_latency"]
    e2e_fast = post(fast.url, gen(128, 40))["meta_info"]["e2e_latency"]
    assert e2e_slow / e2e_fast == pytest.approx(4.0, rel=0.05)


def test_max_running_requests_4_in_loads_and_stamps(sim_server) -> None:
    # independent of timing (issues 23, 24): four streams that would decode for ~20 s hold the four slots while eight
    # short requests queue behind them; /v1/loads is polled until it shows the eight waiting (however slowly they
    # arrive), then the streams are cut (sglang aborts a request whose client went away and frees its slot) and the
    # eight go through, four at a time (each ~0.6 s of decode: the four of a wave overlap however late the aborts)
    srv = sim_server("--max-running-requests", "4")
    assert get(srv.url, "/v1/loads")["loads"][0]["max_running_requests"] == 4
    holders = []
    for _ in range(4):
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        conn.request("POST", "/generate", json.dumps({**gen(64, 4000), "stream": True}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.readline().startswith(b"data: ")   # admitted: its first token came
        holders.append(conn)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(post, srv.url, gen(64, 120), 120) for _ in range(8)]
        deadline = time.monotonic() + 60
        while (load := get(srv.url, "/v1/loads")["loads"][0])["num_waiting_reqs"] < 8:
            assert time.monotonic() < deadline, load
            time.sleep(0.01)
        assert load["num_running_reqs"] == 4 and load["num_waiting_reqs"] == 8
        for conn in holders:
            conn.close()
        metas = [f.result()["meta_info"] for f in futures]
    # in the stamps: between admission (forward_entry) and KV release (finish minus the output hop) at most 4
    hop = PROFILE.output_s
    events = sorted([(m["forward_entry_time"], 1) for m in metas] +
                    [(m["request_finished_ts"] - hop - 1e-4, -1) for m in metas])
    live = peak = 0
    for _, delta in events:
        live += delta
        peak = max(peak, live)
    assert peak == 4
    assert max(m["queue_time"] for m in metas) > 0.1   # the second four waited for the first (~0.6 s each)


def test_requests_over_kv_capacity_wait(sim_server) -> None:
    srv = sim_server("--speed", "10", "--max-total-tokens", "1000")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post, srv.url, gen(400, 300))
        time.sleep(0.05)
        second = pool.submit(post, srv.url, gen(400, 300))
        a, b = first.result()["meta_info"], second.result()["meta_info"]
    assert b["forward_entry_time"] >= a["request_finished_ts"] - PROFILE.output_s / 10 - 1e-4
    assert b["queue_time"] > 0.05
    too_big = urllib.request.Request(srv.url + "/generate", data=json.dumps(gen(800, 300)).encode(), method="POST")
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(too_big, timeout=10)
    assert err.value.code == 400 and "max_total_num_tokens is 1000" in err.value.read().decode()


def test_startup_delay_503_then_200(sim_server) -> None:
    srv = sim_server("--startup-delay", "1.0", wait=False)
    codes: list[tuple[float, int]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < 15:
        try:
            with urllib.request.urlopen(srv.url + "/health", timeout=1) as resp:
                codes.append((time.monotonic(), resp.status))
                break
        except urllib.error.HTTPError as err:
            codes.append((time.monotonic(), err.code))
        except OSError:
            pass  # not listening yet: connection refused, like sglang before its HTTP server is up
        time.sleep(0.05)
    statuses = [c for _, c in codes]
    assert statuses[-1] == 200 and 503 in statuses
    first_503 = next(t for t, c in codes if c == 503)
    assert codes[-1][0] - first_503 > 0.7     # 503 for about the delay
    assert get(srv.url, "/server_info")["status"] == "ready"


def test_sigterm_exits_promptly_with_requests_in_flight(sim_server) -> None:
    srv = sim_server("--speed", "1")
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    conn.request("POST", "/generate", body=json.dumps({**gen(16, 3000), "stream": True}))
    resp = conn.getresponse()
    assert resp.readline().startswith(b"data: ")
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=5) == 0
    assert time.monotonic() - t0 < 3.0
    conn.close()


def test_crash_on_bad_token_kills_the_process(sim_server) -> None:
    srv = sim_server("--speed", "10", "--crash-on-bad-token")
    with pytest.raises((http.client.RemoteDisconnected, ConnectionError, urllib.error.URLError)):
        post(srv.url, {"input_ids": [1, 2, 40000], "sampling_params": {"max_new_tokens": 2}})
    assert srv.proc.wait(timeout=5) != 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=1).close()


def test_client_disconnect_mid_stream_frees_the_slot(sim_server) -> None:
    srv = sim_server("--speed", "1")
    for stream in (True, False):
        sock = socket.create_connection(("127.0.0.1", srv.port))
        body = json.dumps({**gen(100, 3000), "stream": stream}).encode()
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            got = b""
            while b"data: " not in got:
                got += sock.recv(65536)
        else:
            time.sleep(0.3)
        load = get(srv.url, "/v1/loads")["loads"][0]
        assert load["num_running_reqs"] == 1 and load["num_used_tokens"] > 100
        sock.close()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            load = get(srv.url, "/v1/loads")["loads"][0]
            if load["num_running_reqs"] == 0:
                break
            time.sleep(0.02)
        assert load["num_running_reqs"] == 0 and load["num_used_tokens"] == 0 and load["token_usage"] == 0.0
    assert post(srv.url, gen(8, 2))["meta_info"]["completion_tokens"] == 2   # still serving


def test_the_server_takes_a_request_in_the_profiles_hop_after_the_client_sent_it(sim_server) -> None:
    # tracebench's client says when it sent a request (X-Tracebench-Sent, wall clock); the simulator takes it in the
    # profile's request_hop_s after that, as real sglang would, not when this host's loopback brought it (~0.4 ms)
    from tracebench.replay.client import SENT_HEADER
    from tracebench.sim.validate import SENT_HEADER as READ_HEADER
    assert SENT_HEADER == READ_HEADER
    srv = sim_server()
    hop = PROFILE.request_hop_s

    def received(sent: str | None) -> tuple[float, dict]:
        headers = {} if sent is None else {SENT_HEADER: sent}
        req = urllib.request.Request(srv.url + "/generate", data=json.dumps(gen(64, 2)).encode(), method="POST",
                                     headers=headers)
        t_post = time.time()
        with urllib.request.urlopen(req, timeout=30) as resp:
            return t_post, json.loads(resp.read())["meta_info"]

    for _ in range(3):
        t_sent = time.time()
        _, meta = received(repr(t_sent))
        assert meta["request_received_ts"] - t_sent >= hop - 1e-4
    # a request sent long ago (the hop has passed) is taken in on arrival; a sender's clock ahead holds it a hop at most
    t_post, meta = received(repr(time.time() - 10.0))
    assert meta["request_received_ts"] - t_post < 0.05
    t_post, meta = received(repr(time.time() + 10.0))
    assert meta["request_received_ts"] - t_post < hop + 0.05
    req = urllib.request.Request(srv.url + "/generate", data=json.dumps(gen(64, 2)).encode(), method="POST",
                                 headers={SENT_HEADER: "soon"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=30)
    assert err.value.code == 400 and "X-Tracebench-Sent: 'soon' is not a number" in err.value.read().decode()


def test_the_server_sends_an_answers_end_when_sglangs_would(sim_server) -> None:
    # real sglang's answer end reaches tracebench's client response_hop_s after request_finished_ts, a streamed token
    # only TOKEN_HOP_S after it is handed out: the simulator holds an answer's end answer_end_s (the difference) after
    # its model finished the request, whole answers and a stream's last chunk alike (24 ms at speed 0.02), and its
    # own lag (tracebench_sim_lag) does not count the hold: counted, it would be the hold at least (the bound is the
    # hold itself: a loaded 2-core machine's lag here was 5-13 ms)
    from tracebench.profiles import TOKEN_HOP_S

    speed = 0.02
    srv = sim_server("--speed", str(speed))
    hold = PROFILE.answer_end_s / speed
    assert PROFILE.answer_end_s == pytest.approx(PROFILE.response_hop_s - TOKEN_HOP_S)
    assert get(srv.url, "/server_info")["tracebench_sim"]["answer_end_s"] == PROFILE.answer_end_s
    meta = post(srv.url, gen(64, 2))["meta_info"]
    assert meta["response_sent_to_client_ts"] - meta["request_finished_ts"] >= hold - 1e-4
    assert meta["tracebench_sim_lag"] < hold
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", "/generate", json.dumps({**gen(64, 2), "stream": True}), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    last = None
    for line in resp:
        if line.startswith(b"data: {"):
            last, t_read = json.loads(line[6:]), time.time()
    conn.close()
    assert last is not None and last["meta_info"]["finish_reason"]["type"] == "length"
    assert t_read - last["meta_info"]["request_finished_ts"] >= hold - 1e-4
    assert last["meta_info"]["tracebench_sim_lag"] < hold


def test_receipts_keep_the_order_requests_reach_the_server() -> None:
    # a request sent earlier over a slower connection arrives later: it is taken in after the one before it (the
    # model admits in FCFS order of receipt; a paced stamp before the last one crashed the server with a 500)
    from tracebench.sim.validate import SENT_HEADER, BadRequest, receipt_time
    hop = 0.008
    now = time.time()
    first = receipt_time({SENT_HEADER: repr(now)}, 100.0, now + 0.0004, hop, -float("inf"))
    assert first == pytest.approx(100.0 + hop - 0.0004, abs=1e-6)   # the hop from the send, not from the arrival
    # one at a time: right after the one before, never tied with it (the next float)
    second = receipt_time({SENT_HEADER: repr(now - 0.005)}, 100.0001, now + 0.0005, hop, first)
    assert second == math.nextafter(first, math.inf)
    assert receipt_time({}, 100.0002, now + 0.0006, hop, second) == math.nextafter(second, math.inf)
    assert receipt_time({}, 200.0, now + 100.0, hop, first) == 200.0
    # a hop already over on arrival (a slow host): on arrival; a sender's clock ahead: a hop at most
    assert receipt_time({SENT_HEADER: repr(now - 1.0)}, 300.0, now, hop, first) == 300.0
    assert receipt_time({SENT_HEADER: repr(now + 1.0)}, 300.0, now, hop, first) == 300.0 + hop
    # a header that is not a finite number is refused (float() reads 'nan' and 'inf')
    for bad in ("nan", "inf", "-inf", "soon"):
        with pytest.raises(BadRequest, match=f"X-Tracebench-Sent: '{bad}' is not a number"):
            receipt_time({SENT_HEADER: bad}, 100.0, now, hop, -float("inf"))


def test_a_refusal_after_the_receipt_comes_no_sooner_than_the_receipt(sim_server) -> None:
    # sglang's tokenizer manager and scheduler refuse a request after taking it in: the simulator's answer (and its
    # stamps) come no sooner than its modelled receipt, request_hop_s / speed after the send (41 ms at speed 0.05);
    # answered on arrival, a streamed abort's meta_info had a negative e2e_latency and a receipt after its own send
    from tracebench.replay.client import SENT_HEADER
    speed = 0.05
    srv = sim_server("--speed", str(speed))
    hop = PROFILE.request_hop_s / speed
    too_long = 4092   # >= max_req_input_len (4096 - 5 + 1): the scheduler's abort
    cases = [("/generate", {**gen(too_long, 1), "stream": True}, 200),                 # the abort chunk
             ("/generate", gen(too_long, 1), 400),                                       # the scheduler's 400
             ("/generate", gen(4000, 200), 400),                               # the tokenizer manager's
             ("/v1/completions", {"prompt": [7] * too_long, "max_tokens": 1, "stream": True}, 200)]
    for path, body, status in cases:
        t_sent = time.time()
        req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={SENT_HEADER: repr(t_sent), "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                code, text = resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            code, text = err.code, err.read().decode()
        t_answered = time.time()
        assert code == status, (path, text)
        assert t_answered - t_sent >= hop - 1e-3, (path, body.get("stream"), t_answered - t_sent)
        if path == "/generate" and status == 200:
            meta = json.loads(text.split("data: ")[1])["meta_info"]
            assert meta["finish_reason"]["type"] == "abort"
            assert meta["e2e_latency"] >= 0.0
            assert meta["request_received_ts"] <= meta["forward_entry_time"] <= meta["request_finished_ts"]
            assert meta["request_received_ts"] <= meta["response_sent_to_client_ts"]


def test_waits_for_receipts_end_in_receipt_order() -> None:
    # a PD role and a refusal wait for the request's receipt (engine.until_receipt); receipts a float apart (two
    # requests that reached the server together) must be served first come first served: asyncio.sleep(t - now) put
    # half of 300 such waits out of order
    import asyncio

    from tracebench.sim.engine import until_receipt

    async def main() -> list[int]:
        t = asyncio.get_running_loop().time() + 0.02
        receipts = []
        for _ in range(300):
            receipts.append(t)
            t = math.nextafter(t, math.inf)
        order: list[int] = []

        async def wait(i: int) -> None:
            await until_receipt(receipts[i])
            order.append(i)

        await asyncio.gather(*(wait(i) for i in range(300)))
        return order

    assert asyncio.run(main()) == list(range(300))

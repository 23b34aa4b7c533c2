"""Probe of real sglang 0.5.17 behaviours that the shared captures do not cover.

Run on the device machine (stdlib only), after starting two servers:
  A: text mode (word-level tokenizer in the model folder), --enable-metrics, port 30000
  B: --skip-tokenizer-init --enable-metrics --max-running-requests 8, port 30001
Usage: probe_0517.py OUT.json A|B — writes one JSON object (key -> observed answer) to OUT.json.
"""

import http.client
import json
import socket
import sys
import threading
import time

OUT = sys.argv[1]
PART = sys.argv[2]
RES = {}


def save():
    with open(OUT, "w") as f:
        json.dump(RES, f, indent=1, default=str)


def req(port, method, path, body=None, timeout=60, raw=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None
    headers = {}
    if body is not None:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        headers["Content-Type"] = "application/json"
    t0 = time.time()
    c.request(method, path, body=data, headers=headers)
    r = c.getresponse()
    txt = r.read().decode("utf-8", "replace")
    out = {
        "status": r.status,
        "content_type": r.getheader("Content-Type"),
        "secs": round(time.time() - t0, 4),
    }
    if raw:
        out["body"] = txt
    else:
        try:
            out["body"] = json.loads(txt)
        except Exception:
            out["body"] = txt
    c.close()
    return out


def loads(port):
    r = req(port, "GET", "/v1/loads?include=core")
    l = r["body"]["loads"][0]
    return {k: l[k] for k in ("num_running_reqs", "num_waiting_reqs", "max_running_requests", "timestamp")}


def step(name, fn):
    try:
        RES[name] = fn()
    except Exception as e:  # record and go on: this is a probe, each key stands alone
        RES[name] = {"probe_exception": repr(e)}
    save()


def ids(n, start=100):
    return [start + (i % 30000) for i in range(n)]


def gen_body(n_in, n_out, stream=False):
    return {
        "input_ids": ids(n_in),
        "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True, "temperature": 0.0},
        "stream": stream,
    }


def fire_concurrent(port, n, n_in, n_out, poll_secs):
    """n concurrent non-stream requests; poll /v1/loads while they run."""
    done = []

    def one():
        done.append(req(port, "POST", "/generate", gen_body(n_in, n_out), timeout=300)["status"])

    ths = [threading.Thread(target=one) for _ in range(n)]
    for t in ths:
        t.start()
    samples = []
    t0 = time.time()
    while time.time() - t0 < poll_secs and len(done) < n:
        samples.append(loads(port))
        time.sleep(0.05)
    for t in ths:
        t.join()
    return {
        "statuses": done,
        "max_running_seen": max(s["num_running_reqs"] for s in samples),
        "max_waiting_seen": max(s["num_waiting_reqs"] for s in samples),
        "n_samples": len(samples),
        "first_samples": samples[:5],
    }


def sse_raw(port, body, max_lines=8):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/generate", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    lines = []
    while len(lines) < max_lines:
        l = r.readline()
        if not l:
            break
        lines.append(l.decode("utf-8", "replace"))
    c.close()
    return {"status": r.status, "content_type": r.getheader("Content-Type"), "lines": lines}


def disconnect_stream(port, n_out=3000, chunks=5):
    """Stream, read a few chunks, close the socket, then watch /v1/loads."""
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps(gen_body(16, n_out, stream=True)).encode()
    s.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    got = b""
    while got.count(b"data: ") < chunks:
        got += s.recv(65536)
    t_close = time.time()
    s.close()
    samples = []
    while time.time() - t_close < 8:
        l = loads(port)
        samples.append((round(time.time() - t_close, 2), l["num_running_reqs"], l["num_waiting_reqs"]))
        time.sleep(0.25)
    return {"samples_after_close_(s,running,waiting)": samples}


def disconnect_nonstream(port, n_out=3000, wait=1.0):
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps(gen_body(16, n_out)).encode()
    s.sendall(
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    time.sleep(wait)
    t_close = time.time()
    s.close()
    samples = []
    while time.time() - t_close < 10:
        l = loads(port)
        samples.append((round(time.time() - t_close, 2), l["num_running_reqs"], l["num_waiting_reqs"]))
        time.sleep(0.5)
    return {"samples_after_close_(s,running,waiting)": samples}


A, B = 30000, 30001


def part_a():

    # ---- server A: text mode, default max_running_requests ----
    step("A_set_internal_state_max_running_requests", lambda: req(A, "POST", "/set_internal_state", {"server_args": {"max_running_requests": 8}}))
    step("A_set_internal_state_pp_max_micro_batch_size_4", lambda: req(A, "POST", "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 4}}))
    step("A_16_concurrent_with_pp_max_micro_batch_size_4", lambda: fire_concurrent(A, 16, 64, 200, 60))
    step("A_set_internal_state_pp_max_micro_batch_size_5000", lambda: req(A, "POST", "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 5000}}))
    step("A_set_internal_state_pp_max_micro_batch_size_4096", lambda: req(A, "PUT", "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 4096}}))
    step("A_16_concurrent_after_reset_4096", lambda: fire_concurrent(A, 16, 64, 200, 60))
    step("A_stream_too_long", lambda: sse_raw(A, gen_body(5000, 4, stream=True)))
    step("A_stream_empty_ids", lambda: sse_raw(A, {"input_ids": [], "sampling_params": {"max_new_tokens": 4}, "stream": True}))
    step("A_stream_neg_max_new", lambda: sse_raw(A, gen_body(8, -1, stream=True)))
    step("A_nonstream_input_4093_out_1", lambda: req(A, "POST", "/generate", gen_body(4093, 1)))
    step("A_nonstream_input_4089_out_1", lambda: req(A, "POST", "/generate", gen_body(4089, 1)))
    step("A_stream_input_4093_out_1", lambda: sse_raw(A, gen_body(4093, 1, stream=True)))
    step("A_nonstream_input_4095_out_1", lambda: req(A, "POST", "/generate", gen_body(4095, 1)))
    step("A_nonstream_input_4096_out_0", lambda: req(A, "POST", "/generate", gen_body(4096, 0)))
    step("A_nonstream_max_new_tokens_0", lambda: req(A, "POST", "/generate", gen_body(8, 0)))
    step("A_nonstream_no_max_new_tokens", lambda: {k: v for k, v in req(A, "POST", "/generate", {"input_ids": ids(8), "sampling_params": {"ignore_eos": True}}).items()})
    step("A_disconnect_stream", lambda: disconnect_stream(A))
    step("A_disconnect_nonstream", lambda: disconnect_nonstream(A))
    step("A_get_server_info_status", lambda: req(A, "GET", "/get_server_info")["status"])
    step("A_get_model_info", lambda: req(A, "GET", "/get_model_info")["status"])
    step("A_flush_cache_idle", lambda: req(A, "POST", "/flush_cache", raw=True))
    step("A_health_generate", lambda: req(A, "GET", "/health_generate", raw=True))
    step("A_v1_loads_prometheus_head", lambda: req(A, "GET", "/v1/loads?format=prometheus", raw=True)["body"][:1500])


def part_b():
    # ---- server B: --skip-tokenizer-init, --max-running-requests 8 ----
    step("B_nonstream", lambda: req(B, "POST", "/generate", gen_body(16, 4)))
    step("B_stream", lambda: sse_raw(B, gen_body(16, 3, stream=True), max_lines=12))
    step("B_text_input_with_skip_tokenizer", lambda: req(B, "POST", "/generate", {"text": "w5 w6", "sampling_params": {"max_new_tokens": 2}}))
    step("B_loads", lambda: req(B, "GET", "/v1/loads")["body"]["loads"][0])
    step("B_server_info_subset", lambda: {k: v for k, v in req(B, "GET", "/server_info")["body"].items() if k in ("max_running_requests", "pp_max_micro_batch_size", "max_total_num_tokens", "max_req_input_len", "skip_tokenizer_init")})
    step("B_internal_state_effective", lambda: req(B, "GET", "/server_info")["body"]["internal_states"][0].get("effective_max_running_requests_per_dp"))
    step("B_set_pp_max_micro_batch_size_16", lambda: req(B, "POST", "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 16}}))
    step("B_16_concurrent_with_max_running_requests_8", lambda: fire_concurrent(B, 16, 64, 200, 60))
    step("B_set_pp_max_micro_batch_size_2", lambda: req(B, "POST", "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 2}}))
    step("B_16_concurrent_with_pp_2", lambda: fire_concurrent(B, 16, 64, 200, 60))


{"A": part_a, "B": part_b}[PART]()
print("probe done", PART)

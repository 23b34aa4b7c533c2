"""The sim-server's HTTP answers against what real sglang 0.5.17 answered (tests/data/sglang-0.5.17/api_capture.json):
same paths, status codes, content types, key sets (and key order of meta_info) and value types; not values.
One real sim-server process for the module (started like the `sim_server` fixture does)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import SGLANG_CAPTURES, SimServer, free_port, tracebench_cmd, wait_healthy

CAPTURE_DIR = SGLANG_CAPTURES


def _capture() -> dict:
    return json.loads((CAPTURE_DIR / "api_capture.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    port = free_port()
    log = tmp_path_factory.mktemp("sim") / "sim.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(tracebench_cmd("sim-server", "--port", str(port), "--speed", "20", "--seed", "3"),
                                stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    srv = SimServer(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log=log)
    wait_healthy(srv.url, proc, log)
    yield srv
    srv.stop()


def http(url: str, body: bytes | dict | None = None, method: str | None = None) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    req = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


# the simulator's own key, last in a finished answer's meta_info (sim/answers.py): how late it ran (issue 24)
SIM_ONLY_LAST_KEY = "tracebench_sim_lag"


def same_shape(sim, real, path: str = "$") -> None:
    """Same keys (and for dicts with the same order), same value types; None in the capture accepts anything. A
    meta_info may end with the simulator's own key (a number), which sglang does not have."""
    if real is None:
        return
    if isinstance(real, dict):
        assert isinstance(sim, dict), f"{path}: {type(sim).__name__}, capture has an object"
        keys = list(sim)
        if path.endswith("meta_info") and keys and keys[-1] == SIM_ONLY_LAST_KEY:
            assert isinstance(sim[SIM_ONLY_LAST_KEY], float) and sim[SIM_ONLY_LAST_KEY] >= 0.0
            keys.pop()
        assert keys == list(real), f"{path}: keys {keys} != capture {list(real)}"
        for key in real:
            same_shape(sim[key], real[key], f"{path}.{key}")
    elif isinstance(real, list):
        assert isinstance(sim, list), f"{path}: {type(sim).__name__}, capture has a list"
        if real and sim:
            same_shape(sim[0], real[0], f"{path}[0]")
    elif isinstance(real, bool) or isinstance(real, str):
        assert type(sim) is type(real), f"{path}: {type(sim).__name__} != capture {type(real).__name__}"
    else:  # numbers: int and float are both JSON numbers; sglang itself varies (0 vs 0.0)
        assert isinstance(sim, (int, float)) and not isinstance(sim, bool), f"{path}: {sim!r} is not a number"


@pytest.mark.parametrize("path", ["/health", "/health_generate", "/flush_cache"])
def test_plain_endpoints(server: SimServer, path: str) -> None:
    cap = _capture()["flush_cache" if path == "/flush_cache" else f"GET {path}"]
    status, _, body = http(server.url + path, b"" if path == "/flush_cache" else None)
    assert status == cap["status"] == 200
    assert body.decode() == cap["body"]


@pytest.mark.parametrize("path", ["/model_info", "/v1/models", "/v1/loads", "/get_load"])
def test_json_endpoints_have_the_captured_shape(server: SimServer, path: str) -> None:
    cap = _capture()[f"GET {path}"]
    # one request first: /v1/loads decode_moments is null until the first decode step, like sglang
    http(server.url + "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})
    status, headers, body = http(server.url + path)
    assert status == cap["status"]
    assert headers["Content-Type"].startswith(cap["headers"]["Content-Type"])
    same_shape(json.loads(body), json.loads(cap["body"]))


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
def test_server_info_has_sglangs_keys_and_the_sims_values(server: SimServer, path: str) -> None:
    real = json.loads((CAPTURE_DIR / "server_info_skip_tokenizer.json").read_text())
    status, _, body = http(server.url + path)
    assert status == 200
    info = json.loads(body)
    assert list(info)[: len(real)] == list(real)                        # every sglang key, in sglang's order
    assert [k for k in info if k not in real] == ["tracebench_sim"]    # plus one that says it is simulated
    for key in ("max_total_num_tokens", "chunked_prefill_size", "context_length", "port", "version", "status"):
        same_shape(info[key], real[key] if real[key] is not None else info[key], key)
    assert info["port"] == server.port and info["context_length"] == 4096 and info["chunked_prefill_size"] == 8192
    assert info["max_total_num_tokens"] == 231818 and info["random_seed"] == 3
    assert info["tracebench_sim"]["profile"] == "llama-2-7b-h200-triton" and info["tracebench_sim"]["speed"] == 20
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 4096


def test_metrics_names_labels_and_buckets(server: SimServer) -> None:
    http(server.url + "/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}})
    cap = _capture()["GET /metrics"]
    status, headers, body = http(server.url + "/metrics")
    assert status == 200 and headers["Content-Type"] == cap["headers"]["Content-Type"]
    text = body.decode()
    for name, kind in (("sglang:num_running_reqs", "gauge"), ("sglang:num_queue_reqs", "gauge"),
                       ("sglang:gen_throughput", "gauge"), ("sglang:token_usage", "gauge"),
                       ("sglang:e2e_request_latency_seconds", "histogram"),
                       ("sglang:time_to_first_token_seconds", "histogram"),
                       ("sglang:queue_time_seconds", "histogram")):
        assert f"# TYPE {name} {kind}\n" in text, name
    # the captured TTFT lines: same label set and bucket bounds (the capture is cut after le=1.0)
    real_ttft = re.findall(r'^sglang:time_to_first_token_seconds_bucket\{(.*)\} ', cap["body"], re.M)
    sim_ttft = re.findall(r'^sglang:time_to_first_token_seconds_bucket\{(.*)\} ', text, re.M)
    assert sim_ttft[: len(real_ttft)] == real_ttft
    real_queue = re.findall(r'^sglang:queue_time_seconds_bucket\{(.*)\} ', cap["body"], re.M)
    sim_queue = re.findall(r'^sglang:queue_time_seconds_bucket\{(.*)\} ', text, re.M)
    assert sim_queue == real_queue
    gauge = re.search(r'^sglang:num_running_reqs\{(.*)\} (\S+)$', text, re.M)
    per_stage_labels = re.search(r'^sglang:queue_time_seconds_sum\{(.*)\} ', cap["body"], re.M).group(1)
    assert gauge.group(1) == per_stage_labels and float(gauge.group(2)) == 0.0
    count = re.search(r'^sglang:e2e_request_latency_seconds_count\{.*is_streaming="false".*\} (\S+)$', text, re.M)
    assert float(count.group(1)) >= 1.0


@pytest.mark.parametrize("case,payload", [
    ("generate_ids_nonstream", {"input_ids": list(range(1, 17)), "sampling_params": {"max_new_tokens": 4,
                                                                                     "ignore_eos": True}}),
    ("generate_text_nonstream", {"text": "the quick brown fox", "sampling_params": {"max_new_tokens": 4}}),
    ("generate_batch_ids", {"input_ids": [list(range(8)), list(range(12))], "sampling_params": {"max_new_tokens": 3}}),
])
def test_generate_non_streaming(server: SimServer, case: str, payload: dict) -> None:
    cap = _capture()[case]
    status, headers, body = http(server.url + "/generate", payload)
    assert status == cap["status"] == 200 and headers["Content-Type"].startswith("application/json")
    sim, real = json.loads(body), json.loads(cap["body"])
    same_shape(sim, real)
    outs = sim if isinstance(sim, list) else [sim]
    lens = [len(x) for x in payload["input_ids"]] if case == "generate_batch_ids" else [
        len(payload["input_ids"]) if "input_ids" in payload else 4]
    for out, ilen in zip(outs, lens, strict=True):
        n = payload["sampling_params"]["max_new_tokens"]
        meta = out["meta_info"]
        assert len(out["output_ids"]) == n == meta["completion_tokens"] and meta["prompt_tokens"] == ilen
        assert out["text"] == "".join(f" w{i}" for i in out["output_ids"])
        assert meta["finish_reason"] == {"type": "length", "length": n}
        assert (meta["request_received_ts"] <= meta["api_server_dispatch_finish_ts"] <= meta["forward_entry_time"]
                <= meta["prefill_finished_time"] <= meta["request_finished_ts"] <= meta["response_sent_to_client_ts"])
        assert meta["e2e_latency"] == pytest.approx(meta["request_finished_ts"] - meta["request_received_ts"], abs=1e-6)


def test_generate_stream_chunks(sim_server) -> None:
    # its own server at --speed 1 (a decode step ~5 ms): tokens that are ready when the handler wakes go out in one
    # chunk, like sglang's, so at the module server's --speed 20 (0.25 ms a step) a busy machine sent all 12 in one
    server = sim_server("--speed", "1", "--seed", "3")
    cap = _capture()["generate_stream_raw"]
    payload = {"input_ids": list(range(32)), "sampling_params": {"max_new_tokens": 12, "ignore_eos": True},
               "stream": True}
    status, headers, body = http(server.url + "/generate", payload)
    assert status == cap["status"] == 200 and headers["Content-Type"].startswith("text/event-stream")
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n")
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    real = [json.loads(line[6:]) for line in cap["first_lines"] + cap["last_lines"] if line.startswith("data: {")]
    same_shape(chunks[0], real[0])       # first chunk: carries response_sent_to_client_ts
    same_shape(chunks[-1], real[-1])     # final chunk: finish_reason and the server stamps
    for chunk in chunks[1:-1]:
        same_shape(chunk, real[1])       # intermediate chunks
    ids = [c["output_ids"] for c in chunks]
    assert all(later[: len(earlier)] == earlier and len(later) > len(earlier) for earlier, later in zip(ids, ids[1:]))
    assert ids[-1] == chunks[-1]["output_ids"] and len(ids[-1]) == 12
    # the final chunk repeats the first chunk's send stamp, like sglang
    assert chunks[-1]["meta_info"]["response_sent_to_client_ts"] == chunks[0]["meta_info"]["response_sent_to_client_ts"]


@pytest.mark.parametrize("case,payload", [
    ("bad_too_long", {"input_ids": [5] * 5000, "sampling_params": {"max_new_tokens": 4}}),
    ("bad_long_plus_out", {"input_ids": [5] * 4000, "sampling_params": {"max_new_tokens": 500}}),
    ("bad_empty_ids", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}),
    ("bad_neg_max_new", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": -1}}),
    ("bad_json", b'{"input_ids": [1, 2, 3], '),
])
def test_bad_input_gets_sglangs_400(server: SimServer, case: str, payload) -> None:
    cap = _capture()[case]
    status, headers, body = http(server.url + "/generate", payload)
    assert status == cap["status"] == 400
    assert headers["Content-Type"].startswith(cap["headers"]["Content-Type"])
    sim, real = json.loads(body), json.loads(cap["body"])
    same_shape(sim, real)
    if case != "bad_json":
        assert sim == real   # same message text for the same input


def test_out_of_vocab_id_is_refused_by_default(server: SimServer) -> None:
    status, _, body = http(server.url + "/generate", {"input_ids": [1, 32000], "sampling_params": {"max_new_tokens": 1}})
    assert status == 400
    assert json.loads(body) == {"error": {"message": "The input_ids [1, 32000] contains values greater than the "
                                                     "vocab size (32000)."}}
    assert http(server.url + "/health")[0] == 200


def test_same_seed_same_output_ids(sim_server) -> None:
    def ids(srv: SimServer) -> list[list[int]]:
        return [json.loads(http(srv.url + "/generate", {"input_ids": [1, 2, 3], "sampling_params":
                                                        {"max_new_tokens": 6}})[2])["output_ids"] for _ in range(3)]
    a, b, c = (sim_server("--speed", "50", "--seed", s) for s in ("7", "7", "8"))
    first = ids(a)
    assert first == ids(b)
    assert first != ids(c)
    assert len({tuple(x) for x in first}) == 3   # successive requests differ


def test_no_enable_metrics_drops_the_stamps(sim_server) -> None:
    srv = sim_server("--speed", "50", "--no-enable-metrics")
    out = json.loads(http(srv.url + "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}})[2])
    meta = out["meta_info"]
    assert "e2e_latency" in meta and "response_sent_to_client_ts" in meta
    for key in ("request_received_ts", "forward_entry_time", "prefill_finished_time", "request_finished_ts"):
        assert key not in meta
    assert http(srv.url + "/metrics")[2] == b""


def test_help_lists_every_flag(tmp_path: Path) -> None:
    from conftest import run_cli
    res = run_cli("sim-server", "--help")
    assert res.returncode == 0
    for flag in ("--port", "--host", "--profile", "--speed", "--max-running-requests", "--max-total-tokens",
                 "--context-length", "--chunked-prefill-size", "--startup-delay", "--seed", "--vocab-size",
                 "--crash-on-bad-token", "--enable-metrics / --no-enable-metrics"):
        assert flag in res.stdout, flag
    bad = run_cli("sim-server", "--port", "1", "--profile", "nope")
    assert bad.returncode == 2 and "no such profile" in bad.stderr


# ---- against our own H200 probe (.DUCUMENT/captures): streamed errors, scheduler aborts, skip-tokenizer-init ----
PROBE_DIR = Path(__file__).resolve().parents[1] / ".DUCUMENT" / "captures" / "h200-2026-11-22"


def _probe(name: str) -> dict:
    part = "resultsA.json" if name.startswith("A_") else "resultsB.json"
    return json.loads((PROBE_DIR / part).read_text())[name]


def sse_events(body: bytes) -> list[str]:
    text = body.decode()
    assert text.endswith("data: [DONE]\n\n")
    return [e[6:] for e in text.split("\n\n")[:-1]]


@pytest.mark.parametrize("probe,payload", [
    ("A_stream_too_long", {"input_ids": [5] * 5000, "sampling_params": {"max_new_tokens": 4}}),
    ("A_stream_empty_ids", {"input_ids": [], "sampling_params": {"max_new_tokens": 4}}),
    ("A_stream_neg_max_new", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}}),
])
def test_stream_errors_are_sse_events_with_status_200(server: SimServer, probe: str, payload: dict) -> None:
    real = _probe(probe)
    status, headers, body = http(server.url + "/generate", {**payload, "stream": True})
    assert status == real["status"] == 200 and headers["Content-Type"] == real["content_type"]
    events = sse_events(body)
    assert events[:-1] and len(events) == 2   # the error event, then [DONE]
    assert json.loads(events[0]) == json.loads(real["lines"][0][6:])


def test_input_over_max_req_input_len_is_a_scheduler_abort(server: SimServer) -> None:
    real = _probe("A_nonstream_input_4093_out_1")
    status, _, body = http(server.url + "/generate", {"input_ids": [5] * 4093, "sampling_params": {"max_new_tokens": 1}})
    assert status == real["status"] == 400 and json.loads(body) == real["body"]
    assert http(server.url + "/generate", {"input_ids": [5] * 4089,
                                           "sampling_params": {"max_new_tokens": 1}})[0] == 200
    real = _probe("A_stream_input_4093_out_1")
    status, _, body = http(server.url + "/generate", {"input_ids": [5] * 4093, "sampling_params": {"max_new_tokens": 1},
                                                      "stream": True})
    assert status == 200
    (chunk,) = [json.loads(e) for e in sse_events(body)[:-1]]
    want = json.loads(real["lines"][0][6:])
    same_shape(chunk, want)
    assert chunk["meta_info"]["finish_reason"] == want["meta_info"]["finish_reason"]


def test_max_new_tokens_zero_and_default(server: SimServer) -> None:
    real = _probe("A_nonstream_max_new_tokens_0")
    status, _, body = http(server.url + "/generate", {"input_ids": list(range(8)), "sampling_params": {"max_new_tokens": 0}})
    out = json.loads(body)
    assert status == 200
    want = real["body"]
    want["meta_info"]["cached_tokens_details"] = None  # the probe hit the prefix cache; the sim has none
    same_shape(out, want)
    assert out["output_ids"] == [] and out["text"] == "" and out["meta_info"]["finish_reason"]["length"] == 0
    out = json.loads(http(server.url + "/generate", {"input_ids": [1, 2, 3]})[2])
    assert len(out["output_ids"]) == 128   # sglang's default max_new_tokens


def test_rid_is_echoed_and_duplicates_refused(server: SimServer) -> None:
    out = json.loads(http(server.url + "/generate", {"input_ids": [1], "rid": "abc",
                                                     "sampling_params": {"max_new_tokens": 1}})[2])
    assert out["meta_info"]["id"] == "abc"
    outs = json.loads(http(server.url + "/generate", {"input_ids": [[1], [2]], "rid": "b",
                                                      "sampling_params": {"max_new_tokens": 1}})[2])
    assert [o["meta_info"]["id"] for o in outs] == ["b_0", "b_1"]
    status, _, body = http(server.url + "/generate", {"input_ids": [[1], [2]], "rid": ["x", "x"]})
    assert status == 400 and json.loads(body) == {"error": {"message": "Duplicate request ID detected: x"}}


def test_skip_tokenizer_init_answers_like_server_b(sim_server) -> None:
    # one chunk per token, as the probe got, when the stream's writer keeps up with the decode steps: a writer late
    # on a busy machine finds several tokens at once and sends them as one chunk (as sglang's tokenizer manager does).
    # At --speed 0.05 a step lasts ~140 ms: longer than any such delay
    srv = sim_server("--skip-tokenizer-init", "--max-running-requests", "8", "--speed", "0.05")
    status, _, body = http(srv.url + "/generate", {"input_ids": list(range(16)), "sampling_params": {"max_new_tokens": 4}})
    want = _probe("B_nonstream")["body"]
    assert status == 200
    same_shape(json.loads(body), want)
    real = _probe("B_stream")
    status, headers, body = http(srv.url + "/generate", {"input_ids": list(range(16)), "stream": True,
                                                         "sampling_params": {"max_new_tokens": 3}})
    chunks = [json.loads(e) for e in sse_events(body)[:-1]]
    wants = [json.loads(line[6:]) for line in real["lines"] if line.startswith("data: {")]
    for want in wants:   # the probe hit the prefix cache; the sim has none
        want["meta_info"]["cached_tokens_details"] = None
    assert status == 200 and headers["Content-Type"] == real["content_type"] and len(chunks) == len(wants) == 3
    for chunk, want in zip(chunks, wants):
        same_shape(chunk, want)
    real = _probe("B_text_input_with_skip_tokenizer")
    status, _, body = http(srv.url + "/generate", {"text": "hello world"})
    assert status == real["status"] == 400 and json.loads(body) == real["body"]
    load = json.loads(http(srv.url + "/v1/loads")[2])["loads"][0]
    same_shape(load, _probe("B_loads"))
    assert load["max_running_requests"] == 8
    assert json.loads(http(srv.url + "/server_info")[2])["skip_tokenizer_init"] is True


def test_set_internal_state_caps_admission_at_run_time(sim_server) -> None:
    srv = sim_server("--speed", "10")
    for payload, answer in ((_probe("A_set_internal_state_max_running_requests"), [False]),
                            (_probe("A_set_internal_state_pp_max_micro_batch_size_5000"), [False])):
        assert payload["body"] == answer
    assert json.loads(http(srv.url + "/set_internal_state", {"server_args": {"max_running_requests": 8}})[2]) == [False]
    assert json.loads(http(srv.url + "/set_internal_state",
                           {"server_args": {"pp_max_micro_batch_size": 5000}})[2]) == [False]
    assert json.loads(http(srv.url + "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 4}})[2]) == [True]
    from concurrent.futures import ThreadPoolExecutor
    import time
    # the 16 must all be queued before the first 4 finish: 2,500 tokens give the client ~1.5 s at --speed 10 to send
    # them (1,000 tokens gave ~0.6 s: once too little, with four test processes on 2 cores)
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(http, srv.url + "/generate", {"input_ids": [1] * 32,
                                                             "sampling_params": {"max_new_tokens": 2500}})
                   for _ in range(16)]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            load = json.loads(http(srv.url + "/v1/loads")[2])["loads"][0]
            if load["num_running_reqs"] + load["num_waiting_reqs"] == 16:
                break
            time.sleep(0.02)
        assert (load["num_running_reqs"], load["num_waiting_reqs"]) == (4, 12)
        assert load["max_running_requests"] == 4096   # like sglang: the launch value
        status, _, _ = http(srv.url + "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 4096}},
                            method="PUT")
        assert status == 200
        assert all(f.result()[0] == 200 for f in futures)

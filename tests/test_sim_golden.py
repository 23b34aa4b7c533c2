"""The sim-server's answers and /metrics text after a fixed sequence of requests, against a golden file written by the
code before `sim/server.py` was split into components (issue 23): the split must change nothing a client sees.

Numbers that depend on the wall clock (stamps, latencies, `_sum`s of the latency histograms, ids drawn at random) are
masked; every count, token id, text, shape and key order is compared. Requests go one at a time, so the model's
batches, and with them the counters and bucket counts, do not depend on how loaded the machine is.
Rewrite the golden file (only for a deliberate change of the answers): `python tests/test_sim_golden.py --write`."""

from __future__ import annotations

import http.client
import json
import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from conftest import TEST_DATA

GOLDEN = TEST_DATA / "sim_golden.json"
SERVER_ARGS = ("--speed", "50", "--seed", "5")
MASKED = "<masked>"
# keys whose values follow the wall clock or a random draw
_MASK_KEYS = {"created", "timestamp", "ts_tic", "forward_entry_time", "prefill_finished_time", "queue_time",
              "e2e_latency", "decode_throughput", "request_received_ts", "api_server_dispatch_finish_ts",
              "request_finished_ts", "response_sent_to_client_ts", "decode_moments", "gen_throughput",
              "last_gen_throughput", "port", "tracebench_sim_lag"}
_RANDOM_ID = re.compile(r"^[0-9a-f]{32}$")   # uuid4().hex: a request sent without rid


def _mask(value: object) -> object:
    if isinstance(value, dict):
        return {k: (MASKED if k in _MASK_KEYS and v is not None else _mask(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    if isinstance(value, str) and _RANDOM_ID.match(value):
        return MASKED
    return value


def _metrics_lines(text: str) -> list[str]:
    """The /metrics text, the latency sums and the throughput gauge masked."""
    out = []
    for line in text.splitlines():
        # tracebench's lag families follow the clock whole (how late the loop ran), not only their sums
        if not line.startswith("#") and ("_sum{" in line or line.startswith(("sglang:gen_throughput{", "tracebench:"))):
            line = line.rsplit(" ", 1)[0] + " " + MASKED
        out.append(line)
    return out


def _request(url: str, body: dict | None = None, method: str = "POST") -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method if body is not None else "GET",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _stream_summary(chunks: list[dict]) -> dict:
    """What of a stream does not follow the clock: how many tokens it carried, its chunks' keys, its last answer chunk
    (/generate: text and output ids as counts, each chunk holds all so far; OpenAI: the delta's text masked, as how
    the tokens fall into chunks follows the clock, and so do the ids, drawn per chunk) and its usage chunk."""
    answer = [c for c in chunks if c.get("choices") != []]
    last = _mask(answer[-1])
    if "output_ids" in last:
        streamed = len(last["output_ids"])
        last["output_ids"] = streamed
        if "text" in last:
            last["text"] = len(last["text"].split())
    else:
        streamed = 0
        for c in answer:
            for choice in c.get("choices", []):
                streamed += len((choice.get("text") or (choice.get("delta") or {}).get("content") or "").split())
        for choice in last.get("choices", []):
            if "text" in choice:
                choice["text"] = MASKED
            if (choice.get("delta") or {}).get("content"):
                choice["delta"]["content"] = MASKED
    usage = [_mask(c) for c in chunks if c.get("choices") == []]
    return {"streamed_tokens": streamed, "first_keys": list(chunks[0]), "keys": sorted({k for c in chunks for k in c}),
            "last": last, "usage_chunks": usage}


def _answer(status: int, raw: bytes) -> dict:
    """One answer: JSON as such, an SSE stream as its summary."""
    if raw.startswith(b"data: "):
        parts = raw.split(b"\n\n")
        assert parts[-2:] == [b"data: [DONE]", b""], raw[-200:]
        return {"status": status, **_stream_summary([json.loads(p[6:]) for p in parts[:-2]])}
    try:
        return {"status": status, "body": _mask(json.loads(raw))}
    except json.JSONDecodeError:
        return {"status": status, "text": raw.decode()}


def _disconnect_mid_stream(port: int) -> None:
    """A long stream cut after its first chunk: the server aborts the request."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    body = json.dumps({"input_ids": list(range(100, 110)), "rid": "cut", "stream": True,
                       "sampling_params": {"max_new_tokens": 3000}})
    conn.request("POST", "/generate", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "
    conn.close()


def _wait_idle(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        load = json.loads(_request(f"{url}/v1/loads")[1])["loads"][0]
        if load["num_running_reqs"] == 0 and load["num_waiting_reqs"] == 0:
            return
        time.sleep(0.02)
    raise AssertionError("the sim-server did not go idle")


def observe(url: str, port: int) -> dict:
    """The fixed sequence of requests, and what the server answered."""
    ids = list(range(1000, 1040))
    seq: list[tuple[str, str, dict | None]] = [
        ("generate", "/generate", {"input_ids": ids, "rid": "a", "sampling_params": {"max_new_tokens": 6}}),
        ("generate prefix hit, stream", "/generate",
         {"input_ids": ids + [7, 8, 9], "rid": "b", "stream": True, "sampling_params": {"max_new_tokens": 5}}),
        ("generate text batch", "/generate",
         {"text": ["w1 w2 w3 w4", "w1 w2 w9"], "rid": ["c", "d"], "sampling_params": {"max_new_tokens": 3}}),
        ("generate default max_new_tokens", "/generate", {"input_ids": [5, 6, 7], "rid": "e"}),
        ("generate bad request", "/generate", {"input_ids": [], "rid": "f"}),
        ("generate bad request, stream", "/generate", {"input_ids": [1, 2], "rid": "g", "stream": True,
                                                       "sampling_params": {"max_new_tokens": "x"}}),
        ("generate scheduler abort", "/generate",
         {"input_ids": [3] * 4090, "rid": "h", "sampling_params": {"max_new_tokens": 1}}),
        ("generate scheduler abort, stream", "/generate",
         {"input_ids": [3] * 4090, "rid": "i", "stream": True, "sampling_params": {"max_new_tokens": 1}}),
        ("completions", "/v1/completions", {"model": "m", "prompt": ids[:10], "max_tokens": 4}),
        ("completions text", "/v1/completions", {"prompt": "w5 w6 w7", "max_tokens": 2}),
        ("completions stream with usage", "/v1/completions",
         {"prompt": ids[:12], "max_tokens": 4, "stream": True,
          "stream_options": {"include_usage": True, "continuous_usage_stats": True}}),
        ("chat", "/v1/chat/completions",
         {"model": "c", "messages": [{"role": "user", "content": "w11 w12 w13"}], "max_tokens": 3}),
        ("chat stream with usage", "/v1/chat/completions",
         {"messages": [{"role": "system", "content": "w11"}, {"role": "user", "content": "w12 w13"}],
          "max_completion_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}),
        ("chat refused", "/v1/chat/completions", {"messages": []}),
        ("completions scheduler abort, stream", "/v1/completions",
         {"prompt": [3] * 4090, "max_tokens": 1, "stream": True, "stream_options": {"include_usage": True}}),
        ("chat scheduler abort", "/v1/chat/completions",
         {"messages": [{"role": "user", "content": "w3 " * 4090}], "max_tokens": 1}),
        ("set_internal_state", "/set_internal_state", {"server_args": {"pp_max_micro_batch_size": 64}}),
    ]
    answers = {}
    for name, path, body in seq:
        answers[name] = _answer(*_request(f"{url}{path}", body))
    _wait_idle(url)
    for path in ("/v1/loads", "/get_load", "/server_info", "/v1/models", "/model_info"):
        answers[path] = _answer(*_request(f"{url}{path}"))
    metrics = _metrics_lines(_request(f"{url}/metrics")[1].decode())
    # a client that goes away mid-stream: counted as aborted (how far it got follows the clock: only the counters
    # that cannot depend on it are compared)
    _disconnect_mid_stream(port)
    _wait_idle(url)
    after = _request(f"{url}/metrics")[1].decode().splitlines()
    counters = [line for line in after if line.startswith(("sglang:num_aborted", "sglang:num_requests_total",
                                                             "sglang:prompt_tokens_total", "sglang:num_running"))]
    flush = _answer(*_request(f"{url}/flush_cache", {}))
    return {"answers": answers, "metrics": metrics, "after_disconnect": counters, "flush": flush}


def test_answers_and_metrics_match_the_golden_file(sim_server) -> None:
    srv = sim_server(*SERVER_ARGS)
    got = observe(srv.url, srv.port)
    want = json.loads(GOLDEN.read_text())
    assert got["metrics"] == want["metrics"]
    for name in want["answers"]:
        assert got["answers"][name] == want["answers"][name], name
    assert got == want


if __name__ == "__main__":
    # `python tests/test_sim_golden.py --write`: start a sim-server and rewrite the golden file
    import signal
    import subprocess
    import tempfile

    from conftest import free_port, tracebench_cmd, wait_healthy

    if sys.argv[1:] != ["--write"]:
        raise SystemExit("usage: python tests/test_sim_golden.py --write")
    port = free_port()
    log = Path(tempfile.mkdtemp()) / "sim.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(tracebench_cmd("sim-server", "--port", str(port), *SERVER_ARGS), stdout=fh,
                                stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log)
        doc = observe(f"http://127.0.0.1:{port}", port)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()
    GOLDEN.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {GOLDEN}")

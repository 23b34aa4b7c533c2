"""`tracebench record` end to end: a sim-server, the recording proxy and the replay, all real processes.

Round trip: trace A (with prefix blocks) is replayed through the proxy into a sim-server, which records trace B; B
must have A's requests, lengths, arrivals and prefix structure, and B must replay through a proxy that records it
again. Then the bad inputs: an upstream that is down, a client that disconnects, a malformed body.

Two sim-servers serve the module (a slow one, --speed 0.25, and a fast one, --speed 50; each start costs ~1 s): the
tests look at what the proxy forwards and records, which no earlier test's requests change, and every replay
empties the server's prefix cache before it starts (--flush-cache, the default). A test that kills its server
starts its own."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import free_port, run_cli, sim_servers, tracebench_cmd
from tracebench.record.blocks import load_tokenizer, prefix_blocks
from tracebench.trace.format import format_request_line, load_trace, write_trace

WORDLEVEL = Path("wordlevel")  # the built-in word-level tokenizer (tracebench/wordlevel.py): `--tokenizer wordlevel`
BLOCK = 16
SERVED_METRICS = ("total", "server_client", "server_sglang", "ttft", "ttft_dispatch", "tpot")


class Recording:
    """A `tracebench record` process in front of `upstream`, writing `output`."""

    def __init__(self, tmp_path: Path, upstream: str, output: Path, *args: str, wait: bool = True) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output = output
        self.log = tmp_path / f"record-{self.port}.log"
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen(
                tracebench_cmd("record", "--listen", f"127.0.0.1:{self.port}", "--upstream", upstream, "-o",
                               str(output), "--block-size", str(BLOCK), *args),
                stdout=fh, stderr=subprocess.STDOUT,
            )
        if wait:
            self.wait_listening()

    def wait_listening(self) -> None:
        deadline = time.monotonic() + 20
        while b"listening on" not in self.log.read_bytes():
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, "the proxy did not start"
            time.sleep(0.05)

    def stop(self) -> str:
        """Ctrl-C, as a user stops a recording; returns its output."""
        self.proc.send_signal(signal.SIGINT)
        assert self.proc.wait(timeout=20) == 0, self.log.read_text()
        return self.log.read_text()

    def statuses(self) -> list[dict[str, Any]]:
        path = self.output.with_name(f"{self.output.stem}.status.jsonl")
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def slow_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """At --speed 0.25 requests last hundreds of ms (an answer of 200 tokens, seconds): the scale the round trip's
    arrival check holds B's clock to, far above what a busy host delays a stamp, and streams still running when a
    test cuts them."""
    with sim_servers(tmp_path_factory.mktemp("slow-sim")) as start:
        yield start("--speed", "0.25").url


@pytest.fixture(scope="module")
def fast_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """At --speed 50: answers at once, for the tests whose timing is not the point."""
    with sim_servers(tmp_path_factory.mktemp("fast-sim")) as start:
        yield start("--speed", "50").url


@pytest.fixture
def recordings(tmp_path: Path):
    started: list[Recording] = []

    def start(upstream: str, output: Path, *args: str, wait: bool = True) -> Recording:
        rec = Recording(tmp_path, upstream, output, *args, wait=wait)
        started.append(rec)
        return rec

    yield start
    for rec in started:
        if rec.proc.poll() is None:
            rec.proc.kill()
            rec.proc.wait()


def trace_a(path: Path, n: int = 48, rate: float = 30.0, seed: int = 3) -> Path:
    """Requests of three families: a shared system prompt (family's leading blocks) of 1-4 blocks, then their own
    blocks; some requests repeat an earlier prompt whole. Lengths cut blocks partway too."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    lines, earlier = [], []
    for i in range(n):
        if earlier and rng.random() < 0.15:
            input_len, blocks = earlier[int(rng.integers(len(earlier)))]
        else:
            input_len = int(rng.integers(20, 400))
            count = -(-input_len // BLOCK)
            family = int(rng.integers(3))
            shared = min(count, int(rng.integers(1, 5)))
            blocks = [1000 * family + k for k in range(shared)] + [10**6 + 100 * i + k for k in range(count - shared)]
        earlier.append((input_len, blocks))
        lines.append(format_request_line(i, float(arrivals[i]), input_len, int(rng.integers(8, 48)),
                                         {"prefix_blocks": blocks}))
    return write_trace(path, {"num_requests": n, "duration_s": float("%.6f" % arrivals[-1]), "block_size": BLOCK}, lines)


def leading_pattern(requests: list) -> list[list[int]]:
    """For every pair of requests, how many leading blocks they share whole: the prefix structure, free of the ids.
    A block is compared as (id, tokens it holds): a request's partial last block shares only the first tokens of
    its id's content (trace format), which the recorder sees as other content than the whole block."""
    keyed = []
    for r in requests:
        sizes = [BLOCK] * (len(r.prefix_blocks) - 1) + [r.input_len - BLOCK * (len(r.prefix_blocks) - 1)]
        keyed.append(list(zip(r.prefix_blocks, sizes)))

    def shared(a: list, b: list) -> int:
        k = 0
        while k < min(len(a), len(b)) and a[k] == b[k]:
            k += 1
        return k

    return [[shared(a, b) for b in keyed] for a in keyed]


def _replay_args(tmp_path: Path, trace: Path, url: str, name: str, api: str, stream: bool) -> list[str]:
    return ["replay", str(trace), "--attach", url, "--api", api, "--stream" if stream else "--no-stream",
            "--out-dir", str(tmp_path / "runs"), "--run-name", name, "--quiet"]


def replay(tmp_path: Path, trace: Path, url: str, name: str, api: str, stream: bool) -> Path:
    proc = run_cli(*_replay_args(tmp_path, trace, url, name, api, stream))
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "runs" / name


def replay_side_by_side(tmp_path: Path, runs: list[tuple[Path, str, str]], api: str, stream: bool) -> list[Path]:
    """Replays (trace, url, name) at the same time, one process each: whatever else loads the machine loads them
    alike, so their latencies can be compared on a busy machine."""
    procs = [subprocess.Popen(tracebench_cmd(*_replay_args(tmp_path, trace, url, name, api, stream)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for trace, url, name in runs]
    for proc in procs:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    return [tmp_path / "runs" / name for _, _, name in runs]


def records(run: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()), key=lambda r: r["id"])


def in_order_of(reqs_a: list, recorded: list) -> list:
    """B's requests in A's order. The proxy numbers requests as they reach it, and two requests sent a
    millisecond apart on two connections may reach it in either order: each A request is matched with the unused B
    request of the same lengths nearest to it in time (after the constant shift between the two clocks)."""
    shift = float(np.median([b.arrival_s - a.arrival_s for a, b in zip(reqs_a, recorded)]))
    unused = list(recorded)
    ordered = []
    for a in reqs_a:
        same = [b for b in unused if (b.input_len, b.output_len) == (a.input_len, a.output_len)]
        assert same, f"no recorded request with A's request {a.id} lengths ({a.input_len}, {a.output_len})"
        best = min(same, key=lambda b: abs(b.arrival_s - shift - a.arrival_s))
        assert abs(best.arrival_s - shift - a.arrival_s) < 0.5, f"A's request {a.id} recorded 0.5 s or more off"
        unused.remove(best)
        ordered.append(best)
    return ordered


def p99_offset_error(reference: np.ndarray, recorded: np.ndarray) -> float:
    """p99 of |recorded - reference| once the constant shift between the two clocks (the median) is taken out."""
    diff = recorded - reference
    return float(np.quantile(np.abs(diff - np.median(diff)), 0.99))


# ---- the round trip -----------------------------------------------------------------------------------------------

# Not timed: whether replaying B gives A's latencies (medians within 10%) is a measurement of a quiet machine, made
# by bench/bench_record_roundtrip.py (beside a CPU-bound process the two runs' TPOT p50 differed by 11% once in three
# suites); here, what does not depend on the host: same requests, lengths, arrivals, prefix structure, B replayable.
@pytest.mark.parametrize(("api", "stream"), [
    ("generate", True), ("generate", False), ("completions", True), ("completions", False), ("chat", True),
    ("chat", False),
])
def test_round_trip(tmp_path: Path, slow_sim: str, fast_sim: str, recordings, api: str, stream: bool) -> None:
    a = trace_a(tmp_path / "a.jsonl")
    _, reqs_a = load_trace(a)
    # A replays into the slow server: its requests last hundreds of ms, the scale the arrival check below holds B's
    # clock to. B's replay is checked for its requests and arrivals only (0.5 s apart at most): the fast server.
    # The two proxies start together (B's waits idle through A's run, which it does not see)
    rec_a, rec_b = (recordings(slow_sim, tmp_path / "b.jsonl", "--tokenizer", str(WORDLEVEL), wait=False),
                    recordings(fast_sim, tmp_path / "c.jsonl", wait=False))
    for rec in (rec_a, rec_b):
        rec.wait_listening()
    run_a = replay(tmp_path, a, rec_a.url, "run-a", api, stream)
    rec_a.stop()
    header_b, recorded = load_trace(tmp_path / "b.jsonl")
    # the replay's three timestamps and first token, whatever the API
    for r in records(run_a):
        assert r["status"] == "ok" and r["t_arrival"] <= r["t_released"] <= r["t_dispatch"] < r["t_finish"]
        assert (r["completion_tokens"], r["prompt_tokens"]) == (r["output_len"], r["input_len"])
        if stream:
            assert r["t_dispatch"] < r["t_first_token"] <= r["t_finish"]
        else:
            assert r["t_first_token"] is None
        assert (r["server_e2e_latency"] is None) == (api != "generate")  # OpenAI answers carry no meta_info

    # same requests, the same lengths exactly
    assert len(recorded) == len(reqs_a), [s for s in rec_a.statuses() if s["status"] != "ok" or not s["in_trace"]]
    assert header_b.block_size == BLOCK and header_b.fields["counts"] == {"ok": len(reqs_a), "error": 0, "cancelled": 0}
    assert all(s["status"] == "ok" and s["in_trace"] for s in rec_a.statuses())
    reqs_b = in_order_of(reqs_a, recorded)
    assert [(r.input_len, r.output_len) for r in reqs_b] == [(r.input_len, r.output_len) for r in reqs_a]
    # arrivals: B's offsets against A's schedule (the replay's dispatch lag included) and against the moments the
    # replay sent each request (the proxy's own error)
    dispatched = np.array([r["t_dispatch"] for r in records(run_a)])
    arrivals_b = np.array([r.arrival_s for r in reqs_b])
    error_vs_sent = p99_offset_error(dispatched, arrivals_b)
    error_vs_a = p99_offset_error(np.array([r.arrival_s for r in reqs_a]), arrivals_b)
    # A wrong clock (B stamping each request as it finished, not as it arrived) is off by whole request latencies,
    # which differ from request to request by hundreds of ms here (--speed 0.25): the error that clock would make is
    # the scale B's must stay ten times below. A fixed bound in ms measured the host instead: a CPU-bound process
    # beside the suite delays the replay's sends and the proxy's stamps by 25 ms and more at times. The 2 ms p99 the
    # issue asks is a figure of a quiet machine, measured by bench/bench_record_roundtrip.py.
    finish_clock = p99_offset_error(dispatched, np.array([r["t_finish"] for r in records(run_a)]))
    message = (f"arrival offsets p99 error {error_vs_a * 1e3:.2f} ms against A, {error_vs_sent * 1e3:.2f} ms "
               f"against the moments the replay sent them; a finish clock would be off by {finish_clock * 1e3:.1f} ms")
    assert error_vs_sent < finish_clock / 10 and error_vs_a < finish_clock / 10, message
    # prefix structure: the same leading-block sharing between every pair of requests
    pattern_a, pattern_b = leading_pattern(reqs_a), leading_pattern(reqs_b)
    assert any(0 < k for i, row in enumerate(pattern_a) for j, k in enumerate(row) if i != j), "A shares prefixes"
    assert pattern_b == pattern_a, "B shares leading blocks between exactly the requests A does"

    # B replays through a proxy: every request ok, and recording that replay gives B's requests again
    run_b = replay(tmp_path, tmp_path / "b.jsonl", rec_b.url, "run-b", api, stream)
    rec_b.stop()
    assert all(r["status"] == "ok" for r in records(run_b))
    in_order_of(recorded, load_trace(tmp_path / "c.jsonl")[1])


# ---- hashing ------------------------------------------------------------------------------------------------------

def test_blocks_are_chained_and_salted() -> None:
    salt = b"s" * 16
    tokens = list(range(1000, 1100))
    blocks = prefix_blocks(tokens, 100, BLOCK, salt)
    assert len(blocks) == 7
    # the same prefix gives the same ids; a change in block 2 changes block 2 and every block after it
    changed = tokens[:40] + [5] + tokens[41:]
    other = prefix_blocks(changed, 100, BLOCK, salt)
    assert other[:2] == blocks[:2] and all(x != y for x, y in zip(other[2:], blocks[2:]))
    # a partial last block: its own id (equal only to the same tokens, same count)
    assert prefix_blocks(tokens[:40], 40, BLOCK, salt)[:2] == blocks[:2]
    assert prefix_blocks(tokens[:40], 40, BLOCK, salt)[2] != blocks[2]
    # another salt: nothing in common
    assert not set(prefix_blocks(tokens, 100, BLOCK, b"t" * 16)) & set(blocks)
    # the server counted more tokens than the proxy saw (a chat template): still ceil(input_len / B) blocks
    assert len(prefix_blocks(tokens, 130, BLOCK, salt)) == 9 and prefix_blocks(tokens, 130, BLOCK, salt)[:6] == blocks[:6]
    assert all(0 <= b < 2**63 for b in blocks)


def test_wordlevel_tokenizer_without_libraries(tmp_path: Path) -> None:
    folder = tmp_path / "wordlevel-files"
    subprocess.run([sys.executable, "-m", "tracebench.wordlevel", str(folder)], check=True, capture_output=True)
    assert sorted(p.name for p in folder.iterdir()) == ["special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    for source in (WORDLEVEL, folder, folder / "tokenizer.json"):  # the built-in name, the written folder and file
        encode, desc = load_tokenizer(source)
        assert encode("w1000  w31999\nw5 nope") == [1000, 31999, 5, 0], source  # unknown -> <unk> (id 0)
        assert "WordLevel" in desc and "32000 words" in desc
    bpe = tmp_path / "tokenizer.json"
    bpe.write_text(json.dumps({"model": {"type": "BPE", "vocab": {}, "merges": []}, "pre_tokenizer": {"type": "ByteLevel"}}))
    with pytest.raises(Exception, match="'tokenizers' package"):
        load_tokenizer(tmp_path)


# ---- bad input ----------------------------------------------------------------------------------------------------

def test_upstream_down_is_refused_at_start(tmp_path: Path) -> None:
    port = free_port()
    proc = run_cli("record", "--listen", f"127.0.0.1:{free_port()}", "--upstream", f"http://127.0.0.1:{port}",
                   "-o", str(tmp_path / "x.jsonl"), timeout=30)
    assert proc.returncode == 2
    assert f"--upstream http://127.0.0.1:{port}: no answer" in proc.stderr and "is the server up?" in proc.stderr
    assert not list(tmp_path.iterdir()), "nothing written"


def _post(url: str, body: bytes) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_disconnect_and_malformed_body(tmp_path: Path, slow_sim: str, recordings) -> None:
    rec = recordings(slow_sim, tmp_path / "b.jsonl")  # slow: the answer of 200 tokens takes seconds
    # a client that goes away mid-stream
    body = json.dumps({"input_ids": list(range(1000, 1100)), "sampling_params": {"max_new_tokens": 200},
                       "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", rec.port))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % len(body) + body)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()
    time.sleep(0.5)
    # the proxy is unaffected: a malformed body is forwarded and sglang's 400 comes back unchanged
    status, answer = _post(f"{rec.url}/v1/completions", b"{not json")
    direct_status, direct = _post(f"{slow_sim}/v1/completions", b"{not json")
    assert status == direct_status == 400 and answer == direct
    status, _ = _post(f"{rec.url}/generate", json.dumps({"input_ids": [1001, 1002], "sampling_params": {
        "max_new_tokens": 2}}).encode())
    assert status == 200
    rec.stop()
    header, reqs = load_trace(tmp_path / "b.jsonl")
    statuses = rec.statuses()
    assert [s["status"] for s in statuses] == ["cancelled", "error", "ok"]
    assert "disconnected" in statuses[0]["error"]
    assert statuses[1]["http_status"] == 400 and "JSON decode error" in statuses[1]["error"]
    assert [(r.input_len, r.output_len) for r in reqs] == [(2, 2)] and reqs[0].id == 2
    assert header.fields["counts"] == {"ok": 1, "error": 1, "cancelled": 1}


def test_ctrl_c_with_a_request_in_flight_writes_a_valid_trace(tmp_path: Path, slow_sim: str, recordings) -> None:
    rec = recordings(slow_sim, tmp_path / "b.jsonl")
    status, _ = _post(f"{rec.url}/generate", json.dumps({"input_ids": [1001] * 40, "sampling_params": {
        "max_new_tokens": 3}}).encode())
    assert status == 200
    body = json.dumps({"input_ids": [1002] * 40, "sampling_params": {"max_new_tokens": 500}, "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", rec.port))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % len(body) + body)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    out = rec.stop()  # Ctrl-C while the stream runs
    sock.close()
    header, reqs = load_trace(tmp_path / "b.jsonl")  # a valid trace v1
    assert [(r.input_len, r.output_len) for r in reqs] == [(40, 3)] and header.num_requests == 1
    assert [s["status"] for s in rec.statuses()] == ["ok", "cancelled"]
    assert rec.statuses()[1]["error"] == "the recording stopped while the request was in flight"
    assert "ok 1, error 0, cancelled 1" in out
    assert not list(tmp_path.glob(".b.jsonl*")), "no part or temporary file left"


def test_openai_stream_without_usage_reaches_the_client_unchanged(tmp_path: Path, fast_sim: str, recordings) -> None:
    """The proxy asks for the usage chunk the client did not ask for, records it, and keeps it from the client."""
    rec = recordings(fast_sim, tmp_path / "b.jsonl", "--tokenizer", str(WORDLEVEL))

    def shape(raw: bytes) -> list[tuple]:
        """The events' key sets, repeats of one shape counted once (how many tokens share a chunk is timing)."""
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        shapes = [(sorted(o), [sorted(c) for c in o["choices"]], o.get("usage")) for o in
                  (json.loads(e[6:]) for e in events[:-1])]
        return [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1]]

    for path, body in (("/v1/completions", {"prompt": "w7 w8 w9 w10", "max_tokens": 3, "stream": True}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "w7 w8 w9 w10"}],
                                                 "max_tokens": 3, "stream": True})):
        status, proxied = _post(f"{rec.url}{path}", json.dumps(body).encode())
        _, direct = _post(f"{fast_sim}{path}", json.dumps(body).encode())
        assert status == 200 and shape(proxied) == shape(direct)
        assert b'"choices":[]' not in proxied
    rec.stop()
    _, reqs = load_trace(tmp_path / "b.jsonl")
    assert [(r.input_len, r.output_len) for r in reqs] == [(4, 3), (4, 3)]
    assert reqs[0].prefix_blocks == reqs[1].prefix_blocks  # the same 4 words: the same block (chat: contents + " ")


def test_text_without_tokenizer_and_batches(tmp_path: Path, fast_sim: str, recordings) -> None:
    rec = recordings(fast_sim, tmp_path / "b.jsonl")
    for body in ({"text": "w5 w6 w7", "sampling_params": {"max_new_tokens": 2}},
                 {"input_ids": [[1001, 1002], [1003]], "sampling_params": {"max_new_tokens": 2}},
                 {"text": "w5 w6 w8", "sampling_params": {"max_new_tokens": 2}},
                 {"input_ids": [1001, 1002], "sampling_params": {"max_new_tokens": 2}}):
        assert _post(f"{rec.url}/generate", json.dumps(body).encode())[0] == 200
    out = rec.stop()
    header, reqs = load_trace(tmp_path / "b.jsonl")
    assert [(r.id, r.input_len, r.output_len, r.prefix_blocks is None) for r in reqs] == \
        [(0, 3, 2, True), (2, 3, 2, True), (3, 2, 2, False)]
    # issue 23 item 3: which tokenizer to give, at the first such request and with the count at the end
    assert out.count("text prompt and no --tokenizer was given") == 1
    assert "2 of the trace's 3 requests lost their prefix structure" in out
    assert out.count("--tokenizer wordlevel in front of a tracebench sim-server") == 2
    assert "tokenizer.json of the served model" in out
    assert header.fields["text_prompts_without_blocks"] == 2
    statuses = rec.statuses()
    assert [row.get("no_blocks") for row in statuses] == ["text prompt and no --tokenizer", None,
                                                           "text prompt and no --tokenizer", None]
    batch = statuses[1]
    assert batch["status"] == "ok" and not batch["in_trace"] and batch["not_in_trace"].startswith("batch request")


# ---- one recording per name, nothing lost however it stops (issue 20 item 7) --------------------------------------

def _open_stream(port: int, input_ids: list[int], max_new_tokens: int) -> socket.socket:
    """A streamed /generate on a raw connection, its response headers read (the answer runs on)."""
    body = json.dumps({"input_ids": input_ids, "sampling_params": {"max_new_tokens": max_new_tokens},
                       "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % len(body) + body)
    assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    return sock


def test_a_second_recorder_to_the_same_name_is_refused(tmp_path: Path, fast_sim: str, recordings) -> None:
    first = recordings(fast_sim, tmp_path / "b.jsonl")
    second = run_cli("record", "--listen", f"127.0.0.1:{free_port()}", "--upstream", fast_sim, "-o",
                     str(tmp_path / "b.jsonl"), timeout=30)
    assert second.returncode == 2, second.stderr
    assert second.stderr.count("\n") == 1 and f"another tracebench record (pid {first.proc.pid})" in second.stderr
    assert str(tmp_path / ".b.jsonl.part") in second.stderr
    # the first recording is untouched: its requests end up in its trace
    assert _post(f"{first.url}/generate", json.dumps({"input_ids": [1001] * 8, "sampling_params": {
        "max_new_tokens": 2}}).encode())[0] == 200
    first.stop()
    _, reqs = load_trace(tmp_path / "b.jsonl")
    assert [(r.input_len, r.output_len) for r in reqs] == [(8, 2)]


def test_a_killed_recording_is_kept_refused_and_recovered(tmp_path: Path, slow_sim: str, recordings) -> None:
    rec = recordings(slow_sim, tmp_path / "b.jsonl")
    assert _post(f"{rec.url}/generate", json.dumps({"input_ids": [1001] * 40, "sampling_params": {
        "max_new_tokens": 2}}).encode())[0] == 200
    sock = _open_stream(rec.port, [1002] * 40, 500)  # in flight when the recorder dies
    rec.proc.kill()
    rec.proc.wait()
    sock.close()
    part = tmp_path / ".b.jsonl.part"
    kept = part.read_bytes()
    again = run_cli("record", "--listen", f"127.0.0.1:{free_port()}", "--upstream", slow_sim, "-o",
                    str(tmp_path / "b.jsonl"), timeout=30)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert str(part) in again.stderr and f"tracebench record --recover -o {tmp_path / 'b.jsonl'}" in again.stderr
    assert part.read_bytes() == kept, "the part file of the killed recording is left as it was"
    assert not (tmp_path / "b.jsonl").exists()

    done = run_cli("record", "--recover", "-o", str(tmp_path / "b.jsonl"), timeout=30)
    assert done.returncode == 0, done.stderr
    assert "ok 1, error 0, cancelled 1, of which 1 in flight" in done.stderr
    header, reqs = load_trace(tmp_path / "b.jsonl")
    assert [(r.input_len, r.output_len) for r in reqs] == [(40, 2)]
    assert header.fields["counts"] == {"ok": 1, "error": 0, "cancelled": 1} and "recovered" in header.fields
    statuses = rec.statuses()
    assert [s["status"] for s in statuses] == ["ok", "cancelled"]
    assert statuses[1]["error"].startswith("the recorder stopped without finishing")
    assert not part.exists()


def test_an_existing_status_file_is_never_overwritten(tmp_path: Path, fast_sim: str) -> None:
    status = tmp_path / "b.status.jsonl"
    status.write_text("mine\n")
    done = run_cli("record", "--listen", f"127.0.0.1:{free_port()}", "--upstream", fast_sim, "-o",
                   str(tmp_path / "b.jsonl"), timeout=30)
    assert done.returncode == 2 and f"{status} exists already" in done.stderr, done.stderr
    assert status.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["b.status.jsonl"]


def test_an_upstream_that_breaks_off_breaks_the_client_off(tmp_path: Path, sim_server, recordings) -> None:
    """Without the proxy the client sees a chunked answer without its end (curl: exit 18); through it, the same."""
    sim = sim_server("--speed", "0.2")
    rec = recordings(sim.url, tmp_path / "b.jsonl")
    sock = _open_stream(rec.port, [1002] * 40, 500)
    sock.settimeout(20)
    time.sleep(0.5)
    sim.proc.kill()
    received = b""
    while not received.endswith(b"0\r\n\r\n") and (piece := sock.recv(65536)):  # a clean end, or the connection's
        received += piece
    sock.close()
    assert not received.endswith(b"0\r\n\r\n"), "the client must not see a clean end of the answer"
    rec.stop()
    [status] = rec.statuses()
    assert status["status"] == "error" and "broke off the stream" in status["error"], status


def test_a_trace_that_cannot_be_written_at_the_end_keeps_every_request(tmp_path: Path, fast_sim: str,
                                                                         recordings) -> None:
    """A file put at the trace's name during the recording is not overwritten, and the requests are not lost."""
    rec = recordings(fast_sim, tmp_path / "b.jsonl")
    assert _post(f"{rec.url}/generate", json.dumps({"input_ids": [1001] * 8, "sampling_params": {
        "max_new_tokens": 2}}).encode())[0] == 200
    (tmp_path / "b.jsonl").write_text("someone else's\n")
    rec.proc.send_signal(signal.SIGINT)
    assert rec.proc.wait(timeout=20) == 2
    out = rec.log.read_text()
    assert f"tracebench: error: {tmp_path / 'b.jsonl'}: exists already" in out
    assert f"every request of the recording is kept in {tmp_path / '.b.jsonl.part'}" in out
    assert (tmp_path / "b.jsonl").read_text() == "someone else's\n" and not (tmp_path / "b.status.jsonl").exists()
    (tmp_path / "b.jsonl").unlink()
    done = run_cli("record", "--recover", "-o", str(tmp_path / "b.jsonl"), timeout=30)
    assert done.returncode == 0, done.stderr
    _, reqs = load_trace(tmp_path / "b.jsonl")
    assert [(r.input_len, r.output_len) for r in reqs] == [(8, 2)]

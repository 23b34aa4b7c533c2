"""Issue 19, items 1 and 4: the replay records what the server really did, and the client can bound its concurrency.

- Every finished answer is checked against the trace (completion_tokens vs output_len, prompt_tokens vs input_len) for
  every API: a request past sglang's context rule (input + output > context - 2) finishes short, and is recorded as
  `mismatch` with the rule named, never `ok`; the report counts them and warns.
- `tracebench generate`, every importer and the sim-server follow the rule (sglang 0.5.17 scheduler.py L2132-2141).
- `replay --max-concurrency N`: at most N requests in flight across the run, every mode, the wait recorded.
Servers are real sim-server processes (nothing mocked) where the answers come over HTTP (each API); the report's
counts and the client's gate, which are no matter of HTTP, run on the virtual clock (the same router and simulated
sglang in the replay's process); the gate behind sglang-router keeps real time."""

from __future__ import annotations

import csv
import io
import json
import lzma
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import TEST_DATA, run_cli, run_cli_in_process, sim_servers
from test_external_router import needs_router
from test_replay_run import port_base, read_run, write_trace_file
from tracebench.replay.answer_check import ContextLimits, check_answer, mismatch_reason
from tracebench.replay.records import RequestRecord
from tracebench.sim.model import sglang_max_new_tokens
from tracebench.trace.format import format_request_line, iter_requests, read_header, write_trace
from tracebench.trace.lengths import clamp_to_context

MOONCAKE = TEST_DATA / "mooncake_synthetic_trace_last1000.jsonl.xz"
# (input_len, output_len): the first two are past the rule (4094 for a 4096 context) and come back short
CLIPPED = {(4089, 7): 5, (4000, 96): 94}
FULL = [(4089, 5), (4000, 94), (300, 12)]
H100 = ContextLimits(max_req_len=4095, max_total_num_tokens=107675, page_size=1, dcp_size=1)  # /server_info of 0.5.17


def write_pairs(path: Path, pairs: list[tuple[int, int]], gap: float = 0.02) -> Path:
    lines = [format_request_line(i, i * gap, n, o) for i, (n, o) in enumerate(pairs)]
    return write_trace(path, {"num_requests": len(lines), "duration_s": (len(lines) - 1) * gap}, lines)


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def overlap(records: list[dict[str, Any]], start: str, end: str = "t_finish") -> int:
    """The most records whose [start, end] intervals overlap at one moment."""
    events = sorted([(r[start], 1) for r in records] + [(r[end], -1) for r in records], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


# ---- item 1: answers checked against the trace ------------------------------------------------------------------

@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One sim-server (--speed 10) for the module's answers: what it answers depends on each request alone, and a
    replay empties its prefix cache before it starts (--flush-cache)."""
    with sim_servers(tmp_path_factory.mktemp("truth-sim")) as start:
        yield start("--speed", "10").url


@pytest.mark.parametrize("api, stream", [("generate", True), ("completions", False), ("chat", True)])
def test_answers_past_the_context_rule_are_mismatch_records(tmp_path: Path, sim: str, api: str, stream: bool) -> None:
    trace = write_pairs(tmp_path / "t.jsonl", [*CLIPPED, *FULL])
    result = run_cli("replay", str(trace), "--attach", sim, "--api", api,
                     "--stream" if stream else "--no-stream", "--run-name", "r", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "r")
    assert Counter(r["status"] for r in records) == {"mismatch": 2, "ok": 3}
    for r in records:
        pair = (r["input_len"], r["output_len"])
        assert r["prompt_tokens"] == r["input_len"]  # chat too: the word-level template is exact
        if pair in CLIPPED:
            assert r["status"] == "mismatch" and r["completion_tokens"] == CLIPPED[pair] and r["error"] is None
            assert r["mismatch"] == (
                f"completion_tokens {CLIPPED[pair]} != output_len {r['output_len']}: sglang clips max_new_tokens to "
                "context_len - 1 - input_len - 1 (context_len 4096: the whole output only when input_len + "
                "output_len <= 4094, sglang 0.5.17 scheduler.py L2132-2141)")
        else:
            assert r["status"] == "ok" and r["completion_tokens"] == r["output_len"] and r["mismatch"] is None
        assert r["t_finish"] >= r["t_dispatch"] and (r["t_first_token"] is not None) == stream
    # the new fields come last in the record (older runs lack them: the report reads them as null)
    keys = list(records[0])  # (the breakdown's stamps, added later still, follow them: tests/test_overhead.py)
    assert keys[keys.index("itl_hist") + 1:keys.index("sim_lag") + 1] == ["mismatch", "t_admitted", "policy_s", "sim_lag"]
    assert run["counts"] == {"ok": 3, "mismatch": 2, "error": 0, "timeout": 0, "cancelled": 0, "not_sent": 0}
    assert "(ok 3, mismatch 2, error 0, timeout 0, cancelled 0, not_sent 0)" in result.stderr
    assert "  mismatch 2: completion_tokens != output_len: sglang clips max_new_tokens to context_len - 1" in result.stderr


def test_report_counts_mismatches_and_the_client_gate(tmp_path: Path) -> None:
    trace = write_pairs(tmp_path / "t.jsonl", [*CLIPPED, *FULL])
    for name, extra in (("plain", []), ("gated", ["--max-concurrency", "2"])):
        result = run_cli("replay", str(trace), "--clock", "virtual", *extra, "--run-name", name, "--out-dir",
                         str(tmp_path), "--quiet")
        assert result.returncode == 0, result.stderr
    runs = [str(tmp_path / "plain"), str(tmp_path / "gated")]
    reason = ("completion_tokens != output_len: sglang clips max_new_tokens to context_len - 1 - input_len - 1 "
              "(context_len 4096: the whole output only when input_len + output_len <= 4094, sglang 0.5.17 "
              "scheduler.py L2132-2141)")
    done = run_cli("report", *runs, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for entry in report["runs"]:
        assert entry["requests"]["mismatch"] == 2 and entry["requests"]["ok"] == 3
        assert entry["mismatch_reasons"] == {reason: 2}
        assert entry["latency"]["total"]["p50"] is not None  # over ok + mismatch: five requests
    assert [entry["max_concurrency"] for entry in report["runs"]] == [None, 2]
    assert report["config"]["changed"]["max concurrency"] == {"plain": "-", "gated": "2"}  # "What changed"
    gated = report["runs"][1]["latency"]
    assert gated["client_wait"]["max"] > 0 and report["runs"][0]["latency"]["client_wait"]["max"] == 0
    warning = next(w for w in report["warnings"] if "run 'plain'" in w and "mismatch" in w)
    assert warning.startswith(f"run 'plain': 2 of 5 requests are mismatch, finished but not as the trace asked (2 x {reason})")
    assert "TPOT, total latency and output throughput" in warning
    tidy = list(csv.reader(io.StringIO(run_cli("report", *runs, "--format", "csv").stdout)))
    assert ["plain", "requests.mismatch", "count", "2", "requests"] in tidy
    assert ["plain", "mismatch_reason", reason, "2", "requests"] in tidy
    md = run_cli("report", *runs, "--format", "md").stdout
    assert "| mismatch |" in md and "2 of 5 requests are mismatch" in md and "max concurrency" in md
    assert "client wait" in md and "latencies over completed requests (ok + mismatch)" in md
    page = tmp_path / "r.html"
    assert run_cli("report", *runs, "--format", "html", "-o", str(page)).returncode == 0
    assert "2 of 5 requests are mismatch" in page.read_text()
    # packed, the new columns travel; a run recorded before them (no mismatch, t_admitted, max_concurrency) still reads
    assert run_cli("pack", runs[1]).returncode == 0
    old = tmp_path / "old"
    old.mkdir()
    meta = json.loads((tmp_path / "plain" / "run.json").read_text())
    del meta["max_concurrency"], meta["max_concurrency_peak"], meta["options"]["max_concurrency"]
    meta["counts"] = {"ok": 5, "error": 0, "timeout": 0, "cancelled": 0}
    (old / "run.json").write_text(json.dumps(meta))
    lines = []
    for line in (tmp_path / "plain" / "requests.jsonl").read_text().splitlines():
        record = json.loads(line)
        del record["mismatch"], record["t_admitted"]
        record["status"] = "ok"  # what tracebench recorded before it checked answers
        lines.append(json.dumps(record) + "\n")
    (old / "requests.jsonl").write_text("".join(lines))
    done = run_cli("report", str(old), runs[1], "--allow-different-traces", "--format", "json")
    assert done.returncode == 0, done.stderr
    before = json.loads(done.stdout)["runs"][0]
    assert before["requests"]["ok"] == 5 and before["requests"]["mismatch"] == 0 and before["max_concurrency"] is None
    records = [json.loads(line) for line in lines]
    # no t_admitted: the router wait is from the arrival, as it was defined then
    assert before["latency"]["router_wait"]["max"] == pytest.approx(max(r["t_dispatch"] - r["t_arrival"] for r in records))
    assert before["latency"]["client_wait"]["max"] is None  # nothing recorded, nothing made up


def test_mismatch_reasons_named_or_unknown() -> None:
    def rec(n: int, o: int, got: int, prompt: int | None = None) -> RequestRecord:
        r = RequestRecord(0, n, o, 0.0)
        r.completion_tokens, r.prompt_tokens = got, n if prompt is None else prompt
        return r

    assert check_answer(rec(4089, 5, 5), H100, "generate") is None
    assert "context_len - 1 - input_len - 1 (context_len 4096" in check_answer(rec(4089, 7, 5), H100, "generate")
    # a count the rule does not give: said, without a made-up cause
    assert check_answer(rec(100, 50, 40), H100, "completions") == (
        "completion_tokens 40 != output_len 50: reason unknown (sglang's context rule leaves this request its whole output)")
    # a KV pool smaller than the context clips by the pool
    small = ContextLimits(max_req_len=4095, max_total_num_tokens=3000, page_size=1, dcp_size=1)
    assert "to its KV pool" in check_answer(rec(2000, 999, 998), small, "generate")
    # chat with a tokenizer other than the word-level one: the prompt length differs, named
    text = check_answer(rec(1000, 10, 10, prompt=1203), H100, "chat")
    assert text.startswith("prompt_tokens 1203 != input_len 1000: --api chat sends the ids as words w<id>")
    assert check_answer(rec(1000, 10, 10, prompt=1001), H100, "generate").endswith("reason unknown (the trace's ids were sent as they are)")
    both = check_answer(rec(4089, 7, 5, prompt=1), H100, "generate")
    assert mismatch_reason(both).startswith("completion_tokens != output_len: sglang clips")
    assert "; prompt_tokens != input_len: reason unknown" in mismatch_reason(both)


# ---- item 1: the rule in the simulator and in every trace source ------------------------------------------------

def test_sim_server_clips_like_sglang(sim: str) -> None:
    # the formula (scheduler.py L2132-2141): context term, then a KV pool smaller than the context
    assert [sglang_max_new_tokens(m, 4089, 4096, 231818) for m in range(1, 8)] == [1, 2, 3, 4, 5, 5, 5]
    assert [sglang_max_new_tokens(m, 4000, 4096, 231818) for m in range(93, 97)] == [93, 94, 94, 94]
    assert sglang_max_new_tokens(999, 2000, 4096, 3000) == 998
    ids = np.random.default_rng(0).integers(1000, 32000, 4089).tolist()
    for asked, got in ((5, 5), (6, 5), (7, 5)):
        status, obj = post(f"{sim}/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": asked}})
        assert status == 200 and obj["meta_info"]["completion_tokens"] == got == len(obj["output_ids"])
        assert obj["meta_info"]["finish_reason"] == {"type": "length", "length": got}
    # the 400 checks are as they were: over the context is refused, not clipped
    status, obj = post(f"{sim}/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 8}})
    assert status == 400 and "Requested token count exceeds" in obj["error"]["message"]


def test_clamp_follows_the_rule() -> None:
    clamped = clamp_to_context(np.array([4089, 4000, 4093, 100, 4000]), np.array([7, 96, 10, 5, 94]), 4096)
    assert clamped.input_len.tolist() == [4089, 4000, 4089, 100, 4000]
    assert clamped.output_len.tolist() == [5, 94, 5, 5, 94]
    assert (clamped.clamped, clamped.input_cut) == (3, 1)


def test_generate_and_importers_clamp_to_context_minus_two(tmp_path: Path) -> None:
    # synthetic lengths
    proc = run_cli("generate", "--rate", "10", "--num-requests", "300", "--input-len", "3950", "--output-len", "140",
                   "--length-dist", "uniform", "--length-spread", "0.02", "-o", str(tmp_path / "g.jsonl"))
    assert proc.returncode == 0, proc.stderr
    requests = list(iter_requests(tmp_path / "g.jsonl"))
    clamped = read_header(tmp_path / "g.jsonl").fields["clamped_requests"]
    assert clamped > 0 and max(r.input_len + r.output_len for r in requests) == 4094
    assert (f"{clamped} of 300 requests clamped to input_len + output_len <= 4094: sglang generates the whole answer "
            "only up to its context length - 2") in proc.stderr
    # the Mooncake importer (prompts up to ~16k tokens in this slice)
    proc = run_cli("generate", "--dataset", str(MOONCAKE), "--keep-timestamps", "-o", str(tmp_path / "m.jsonl"))
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in lzma.decompress(MOONCAKE.read_bytes()).decode().splitlines()]
    over = sum(1 for r in rows if r["input_length"] + r["output_length"] > 4094 or r["input_length"] > 4089)
    mooncake = list(iter_requests(tmp_path / "m.jsonl"))
    assert read_header(tmp_path / "m.jsonl").fields["clamped_requests"] == over > 0
    assert max(r.input_len + r.output_len for r in mooncake) <= 4094 and max(r.input_len for r in mooncake) == 4089
    # a workload: a system prompt that almost fills the context
    proc = run_cli("generate", "--workload", "shared-prompt", "--groups", "2", "--prefix-len", "3968", "--input-len",
                   "60", "--output-len", "60", "--num-requests", "50", "-o", str(tmp_path / "w.jsonl"))
    assert proc.returncode == 0, proc.stderr
    workload = list(iter_requests(tmp_path / "w.jsonl"))
    assert max(r.input_len + r.output_len for r in workload) == 4094
    assert "requests clamped to input_len + output_len <= 4094" in proc.stderr


def test_inspect_counts_requests_past_the_rule(tmp_path: Path) -> None:
    trace = write_pairs(tmp_path / "t.jsonl", [*CLIPPED, *FULL, (4093, 2)])
    proc = run_cli("inspect", str(trace))
    assert proc.returncode == 0, proc.stderr
    assert ("context fit       3 requests over input_len + output_len <= 4094 (context 4096, llama-2's; --max-context C "
            "for another model): sglang answers them short (max_new_tokens clipped to context - 1 - input_len - 1); "
            "1 prompts over 4089 tokens (refused)") in proc.stdout
    proc = run_cli("inspect", str(trace), "--json", "--max-context", "8192")
    assert json.loads(proc.stdout)["context"] == {"max_context": 8192, "source": "--max-context", "over": 0,
                                                  "prompt_over": 0}


# ---- item 4: --max-concurrency ------------------------------------------------------------------------------------

QUEUE_POLICY = '''
from tracebench.policies import Policy


class Fifo(Policy):
    """Oldest first to any free server; writes the longest router queue it was shown (the gate stands before it)."""

    name = "fifo_probe"
    description = "fifo, records the queue length it saw"

    def assign(self, queue, servers):
        path = "{path}"
        seen = int(open(path).read() or 0)
        open(path, "w").write(str(max(seen, len(queue))))
        free = {{s.index: s.free_slots for s in servers}}
        picks = []
        for request in queue:
            open_servers = [s for s in servers if free[s.index] > 0]
            if not open_servers:
                break
            server = min(open_servers, key=lambda s: s.index)
            free[server.index] -= 1
            picks.append((request, server))
        return picks
'''


def check_bounded(records: list[dict[str, Any]], run: dict[str, Any], limit: int, n: int) -> None:
    assert Counter(r["status"] for r in records) == {"ok": n}
    assert overlap(records, "t_dispatch") == limit  # in flight at the servers: reaches the bound, never passes it
    assert overlap(records, "t_admitted") == limit  # admitted (router queue included)
    waits = [r["t_admitted"] - r["t_released"] for r in records]
    assert min(waits) >= 0 and max(waits) > 0.05  # arrivals beyond the bound waited at the client
    assert all(r["t_released"] <= r["t_admitted"] <= r["t_dispatch"] for r in records)
    assert run["max_concurrency"] == limit == run["max_concurrency_peak"] and run["options"]["max_concurrency"] == limit


def test_max_concurrency_bounds_continuous_and_static_runs(tmp_path: Path) -> None:
    servers = ["--clock", "virtual", "--gpus", "2"]
    n = 120
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=400, outputs=(20, 40))  # a burst: far more than 4 at once
    seen = tmp_path / "queue_seen.txt"
    seen.write_text("0")
    policy = tmp_path / "fifo_probe.py"
    policy.write_text(QUEUE_POLICY.format(path=seen))
    result = run_cli("replay", str(trace), *servers, "--max-concurrency", "4", "--policy", f"{policy}:Fifo",
                     "--run-name", "cont", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "cont")
    check_bounded(records, run, 4, n)
    assert 1 <= int(seen.read_text()) <= 4  # the policy never saw a request the gate held
    # static batches larger than the bound still go (a batch that cannot grow is sent), never more than 3 at once
    result = run_cli("replay", str(trace), *servers, "--mode", "static", "--batch-size", "8", "--max-concurrency", "3",
                     "--run-name", "static", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "static")
    check_bounded(records, run, 3, n)
    batches = Counter((r["server"], r["batch"]) for r in records)
    assert max(batches.values()) <= 3
    # refused where it means nothing; before anything starts (no server, no event loop), so answered in this process
    # as the process answers it
    bad = run_cli_in_process("replay", str(trace), *servers, "--max-concurrency", "0", "--out-dir", str(tmp_path))
    assert bad.returncode == 2 and "--max-concurrency must be >= 1, got 0" in bad.stderr


def test_max_concurrency_with_closed_loop(tmp_path: Path) -> None:
    trace = tmp_path / "multi.jsonl"
    proc = run_cli("generate", "--workload", "multi-turn", "--sessions", "12", "--turns", "3", "--rate", "50",
                   "--think-time", "0.05", "--input-len", "64", "--output-len", "128", "--closed-loop", "-o", str(trace))
    assert proc.returncode == 0, proc.stderr
    n = read_header(trace).fields["num_requests"]
    result = run_cli("replay", str(trace), "--clock", "virtual", "--max-concurrency", "2", "--run-name", "loop",
                     "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "loop")
    check_bounded(records, run, 2, n)


@needs_router
def test_max_concurrency_behind_sglang_router(tmp_path: Path) -> None:
    n = 60
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=400, outputs=(20, 40))
    result = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "10", "--port-base",
                     port_base(), "--router", "sglang-router", "--router-policy", "round_robin", "--max-concurrency",
                     "3", "--run-name", "via", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "via")
    check_bounded(records, run, 3, n)
    # the servers saw at most 3 at once as well: sglang's own stamps
    assert overlap(records, "server_received", "server_finished") <= 3

"""--clock virtual (issue 32): the simulated cluster inside the replay's process, on a simulated clock, through the same
router, policies and records as a real-time run. Each test runs real `tracebench replay` processes."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from conftest import run_cli

from tracebench.profiles import load_profile
from tracebench.sim.model import BatchModel, Limits, SimRequest

REPO = Path(__file__).resolve().parents[1]


def _records(run: Path) -> list[dict]:
    return [orjson.loads(line) for line in (run / "requests.jsonl").read_bytes().splitlines()]


def _generate(path: Path, *args: str) -> Path:
    done = run_cli("generate", *args, "-o", str(path))
    assert done.returncode == 0, done.stderr
    return path


def _replay(trace: Path, out: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("replay", str(trace), "--clock", "virtual", "--run-name", name, "--out-dir", str(out), "--quiet",
                   *args)


def test_virtual_run_is_deterministic_and_deaf_to_host_load(tmp_path: Path) -> None:
    """The same trace, options and seed give a byte-identical requests.jsonl, also beside two CPU-bound processes,
    for a plain run and a PD one; every record is whole, and the modelled hops are what run.json states."""
    trace = _generate(tmp_path / "t.jsonl", "--workload", "shared-prompt", "--groups", "4", "--prefix-len", "512",
                      "--rate", "30", "--num-requests", "300", "--seed", "3")
    args = ("--gpus", "2", "--policy", "cache_aware", "--max-running-requests", "6")
    pd_trace = _generate(tmp_path / "pd.jsonl", "--workload", "shared-prompt", "--groups", "3", "--prefix-len", "256",
                         "--rate", "8", "--num-requests", "60", "--seed", "5")
    pd_args = ("--pd", "1:2", "--policy", "cache_aware", "--kv-link", "rdma-200g")
    done = _replay(trace, tmp_path, "quiet", *args)
    assert done.returncode == 0, done.stderr
    done = _replay(pd_trace, tmp_path, "pd-quiet", *pd_args)
    assert done.returncode == 0, done.stderr
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        done = _replay(trace, tmp_path, "busy", *args)
        pd_done = _replay(pd_trace, tmp_path, "pd-busy", *pd_args)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0 and pd_done.returncode == 0, done.stderr + pd_done.stderr
    assert "simulated s" in done.stderr and "x real time" in done.stderr
    quiet = (tmp_path / "quiet" / "requests.jsonl").read_bytes()
    assert quiet == (tmp_path / "busy" / "requests.jsonl").read_bytes()
    assert (tmp_path / "pd-quiet" / "requests.jsonl").read_bytes() == (tmp_path / "pd-busy" / "requests.jsonl").read_bytes()
    _check_pd_run(tmp_path / "pd-quiet")
    meta = json.loads((tmp_path / "quiet" / "run.json").read_text())
    assert meta["clock"] == "virtual" and meta["backend"] == "sim" and meta["status"] == "completed"
    hops = meta["virtual_clock"]
    assert hops["request_hop_s"] > 0 and hops["response_hop_s"] > 0
    assert all(s["in_process"] for s in meta["servers"]) and meta["control_url"] is None
    records = _records(tmp_path / "quiet")
    assert len(records) == 300 and {r["status"] for r in records} == {"ok"}
    assert sum(r["cached_tokens"] for r in records) > 0  # the shared prompts hit the in-process radix caches
    for r in records:
        assert r["t_arrival"] <= r["t_dispatch"] < r["server_received"] < r["t_first_token"] <= r["t_finish"]
        # the request hop, or later where the server was still taking in the one before (intake_gap_s)
        assert r["server_received"] - r["t_dispatch"] >= hops["request_hop_s"] - 1e-9
        assert r["t_finish"] - r["server_finished"] == pytest.approx(hops["response_hop_s"], abs=1e-9)
        assert r["policy_s"] == 0.0 and r["sim_lag"] == 0.0  # no host time on the run's clock
        assert r["itl_hist"] is not None or r["output_len"] == 1
    for server in (0, 1):
        mine = sorted((r["server_received"], r["t_dispatch"]) for r in records if r["server"] == server)
        for (before, _), (received, dispatched) in zip(mine, mine[1:]):
            assert received == pytest.approx(max(dispatched + hops["request_hop_s"],
                                                 before + hops["intake_gap_s"]), abs=1e-9)
    # the cap: never more than 6 in flight at a server (the poller's view, every 0.5 s)
    telemetry = [orjson.loads(line) for line in (tmp_path / "quiet" / "telemetry.jsonl").read_bytes().splitlines()]
    assert telemetry and max(line["in_flight"] for line in telemetry) <= 6


def _check_pd_run(run: Path) -> None:
    """A virtual PD run: its pools, link and the servers' PD counters in run.json; each record's prefill side, on the
    run's clock, in the order the real-time simulator's are (tests/test_pd.py), with the modelled hops."""
    meta = json.loads((run / "run.json").read_text())
    assert meta["clock"] == "virtual" and meta["status"] == "completed"
    assert [s["role"] for s in meta["servers"]] == ["prefill", "decode", "decode"]
    assert meta["pd"]["pools"] == {"prefill": [0], "decode": [1, 2]} and meta["pd"]["kv_link"]["name"] == "rdma-200g"
    deltas = [m["delta"] for m in meta["pd"]["server_metrics"]]
    assert deltas[0]["kv_transfer_latency_ms_count"] == 60 and deltas[0]["cached_tokens_total"] > 0
    assert deltas[1]["num_requests_total"] + deltas[2]["num_requests_total"] == 60
    hops = meta["virtual_clock"]
    records = _records(run)
    assert len(records) == 60 and {r["status"] for r in records} == {"ok"}
    assert {r["prefill_server"] for r in records} == {0} and {r["server"] for r in records} == {1, 2}
    assert len({r["bootstrap_room"] for r in records}) == 60
    assert sum(r["cached_tokens"] for r in records) > 0   # the prefill server's radix cache, reported by the decode
    for r in records:
        # both sent at once: each received a request hop later, or later where its server was still taking in the
        # request before (intake_gap_s)
        assert r["prefill_received"] - r["t_dispatch"] >= hops["request_hop_s"] - 1e-9
        assert r["server_received"] - r["t_dispatch"] >= hops["request_hop_s"] - 1e-9
        assert r["t_prefill_answer"] - r["prefill_finished"] == pytest.approx(hops["response_hop_s"], abs=1e-9)
        kv_arrival = r["server_forward_entry"] - r["server_queue_time"]
        assert r["prefill_done"] <= kv_arrival <= r["t_first_token"]   # the KV came before the first token
        order = ["t_arrival", "t_released", "t_admitted", "t_assigned", "t_built", "t_dispatch", "t_written",
                 "t_headers", "t_first_token", "t_last_chunk", "t_finish", "t_parsed"]
        stamps = [r[name] for name in order]
        assert None not in stamps and stamps == sorted(stamps), dict(zip(order, stamps))
        assert r["t_finish"] == max(r["t_last_chunk"], r["t_prefill_answer"]) and r["server_prefill_finished"] is None


def test_virtual_pd_aborts_and_timeouts(tmp_path: Path) -> None:
    """A decode server short of KV room on the virtual clock: prefill requests whose KV destination does not come in
    sglang's bootstrap timeout are aborted (500, the pair ends with the prefill's error), --timeout ends pairs that
    are not whole in time; every request is recorded once and the servers' counters say the same."""
    trace = _generate(tmp_path / "t.jsonl", "--rate", "30", "--num-requests", "80", "--input-len", "2000",
                      "--output-len", "400", "--seed", "3")
    done = run_cli("replay", str(trace), "--clock", "virtual", "--pd", "1:1", "--server-arg",
                   "--max-total-tokens 20000", "--kv-link", "nvlink", "--timeout", "4", "--run-name", "ab",
                   "--out-dir", str(tmp_path), "--quiet", env={"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "2"})
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "ab")
    assert sorted(r["id"] for r in records) == list(range(80))
    aborted = [r for r in records if r["status"] == "error"]
    late = [r for r in records if r["status"] == "timeout"]
    ok = [r for r in records if r["status"] == "ok"]
    assert aborted and late and ok and len(aborted) + len(late) + len(ok) == 80
    assert all(r["error"].startswith("prefill server: aborted by the server: Prefill bootstrap failed") and
               r["t_prefill_answer"] == r["t_finish"] for r in aborted)
    assert all(r["error"] == "decode server: no complete answer within --timeout 4 s" and
               r["t_finish"] - r["t_dispatch"] == pytest.approx(4.0) for r in late)
    meta = json.loads((tmp_path / "ab" / "run.json").read_text())
    prefill, decode = (m["delta"] for m in meta["pd"]["server_metrics"])
    assert prefill["num_bootstrap_failed_reqs_total"] == len(aborted)
    assert decode["num_requests_total"] == len(ok) and decode["num_aborted_requests_total"] == len(aborted) + len(late)


def test_a_saturation_stop_writes_the_same_records_every_time(tmp_path: Path) -> None:
    """The saturation stop cancels ~1,000 requests in flight: their records come out in the same order in every run
    (the router once cancelled them in a set's order, which followed the tasks' addresses)."""
    trace = _generate(tmp_path / "t.jsonl", "--rate", "100", "--num-requests", "1200", "--seed", "1")
    runs = []
    for name in ("one", "two"):
        done = _replay(trace, tmp_path, name, "--gpus", "1", "--saturation-window", "5")
        assert done.returncode == 0, done.stderr
        runs.append((tmp_path / name / "requests.jsonl").read_bytes())
    assert runs[0] == runs[1]
    statuses = [orjson.loads(line)["status"] for line in runs[0].splitlines()]
    assert statuses.count("cancelled") > 500 and len(statuses) == 1200


@pytest.mark.parametrize("extra, says", [
    (("--attach", "http://127.0.0.1:9"), "--attach cannot be used"),
    (("--speed", "4"), "--speed cannot be used"),
    (("--control-port", "9"), "--control-port cannot be used"),
    (("--backend", "sglang"), "--backend sglang needs --clock real"),
    (("--router", "sglang-router", "--router-policy", "round_robin"), "cannot run on a virtual clock"),
    (("--api", "chat"), "--api chat"),
])
def test_virtual_refuses_what_needs_real_time(tmp_path: Path, extra: tuple[str, ...], says: str) -> None:
    trace = _generate(tmp_path / "t.jsonl", "--rate", "10", "--num-requests", "5")
    done = run_cli("replay", str(trace), "--clock", "virtual", "--out-dir", str(tmp_path / "runs"), *extra)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists()


def test_virtual_runs_static_batches_cap_schedule_gate_and_a_policy_file(tmp_path: Path) -> None:
    """The router's own features run on the virtual clock unchanged: static batches, a cap schedule, the client's
    --max-concurrency gate and a user's policy file."""
    trace = _generate(tmp_path / "t.jsonl", "--rate", "40", "--num-requests", "200", "--seed", "1")
    done = _replay(trace, tmp_path, "static", "--gpus", "2", "--mode", "static", "--batch-size", "4",
                   "--policy", "round_robin")
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "static")
    batches: dict[tuple[int, int], list[dict]] = {}
    for r in records:
        batches.setdefault((r["server"], r["batch"]), []).append(r)
    assert all(len(b) <= 4 for b in batches.values()) and max(len(b) for b in batches.values()) == 4
    meta = json.loads((tmp_path / "static" / "run.json").read_text())
    gap = meta["virtual_clock"]["intake_gap_s"]
    assert gap > 0
    for members in batches.values():  # one send moment per batch ...
        assert len({r["t_dispatch"] for r in members}) == 1
        # ... received one at a time, as sglang's intake does (inprocess.INTAKE_GAP_S)
        received = sorted(r["server_received"] for r in members)
        assert all(b - a >= gap * 0.999 for a, b in zip(received, received[1:]))
    # a batch reaching an idle server: its first request is prefilled alone, the rest together after it (sglang's
    # shape on the committed real static runs; a batch received at one instant would be prefilled as one)
    first = min(batches.values(), key=lambda b: b[0]["t_dispatch"])
    entries = sorted(r["server_forward_entry"] for r in first)
    assert entries[0] < entries[1] == entries[-1]
    done = _replay(trace, tmp_path, "capped", "--gpus", "2", "--cap-schedule", "0s:8,2s:2",
                   "--max-concurrency", "10", "--policy", str(REPO / "policies" / "example_least_loaded.py:LeastLoaded"))
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "capped" / "run.json").read_text())
    assert [c["t"] for c in meta["caps"]["changes"]] == [0.0, 0.0, 2.0, 2.0]
    assert meta["max_concurrency_peak"] == 10
    records = _records(tmp_path / "capped")
    assert {r["status"] for r in records} == {"ok"}
    assert any(r["t_admitted"] > r["t_released"] for r in records)  # the gate held some at the client
    # after the cap fell to 2, no server ever had more than 2 requests dispatched and unfinished
    late = sorted((r["t_dispatch"], r["t_finish"], r["server"]) for r in records if r["t_dispatch"] >= 2.0)
    for t, _, server in late:
        running = sum(1 for r in records if r["server"] == server and r["t_dispatch"] <= t < r["t_finish"])
        assert running <= 2


def _steps(profile_name: str, fold: int, seed: int) -> tuple[list[tuple], list[tuple]]:
    """A random workload through the model, one step at a time (fold 0) or in decode runs cut at each arrival, as
    the in-process engine drives it: every step (kind, start, end, batch size) and every request's times, then the
    model's counters (/v1/loads' decode_moments among them)."""
    profile = load_profile(profile_name)
    model = BatchModel(profile, Limits(max_running_requests=16, max_total_num_tokens=60000, chunked_prefill_size=2048))
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for i in range(120):
        t += rng.expovariate(8.0)
        ids = [rng.randrange(3) for _ in range(4)] + [rng.randrange(32000) for _ in range(rng.randrange(1, 900))]
        arrivals.append(SimRequest(str(i), len(ids), rng.randrange(1, 200), t_ready=t, input_ids=ids))
    steps: list[tuple] = []
    t_free, i = 0.0, 0
    while True:
        t_start = model.next_start(t_free)
        if i < len(arrivals) and (t_start is None or arrivals[i].t_ready <= t_start):
            model.submit(arrivals[i])
            i += 1
            continue
        if t_start is None:
            break
        step = model.start_decode_run(t_start, fold) if fold else model.start_step(t_start)
        assert step is not None
        if step.run_starts is not None and i < len(arrivals) and arrivals[i].t_ready < step.t_end:
            model.cut_run(step, arrivals[i].t_ready)  # the engine cuts a run when a request comes in
        model.finish_step(step)
        for start, end in zip(step.run_starts or [step.t_start], step.step_ends):
            steps.append((step.kind, start, end, len(step.requests)))
        t_free = step.t_end
    return steps, [*((r.t_forward_entry, r.t_prefill_finished, r.t_finished, r.cached_tokens, r.output_len)
                     for r in arrivals),
                   (model.num_steps, model.total_generated_tokens, model.decode_moments)]


# issue 36's candidate: a decode step that depends on each request's context and on shared prefixes
ATTENTION_PROFILE = str(REPO / "bench" / "profiles" / "llama-2-7b-h200-triton-attention.json")


@pytest.mark.parametrize("seed,profile", [(0, "llama-2-7b-h200-triton"), (1, "llama-2-7b-h200-triton"),
                                          (0, ATTENTION_PROFILE)])
def test_decode_runs_are_a_shorthand_for_steps(seed: int, profile: str) -> None:
    """BatchModel.start_decode_run plans exactly the steps start_step would, one by one (same times, bit for bit)."""
    one, times_one = _steps(profile, 0, seed)
    runs, times_runs = _steps(profile, 15, seed)
    assert runs == one and times_runs == times_one
    assert len(one) > 1000


def test_sweep_on_the_virtual_clock(tmp_path: Path) -> None:
    trace = _generate(tmp_path / "t.jsonl", "--rate", "20", "--num-requests", "400", "--seed", "2")
    done = run_cli("sweep", str(trace), "--rates", "10,40", "--clock", "virtual", "--point-duration", "10",
                   "--name", "sw", "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "sw" / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["points"]) == 2
    assert summary["points"][0]["status"] == "completed" and summary["points"][0]["throughput_rps"] > 5
    for point in (tmp_path / "sw").glob("rate-*/run.json"):
        assert json.loads(point.read_text())["clock"] == "virtual"


def _summary_without_walls(folder: Path) -> dict:
    doc = json.loads((folder / "summary.json").read_text())
    for row in doc["points"]:
        row.pop("wall_s", None)
    doc.pop("wall_s", None)
    return {"points": doc["points"], "capacity": doc.get("capacity"), "status": doc["status"]}


def test_parallel_search_is_the_one_process_search(tmp_path: Path) -> None:
    """--jobs 2 runs the capacity search's combinations in two worker processes: the same points, figures, answers
    and byte-identical records as --jobs 1; a policy that raises in one combination fails the sweep with its own
    error (exit 1), after the other combination's points are in the summary."""
    trace = _generate(tmp_path / "t.jsonl", "--rate", "10", "--num-requests", "600", "--seed", "4")
    common = ("sweep", str(trace), "--find-max-rate", "--slo", "ttft=300ms,tpot=40ms", "--point-duration", "4",
              "--saturation-window", "0", "--clock", "virtual", "--gpus", "1,2", "--max-points", "3",
              "--out-dir", str(tmp_path), "--quiet")
    one = run_cli(*common, "--policy", "round_robin", "--name", "one", "--jobs", "1")
    two = run_cli(*common, "--policy", "round_robin", "--name", "two")  # the default: one part per core
    assert one.returncode == 0 and two.returncode == 0, one.stderr + two.stderr
    if len(os.sched_getaffinity(0)) > 1:
        assert "2 parts, 2 at a time" in two.stderr
    assert _summary_without_walls(tmp_path / "one") == _summary_without_walls(tmp_path / "two")
    points = [row["point"] for row in json.loads((tmp_path / "one" / "summary.json").read_text())["points"]]
    assert len(points) >= 4
    for point in points:
        assert (tmp_path / "one" / point / "requests.jsonl").read_bytes() == \
            (tmp_path / "two" / point / "requests.jsonl").read_bytes()
    bad = tmp_path / "bad.py"
    bad.write_text("from tracebench.policies.base import Policy\n\n"
                   "class TwoBreaks(Policy):\n    name = 'two_breaks'\n\n"
                   "    def assign(self, queue, servers):\n"
                   "        if len(servers) == 2:\n            raise ValueError('two servers break me')\n"
                   "        return [(queue[0], servers[0])] if servers[0].free_slots else []\n")
    failed = run_cli(*common, "--policy", f"{bad}:TwoBreaks", "--name", "bad", "--jobs", "2")
    assert failed.returncode == 1, failed.stderr
    assert "two servers break me" in failed.stderr
    doc = json.loads((tmp_path / "bad" / "summary.json").read_text())
    assert doc["status"] == "failed" and "two servers break me" in doc["error"]


def test_virtual_timeout_and_no_stream(tmp_path: Path) -> None:
    """--timeout ends a request that is not whole in time (recorded `timeout`, its server aborts it); --no-stream
    answers come whole (no first token, no gaps)."""
    trace = _generate(tmp_path / "t.jsonl", "--rate", "20", "--num-requests", "60", "--input-len", "200",
                      "--output-len", "400", "--seed", "0")
    done = _replay(trace, tmp_path, "timeout", "--gpus", "1", "--timeout", "1.5")
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "timeout")
    late = [r for r in records if r["status"] == "timeout"]
    assert late and all(r["error"] == "no complete answer within --timeout 1.5 s" for r in late)
    assert all(r["t_finish"] - r["t_dispatch"] == pytest.approx(1.5) for r in late)
    assert all(r["t_finish"] - r["t_dispatch"] < 1.5 for r in records if r["status"] == "ok")
    done = _replay(trace, tmp_path, "whole", "--gpus", "1", "--no-stream")
    assert done.returncode == 0, done.stderr
    records = _records(tmp_path / "whole")
    assert {r["status"] for r in records} == {"ok"}
    assert all(r["t_first_token"] is None and r["itl_hist"] is None and r["t_headers"] == r["t_finish"]
               for r in records)


def test_ctrl_c_stops_a_virtual_run_with_every_request_recorded(tmp_path: Path) -> None:
    """The virtual loop still sees a signal (it looks at its wake-up pipe every few turns): SIGINT stops the run,
    exit 130, each request recorded exactly once."""
    import signal
    import time

    from conftest import tracebench_cmd

    trace = _generate(tmp_path / "t.jsonl", "--rate", "40", "--num-requests", "20000", "--seed", "0")
    proc = subprocess.Popen(tracebench_cmd("replay", str(trace), "--clock", "virtual", "--gpus", "2", "--run-name",
                                           "stopped", "--out-dir", str(tmp_path), "--quiet"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "stopped" / "requests.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # requests are being recorded (20,000 take far longer than this)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    meta = json.loads((tmp_path / "stopped" / "run.json").read_text())
    assert meta["status"] == "interrupted" and meta["counts"]["not_sent"] > 0
    ids = [r["id"] for r in _records(tmp_path / "stopped")]
    assert sorted(ids) == list(range(20000))


# Runs as a fresh interpreter: two virtual runs (one with a cap schedule, one PD pair) through the CLI's entry point,
# then the HTTP modules this process imported. `tracebench` exits through SystemExit(0) when it is done.
_IMPORT_CHECK = """
import sys
from tracebench.cli import main
for args in sys.argv[1:]:
    try:
        main(args.split("|"))
    except SystemExit as end:
        assert end.code in (0, None), (args, end.code)
http = ("aiohttp", "yarl", "multidict", "tracebench.replay.http_session", "tracebench.replay.control")
print("IMPORTED:", sorted(m for m in sys.modules if m.startswith(http)))
"""


def test_a_virtual_run_imports_no_http_client_or_server(tmp_path: Path) -> None:
    """A virtual run opens no socket: it imports no aiohttp (~120 ms of start-up), neither through the client's
    answers and APIs nor through the simulated server's classes or the cap control endpoint."""
    trace = _generate(tmp_path / "t.jsonl", "--rate", "20", "--num-requests", "20", "--seed", "3")
    common = f"replay|{trace}|--clock|virtual|--out-dir|{tmp_path}|--quiet|--policy|round_robin"
    done = subprocess.run([sys.executable, "-c", _IMPORT_CHECK, f"{common}|--gpus|2|--cap-schedule|1s:2",
                           f"{common}|--pd|1:1"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "IMPORTED: []", done.stdout
    assert len(list(tmp_path.glob("*/requests.jsonl"))) == 2


@pytest.mark.parametrize("before_first_turn", [True, False])
def test_a_cancelled_engine_serves_nothing_more(before_first_turn: bool) -> None:
    """The simulated engine runs as loop callbacks behind one task: cancelling that task stops them, also when it is
    cancelled before its first step (then its cancel never reaches the future it would have awaited)."""
    import asyncio

    from tracebench.replay.loop import run_virtual
    from tracebench.sim.inprocess import InProcessServer, sim_args_from_command

    async def main() -> tuple[bool, bool, int]:
        server = InProcessServer(sim_args_from_command(["--port", "1"]))
        task = server.start(run_start=asyncio.get_running_loop().time())
        if not before_first_turn:
            await asyncio.sleep(0.01)
        task.cancel()
        await asyncio.sleep(0.01)
        pend = server.submit(300, 20, None, asyncio.get_running_loop().time(), stream=False)
        await asyncio.sleep(5)
        return task.cancelled(), pend.finished, pend.visible

    assert run_virtual(main()) == (True, False, 0)


def test_a_refused_request_and_the_next_have_their_own_ids() -> None:
    """An in-process server's scheduler-side abort answers with an id of its own; the request after it had the same
    one (its rid was not counted)."""
    import asyncio

    from tracebench.replay.loop import run_virtual
    from tracebench.sim.inprocess import InProcessServer, sim_args_from_command

    async def main() -> tuple[str, str]:
        server = InProcessServer(sim_args_from_command(["--port", "1"]))
        task = server.start(run_start=asyncio.get_running_loop().time())
        now = asyncio.get_running_loop().time()
        refused = server.abort_answer("too long", now, now)["meta_info"]["id"]
        pend = server.submit(300, 20, None, now, stream=False)
        task.cancel()
        return refused, pend.rid

    refused, accepted = run_virtual(main())
    assert refused != accepted

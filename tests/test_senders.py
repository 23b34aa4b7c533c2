"""`tracebench replay --senders N` (replay/senders.py): real replay processes, their sender processes and simulated
servers on 127.0.0.1; nothing mocked. The records of a run through sender processes are those of one process (same
ids, statuses, servers, fields), a sender process that dies is a fault the run reports, and Ctrl-C still records
every request once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import free_port, run_cli, run_cli_in_process, tracebench_cmd, wait_served
from test_replay_run import check_every_request_once, read_run, write_trace_file

STAMP_SLACK = 0.005  # server stamps are time.time(), ours monotonic





def start_replay(*args: str, cwd: Path) -> subprocess.Popen[str]:
    # its own session, as a shell's job: Ctrl-C reaches its whole process group (its sender processes too)
    return subprocess.Popen(tracebench_cmd("replay", *args), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def wait_running(run_dir: Path, proc: subprocess.Popen[str], timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        path = run_dir / "run.json"
        if path.is_file():
            run = json.loads(path.read_text())
            if run["wall_clock_start"] is not None:
                return run
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    raise AssertionError("the run did not start")


def gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_two_senders_record_what_one_does(tmp_path: Path) -> None:
    n = 240
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=120 / 20)  # 120 req/s of run time at --speed 20
    runs = {}
    for senders in (1, 2):
        name = f"s{senders}"
        result = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "20", "--port-base",
                         str(free_port(2)), "--policy", "round_robin", "--senders", str(senders), "--run-name", name,
                         *(("--router-sends-under", "0") if senders > 1 else ()),
                         "--out-dir", str(tmp_path), "--quiet")
        assert result.returncode == 0, result.stderr
        runs[senders] = read_run(tmp_path / name)
    (run1, recs1), (run2, recs2) = runs[1], runs[2]
    assert run1["senders"] == {"count": 1} and run1["options"]["senders"] == 1
    assert run2["senders"]["count"] == 2 and len(run2["senders"]["pids"]) == 2 and run2["senders"]["fault"] is None
    assert run2["options"]["senders"] == 2 and run2["status"] == "completed"
    assert 0 < run2["senders"]["router_cpu_s"] < run2["t_end"] + 1  # the router process's CPU over the run
    # --router-sends-under 0: every request went through a sender process, both of them used
    assert run2["senders"]["carried_by_router"] == 0 and sum(run2["senders"]["carried_by_process"]) == n
    assert min(run2["senders"]["carried_by_process"]) > 0
    for recs in (recs1, recs2):
        check_every_request_once(recs, n)
    one, two = ({r["id"]: r for r in recs} for recs in (recs1, recs2))
    same = ("status", "server", "input_len", "output_len", "completion_tokens", "prompt_tokens", "error", "mismatch")
    assert [[one[i][k] for k in same] for i in range(n)] == [[two[i][k] for k in same] for i in range(n)]
    assert Counter(r["status"] for r in recs2) == {"ok": n}
    # the same fields, null in the same places (but the inter-token gaps: whether an answer came in one chunk or in
    # several is the network's timing, in either run)
    timing = {"itl_max", "itl_hist"}
    assert [sorted(k for k, v in one[i].items() if v is not None and k not in timing) for i in range(n)] == \
           [sorted(k for k, v in two[i].items() if v is not None and k not in timing) for i in range(n)]
    assert one[0].keys() == two[0].keys()
    # one clock: the stamps a sender process took and the router's own are in order, and sglang's (time.time() on
    # the server, converted by the router) fall inside [t_dispatch, t_finish]
    for r in recs2:
        ordered = [r["t_released"], r["t_admitted"], r["t_assigned"], r["t_built"], r["t_written"], r["t_headers"],
                   r["t_first_token"], r["t_last_chunk"], r["t_finish"], r["t_parsed"]]
        assert ordered == sorted(ordered), r
        assert r["t_built"] == r["t_dispatch"]
        assert r["t_dispatch"] - STAMP_SLACK <= r["server_received"] <= r["server_finished"] <= r["t_finish"] + STAMP_SLACK, r
        assert r["t_arrival"] - 0.001 <= r["t_released"]
    keep = run2["client_keepup"]
    assert keep["own_before_wire_s"]["requests"] == n and keep["release_lag_s"]["requests"] == n
    assert all(gone(pid) for pid in run2["senders"]["pids"]), "a sender process outlived the run"


def test_a_killed_sender_process_is_a_fault_the_run_reports(tmp_path: Path) -> None:
    n = 300
    # long answers (200-400 tokens at --speed 4: 0.5-1 s each) at 40 req/s: ~30 in flight when the sender dies
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=40 / 4, outputs=(200, 400))
    proc = start_replay(str(trace), "--backend", "sim", "--gpus", "2", "--speed", "4", "--port-base", str(free_port(2)),
                        "--senders", "2", "--router-sends-under", "0", "--run-name", "k", "--out-dir", str(tmp_path), "--quiet", cwd=tmp_path)
    run = wait_running(tmp_path / "k", proc)
    pids = run["senders"]["pids"]
    wait_served([s["url"] for s in run["servers"]], 5)
    os.kill(pids[1], signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    why = f"sender process 1 (pid {pids[1]}) died (killed by signal SIGKILL)"
    assert why in stderr and "Traceback" not in stderr
    run, records = read_run(tmp_path / "k")
    check_every_request_once(records, n)
    assert run["status"] == "failed" and why in run["error"] and why in run["senders"]["fault"]
    statuses = Counter(r["status"] for r in records)
    assert set(statuses) <= {"ok", "error", "cancelled", "not_sent"} and statuses["ok"] and statuses["not_sent"]
    # its requests in flight: error, saying why; the other sender's: cancelled when the run stopped
    errors = [r for r in records if r["status"] == "error"]
    assert errors and all(r["error"].startswith("SenderDied: " + why) for r in errors)
    assert all(r["t_dispatch"] is None for r in records if r["status"] == "not_sent")
    assert gone(pids[0]), "the other sender process outlived the run"


def test_ctrl_c_with_senders_records_every_request_once(tmp_path: Path) -> None:
    n = 400
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=100 / 2, outputs=(32, 64))  # 100 req/s of run time
    proc = start_replay(str(trace), "--backend", "sim", "--gpus", "2", "--speed", "2", "--port-base", str(free_port(2)),
                        "--senders", "2", "--router-sends-under", "0", "--run-name", "int", "--out-dir", str(tmp_path), "--quiet", cwd=tmp_path)
    run = wait_running(tmp_path / "int", proc)
    wait_served([s["url"] for s in run["servers"]], 21)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the replay and its sender processes
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    run, records = read_run(tmp_path / "int")
    check_every_request_once(records, n)
    assert run["status"] == "interrupted" and run["senders"]["fault"] is None
    statuses = Counter(r["status"] for r in records)
    assert set(statuses) <= {"ok", "cancelled", "not_sent"} and statuses["ok"] > 20 and statuses["not_sent"]
    # never sent: no server either, also when a sender had already taken it over
    assert all(r["t_dispatch"] is None and r["server"] is None for r in records if r["status"] == "not_sent")
    assert any(r["t_dispatch"] is not None for r in records if r["status"] == "cancelled")  # in flight at Ctrl-C
    assert all(gone(pid) for pid in run["senders"]["pids"]), "a sender process outlived the run"


def test_senders_refused_where_they_cannot_work(tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 5, rate=10)
    for args, why in (
        (("--senders", "0"), "--senders must be from 1 to"),
        (("--senders", "2", "--clock", "virtual"), "--clock virtual needs --senders 1"),
        (("--senders", "2", "--pd", "1:1"), "PD runs need --senders 1"),
        (("--router-sends-under", "0.01",), "--router-sends-under is for --senders N > 1"),
    ):
        # refused before anything starts (no server, no event loop): answered in this process as the process answers it
        result = run_cli_in_process("replay", str(trace), "--backend", "sim", *args, "--out-dir", str(tmp_path),
                                    "--quiet")
        assert result.returncode == 2, (args, result.stderr)
        assert why in result.stderr, result.stderr


def test_the_router_hands_over_only_when_it_falls_behind() -> None:
    from tracebench.replay.senders import Split

    split = Split(0.001)
    assert not any(split.hand_over(0.0003) for _ in range(1000))  # on time: it sends everything itself
    # a few late ones (1 in 10) do not make it hand over
    assert not any(split.hand_over(0.005 if i % 10 == 0 else 0.0003) for i in range(1000))
    behind = [split.hand_over(0.005) for _ in range(200)]  # behind: it hands over, soon all
    assert any(behind[:40]) and all(behind[100:])
    back = [split.hand_over(0.0003) for _ in range(200)]  # on time again: it takes them back
    assert not any(back[100:])
    # behind, but no spare core on the host (every core busy): it keeps sending itself
    split = Split(0.001)
    split.idle_cores = 0.3
    assert not any(split.hand_over(0.005) for _ in range(200))
    split.idle_cores = 4.0
    assert all([split.hand_over(0.005) for _ in range(200)][100:])


@pytest.mark.skipif(not Path("/proc/stat").exists(), reason="Linux /proc/stat")
def test_idle_cores_are_counted_on_the_senders_cpus_only() -> None:
    """The split's "spare core" is measured over the CPUs the sender processes may use (their --pin-cpus, or the
    affinity), not the whole host: under `taskset -c 0,1` on a 16-core host the 14 idle cores said "spare"."""
    from tracebench.replay.senders import IdleCores

    one = IdleCores([min(os.sched_getaffinity(0))])
    assert one.cores == 1
    none = IdleCores([1_000_000])  # no such CPU: nothing measured
    deadline = time.monotonic() + 0.3
    while time.monotonic() < deadline:
        pass
    idle = one.sample()
    assert idle is not None and 0.0 <= idle <= 1.0
    assert none.sample() is None


def test_a_request_cancelled_before_its_sender_starts_it_is_answered(tmp_path: Path) -> None:
    """The race behind a Ctrl-C that never ended (a run left `running`): a sender process slow to turn its loop reads
    a request's "go" and its "cancel" in one batch, so the request's task is cancelled before its first step; it must
    still answer "cancelled" (else the router waits for it forever). The real sender loop, on a real pipe; its request
    is cancelled before it connects anywhere."""
    import multiprocessing
    import threading

    from tracebench.precise_loop import run
    from tracebench.replay.senders import SenderSetup, _SenderLoop

    mine, theirs = multiprocessing.Pipe(duplex=True)
    setup = SenderSetup("0" * 64, 32000, None, "generate", True, True, None, None, 4.0, None)
    thread = threading.Thread(target=run, args=(_SenderLoop(theirs, setup).serve(),), daemon=True)
    thread.start()
    try:
        assert mine.poll(10) and mine.recv()[0][0] == "ready"
        url = f"http://127.0.0.1:{free_port()}/generate"  # nothing listens: it must not matter
        mine.send([("clock", time.monotonic(), time.time()), ("go", 7, url, 16, 4, None), ("cancel", 7)])
        answers = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not answers:
            if mine.poll(0.1):
                answers += [m for m in mine.recv() if m[0] != "progress"]
        assert [(m[0], m[1]) for m in answers] == [("cancelled", 7)], answers
        assert answers[0][2][1] is None  # t_dispatch: it never went out (a not_sent record, truly)
    finally:
        mine.send([("stop",)])
        thread.join(10)
    assert not thread.is_alive()


def test_pin_cpus_refusals(tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 5, rate=10)
    allowed = sorted(os.sched_getaffinity(0))
    outside = max(allowed) + 1
    for args, why in (
        (("--pin-cpus", "0-1"), "with --senders 1 the router is the only process: give one CPU"),
        (("--senders", "2", "--pin-cpus", str(allowed[0])), "at least one for the sender processes"),
        (("--senders", "2", "--pin-cpus", "1,1"), "a CPU is named twice"),
        (("--senders", "2", "--pin-cpus", "3-1"), "runs backwards"),
        (("--senders", "2", "--pin-cpus", "a"), "expected CPU numbers and ranges"),
        (("--senders", "2", "--pin-cpus", f"{allowed[0]},{outside}"), f"CPU(s) [{outside}] are not among"),
    ):
        result = run_cli_in_process("replay", str(trace), "--backend", "sim", *args, "--out-dir", str(tmp_path),
                                    "--quiet")
        assert result.returncode == 2, (args, result.stderr)
        assert why in result.stderr, result.stderr


def test_both_ends_of_a_sender_connection_write_at_once_without_waiting_on_each_other() -> None:
    """Each end writes far more than a socket buffer holds before either reads (a router and a sender process both
    busy answering each other). multiprocessing's Connection.send would block the first write here for ever, as
    router and sender did at 1,000 req/s on 2 cores; a Channel queues it and the loop delivers every message, in
    order, whole, once both ends read."""
    import asyncio
    import multiprocessing

    from tracebench.precise_loop import run
    from tracebench.replay.senders import Channel

    batch = [("done", i, "x" * 1_000) for i in range(2_000)]  # ~2 MB a list: many times a socket's buffer

    async def main() -> tuple[list, list, list]:
        got: dict[str, list] = {"a": [], "b": []}
        closed: list = []
        mine, theirs = multiprocessing.Pipe(duplex=True)
        a = await Channel.over(mine, got["a"].extend, closed.append)
        b = await Channel.over(theirs, got["b"].extend, closed.append)
        for _ in range(3):  # no read can happen in between: this coroutine does not yield
            assert a.send(batch) and b.send(batch)
        deadline = asyncio.get_running_loop().time() + 30
        while (len(got["a"]) < 3 * len(batch) or len(got["b"]) < 3 * len(batch)) and \
                asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        a.close()
        await asyncio.wait([a.lost, b.lost], timeout=5)
        return got["a"], got["b"], closed

    got_a, got_b, closed = run(main())
    assert got_a == batch * 3 and got_b == batch * 3
    assert closed == [None, None]  # both ends saw the close, neither a broken message

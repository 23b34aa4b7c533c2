"""The replay never hangs, never loses a record and never mislabels one (issue 20): hung servers, policies that stall,
block or raise, a full disk, SSE lines to ignore, a probe at shutdown, the summary at --speed K, the trace read once.

Real processes throughout: the replay, sim-servers, and tests/fault_proxy.py (a proxy injecting faults in front of a
sim-server)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import (
    REPO, SimServer, free_port, run_cli, run_cli_in_process, sim_servers, tracebench_cmd, wait_healthy,
    wait_served,
)
from test_replay_run import check_every_request_once, read_run, start_replay, wait_running, write_trace_file
from tracebench.trace.format import format_request_line, sha256_file, write_trace

FAST = ("--backend", "sim", "--speed", "10", "--quiet")
# the policy checks run on the virtual clock: the router and the policy are the real-time run's, and what a policy
# that assigns nothing, or raises, does to the run is no matter of HTTP or host time (docs/virtual-clock.md)
VIRTUAL = ("--clock", "virtual", "--quiet")


@pytest.fixture(scope="module")
def shared_sim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    """One sim-server (--speed 10) for the tests that only need a server to be there (its start costs ~1 s)."""
    with sim_servers(tmp_path_factory.mktemp("shared-sim")) as start:
        yield start("--speed", "10")


@pytest.fixture(scope="module")
def shared_sim(shared_sim_server: SimServer) -> str:
    return shared_sim_server.url


def policy_file(tmp_path: Path, name: str, body: str, imports: str = "") -> str:
    """A policy file `name.py` whose class `P` has `name` and the given assign() body (indented 8)."""
    path = tmp_path / f"{name}.py"
    path.write_text(
        f"{imports}from tracebench.policies import Policy\n\n"
        "class P(Policy):\n"
        f"    name = {name!r}\n"
        "    description = 'a test policy'\n"
        "    calls = 0\n\n"
        "    def assign(self, queue, servers):\n"
        "        type(self).calls += 1\n"
        f"{body}"
    )
    return f"{path}:P"


def first_free() -> str:
    """assign() body: each queued request to the first server with a free slot (work-conserving)."""
    return ("        picks, free = [], {s.index: s.free_slots for s in servers}\n"
            "        for req in queue:\n"
            "            s = next((s for s in servers if free[s.index] > 0), None)\n"
            "            if s is None:\n"
            "                break\n"
            "            free[s.index] -= 1\n"
            "            picks.append((req, s))\n"
            "        return picks\n")


@contextlib.contextmanager
def proxy(upstream: str, *args: str) -> Iterator[str]:
    port = free_port()
    log = open(os.devnull, "wb")
    proc = subprocess.Popen([sys.executable, str(REPO / "tests" / "fault_proxy.py"), "--port", str(port),
                             "--upstream", upstream, *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, Path(os.devnull))
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """The replay's output; a replay still running after `timeout` is killed and the test fails (it hung)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the replay hung (still running after {timeout} s):\n{err[-3000:]}") from None


# ---- 1. a hung server ------------------------------------------------------------------------------------------


def test_hung_server_is_taken_out_and_its_requests_time_out(tmp_path: Path, sim_server) -> None:
    servers = [sim_server("--speed", "10", wait=False) for _ in range(2)]  # started together
    for server in servers:
        wait_healthy(server.url, server.proc, server.log)
    n = 120
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=40, outputs=(16, 48))
    proc = start_replay(str(trace), "--attach", servers[0].url, "--attach", servers[1].url, "--policy", "round_robin",
                        "--stall-timeout", "1", "--poll-interval", "0.2", "--run-name", "hung",
                        "--out-dir", str(tmp_path), "--quiet", cwd=tmp_path)
    try:
        wait_running(tmp_path / "hung", proc)
        wait_served([s.url for s in servers], 20)   # a sixth of the trace went through both
        servers[1].proc.send_signal(signal.SIGSTOP)
        t_stop = time.monotonic()
        _, stderr = finish(proc, timeout=30)
        took = time.monotonic() - t_stop
    finally:
        servers[1].proc.send_signal(signal.SIGCONT)
    assert proc.returncode == 0, stderr
    assert took < 12, took
    run, records = read_run(tmp_path / "hung")
    check_every_request_once(records, n)
    assert run["status"] == "completed"
    assert run["stall"]["no_progress_s"] == 1 and run["stall"]["source"] == "--stall-timeout"
    [down] = [e for e in run["events"] if e["kind"] == "server_down"]
    assert down["server"] == 1 and "stalled" in down["detail"], down
    hung = [r for r in records if r["status"] == "timeout"]
    assert hung and all(r["server"] == 1 and "server 1 stalled" in r["error"] for r in hung), hung
    assert {r["status"] for r in records} == {"ok", "timeout"}
    assert not [r for r in records if r["server"] == 1 and r["t_dispatch"] > down["t"]]  # out of routing
    assert sum(r["server"] == 0 and r["t_dispatch"] > down["t"] for r in records) > 10  # the run went on


@pytest.mark.parametrize("stream", [True, False])
def test_queueing_on_a_busy_server_is_never_a_timeout(tmp_path: Path, sim_server, stream: bool) -> None:
    # an overloaded but healthy server, no router cap: requests wait in its own queue far longer than the stall bound,
    # with nothing on their streams (or no answer) until their turn; that wait is their TTFT, not a stall
    server = sim_server("--max-running-requests", "1", "--speed", "0.25")
    n = 24
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=500, inputs=(16, 64), outputs=(1, 3))
    result = run_cli("replay", str(trace), "--attach", server.url, "--stall-timeout", "0.2", "--poll-interval", "0.1",
                     "--stream" if stream else "--no-stream", "--run-name", "q", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "q")
    check_every_request_once(records, n)
    assert Counter(r["status"] for r in records) == {"ok": n}, [r["error"] for r in records if r["error"]][:3]
    # the test means something: the longest wait for a first token (or a whole answer) went far past the bounds
    waits = [(r["t_first_token"] if stream else r["t_finish"]) - r["t_dispatch"] for r in records]
    assert max(waits) > 3 * run["stall"]["run_no_progress_s"], max(waits)
    if not stream:
        assert max(waits) > run["stall"]["run_no_stream_total_s"], (max(waits), run["stall"])
    assert "never before" in run["stall"]["rule"]


@pytest.mark.parametrize("senders", [1, 2])
def test_a_scheduler_hung_behind_a_live_http_side_and_a_request_stalled_after_its_first_token(
        tmp_path: Path, sim_server, senders: int) -> None:
    # server 0 hangs behind a live HTTP side (its polls answer the same snapshot again): nothing of it shows progress,
    # so it is stalled, requests waiting for their first token there included (no --timeout: without this the run
    # would never end); server 1 serves on, but holds one request after its first token: that request alone stalls.
    # With 2 sender processes carrying every request (their progress reports feed the watchdog; the router asks them
    # to cancel what it ends), the same
    sims = [sim_server("--speed", "10", wait=False) for _ in range(2)]  # started together
    for server in sims:
        wait_healthy(server.url, server.proc, server.log)
    n = 80
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=40, outputs=(16, 48))
    with proxy(sims[0].url, "--freeze-after", "0.5") as hung, proxy(sims[1].url, "--hold-nth", "3") as holding:
        proc = start_replay(str(trace), "--attach", hung, "--attach", holding, "--policy", "round_robin",
                            "--stall-timeout", "1", "--poll-interval", "0.2", "--run-name", "f",
                            *(("--senders", str(senders), "--router-sends-under", "0") if senders > 1 else ()),
                            "--out-dir", str(tmp_path), "--quiet", cwd=tmp_path)
        _, stderr = finish(proc, timeout=40)
    assert proc.returncode == 0, stderr
    run, records = read_run(tmp_path / "f")
    check_every_request_once(records, n)
    [down] = [e for e in run["events"] if e["kind"] == "server_down"]
    assert down["server"] == 0 and "stalled" in down["detail"] and "/v1/loads snapshot" in down["detail"], down
    hung_records = [r for r in records if r["server"] == 0 and r["status"] != "ok"]
    assert hung_records and all(r["status"] == "timeout" and "server 0 stalled" in r["error"] for r in hung_records)
    assert any(r["t_first_token"] is None for r in hung_records)  # waiting for a first token did not save them
    [held] = [r for r in records if r["server"] == 1 and r["status"] != "ok"]
    assert held["status"] == "timeout" and "after its first token" in held["error"], held
    assert held["t_first_token"] is not None
    assert sum(r["server"] == 1 and r["t_dispatch"] > down["t"] for r in records) > 10  # the run went on there


def test_default_stall_bound_comes_from_the_trace() -> None:
    import numpy as np

    from tracebench.replay.stall import stall_bounds

    lens = np.array([100, 4000]), np.array([10, 300])
    default = stall_bounds(*lens, speed=None, given=None)
    assert default.no_progress_s == 60.0 and default.no_stream_total_s == 60.0 + 300 / 5
    assert default.run_no_progress_s == 60.0 and "default" in default.source
    long_prompt = stall_bounds(np.array([200_000]), np.array([10]), speed=None, given=None)
    assert long_prompt.no_progress_s == 2 * 200_000 / 1000  # the longest prompt at a pessimistic prefill rate
    fast = stall_bounds(*lens, speed=40.0, given=None)
    assert fast.run_no_progress_s == 5.0  # 60 / 40 = 1.5 s of run time: the host floor holds
    given = stall_bounds(*lens, speed=4.0, given=2.0)
    assert given.no_progress_s == 2.0 and given.run_no_progress_s == 0.5 and given.source == "--stall-timeout"


# ---- 2-4. policies that never assign, block, or raise ---------------------------------------------------------


def test_policy_that_never_assigns_stops_at_once(tmp_path: Path) -> None:
    policy = policy_file(tmp_path, "never", "        return []\n")
    trace = write_trace_file(tmp_path / "t.jsonl", 5, rate=50)
    proc = start_replay(str(trace), *VIRTUAL, "--policy", policy, "--run-name", "n", "--out-dir", str(tmp_path),
                        cwd=tmp_path)
    _, stderr = finish(proc, timeout=30)
    assert proc.returncode == 1, stderr
    assert "policy 'never' assigned nothing" in stderr and "nothing can ask it again" in stderr, stderr
    # an uncapped server's slots are not a number to sum (issue 33 item 18: "1073741824 free slot(s)")
    assert "1 healthy uncapped server(s) (no slot limit)" in stderr and "1073741824" not in stderr, stderr
    run, records = read_run(tmp_path / "n")
    check_every_request_once(records, 5)
    assert all(r["status"] == "not_sent" and "PolicyError" in r["error"] for r in records)
    assert run["status"] == "failed" and run["counts"]["not_sent"] == 5


def test_policy_that_stops_assigning_is_stopped_after_the_bound(tmp_path: Path) -> None:
    # an arrival is still to come (at 300 s), so the policy could be asked again: the bound decides (1 s of the
    # run's clock, here the virtual one)
    lines = [format_request_line(i, 0.01 * i, 32, 4) for i in range(3)] + [format_request_line(3, 300.0, 32, 4)]
    trace = write_trace(tmp_path / "t.jsonl", {"num_requests": 4, "duration_s": 300.0}, lines)
    policy = policy_file(tmp_path, "lazy", "        return []\n")
    proc = start_replay(str(trace), *VIRTUAL, "--stall-timeout", "1", "--policy", policy, "--run-name", "l",
                        "--out-dir", str(tmp_path), cwd=tmp_path)
    _, stderr = finish(proc, timeout=30)
    assert proc.returncode == 1, stderr
    assert "policy 'lazy' assigned nothing for 1 s of run time" in stderr, stderr
    run, records = read_run(tmp_path / "l")
    check_every_request_once(records, 4)
    assert Counter(r["status"] for r in records) == {"not_sent": 4}
    assert [r["t_released"] is None for r in sorted(records, key=lambda r: r["id"])] == [False, False, False, True]


def test_blocking_policy_is_measured_and_warned(tmp_path: Path, shared_sim: str) -> None:
    body = ("        if type(self).calls == 2:\n"
            "            time.sleep(0.4)\n" + first_free())
    policy = policy_file(tmp_path, "sleepy", body, imports="import time\n")
    trace = write_trace_file(tmp_path / "t.jsonl", 8, rate=100)
    result = run_cli("replay", str(trace), "--attach", shared_sim, "--quiet", "--max-running-requests", "2",
                     "--policy", policy, "--run-name", "s", "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    said = re.search(r"warning: policy 'sleepy' held the replay loop .*?assign: .*?longest call (\d+) ms.* over the bound of "
                     r"20 ms", result.stderr)
    assert said and 400 <= int(said[1]) < 1000, result.stderr
    run, records = read_run(tmp_path / "s")
    timing = run["policy_time"]
    assert timing["assign"]["calls"] >= 2 and 0.4 <= timing["assign"]["max_s"] < 1.0
    assert timing["assign"]["total_s"] >= 0.4 and timing["warning"].startswith("policy 'sleepy' held")
    assert max(r["policy_s"] for r in records) >= 0.4  # the requests that waited through that call say so
    assert min(r["policy_s"] for r in records) < 0.4
    report = run_cli("report", str(tmp_path / "s"), "--format", "md")  # the report repeats the warning
    assert report.returncode == 0, report.stderr
    assert "run 's': policy 'sleepy' held the replay loop" in report.stdout
    # issue 33 B8: the requests released behind that call went out ~0.4 s late: the client could not keep up, and
    # the terminal, run.json and the report say so
    keepup = run["client_keepup"]
    assert keepup["bound_p99_s"] == 0.010 and keepup["release_lag_s"]["requests"] == 8
    assert keepup["release_lag_s"]["p99"] > 0.2 and keepup["own_before_wire_s"]["p99"] > 0.2
    assert keepup["behind"].startswith("the client could not keep up: release lag p99 "), keepup
    assert f"tracebench replay: warning: {keepup['behind']}" in result.stderr
    assert "run 's': the client could not keep up: release lag p99" in report.stdout, report.stdout


@pytest.mark.parametrize("raised", ["SystemExit(0)", "KeyboardInterrupt()", "ValueError('bad')"])
def test_anything_a_policy_raises_fails_the_run_with_every_request_recorded(tmp_path: Path, raised: str) -> None:
    # it raises while requests are in flight (they become cancelled) and others wait (they become not_sent)
    body = (f"        if type(self).calls >= 4 and any(s.in_flight for s in servers):\n"
            f"            raise {raised}\n" + first_free())
    policy = policy_file(tmp_path, "raiser", body)
    n = 40
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=100, outputs=(40, 60))
    result = run_cli("replay", str(trace), *VIRTUAL, "--max-running-requests", "4", "--policy", policy,
                     "--run-name", "r", "--out-dir", str(tmp_path))
    kind = raised.split("(")[0]
    assert result.returncode == 1, result.stderr
    assert f"policy 'raiser' raised {kind} in assign" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    run, records = read_run(tmp_path / "r")
    check_every_request_once(records, n)
    statuses = Counter(r["status"] for r in records)
    assert run["status"] == "failed" and run["error"].startswith("PolicyError: policy 'raiser' raised")
    assert run["counts"] == {**dict.fromkeys(run["counts"], 0), **statuses}
    # in flight when it raised: cancelled; never sent: not_sent; nothing is an error
    assert set(statuses) <= {"ok", "cancelled", "not_sent"} and statuses["cancelled"] and statuses["not_sent"]
    assert all(r["t_dispatch"] is not None for r in records if r["status"] == "cancelled")
    assert all(r["t_dispatch"] is None and "not sent" in r["error"] for r in records if r["status"] == "not_sent")
    if kind == "ValueError":  # the report reads the new status (once is enough: it costs a report)
        report = run_cli("report", str(tmp_path / "r"), "--format", "json")
        assert report.returncode == 0, report.stderr
        counts = json.loads(report.stdout)["runs"][0]["requests"]
        assert counts["not_sent"] == statuses["not_sent"] and counts["cancelled"] == statuses["cancelled"]


# ---- 6. disk full ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def small_disk(path: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)]).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_disk_obviously_too_small_is_refused_before_anything_starts(tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 10_000, rate=2000)
    with small_disk(tmp_path / "disk", "512k") as disk:
        result = run_cli("replay", str(trace), *FAST, "--run-name", "d", "--out-dir", str(disk))
        assert result.returncode == 2, result.stderr
        assert "not enough free space" in result.stderr and "10000 requests" in result.stderr, result.stderr
        assert not (disk / "d").exists()


def test_disk_full_keeps_every_whole_line_that_fits(tmp_path: Path) -> None:
    # issue 33 item 9: a batch that only partly fits keeps its whole lines (it was cut back to the previous batch, so
    # a 512 KiB disk kept none of 550 records with 304 KB free)
    from tracebench.replay.records import AppendFile
    line = b"x" * 199 + b"\n"
    failures: list[BaseException] = []
    with small_disk(tmp_path / "disk", "64k") as disk:
        out = AppendFile(disk / "f.jsonl", failures.append, flush_lines=1000)
        for _ in range(1000):  # 200 KB in one batch: about a third of it fits
            out.write(line)
        out.close()
        data = (disk / "f.jsonl").read_bytes()
        assert len(failures) == 1 and out.failure is not None and "disk full" in str(out.failure)
        assert data.endswith(b"\n") and set(data.splitlines()) == {line[:-1]}
        assert out.lines_on_disk == len(data) // len(line)
        assert len(data) > 65536 - 4096 - len(line), len(data)  # all but the last page and a line


def fill_disk(disk: Path) -> None:
    """Write zeros into `disk` until it is full."""
    with contextlib.suppress(OSError), (disk / "filler").open("wb") as fh:
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()


def test_disk_full_mid_run_stops_it_and_says_so(tmp_path: Path, shared_sim: str) -> None:
    n = 400
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=100)
    with small_disk(tmp_path / "disk", "1m") as disk:
        proc = start_replay(str(trace), "--attach", shared_sim, "--quiet", "--run-name", "d", "--out-dir", str(disk),
                            cwd=tmp_path)
        wait_running(disk / "d", proc)
        time.sleep(0.5)
        fill_disk(disk)
        _, stderr = finish(proc, timeout=30)
        assert proc.returncode == 1, stderr
        assert "disk full" in stderr and "Traceback" not in stderr, stderr
        run = json.loads((disk / "d" / "run.json").read_text())
        lines = (disk / "d" / "requests.jsonl").read_bytes().splitlines()
        records = [json.loads(line) for line in lines]  # whole lines only
        assert run["status"] == "failed" and "disk full" in run["error"], run["error"]
        assert run["records_written"] == len(records) < n
        assert sum(run["counts"].values()) == n  # every request was decided; the error says how many reached the disk
        assert f"{len(records)} of {n} records reached requests.jsonl" in run["error"]
        assert not (disk / "d" / ".reserve").exists()


def test_disk_full_leaves_whole_lines_in_the_telemetry_files_too(tmp_path: Path, shared_sim: str) -> None:
    # server_metrics.jsonl and gpu.jsonl are written as fast as they can be (a scrape every 20 ms, a stand-in
    # nvidia-smi printing without pause) when the disk fills: each is cut back to its last whole line
    smi = tmp_path / "smi"
    smi.write_text("#!/bin/sh\nwhile :; do echo '0, GPU-aaaa, 37, 12, 1024, 81559, 123.45, NVIDIA H100 80GB HBM3'; "
                   "sleep 0.002; done\n")
    smi.chmod(0o755)
    n = 400
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=100)
    with small_disk(tmp_path / "disk", "1m") as disk:
        proc = subprocess.Popen(
            tracebench_cmd("replay", str(trace), "--attach", shared_sim, "--quiet", "--run-name", "d", "--out-dir",
                           str(disk), "--metrics-interval", "0.02"),
            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "TRACEBENCH_NVIDIA_SMI": str(smi)})
        wait_running(disk / "d", proc)
        time.sleep(0.5)
        fill_disk(disk)
        _, stderr = finish(proc, timeout=30)
        assert proc.returncode == 1, stderr
        assert "disk full" in stderr and "Traceback" not in stderr, stderr
        run = json.loads((disk / "d" / "run.json").read_text())
        assert run["status"] == "failed" and "disk full" in run["error"], run["error"]
        for name, meta in (("server_metrics.jsonl", run["server_metrics"]), ("gpu.jsonl", run["gpu_telemetry"])):
            text = (disk / "d" / name).read_bytes()
            assert text.endswith(b"\n"), (name, text[-200:])  # whole lines only
            rows = [json.loads(line) for line in text.splitlines()]
            assert rows and meta["rows"] == len(rows), (name, meta["rows"], len(rows))


# ---- 9. SSE lines, duplicate servers, a trace read once, unique run names, exit codes --------------------------


def test_sse_comments_and_fields_are_ignored(tmp_path: Path, shared_sim: str) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 10, rate=50)
    with proxy(shared_sim, "--sse-noise") as url:
        result = run_cli("replay", str(trace), "--attach", url, "--run-name", "sse", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    _, records = read_run(tmp_path / "sse")
    assert {r["status"] for r in records} == {"ok"} and all(r["t_first_token"] for r in records)


def test_sse_event_parsing_follows_the_spec() -> None:
    from tracebench.errors import ServerProtocolError
    from tracebench.replay.client import sse_data

    assert sse_data("u", b"data: {}") == b"{}"
    assert sse_data("u", b": keepalive") is None
    assert sse_data("u", b"event: message\nid: 3\nretry: 100\ndata: [DONE]") == b"[DONE]"
    assert sse_data("u", b"data:{\"a\":\ndata: 1}") == b'{"a":\n1}'  # no space after the colon; two data lines
    assert sse_data("u", b"event: ping") is None
    with pytest.raises(ServerProtocolError, match="not a line of a server-sent event"):
        sse_data("u", b"garbage")


def test_the_same_server_twice_is_refused(tmp_path: Path) -> None:
    from tracebench.errors import ConfigError
    from tracebench.replay.servers import plan_attached

    port = free_port()
    for a, b in ((f"http://127.0.0.1:{port}", f"http://localhost:{port}"),
                 (f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port}/"),
                 (f"http://LOCALHOST:{port}", f"http://[::1]:{port}"),
                 ("http://127.0.0.1:80", "http://127.0.0.1")):
        with pytest.raises(ConfigError, match="are the same server"):  # ConfigError: exit 2, before anything starts
            plan_attached([a, b])
    assert len(plan_attached([f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}/"])) == 2


def test_a_trace_from_a_pipe_is_read_once(tmp_path: Path, shared_sim: str) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 6, rate=50)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def feed() -> None:
        with fifo.open("wb") as fh:
            fh.write(trace.read_bytes())

    feeder = threading.Thread(target=feed)
    feeder.start()
    result = run_cli("replay", str(fifo), "--attach", shared_sim, "--quiet", "--run-name", "pipe",
                     "--out-dir", str(tmp_path))
    feeder.join(timeout=10)
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "pipe")
    check_every_request_once(records, 6)
    assert run["trace"]["sha256"] == sha256_file(trace)


def test_a_trace_that_cannot_be_read_is_one_clear_line(tmp_path: Path) -> None:
    # refused before anything starts (no server, no event loop): answered in this process as the process answers it
    folder = tmp_path / "folder.jsonl"
    folder.mkdir()
    result = run_cli_in_process("replay", str(folder), *FAST, "--out-dir", str(tmp_path))
    assert result.returncode == 2 and "is a directory" in result.stderr, result.stderr
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00" + b"\0" * 20)
    result = run_cli_in_process("replay", str(gz), *FAST, "--out-dir", str(tmp_path))
    assert result.returncode == 2 and "gzip" in result.stderr, result.stderr


def test_default_run_names_are_unique(tmp_path: Path) -> None:
    from tracebench.replay.run import claim_run_dir

    names = [claim_run_dir(tmp_path, "t-continuous-1g-20260101-000000", generated=True).name for _ in range(3)]
    assert names == ["t-continuous-1g-20260101-000000", "t-continuous-1g-20260101-000000-2",
                     "t-continuous-1g-20260101-000000-3"]
    assert names == sorted(names) and all((tmp_path / n).is_dir() for n in names)
    from tracebench.errors import ConfigError

    with pytest.raises(ConfigError, match="already exists"):  # a name the user gave is never changed
        claim_run_dir(tmp_path, names[0], generated=False)


def test_docs_give_one_exit_code_per_signal() -> None:
    text = (REPO / "docs" / "replay.md").read_text()
    for paragraph in re.split(r"\n\s*\n|\n- ", text):  # paragraphs and list items
        if "SIGTERM" in paragraph and "130" in paragraph:
            assert "143" in paragraph, paragraph


# ---- the columnar copy stopped by a signal (tracebench/report/columns.py) ------------------------------------------


def test_sigterm_while_the_columnar_copy_is_written_leaves_the_run_whole_and_no_temporary_file(
        tmp_path: Path, shared_sim_server: SimServer) -> None:
    """SIGTERM used to end the replay command in the middle of writing requests.columns.parquet (Python's default
    handler), leaving .requests.columns.parquet.writing-<pid>. The window is hit without timing: the copy's temporary
    name (its pid is the process's) is a named pipe of one page that this test holds open, so the real polars write
    blocks in it until the test reads; the test sends SIGTERM once bytes of the copy are in the pipe (the process is
    inside the write), and only then reads. The temporary name can be made before the copy and after the run folder
    exists because the server is stopped (SIGSTOP) until then: the replay waits for it, its folder already claimed.
    TRACEBENCH_COPY_MIN_BYTES=0 (for tests, docs/run-format.md) gives a four-request run its copy."""
    from tracebench.report.load import COLUMNS_COPY, load_run

    n = 4
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=50, outputs=(4, 8))
    run_dir = tmp_path / "c"
    server = shared_sim_server.proc
    server.send_signal(signal.SIGSTOP)
    try:
        proc = subprocess.Popen(tracebench_cmd("replay", str(trace), "--attach", shared_sim_server.url, "--quiet",
                                               "--run-name", "c", "--out-dir", str(tmp_path)),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "TRACEBENCH_COPY_MIN_BYTES": "0"})
        deadline = time.monotonic() + 60
        while not run_dir.is_dir():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.005)
        temp = run_dir / f".{COLUMNS_COPY}.writing-{proc.pid}"
        os.mkfifo(temp)
        # read and write ends in one: the writer's opens never wait, and the pipe is readable only when it holds
        # bytes (polars opens the file, closes it and opens it again before it writes: no end-of-file seen between)
        pipe = os.open(temp, os.O_RDWR | os.O_NONBLOCK)
    finally:
        server.send_signal(signal.SIGCONT)
    try:
        import fcntl

        fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, 4096)  # the copy (> 4 kB: its footer alone) cannot fit: it waits
        while not select.select([pipe], [], [], 0.1)[0]:  # the first bytes of the copy: the process is inside it
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None:  # then read what it writes, until it has exited
            assert time.monotonic() < deadline, "the replay did not exit"
            if select.select([pipe], [], [], 0.05)[0]:
                os.read(pipe, 1 << 16)
    finally:
        os.close(pipe)
        if proc.poll() is None:
            proc.kill()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert out == f"{run_dir}\n"  # the run folder, printed as after a copy
    assert err.splitlines()[-1] == (f"tracebench replay: stopped by SIGTERM while writing {run_dir}/{COLUMNS_COPY}: "
                                    "not written; the run is whole without it")
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".") or "columns" in p.name) == []
    run = load_run(run_dir)  # whole: what the report reads, from requests.jsonl
    assert run.meta["status"] == "completed" and run.requests.height == n


# ---- 11, 12. the shutdown order; the summary line at --speed K -------------------------------------------------


def test_a_probe_under_way_at_the_end_does_not_fail_the_run(tmp_path: Path, shared_sim: str) -> None:
    n = 3
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=5)
    # the last request's stream is cut (the server stays healthy); its liveness probe answers after 2 s
    with proxy(shared_sim, "--break-nth", str(n), "--model-info-delay", "2") as url:
        result = run_cli("replay", str(trace), "--attach", url, "--run-name", "p", "--out-dir", str(tmp_path), "--quiet")
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "p")
    assert run["status"] == "completed" and run["error"] is None, run["error"]
    assert Counter(r["status"] for r in records) == {"ok": n - 1, "error": 1}


def test_summary_at_speed_k_gives_the_reports_duration(tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 30, rate=10, outputs=(20, 60))
    result = run_cli("replay", str(trace), "--backend", "sim", "--speed", "4", "--quiet", "--run-name", "k",
                     "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    said = re.search(r"completed in ([0-9.]+) s of run time \(--speed 4: ([0-9.]+) simulated s from the first "
                     r"arrival to the last completed finish, as tracebench report counts them\)", result.stderr)
    assert said, result.stderr
    report = run_cli("report", str(tmp_path / "k"), "--format", "json")
    assert report.returncode == 0, report.stderr
    duration = json.loads(report.stdout)["runs"][0]["throughput"]["duration"]
    assert abs(float(said[2]) - duration) < 0.05, (said[0], duration)
    run = json.loads((tmp_path / "k" / "run.json").read_text())
    assert abs(float(said[1]) - run["t_end"]) < 0.05


# ---- issue 24: a dead router is named as the cause every time --------------------------------------------------


def test_a_router_refusing_connections_before_it_is_seen_to_exit_is_named_by_its_exit(tmp_path: Path) -> None:
    """A killed process refuses connections a moment before it can be reaped; the probe must name its exit, not the
    refused connection it saw first. Here the window is made wide: a process with no listener that exits 0.5 s later."""
    import asyncio

    pytest.importorskip("sglang_router")
    from tracebench.replay.client import SglangClient
    from tracebench.replay.external_router import SglangRouter
    from tracebench.replay.servers import Fleet, ServerPlan

    router = SglangRouter("cache_aware", (), [], tmp_path)
    router.plan = ServerPlan(index=0, url=f"http://127.0.0.1:{free_port()}", log=tmp_path / "router.log", port=None,
                             command=[sys.executable, "-c", "import time; time.sleep(0.5); raise SystemExit(3)"])
    router.fleet = Fleet("sglang-router", [router.plan])
    router.fleet.procs[0] = subprocess.Popen(router.plan.command)

    async def probe() -> str | None:
        client = SglangClient(None, True)
        try:
            return await router.health_check(client)(0)
        finally:
            await client.close()

    try:
        assert asyncio.run(probe()) == "sglang-router exited with code 3"
    finally:
        router.fleet.procs[0].kill()
        router.fleet.procs[0].wait()


# ---- issue 33 B7: the client's pool against a server that closes idle connections ------------------------------


def test_no_request_is_written_into_a_connection_the_server_closes_for_idling(tmp_path: Path, shared_sim: str) -> None:
    """sglang's uvicorn closes a connection idle for 5 s; aiohttp kept idle connections 15 s and reuses the one idle
    longest first, so a request could be written into a connection the server was closing: "Connection reset by
    peer" / ServerDisconnectedError, 2 of 7,961 on GPUs. Here the server side (tests/fault_proxy.py --idle-reset 0.8)
    resets every request that comes on a connection idle for more than 0.8 s: two bursts 1.5 s apart. A client pool
    that keeps connections longer than the server (--keepalive 3, like the 4 s default against a 0.8 s server) loses
    the second burst; one below it (--keepalive 0.5) loses nothing."""
    burst = [format_request_line(i, 0.002 * i, 16, 4) for i in range(8)]
    burst += [format_request_line(8 + i, 1.5 + 0.002 * i, 16, 4) for i in range(8)]
    trace = write_trace(tmp_path / "t.jsonl", {"num_requests": 16, "duration_s": 1.514}, burst)
    errors = {}
    with proxy(shared_sim, "--idle-reset", "0.8") as server:
        for keepalive in ("3", "0.5"):
            result = run_cli("replay", str(trace), "--attach", server, "--keepalive", keepalive, "--poll-interval",
                             "5", "--metrics-interval", "0", "--quiet", "--run-name", f"k{keepalive}", "--out-dir",
                             str(tmp_path), timeout=60)
            # the longer pool: when its liveness probe after a reset meets a reset too, the server is taken for
            # down and the run fails (exit 1); whether the probe draws such a connection varies
            assert result.returncode in ((0, 1) if keepalive == "3" else (0,)), result.stderr
            run, records = read_run(tmp_path / f"k{keepalive}")
            check_every_request_once(records, 16)
            errors[keepalive] = [r for r in records if r["status"] == "error"]
            assert run["options"]["keepalive"] == float(keepalive)
    # the longer pool writes the second burst into connections the server has given up: they fail
    assert errors["3"] and all(r["id"] >= 8 and "Server disconnected" in r["error"] for r in errors["3"]), errors["3"]
    assert not errors["0.5"], errors["0.5"]

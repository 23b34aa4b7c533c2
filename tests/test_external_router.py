"""`tracebench replay --router sglang-router`: sglang's own router (sglang-router 0.3.2, a real process) in front of
two simulated servers (real processes). The end-to-end tests need the extra `tracebench[router]` (`make test`
installs it) and are skipped, with the reason shown, where it is missing."""

from __future__ import annotations

import json
import os
import signal
from collections import Counter
from importlib import metadata
from pathlib import Path

import pytest

from conftest import REPO, run_cli, run_cli_in_process, wait_served
from test_replay_run import (
    check_every_request_once, check_ok_order, group_gone, port_base, read_run, start_replay, wait_running,
    write_trace_file,
)
from tracebench.errors import ConfigError
from tracebench.replay.external_router import installed_version, parse_counters
from tracebench.replay.run import ReplayConfig

try:
    ROUTER_VERSION: str | None = metadata.version("sglang-router")
except metadata.PackageNotFoundError:
    ROUTER_VERSION = None
needs_router = pytest.mark.skipif(
    ROUTER_VERSION != "0.3.2",
    reason=f"sglang-router 0.3.2 is not installed (found {ROUTER_VERSION}): pip install -e '.[router]'",
)


@pytest.mark.parametrize("options, message", [
    (dict(cap_schedule="10s:2"), "--cap-schedule cannot be used with --router sglang-router"),
    (dict(control_port=4000), "--control-port cannot be used with --router sglang-router"),
    (dict(policy_options=(("key", "input"),)), "--policy-opt cannot be used with --router sglang-router"),
    (dict(mode="static", batch_size=4), "--batch-size cannot be used with --router sglang-router"),
    (dict(router_args=("--port 9",)), "--router-arg --port: tracebench sets --port itself"),
    (dict(router_args=("--disable-retries=false",)), "tracebench sets --disable-retries itself"),
    (dict(router_policy="manual"), "--router-policy must be one of"),
    (dict(attach=("http://127.0.0.1:1",), vocab_size=32000, max_running_requests=4),
     "attached servers keep the one they were started with"),
])
def test_refused_behind_sglang_router(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ReplayConfig(trace=Path("t.jsonl"), backend=None if "attach" in options else "sim", router="sglang-router",
                     **options).resolve()


def test_router_options_need_the_router() -> None:
    for options in (dict(router_policy="random"), dict(router_args=("--cache-threshold 0.5",))):
        with pytest.raises(ConfigError, match="is for --router sglang-router"):
            ReplayConfig(trace=Path("t.jsonl"), backend="sim", **options).resolve()
    cfg = ReplayConfig(trace=Path("t.jsonl"), backend="sim", router="sglang-router", max_running_requests=8).resolve()
    assert cfg.router_policy == "cache_aware" and cfg.max_running_requests == 8  # the launched servers' own cap


def test_explicit_policy_refused_on_the_command_line(tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 3, rate=10)
    # refused before anything starts (no server, no event loop): answered in this process as the process answers it
    result = run_cli_in_process("replay", str(trace), "--backend", "sim", "--router", "sglang-router", "--policy",
                                "sjf", "--out-dir", str(tmp_path / "runs"))
    assert result.returncode == 2
    assert "--policy is tracebench's router; with --router sglang-router give --router-policy" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_missing_package_names_the_extra() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'tracebench\[router\]'"):
        installed_version("sglang-router-not-installed")


def test_counters_from_a_real_sglang_metrics_body() -> None:
    # the full /metrics of a real sglang 0.5.17 (one stream and 38 non-stream requests, a prefix cache hit)
    text = (REPO / ".DUCUMENT/captures/h200-2026-11-22/metricsA.txt").read_text()
    assert parse_counters(text) == {"requests": 39.0, "prompt_tokens": 6162.0, "generation_tokens": 6540.0,
                                    "cached_tokens": 1842.0}
    assert parse_counters("")["requests"] is None  # a server started without --enable-metrics


@needs_router
def test_run_through_sglang_router(tmp_path: Path) -> None:
    n = 200
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=100 / 20)  # 100 req/s of run time at --speed 20
    result = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "20", "--port-base",
                     port_base(), "--router", "sglang-router", "--router-policy", "round_robin", "--run-name", "rr",
                     "--out-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "2 server(s) behind sglang-router 0.3.2 --policy round_robin" in result.stderr
    run, records = read_run(tmp_path / "rr")
    check_every_request_once(records, n)
    assert Counter(r["status"] for r in records) == {"ok": n}
    check_ok_order(records)  # sglang's own stamps lie between dispatch (to the router) and finish
    assert all(r["server"] is None for r in records)  # sglang-router does not say which server served it
    ext = run["external_router"]
    assert ext["version"] == "0.3.2" and ext["policy"] == "round_robin" and run["policy"]["name"] == "sglang-router-round_robin"
    command = ext["command"]
    for flag, value in (("--host", "127.0.0.1"), ("--prometheus-host", "127.0.0.1"), ("--policy", "round_robin")):
        assert command[command.index(flag) + 1] == value
    assert "--disable-retries" in command and "--disable-circuit-breaker" in command
    assert command[command.index("--worker-urls") + 1:] == [s["url"] for s in run["servers"]]
    assert ext["env"]["HF_ENDPOINT"].startswith("http://127.0.0.1:")
    assert "Starting router on 127.0.0.1:" in ext["startup_line"] and "RoundRobin" in ext["startup_line"]
    assert {w["url"] for w in ext["workers"] if w["is_healthy"]} == {s["url"] for s in run["servers"]}
    # per-server figures from the servers' own counters add up to what the records say
    counters = ext["server_counters"]
    assert [c["error"] for c in counters] == [None, None]
    assert sum(c["requests"] for c in counters) == n
    assert sum(c["prompt_tokens"] for c in counters) == sum(r["prompt_tokens"] for r in records)
    assert sum(c["generation_tokens"] for c in counters) == sum(r["completion_tokens"] for r in records)
    assert abs(counters[0]["requests"] - counters[1]["requests"]) <= 1  # round robin over two workers
    # sglang-router's own per-worker count of 2xx answers agrees with the servers' counters
    assert [c["routed_ok"] for c in counters] == [c["requests"] for c in counters]
    assert [c["routed_failed"] for c in counters] == [0, 0]
    assert run["caps"]["initial"] == [None, None] and run["control_url"] is None
    report = run_cli("report", str(tmp_path / "rr"))
    assert report.returncode == 0, report.stderr
    assert "via sglang-router" in report.stdout
    row = next(line for line in report.stdout.splitlines() if f"0 {run['servers'][0]['url']}" in line)
    assert f" {counters[0]['requests']} " in row


@needs_router
def test_ctrl_c_through_sglang_router(tmp_path: Path) -> None:
    n = 400
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=100 / 2, outputs=(32, 64))  # 100 req/s of run time
    proc = start_replay(str(trace), "--backend", "sim", "--gpus", "2", "--speed", "2", "--port-base", port_base(),
                        "--router", "sglang-router", "--run-name", "int", "--out-dir", str(tmp_path), "--quiet",
                        cwd=tmp_path)
    run_dir = tmp_path / "int"
    wait_running(run_dir, proc)
    run = json.loads((run_dir / "run.json").read_text())
    pids = [s["pid"] for s in run["servers"]] + [run["external_router"]["pid"]]
    # the servers' count leads the client's records by the answers still on their way to it: a margin of 5 (at load
    # 3-4, 20 of 21 served were read before the Ctrl-C)
    wait_served([s["url"] for s in run["servers"]], 26)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert all(group_gone(pid) for pid in pids), "the router or a server outlived the run"
    run, records = read_run(run_dir)
    check_every_request_once(records, n)
    statuses = Counter(r["status"] for r in records)
    assert set(statuses) <= {"ok", "cancelled", "not_sent"} and statuses["ok"] > 20 and statuses["not_sent"]
    assert run["status"] == "interrupted"
    assert all(r["t_dispatch"] is None for r in records if r["status"] == "not_sent")
    assert any(r["t_dispatch"] is not None for r in records if r["status"] == "cancelled")  # in flight at Ctrl-C
    assert all(c["requests"] >= 0 for c in run["external_router"]["server_counters"])


@needs_router
def test_dying_sglang_router_fails_the_run(tmp_path: Path) -> None:
    # 400 requests (6.7 s of run time): the run stops when the router dies, a few hundred never sent however late
    n = 400
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=60 / 4, outputs=(32, 64))  # 60 req/s of run time
    proc = start_replay(str(trace), "--backend", "sim", "--gpus", "2", "--speed", "4", "--port-base", port_base(),
                        "--router", "sglang-router", "--run-name", "dead", "--out-dir", str(tmp_path), "--quiet",
                        cwd=tmp_path)
    wait_running(tmp_path / "dead", proc)
    run = json.loads((tmp_path / "dead" / "run.json").read_text())
    wait_served([s["url"] for s in run["servers"]], 11)
    router_pid = run["external_router"]["pid"]
    os.kill(router_pid, signal.SIGKILL)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1, stderr
    assert "sglang-router exited with code -9" in stderr and "Traceback" not in stderr
    assert all(group_gone(s["pid"]) for s in run["servers"])
    run, records = read_run(tmp_path / "dead")
    check_every_request_once(records, n)
    statuses = Counter(r["status"] for r in records)
    # in flight when it died: error (the connection dropped); the rest never sent: not_sent
    assert set(statuses) <= {"ok", "error", "cancelled", "not_sent"} and statuses["ok"] > 10 and statuses["not_sent"]
    assert run["status"] == "failed"
    (down,) = run["events"]  # about sglang-router, not about servers[0]
    assert down["kind"] == "server_down" and down["server"] is None and down["detail"].startswith("sglang-router (")


@needs_router
def test_router_start_failure_is_reported(tmp_path: Path) -> None:
    trace = write_trace_file(tmp_path / "t.jsonl", 5, rate=10)
    result = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--port-base", port_base(),
                     "--router", "sglang-router", "--router-arg", "--no-such-flag", "--run-name", "f",
                     "--out-dir", str(tmp_path))
    assert result.returncode == 1
    assert "sglang-router (http://127.0.0.1:" in result.stderr and "exited with code 2 while starting" in result.stderr
    assert "unrecognized arguments: --no-such-flag" in result.stderr  # the end of its log
    # the run never started: run.json says so, and no request is recorded as failed (issue 15)
    run = json.loads((tmp_path / "f" / "run.json").read_text())
    assert run["status"] == "not_started" and "ServerStartError" in run["error"] and "sglang-router" in run["error"]
    assert not (tmp_path / "f" / "requests.jsonl").exists()
    assert all(group_gone(s["pid"]) for s in run["servers"])


def test_router_metrics_without_the_labels_read_are_refused() -> None:
    from tracebench.errors import ServerProtocolError
    from tracebench.replay.external_router import routed_outcomes

    good = 'smg_worker_cb_outcomes_total{worker="http://127.0.0.1:1",outcome="success"} 3\n'
    assert routed_outcomes(good) == {("http://127.0.0.1:1", "success"): 3}
    with pytest.raises(ServerProtocolError, match="lacks the worker or outcome label"):
        routed_outcomes('smg_worker_cb_outcomes_total{url="http://127.0.0.1:1",outcome="success"} 3\n')

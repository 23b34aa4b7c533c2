"""replay --adapt-speed (issue 24): a run the host could not hold at --speed K is made again at a lower K, said."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli, run_cli_in_process
from tracebench.speedguard import Attempt, next_speed


def attempt(speed: float, worst: float) -> Attempt:
    return Attempt(speed=speed, shares={"ttft p50": worst, "total p99": worst / 10}, bound=0.06)


def test_next_speed_follows_the_lag_measured_and_at_least_halves() -> None:
    assert next_speed(attempt(200, 3.0)) == 4       # 200 x 6% / 300%
    assert next_speed(attempt(4, 0.11)) == 2        # 4 x 6% / 11% = 2.2 -> 2
    assert next_speed(attempt(4, 0.07)) == 2        # 3.4, but never more than K / 2
    assert next_speed(attempt(3, 0.085)) == 1       # 1.5 -> 1
    assert next_speed(attempt(2, 50.0)) == 1        # never below 1
    assert attempt(4, 0.06).held and not attempt(4, 0.0601).held


def test_adapt_speed_needs_a_simulated_speed_above_1(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "40", "--num-requests", "4", "--seed", "0", "-o", str(trace)).returncode == 0
    for extra in ((), ("--speed", "1")):
        # refused before anything starts (no server, no event loop): answered in this process as the process answers it
        done = run_cli_in_process("replay", str(trace), "--backend", "sim", "--adapt-speed", *extra, "--out-dir",
                                  str(tmp_path))
        assert done.returncode == 2 and "--adapt-speed: give --speed K > 1" in done.stderr, done.stderr
    assert not (tmp_path / "reports").exists() and len(list(tmp_path.iterdir())) == 1   # nothing ran


def test_adapt_speed_lowers_a_speed_the_host_cannot_hold_and_says_so(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "40", "--num-requests", "16", "--seed", "0", "--input-len", "256",
                   "--output-len", "16", "-o", str(trace)).returncode == 0
    # at --speed 1000 a 20 ms step is 20 us of wall time: any host's lag, x 1000, is most of every latency
    done = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "1000", "--adapt-speed",
                   "--run-name", "a", "--out-dir", str(tmp_path / "out"), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "the host could not hold --speed 1000" in done.stderr and "replaying again at --speed" in done.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["a"]     # the lagged attempt was deleted
    meta = json.loads((tmp_path / "out" / "a" / "run.json").read_text())
    guard = meta["speed_guard"]
    assert guard["requested"] == 1000 and guard["used"] == meta["speed"] < 1000
    assert guard["attempts"][0]["speed"] == 1000 and not guard["attempts"][0]["held"]
    assert [a["speed"] for a in guard["attempts"]][-1] == meta["speed"]
    assert guard["held"] == guard["attempts"][-1]["held"] and (guard["held"] or meta["speed"] == 1)
    report = run_cli("report", str(tmp_path / "out" / "a"), "--format", "json", "--bootstrap", "0")
    assert report.returncode == 0, report.stderr
    assert "not the 1000 asked for: --adapt-speed found the host could not hold" in report.stdout

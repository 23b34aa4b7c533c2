"""Each built-in policy's defining behaviour, seen in the requests.jsonl of a real `tracebench replay` against two
simulated servers on the virtual clock (`--clock virtual`: the policy, the router and the model are a real-time run's,
HTTP is not the point here), and the example policy run from its file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, run_cli
from tracebench.trace.format import format_request_line, write_trace

Row = tuple[float, int, int]  # arrival (run seconds), input_len, output_len
SPEED = 10  # the rows below are in tenths of the trace's seconds (they were written for --speed 10 runs)


def write(path: Path, rows: list[Row]) -> Path:
    """A trace whose requests arrive at the given times × SPEED (trace seconds)."""
    lines = [format_request_line(i, arrival * SPEED, ilen, olen) for i, (arrival, ilen, olen) in enumerate(rows)]
    return write_trace(path, {"num_requests": len(rows), "duration_s": rows[-1][0] * SPEED}, lines)


def replay(tmp_path: Path, trace: Path, name: str, *args: str) -> tuple[list[dict], dict]:
    """Run the replay (2 simulated servers, virtual clock); the records sorted by dispatch time, and run.json."""
    proc = run_cli(
        "replay", str(trace), "--clock", "virtual", "--gpus", "2",
        "--out-dir", str(tmp_path / "runs"), "--run-name", name, "--quiet", *args, cwd=REPO, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    run_dir = tmp_path / "runs" / name
    records = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" for r in records), [r for r in records if r["status"] != "ok"][:3]
    records.sort(key=lambda r: (r["t_dispatch"], r["id"]))
    return records, json.loads((run_dir / "run.json").read_text())


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("traces")
    # spaced short requests: each finishes well before the next arrives
    spaced = [(i * 0.02, 64, 16) for i in range(40)]
    # one long request, then short ones that each finish before the next arrives
    one_long = [(0.0, 64, 1000)] + [(0.05 + i * 0.035, 64, 8) for i in range(10)]
    # two long requests fill both servers (cap 1); ten more queue at the router with lengths in no order
    outputs = [90, 10, 70, 30, 50, 20, 80, 40, 60, 100]
    inputs = [300, 900, 100, 700, 500, 800, 200, 1000, 400, 600]
    # (the ten come 0.2 s after the two: a replay loop that starts late on a busy machine still assigns the two
    # long ones first, alone in the queue)
    queued_up = [(0.0, 64, 1000), (0.0, 64, 1000)] + [
        (0.2 + i * 0.005, ilen, olen) for i, (ilen, olen) in enumerate(zip(inputs, outputs))
    ]
    burst = [(i * 0.002, 64, 16) for i in range(200)]
    return {name: write(d / f"{name}.jsonl", rows) for name, rows in
            [("spaced", spaced), ("one_long", one_long), ("queued_up", queued_up), ("burst", burst)]}


def test_round_robin_alternates(tmp_path: Path, traces: dict[str, Path]) -> None:
    records, run = replay(tmp_path, traces["spaced"], "rr", "--policy", "round_robin")
    assert run["policy"]["name"] == "round_robin"
    assert [r["server"] for r in records] == [0, 1] * 20


def assert_avoids_the_busy_server(records: list[dict]) -> None:
    """While the long request (id 0) runs, a short one that finds the other server empty must go there (1 in
    flight against 0). If the previous short one is still running there (a slow CI machine), it is a tie."""
    long_one = next(r for r in records if r["id"] == 0)
    other = 1 - long_one["server"]
    during = [r for r in records if long_one["t_dispatch"] < r["t_dispatch"] < long_one["t_finish"]]
    assert len(during) >= 8, "the long request should outlast most short ones"

    def other_busy(at: float) -> bool:
        return any(q["server"] == other and q["t_dispatch"] <= at <= q["t_finish"] + 0.005 for q in during)

    wrong = [r["id"] for r in during if r["server"] != other and not other_busy(r["t_dispatch"])]
    assert wrong == [], f"sent to the busy server {long_one['server']} while server {other} was empty"
    assert sum(r["server"] == other for r in during) >= 6


def test_least_outstanding_avoids_the_busy_server(tmp_path: Path, traces: dict[str, Path]) -> None:
    records, _ = replay(tmp_path, traces["one_long"], "lo", "--policy", "least_outstanding")
    assert_avoids_the_busy_server(records)


@pytest.mark.parametrize("key_args, length_field", [((), "output_len"), (("--sjf-key", "input"), "input_len")])
def test_sjf_dispatches_the_shortest_queued_first(
    tmp_path: Path, traces: dict[str, Path], key_args: tuple[str, ...], length_field: str
) -> None:
    records, run = replay(tmp_path, traces["queued_up"], "sjf", "--policy", "sjf", "--max-running-requests", "1",
                          *key_args)
    assert run["policy"]["settings"]["key"] == length_field.split("_")[0]
    # independent of timing: whichever two went first (a loaded machine may release request 2 before the first
    # assignment round, and sjf then rightly prefers it to request 1), every request dispatched after the last
    # arrival was chosen from a queue holding all of the rest: they go shortest first
    last_arrival = max(r["t_released"] for r in records)
    first_two = records[:2]
    assert last_arrival < min(r["t_finish"] for r in first_two), "the rest must all be queued before a slot frees"
    queued = [r for r in records if r["t_dispatch"] > last_arrival]
    assert len(queued) == 10
    lengths = [r[length_field] for r in queued]
    assert lengths == sorted(lengths)
    assert [r["id"] for r in queued] != sorted(r["id"] for r in queued)  # not first-come-first-served


def test_random_is_uniform_and_seeded(tmp_path: Path, traces: dict[str, Path]) -> None:
    def servers_by_id(name: str, seed: str) -> list[int]:
        records, _ = replay(tmp_path, traces["burst"], name, "--policy", "random", "--seed", seed)
        return [r["server"] for r in sorted(records, key=lambda r: r["id"])]

    first = servers_by_id("random-a", "5")
    assert 70 <= first.count(0) <= 130  # binomial(200, 1/2): +-30 is over 4 standard deviations
    assert servers_by_id("random-b", "5") == first  # same seed, same choices
    assert servers_by_id("random-c", "6") != first


@pytest.mark.parametrize("spec", ["policies/example_least_loaded.py:LeastLoaded", "example_least_loaded"])
def test_example_policy_runs_from_its_file(tmp_path: Path, traces: dict[str, Path], spec: str) -> None:
    records, run = replay(tmp_path, traces["one_long"], "example", "--policy", spec,
                          "--policy-opt", "waiting_weight=2")
    assert run["policy"]["name"] == "least_loaded"
    assert run["policy"]["file"] == "policies/example_least_loaded.py"  # relative to the working folder (REPO)
    assert run["policy"]["settings"] == {"waiting_weight": 2.0}
    assert_avoids_the_busy_server(records)


@pytest.mark.parametrize("policy", ["power_of_two", "param_aware"])
def test_load_aware_policies_run_under_a_cap(tmp_path: Path, traces: dict[str, Path], policy: str) -> None:
    # a burst at cap 2: requests queue at the router and every assignment is checked against free slots
    records, run = replay(tmp_path, traces["burst"], policy, "--policy", policy, "--max-running-requests", "2")
    assert run["policy"]["name"] == policy and len(records) == 200
    for server in (0, 1):
        mine = [r for r in records if r["server"] == server]
        assert len(mine) >= 60  # both servers used, neither starved
        # never more than the cap in flight, reconstructed from the records
        events = sorted([(r["t_dispatch"], 1) for r in mine] + [(r["t_finish"], -1) for r in mine],
                        key=lambda e: (e[0], e[1]))
        level = peak = 0
        for _, step in events:
            level += step
            peak = max(peak, level)
        assert peak <= 2

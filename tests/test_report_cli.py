"""`tracebench report` on run folders written by real replays against sim servers (real processes, real HTTP).

The replays run once for the module: one trace replayed with a roomy cap (`wide`) and with cap 1 (`narrow`, so
requests wait at the router), a second trace (`other`), and a replay stopped with SIGINT (`stopped`). Every number
the report prints is checked against an independent computation from requests.jsonl here (json + numpy). The replays
run at --speed 10, so requests.jsonl is on a 10 times compressed run clock and the report is in simulated seconds:
`_records` multiplies every time by run.json's speed, as the report must."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import select
import shutil
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from conftest import free_port, run_cli, tracebench_cmd, wait_served
from test_replay_run import wait_running

SPEED = "10"
TIME_FIELDS = ("t_arrival", "t_released", "t_dispatch", "t_first_token", "t_finish", "server_e2e_latency",
               "server_queue_time", "server_received", "server_forward_entry", "server_prefill_finished", "server_finished")


def _replay_cmd(trace: Path, out: Path, name: str, port_base: int, *args: str, speed: str = SPEED) -> list[str]:
    return tracebench_cmd("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", speed,
                          "--policy", "round_robin", "--out-dir", str(out), "--run-name", name, "--quiet",
                          "--port-base", str(port_base), *args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with reports/{wide,narrow,other,stopped}, each written by `tracebench replay`."""
    root = tmp_path_factory.mktemp("report-runs")
    out = root / "reports"
    trace, other_trace = root / "traces" / "a.jsonl", root / "traces" / "b.jsonl"
    # 10 req/s of trace time: at --speed 10, 100 requests per run second (a 300-request trace runs 3 s)
    for path, seed, num in ((trace, "1", "300"), (other_trace, "2", "60")):
        done = run_cli("generate", "--rate", "10", "--num-requests", num, "--seed", seed, "--input-len", "200",
                       "--output-len", "50", "-o", str(path))
        assert done.returncode == 0, done.stderr
    # one draw of 8 free ports for the four runs started together (two each): separate draws once gave two of them
    # the same base, and one run's requests went to the other's servers
    base = free_port(8)
    procs = {
        "wide": subprocess.Popen(_replay_cmd(trace, out, "wide", base, "--max-running-requests", "8"),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        "narrow": subprocess.Popen(_replay_cmd(trace, out, "narrow", base + 2, "--max-running-requests", "1"),
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        "other": subprocess.Popen(_replay_cmd(other_trace, out, "other", base + 4, "--max-running-requests", "8"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
        # at --speed 2 a request of 200 in / 50 out is ~0.13 s on its server: the two in flight when Ctrl-C comes are
        # still running when the replay handles it, however busy the machine (at --speed 10, ~25 ms: a loaded
        # machine's late signal handling let them finish, and the run had nothing to cancel)
        "stopped": subprocess.Popen(_replay_cmd(trace, out, "stopped", base + 6, "--max-running-requests", "1", speed="2"),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT),
    }
    # stop one replay with Ctrl-C early in its run (the trace lasts 30 trace seconds, 3 s of run time; with cap 1 the
    # run lasts longer): the replay prints its "control:" line when its clock starts
    stopped = procs["stopped"]
    assert stopped.stdout is not None
    seen, deadline = b"", time.monotonic() + 60
    while b"control:" not in seen and time.monotonic() < deadline and stopped.poll() is None:
        if select.select([stopped.stdout], [], [], 0.1)[0]:
            seen += os.read(stopped.stdout.fileno(), 4096)
    assert b"control:" in seen, seen.decode()
    # independent of timing: Ctrl-C once its two servers (cap 1, the queue long) have finished 10 requests, so the
    # run has finished ones and two in flight to cancel however late a busy machine started it
    meta = wait_running(out / "stopped", stopped)
    wait_served([s["url"] for s in meta["servers"]], 10)
    stopped.send_signal(signal.SIGINT)
    for name, proc in procs.items():
        output = proc.communicate(timeout=120)[0].decode()
        expected = 130 if name == "stopped" else 0
        assert proc.returncode == expected, f"replay {name} exited {proc.returncode}:\n{output}"
    return root


def _report(runs: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("report", *args, cwd=runs)


def _report_json(runs: Path, *args: str) -> dict:
    done = _report(runs, *args, "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _raw_records(runs: Path, name: str) -> list[dict]:
    """requests.jsonl as written: times in run seconds."""
    with (runs / "reports" / name / "requests.jsonl").open() as fh:
        return [json.loads(line) for line in fh]


def _intake(r: dict, meta: dict, k: float) -> float:
    """docs/report.md: dispatch -> the simulator's request_received_ts (its modelled intake: request_hop_s)."""
    return _modelled_hop(r["server_received"] - r["t_dispatch"], r, meta, "request_hop_s", k)


def _answer_end(r: dict, meta: dict, k: float) -> float:
    """docs/report.md: the simulator's request_finished_ts -> the client's read of the answer's end (its modelled
    part: answer_end_s)."""
    return _modelled_hop(r["t_finish"] - r["server_finished"], r, meta, "answer_end_s", k)


def _modelled_hop(hop: float, r: dict, meta: dict, key: str, k: float) -> float:
    """A run-clock hop in simulated seconds: the part its server models (up to tracebench_sim[key] / K of the run
    clock) x K, the rest as measured."""
    paced = meta["servers"][r["server"]]["server_info"]["tracebench_sim"][key] / k
    return hop + min(max(hop, 0.0), paced) * (k - 1)


def _capped_dispatch(records: list[dict], meta: dict, k: float) -> dict[int, float]:
    """docs/report.md: a capped run's dispatch is the latest event before it (its release, a finish that freed a slot,
    a cap change) on the simulated timeline plus the host time since; computed request by request in dispatch order."""
    out: dict[int, float] = {}
    finishes: list[tuple[float, float]] = []   # (run-clock finish, simulated finish) of the requests taken so far
    changes = [c["t"] for c in meta["caps"]["changes"]]
    for r in sorted((r for r in records if r["t_dispatch"] is not None), key=lambda r: r["t_dispatch"]):
        d = r["t_dispatch"]
        candidates = [r["t_arrival"] * k + (r["t_released"] - r["t_arrival"]) + (d - r["t_released"])]
        done = [f for f in finishes if f[0] <= d]
        if done:
            candidates.append(max(sim for _, sim in done) + d - max(run for run, _ in done))
        candidates += [k * t + d - t for t in changes if t <= d][-1:]
        out[r["id"]] = dispatch = max(candidates)
        if r["t_finish"] is not None:
            if r["server_received"] is not None and r["server_finished"] is not None:
                finish = (dispatch + _intake(r, meta, k) + (r["server_finished"] - r["server_received"]) * k
                          + _answer_end(r, meta, k))
            else:
                finish = dispatch + (r["t_finish"] - d) * k
            finishes.append((r["t_finish"], finish))
    return out


def _records(runs: Path, name: str) -> list[dict]:
    """requests.jsonl in simulated seconds, as docs/report.md defines it for a run at --speed K: the simulator's time
    (its modelled intake, request_received_ts -> its other stamps, its modelled answer's end) x K, tracebench's host
    time (release lag, the HTTP hops beyond what the simulator models, the router wait of an uncapped run) as
    measured, the arrival x K."""
    meta = json.loads((runs / "reports" / name / "run.json").read_text())
    k = meta["speed"]
    assert k == (2.0 if name == "stopped" else float(SPEED))
    uncapped = meta["mode"] == "continuous" and all(c is None for c in meta["caps"]["initial"]) and not meta["caps"]["changes"]
    out_delay = [s["server_info"]["tracebench_sim"]["output_s"] for s in meta["servers"]]
    records = _raw_records(runs, name)
    dispatch_sim = {} if uncapped else _capped_dispatch(records, meta, k)
    for r in records:
        raw = dict(r)
        r["t_arrival"] = raw["t_arrival"] * k
        if raw["t_released"] is not None:
            r["t_released"] = r["t_arrival"] + raw["t_released"] - raw["t_arrival"]
        if raw["t_admitted"] is not None:  # without --max-concurrency admitted at the release: host time after it
            assert meta["max_concurrency"] is None
            r["t_admitted"] = r["t_released"] + (raw["t_admitted"] - raw["t_released"])
        if raw["t_dispatch"] is not None:  # capped: after the release or the finish that freed its slot, + host time
            r["t_dispatch"] = (r["t_released"] + raw["t_dispatch"] - raw["t_released"]) if uncapped else dispatch_sim[r["id"]]
        for field in ("server_e2e_latency", "server_queue_time", "itl_max"):
            if raw[field] is not None:
                r[field] = raw[field] * k
        if raw["server_received"] is not None and raw["server_finished"] is not None:
            received = r["t_dispatch"] + _intake(raw, meta, k)
            for field in ("server_received", "server_forward_entry", "server_prefill_finished", "server_finished"):
                r[field] = received + (raw[field] - raw["server_received"]) * k
            r["t_finish"] = r["server_finished"] + _answer_end(raw, meta, k)
            if raw["t_first_token"] is not None:
                o = out_delay[raw["server"]]
                r["t_first_token"] = r["server_prefill_finished"] + o + raw["t_first_token"] - (raw["server_prefill_finished"] + o / k)
        else:
            assert raw["status"] != "ok", "an ok record of a launched simulator has its stamps"
            for field in ("t_first_token", "t_finish"):
                if raw[field] is not None:
                    if raw["t_dispatch"] is not None:
                        r[field] = r["t_dispatch"] + (raw[field] - raw["t_dispatch"]) * k
                    elif raw["t_released"] is not None and uncapped:
                        r[field] = r["t_released"] + raw[field] - raw["t_released"]
                    else:
                        r[field] = raw[field] * k
        # the breakdown's stamps: host time around the stamp they follow or precede, sglang's dispatch inside it
        streamed = raw["t_first_token"] is not None
        for field, anchor in (("t_assigned", "t_dispatch"), ("t_built", "t_dispatch"), ("t_written", "t_dispatch"),
                              ("t_headers", "t_dispatch" if streamed else "t_finish"), ("t_last_chunk", "t_finish"),
                              ("t_parsed", "t_finish"), ("server_first_sent", "t_first_token" if streamed else "t_finish")):
            if raw[field] is not None:  # (the difference first: 0 stays 0 exactly; no anchor: unknown, as speed.py)
                r[field] = None if raw[anchor] is None else r[anchor] + (raw[field] - raw[anchor])
        if raw["server_dispatched"] is not None:
            r["server_dispatched"] = r["server_received"] + (raw["server_dispatched"] - raw["server_received"]) * k
    return records


def _close(a: float | None, b: float, rel: float = 1e-9) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=rel, abs_tol=1e-12)


def _latencies(ok: list[dict]) -> dict[str, np.ndarray]:
    def arr(values):
        return np.array([v for v in values if v is not None], dtype=float)

    return {
        "total": arr(r["t_finish"] - r["t_arrival"] for r in ok),
        "router_wait": arr(r["t_dispatch"] - r["t_admitted"] for r in ok),  # the router queue: admitted -> dispatched
        "server_client": arr(r["t_finish"] - r["t_dispatch"] for r in ok),
        "server_sglang": arr(r["server_e2e_latency"] for r in ok),
        "ttft": arr(r["t_first_token"] - r["t_arrival"] if r["t_first_token"] is not None else None for r in ok),
        "ttft_dispatch": arr(r["t_first_token"] - r["t_dispatch"] if r["t_first_token"] is not None else None for r in ok),
        "tpot": arr((r["t_finish"] - r["t_first_token"]) / (r["completion_tokens"] - 1)
                    if r["t_first_token"] is not None and r["completion_tokens"] > 1 else None for r in ok),
        "release_lag": arr(r["t_released"] - r["t_arrival"] for r in ok),
    }


# ------------------------------------------------------------------------------------------------ numbers

def test_numbers_equal_an_independent_computation(runs: Path) -> None:
    report = _report_json(runs, "wide", "narrow")
    assert report["baseline"] == "wide"
    for entry in report["runs"]:
        records = _records(runs, entry["label"])
        ok = [r for r in records if r["status"] == "ok"]
        assert entry["requests"]["ok"] == len(ok) == 300 and isinstance(entry["requests"]["ok"], int)
        assert entry["requests"]["error"] == entry["requests"]["timeout"] == entry["requests"]["cancelled"] == 0
        start = min(r["t_arrival"] for r in records)
        end = max(r["t_finish"] for r in ok)
        assert _close(entry["throughput"]["duration"], end - start)
        assert _close(entry["throughput"]["requests_per_s"], len(ok) / (end - start))
        assert _close(entry["throughput"]["input_tokens_per_s"], sum(r["input_len"] for r in ok) / (end - start))
        assert _close(entry["throughput"]["output_tokens_per_s"], sum(r["completion_tokens"] for r in ok) / (end - start))
        for key, values in _latencies(ok).items():
            assert values.size > 200, key
            stats = entry["latency"][key]
            assert _close(stats["mean"], float(values.mean())), key
            assert _close(stats["max"], float(values.max())), key
            for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
                assert _close(stats[name], float(np.percentile(values, q))), (key, name)
    wide, narrow = report["runs"]
    delta = narrow["delta"]["latency"]["total"]["p90"]
    expected = narrow["latency"]["total"]["p90"] - wide["latency"]["total"]["p90"]
    assert _close(delta["abs"], expected)
    assert _close(delta["pct"], expected / wide["latency"]["total"]["p90"] * 100)


def test_sped_up_run_is_reported_in_simulated_seconds(runs: Path, tmp_path: Path) -> None:
    """A --speed 10 run: the simulators' time x10, tracebench's host time as measured (not x10)."""
    speed = float(SPEED)
    report = _report_json(runs, "wide")
    entry = report["runs"][0]
    raw = _raw_records(runs, "wide")
    ok = [r for r in raw if r["status"] == "ok"]
    run_duration = max(r["t_finish"] for r in ok) - min(r["t_arrival"] for r in raw)  # run seconds, as recorded
    assert 2.5 < run_duration < 10  # the replay itself took seconds: its trace spans 30 trace seconds
    # the window is the trace's (x10) plus the last request's latency, whose host part is not x10
    assert run_duration * speed * 0.95 < entry["throughput"]["duration"] <= run_duration * speed
    for key, seconds, factor in (
        ("server_sglang", [r["server_e2e_latency"] for r in ok], speed),  # all inside the simulator
        ("release_lag", [r["t_released"] - r["t_arrival"] for r in ok], 1.0),  # all host time
    ):
        for stat, q in (("p50", 50), ("p99", 99)):
            assert _close(entry["latency"][key][stat], float(np.percentile(seconds, q)) * factor, rel=1e-9), (key, stat)
    # TTFT from dispatch: the simulator's part x10 plus the host's hops; less than the whole x10
    host = [r["t_first_token"] - r["t_dispatch"] - (r["server_prefill_finished"] - r["server_received"]) for r in ok]
    assert min(host) > 0
    assert entry["latency"]["ttft_dispatch"]["p50"] < float(np.percentile(
        [r["t_first_token"] - r["t_dispatch"] for r in ok], 50)) * speed
    meta = json.loads((runs / "reports" / "wide" / "run.json").read_text())
    assert _close(entry["t_end"], meta["t_end"] * speed, rel=1e-12)
    # every format says so
    assert entry["speed"] == speed and entry["times"].startswith("simulated seconds (simulator time x10, host time")
    assert report["notes"] and "simulated seconds" in report["notes"][0] and "wide at --speed 10" in report["notes"][0]
    table = _report(runs, "wide").stdout
    assert "times of sped-up runs are in simulated seconds (wide at --speed 10: simulator time x10" in table
    assert "speed 10x (simulated seconds)" in table
    tidy = _report(runs, "wide", "--format", "csv").stdout
    rows = {(r["metric"], r["stat"]): r["value"] for r in csv.DictReader(io.StringIO(tidy))}
    assert rows[("run", "speed")] == "10.0" and rows[("run", "times")] == entry["times"]
    assert "times of sped-up runs are in simulated seconds" in _report(runs, "wide", "--format", "md").stdout
    # the HTML page says it too: test_html_page_with_plots_and_png (one page of plots, ~3 s of CPU, made once)


def test_sped_up_run_compares_like_with_like_with_a_real_time_run(runs: Path, tmp_path: Path) -> None:
    """The wide run written as a real-time run would have recorded it (every time x10, speed null) compares equal
    to the sped-up original: no throughput or latency changes, only the speed setting differs."""
    real = tmp_path / "wide-real-time"
    shutil.copytree(runs / "reports" / "wide", real)
    meta = json.loads((real / "run.json").read_text())
    speed = meta["speed"]
    meta["speed"] = None
    meta["options"]["speed"] = None
    meta["t_end"] *= speed
    for change in meta["caps"]["changes"]:
        change["t"] *= speed
    (real / "run.json").write_text(json.dumps(meta))
    (real / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _records(runs, "wide")))
    report = _report_json(runs, "wide", str(real))
    assert report["runs"][1]["speed"] is None and report["runs"][1]["times"] == "seconds (run clock)"
    labels = [entry["label"] for entry in report["runs"]]  # both are named "wide": labelled by their folders
    assert report["config"]["changed"]["speed"] == dict(zip(labels, ["10x (simulated seconds)", "1x (real time)"]))
    for section in ("throughput", "latency"):
        for metric, delta in report["runs"][1]["delta"][section].items():
            if metric == "itl":  # its histogram buckets cannot be rescaled x10 (log buckets): only its max is
                assert abs(delta["max"]["abs"]) < 1e-9
                continue
            for d in delta.values() if section == "latency" else [delta]:
                assert d["abs"] is not None and abs(d["abs"]) < 1e-9, (section, metric, d)
    durations = [entry["throughput"]["duration"] for entry in report["runs"]]
    assert durations[0] == pytest.approx(durations[1], rel=1e-12)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    return total + (current_end - current_start if current_end is not None else 0.0)


def test_per_server_share_busy_time_and_balance(runs: Path) -> None:
    report = _report_json(runs, "wide", "narrow")
    for entry in report["runs"]:
        records = _records(runs, entry["label"])
        start = min(r["t_arrival"] for r in records)
        end = max(r["t_finish"] for r in records if r["status"] == "ok")
        dispatched = [r for r in records if r["t_dispatch"] is not None]
        for load in entry["servers"]:
            mine = [r for r in dispatched if r["server"] == load["server"]]
            spans = [(max(r["t_dispatch"], start), min(r["t_finish"], end)) for r in mine]
            assert load["requests"] == len(mine)
            assert _close(load["share"], len(mine) / len(dispatched))
            assert _close(load["busy_s"], _union_length(spans), rel=1e-6)
            assert _close(load["mean_in_flight"], sum(b - a for a, b in spans) / (end - start), rel=1e-6)
        counts = np.array([load["requests"] for load in entry["servers"]], dtype=float)
        assert _close(entry["balance"]["cv"], float(counts.std() / counts.mean()), rel=1e-9) or entry["balance"]["cv"] == 0
        # round robin over 2 servers: about half each (it skips a server whose cap is full)
        assert abs(counts[0] - counts[1]) <= 30 and entry["balance"]["verdict"] == "balanced"
    # cap 1 keeps at most one request in flight per server: a mean of at most 1
    assert all(load["mean_in_flight"] <= 1.0 + 1e-9 for load in report["runs"][1]["servers"])


def test_bootstrap_interval_matches_resampling_and_says_significant(runs: Path) -> None:
    report = _report_json(runs, "wide", "narrow", "--bootstrap", "2000", "--seed", "3")
    waits = {name: _latencies([r for r in _records(runs, name) if r["status"] == "ok"])["router_wait"]
             for name in ("wide", "narrow")}
    rng = np.random.default_rng(7)
    for stat, q in (("p50", 50), ("p90", 90)):
        # plain bootstrap: resample each run's requests with replacement, take the percentile, subtract
        draws = [np.percentile(waits[name][rng.integers(0, waits[name].size, (2000, waits[name].size))], q, axis=1)
                 for name in ("narrow", "wide")]
        low, high = np.percentile(draws[0] - draws[1], [2.5, 97.5])
        delta = report["runs"][1]["delta"]["latency"]["router_wait"][stat]
        width = high - low
        assert abs(delta["ci95_low"] - low) < 0.25 * width, (stat, delta, low, high)
        assert abs(delta["ci95_high"] - high) < 0.25 * width, (stat, delta, low, high)
        assert delta["ci95_low"] <= delta["abs"] <= delta["ci95_high"]
        # cap 1 makes requests queue at the router: far longer waits, and the interval says so
        assert delta["ci95_low"] > 0 and delta["significant"] is True
    table = _report(runs, "wide", "narrow").stdout
    wait_p90 = next(line for line in table.splitlines() if line.strip().startswith("p90") and "significant" in line)
    assert wait_p90.rstrip().endswith("significant")


def test_significant_never_said_when_the_interval_holds_zero(runs: Path) -> None:
    twin = runs / "twin-of-wide"
    if not twin.exists():
        shutil.copytree(runs / "reports" / "wide", twin)
    report = _report_json(runs, "wide", str(twin))
    for key, stats in report["runs"][1]["delta"]["latency"].items():
        for stat in ("p50", "p90", "p99"):
            assert stats[stat]["abs"] == 0.0
            if key == "itl":  # pooled over gaps: no bootstrap over requests
                assert "ci95_low" not in stats[stat]
                continue
            assert stats[stat]["ci95_low"] <= 0.0 <= stats[stat]["ci95_high"]
            assert stats[stat]["significant"] is False
    table = _report(runs, "wide", str(twin)).stdout
    latency = table[table.index("Latency (ms)"):table.index("Per server")]
    assert "significant" not in latency


# ------------------------------------------------------------------------------------------------ options

def test_refuses_runs_of_different_traces(runs: Path) -> None:
    done = _report(runs, "wide", "other")
    assert done.returncode == 2
    assert "different traces" in done.stderr and "a.jsonl" in done.stderr and "b.jsonl" in done.stderr
    assert "--allow-different-traces" in done.stderr and done.stdout == ""
    allowed = _report(runs, "wide", "other", "--allow-different-traces")
    assert allowed.returncode == 0, allowed.stderr
    assert "different traces" in allowed.stdout


def test_warmup_excludes_early_arrivals(runs: Path) -> None:
    report = _report_json(runs, "wide", "narrow", "--warmup", "10")  # simulated seconds, a third of the trace
    for entry in report["runs"]:
        records = _records(runs, entry["label"])
        kept = [r for r in records if r["t_arrival"] >= 10.0]
        ok = [r for r in kept if r["status"] == "ok"]
        assert 100 < len(kept) < 300
        assert entry["kept"] == entry["requests"]["kept"] == len(kept)
        assert entry["requests"]["ok"] == len(ok)
        assert _close(entry["window"]["start"], min(r["t_arrival"] for r in kept))
        duration = max(r["t_finish"] for r in ok) - min(r["t_arrival"] for r in kept)
        assert _close(entry["throughput"]["requests_per_s"], len(ok) / duration)
        totals = _latencies(ok)["total"]
        assert _close(entry["latency"]["total"]["p50"], float(np.percentile(totals, 50)))
    assert "after warm-up" in _report(runs, "wide", "--warmup", "1").stdout


def test_slo_fraction_and_goodput(runs: Path) -> None:
    records = _records(runs, "narrow")
    ok = [r for r in records if r["status"] == "ok"]
    ttft_limit = float(np.percentile([r["t_first_token"] - r["t_arrival"] for r in ok], 60))
    total_limit = float(np.percentile([r["t_finish"] - r["t_arrival"] for r in ok], 70))
    report = _report_json(runs, "narrow", "--slo", f"ttft={ttft_limit},total={total_limit}")
    met = [r for r in ok if r["t_first_token"] - r["t_arrival"] <= ttft_limit and r["t_finish"] - r["t_arrival"] <= total_limit]
    duration = max(r["t_finish"] for r in ok) - min(r["t_arrival"] for r in records)
    slo = report["runs"][0]["slo"]
    assert 0 < len(met) < len(ok)
    assert slo["met"] == len(met)
    assert _close(slo["fraction"], len(met) / len(records))
    assert _close(slo["goodput"], len(met) / duration)
    # milliseconds are accepted too, and mean the same
    again = _report_json(runs, "narrow", "--slo", f"ttft={ttft_limit * 1000}ms, total={total_limit}s")
    assert again["runs"][0]["slo"]["met"] == len(met)


def test_baseline_option_and_name_lookup(runs: Path) -> None:
    report = _report_json(runs, "wide", "narrow", "--baseline", "narrow")
    assert report["baseline"] == "narrow"
    assert "delta" in report["runs"][0] and "delta" not in report["runs"][1]
    # a baseline that is not among the RUNs joins the comparison, first
    report = _report_json(runs, "narrow", "--baseline", str(runs / "reports" / "wide"))
    assert [r["label"] for r in report["runs"]] == ["wide", "narrow"] and report["baseline"] == "wide"
    # what changed between them comes first, and names the cap
    table = _report(runs, "wide", "narrow").stdout
    changed = table[table.index("What changed"):table.index("Requests and throughput")]
    assert "caps" in changed and "policy round_robin" in changed


# ------------------------------------------------------------------------------------------------ formats

def test_table_is_plain_when_not_a_terminal(runs: Path) -> None:
    done = _report(runs, "wide", "narrow", "--slo", "total=1")
    assert done.returncode == 0, done.stderr
    assert "\x1b[" not in done.stdout
    for heading in ("What changed", "Requests and throughput", "Latency (ms)", "SLO (total <= 1 s)", "Per server",
                    "TTFT from dispatch", "release lag", "goodput"):
        assert heading in done.stdout


def test_terminal_colours_deltas(runs: Path) -> None:
    from tracebench.report.load import load_runs
    from tracebench.report.metrics import build_report
    from tracebench.report.render import document
    from tracebench.report.render.table import render_table

    report = build_report(load_runs(["wide", "narrow"], runs / "reports"), 0)
    coloured = render_table(document(report), colour=True)
    assert "\x1b[31;1m" in coloured  # narrow's longer router wait: significant and worse, red
    assert "\x1b[" not in render_table(document(report), colour=False)


def test_markdown_csv_json_files(runs: Path, tmp_path: Path) -> None:
    md, csv_path, json_path = tmp_path / "r.md", tmp_path / "r.csv", tmp_path / "r.json"
    for path in (md, csv_path, json_path):
        done = _report(runs, "wide", "narrow", "-o", str(path))
        assert done.returncode == 0, done.stderr
    text = md.read_text()
    assert "## Latency (ms)" in text
    assert "| metric | stat | wide (baseline) | narrow | Δ narrow | 95% CI of Δ |" in text
    assert "| --- | --- | ---: | ---: | ---: | --- |" in text
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert list(rows[0]) == ["run", "metric", "stat", "value", "unit"]
    doc = json.loads(json_path.read_text())
    value = {(r["run"], r["metric"], r["stat"]): r["value"] for r in rows}
    assert float(value[("narrow", "latency.total", "p99")]) == doc["runs"][1]["latency"]["total"]["p99"]
    assert float(value[("narrow", "latency.total", "p99.ci95_low")]) == doc["runs"][1]["delta"]["latency"]["total"]["p99"]["ci95_low"]
    assert float(value[("wide", "throughput.requests_per_s", "value")]) == doc["runs"][0]["throughput"]["requests_per_s"]
    assert value[("narrow", "run", "status")] == "completed"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_page_with_plots_and_png(runs: Path, tmp_path: Path) -> None:
    page = tmp_path / "out" / "report.html"
    done = _report(runs, "wide", "narrow", "stopped", "--format", "html", "-o", str(page), "--slo", "ttft=0.05")
    assert done.returncode == 0, done.stderr
    parser = _Tags()
    parser.feed(page.read_text())
    parser.close()
    # the runs were scraped (/metrics): a fifth figure, server telemetry (tests/test_telemetry.py checks its data)
    assert parser.tags.count("svg") == 5 and parser.tags.count("figure") == 5
    assert parser.tags.count("table") >= 5
    text = " ".join(parser.text)
    for words in ("Latency CDFs", "Over time", "Router queue length", "Per-server load", "INTERRUPTED", "significant",
                  "Router wait (arrival", "Time per output token", "by its arrival time", "Per server over time",
                  "KV cache usage", "Server telemetry", "prefix-cache hit rate",
                  "times of sped-up runs are in simulated seconds (wide, narrow at --speed 10", "stopped at --speed 2"):
        assert words in text, words
    assert "<script" not in page.read_text() and "http://" not in page.read_text().split("<svg")[0].split("Runs")[0]
    source = page.read_text()
    for chunk in source.split("<svg")[1:]:  # each inline figure is well-formed XML
        ET.fromstring("<svg" + chunk[: chunk.index("</svg>") + len("</svg>")])
    png = page.with_suffix(".png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    assert page.with_suffix(".telemetry.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    browser = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
    if browser is not None:  # optional: the page renders in a headless browser
        shot = tmp_path / "shot.png"
        subprocess.run([browser, "--headless", "--no-sandbox", f"--screenshot={shot}", page.as_uri()],
                       capture_output=True, timeout=60, check=True)
        assert shot.stat().st_size > 10_000


def test_interrupted_run_is_marked(runs: Path) -> None:
    meta = json.loads((runs / "reports" / "stopped" / "run.json").read_text())
    assert meta["status"] == "interrupted"
    done = _report(runs, "stopped")
    assert done.returncode == 0, done.stderr
    assert "INTERRUPTED" in done.stdout
    assert "run 'stopped' is INTERRUPTED" in done.stdout
    report = _report_json(runs, "wide", "stopped")
    entry = report["runs"][1]
    assert entry["status"] == "interrupted" and entry["mark"] == "INTERRUPTED"
    records = _records(runs, "stopped")
    assert entry["requests"]["cancelled"] == sum(r["status"] == "cancelled" for r in records) > 0
    assert any("INTERRUPTED" in w for w in report["warnings"])


def test_a_run_where_no_request_completed_is_reported(runs: Path, tmp_path: Path) -> None:
    # every request timed out (a --timeout below any answer's time): no measurement window (it ends at the last
    # completed finish), the table says so instead of failing on it
    folder = _copy_run(runs, tmp_path, "none-completed")
    path = folder / "requests.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for r in records:
        r["status"], r["error"] = "timeout", "no complete answer within --timeout 0.001 s"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    for fmt in ("table", "md"):
        done = _report(runs, str(folder), "--format", fmt)
        assert done.returncode == 0, done.stderr
    entry = _report_json(runs, str(folder))["runs"][0]
    assert entry["window"]["end"] is None and entry["window"]["duration_s"] is None
    assert entry["requests"]["timeout"] == len(records)


# ------------------------------------------------------------------------------------------------ bad input

def _copy_run(runs: Path, tmp_path: Path, name: str = "broken") -> Path:
    target = tmp_path / name
    shutil.copytree(runs / "reports" / "wide", target)
    return target


def _rewrite_line(path: Path, lineno: int, change) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[lineno - 1] = change(lines[lineno - 1])
    path.write_text("".join(lines))


def _set_field(field: str, value: object):
    def change(line: str) -> str:
        obj = json.loads(line)
        obj[field] = value
        return json.dumps(obj) + "\n"
    return change


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda p: _rewrite_line(p, 7, lambda line: line[: len(line) // 2] + "\n"), "requests.jsonl:7: not JSON"),
        (lambda p: _rewrite_line(p, 12, _set_field("t_finish", "soon")), "requests.jsonl:12: field 't_finish': must be a number"),
        (lambda p: _rewrite_line(p, 20, _set_field("status", "weird")), "requests.jsonl:20: field 'status': must be one of"),
        (lambda p: _rewrite_line(p, 33, _set_field("t_dispatch", None)), "requests.jsonl:33: field 't_dispatch': null in a completed (ok or mismatch) record"),
        (lambda p: _rewrite_line(p, 40, _set_field("server", 5)), "requests.jsonl:40: field 'server': not an index"),
        (lambda p: _rewrite_line(p, 41, _set_field("id", 3)), "requests.jsonl:41: field 'id': this id was already recorded"),
        (lambda p: _rewrite_line(p, 50, _set_field("t_finish", 0.0)), "requests.jsonl:50: field 't_finish': before t_dispatch"),
        (lambda p: _rewrite_line(p, 9, lambda line: "\n"), "requests.jsonl:9: empty line"),
        (lambda p: p.write_text(p.read_text()[:-40]), "requests.jsonl:300: last line is cut short"),
        (lambda p: p.write_text(""), "requests.jsonl: empty run"),
        (lambda p: p.unlink(), "requests.jsonl: missing"),
        (lambda p: p.write_text("".join(p.read_text().splitlines(keepends=True)[:250])),
         "has 250 records but the trace has 300 requests and run.json says the run completed"),
    ],
)
def test_damaged_requests_name_file_and_line(runs: Path, tmp_path: Path, damage, expected: str) -> None:
    from tracebench.errors import RunFolderError
    from tracebench.report.load import load_run

    folder = _copy_run(runs, tmp_path)
    damage(folder / "requests.jsonl")
    with pytest.raises(RunFolderError) as caught:
        load_run(folder)
    assert expected in str(caught.value) and str(folder) in str(caught.value)


def test_damaged_run_exits_2_with_one_line_and_writes_nothing(runs: Path, tmp_path: Path) -> None:
    folder = _copy_run(runs, tmp_path)
    _rewrite_line(folder / "requests.jsonl", 7, lambda line: line[:30] + "\n")
    out = tmp_path / "report.json"
    done = _report(runs, "wide", str(folder), "-o", str(out))
    assert done.returncode == 2
    assert done.stderr.startswith(f"tracebench: error: {folder}/requests.jsonl:7: not JSON")
    assert done.stderr.count("\n") == 1  # one line, no traceback
    assert not out.exists() and list(tmp_path.glob(".report.json*")) == []


def test_not_a_run_folder(runs: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _report(runs, str(empty))
    assert done.returncode == 2 and "not a run folder: it has no run.json" in done.stderr
    done = _report(runs, "no-such-run")
    assert done.returncode == 2 and "no such run folder" in done.stderr
    folder = _copy_run(runs, tmp_path, "future")
    meta = json.loads((folder / "run.json").read_text())
    meta["tracebench_run"] = 2
    (folder / "run.json").write_text(json.dumps(meta))
    done = _report(runs, str(folder))
    assert done.returncode == 2 and "field 'tracebench_run': unknown run format version 2" in done.stderr
    (folder / "run.json").write_text("{not json")
    done = _report(runs, str(folder))
    assert done.returncode == 2 and "run.json: not JSON" in done.stderr
    # a run without "speed" (written before replays recorded it, when --speed did not compress arrivals), or a bad one
    for speed, why in ((..., "field 'speed': missing"), (0, "field 'speed': must be a number > 0 or null"),
                       ("4", "field 'speed': must be int or float or null")):
        meta = json.loads((runs / "reports" / "wide" / "run.json").read_text())
        if speed is ...:
            del meta["speed"]
        else:
            meta["speed"] = speed
        (folder / "run.json").write_text(json.dumps(meta))
        done = _report(runs, str(folder))
        assert done.returncode == 2 and why in done.stderr, done.stderr
    # a simulator's modelled intake that is not a number (the --speed conversion reads it)
    meta = json.loads((runs / "reports" / "wide" / "run.json").read_text())
    meta["servers"][0]["server_info"]["tracebench_sim"]["request_hop_s"] = "2ms"
    (folder / "run.json").write_text(json.dumps(meta))
    done = _report(runs, str(folder))
    assert done.returncode == 2 and ("field 'servers[0].server_info.tracebench_sim.request_hop_s': must be a number "
                                     ">= 0, got '2ms'") in done.stderr, done.stderr
    meta["servers"][0]["server_info"]["tracebench_sim"]["request_hop_s"] = 0.002
    meta["servers"][0]["server_info"]["tracebench_sim"]["answer_end_s"] = -0.0005   # and its modelled answer's end
    (folder / "run.json").write_text(json.dumps(meta))
    done = _report(runs, str(folder))
    assert done.returncode == 2 and ("field 'servers[0].server_info.tracebench_sim.answer_end_s': must be a number "
                                     ">= 0, got -0.0005") in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("wide", "--slo", "ttft=fast"), "is not a duration"),
        (("wide", "--slo", "latency=1"), "unknown key 'latency'"),
        (("wide", "--slo", "ttft=0"), "must be > 0"),
        (("wide", "--format", "html"), "give -o FILE.html"),
        (("wide", "-o", "x.html", "--format", "json"), "contradicts"),
        (("wide", "-o", "x.pdf"), "cannot tell the format"),
        (("wide", "--warmup", "99"), "leaves no request"),
        (("wide", "--warmup", "-1"), "--warmup must be >= 0"),
        (("wide", "wide"), "given twice"),
        (("wide", "--slo", "ttft=1", "--baseline", "no-such"), "no such run folder"),
    ],
)
def test_bad_options_exit_2(runs: Path, args: tuple[str, ...], expected: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from tracebench.cli import main

    monkeypatch.chdir(runs)  # RUN names are looked up in ./reports
    result = CliRunner().invoke(main, ["report", *args])
    assert result.exit_code == 2 and expected in result.output, result.output


def test_help_lists_every_option() -> None:
    done = run_cli("report", "--help")
    assert done.returncode == 0
    for option in ("--baseline", "--format", "--output", "--slo", "--warmup", "--allow-different-traces",
                   "--bootstrap", "--seed", "ttft", "tpot", "wait"):
        assert option in done.stdout
    assert os.path.exists(Path(__file__).parents[1] / "docs" / "report.md")


@pytest.mark.parametrize(("status", "mark"), [("failed", "FAILED"), ("running", "UNFINISHED")])
def test_failed_and_unfinished_runs_are_marked(runs: Path, tmp_path: Path, status: str, mark: str) -> None:
    from tracebench.report.load import load_runs
    from tracebench.report.metrics import build_report
    from tracebench.report.render import document
    from tracebench.report.render.md import render_md
    from tracebench.report.render.table import render_table

    folder = _copy_run(runs, tmp_path, f"run-{status}")
    meta = json.loads((folder / "run.json").read_text())
    meta["status"] = status
    if status == "running":
        meta["t_end"] = None
    (folder / "run.json").write_text(json.dumps(meta))
    report = build_report(load_runs(["wide", str(folder)], runs / "reports"), 0)
    for text in (render_table(document(report), colour=False), render_md(document(report))):
        assert f"[{mark}]" in text and text.count(mark) >= 3  # column headings, runs table, warning


def test_cdf_axes_follow_the_data_not_the_slo(runs: Path) -> None:
    """A far SLO (100 s) must not stretch the CDFs: the axis ends just past the data, and the SLO is an arrow at the
    edge; an SLO inside the data is a dashed line."""
    from tracebench.report.load import load_runs
    from tracebench.report.metrics import build_report
    from polars import col as pl_col

    from tracebench.report.render import plots

    loaded = load_runs(["wide", "narrow"], runs / "reports")
    top = max(float(load.requests.select((pl_col("t_finish") - pl_col("t_arrival")).max()).item()) for load in loaded)
    for limit, inside in ((100.0, False), (round(top / 2, 3), True)):
        report = build_report(loaded, 0, slo={"total": limit}, bootstrap=0, with_series=True)
        assert max(float(s.cdf["total"][0][-1]) for s in report.series) == pytest.approx(top)
        fig = plots.latency_cdfs(report)
        ax = fig.axes[0]
        scale, unit = 1000.0, "ms"  # every panel in ms, as the tables (issue 23 item 10)
        assert ax.get_xlim()[1] == pytest.approx(top * scale * 1.04)
        texts = [t.get_text().strip() for t in ax.texts]
        if inside:
            assert f"SLO {limit * scale:g} {unit}" in texts, texts
            assert any(line.get_label() == "_slo" for line in ax.get_lines())
        else:
            assert any(t.endswith("→") and "SLO 100" in t for t in texts), texts
            assert not any(line.get_label() == "_slo" for line in ax.get_lines())
        plots.close(fig)


def test_itl_from_the_stream_and_its_slo(runs: Path) -> None:
    """Inter-token latency: each record's histogram accounts for its stream (gaps summing to first token -> finish),
    the pooled percentiles equal an independent computation from the records, and --slo itl counts the requests
    whose every gap is within it."""
    from tracebench.itl import FLOOR_S, bucket_value, parse_hist

    speed = float(SPEED)
    raw = [r for r in _raw_records(runs, "wide") if r["status"] == "ok"]
    values, weights, spans = [], [], []
    for r in raw:
        if r["itl_hist"] is None:  # one chunk: the sim had every token out before the stream first wrote
            assert r["itl_max"] is None
            continue
        hist = parse_hist(r["itl_hist"])
        buckets, counts = [b for b, _ in hist], [n for _, n in hist]
        assert buckets == sorted(set(buckets)), r
        gaps = sum(counts)
        assert 1 <= gaps <= r["completion_tokens"] - 1  # one chunk per decode step (two steps may share one)
        rebuilt = sum(bucket_value(b) * n for b, n in hist)
        span = r["t_finish"] - r["t_first_token"]
        # the gaps end at the last chunk, t_finish at [DONE] a moment later; buckets are within 1%
        assert rebuilt <= span * 1.01 + 1e-4, (rebuilt, span)
        spans.append((rebuilt, span))
        top = max(buckets)  # bucket 0: under 10 us (chunks read together)
        assert r["itl_max"] < FLOOR_S if top == 0 else bucket_value(top) == pytest.approx(r["itl_max"], rel=0.011)
        values += [bucket_value(b) * speed for b in buckets]
        weights += counts
    assert len(spans) > 0.9 * len(raw)
    # over the run the gaps account for the streams (a loaded client may read a few chunks with [DONE] at once)
    assert sum(r for r, _ in spans) > 0.9 * sum(s for _, s in spans)
    pooled = np.repeat(np.array(values), np.array(weights))
    # an ITL SLO between the requests' largest gaps (their median), so some meet it and some do not
    limit = float(np.median([r["itl_max"] for r in raw if r["itl_max"] is not None])) * speed
    report = _report_json(runs, "wide", "--slo", f"itl={limit!r}")
    entry = report["runs"][0]
    itl = entry["latency"]["itl"]
    for name, q in (("p50", 50), ("p90", 90), ("p99", 99)):
        assert _close(itl[name], float(np.percentile(pooled, q)), rel=1e-9), name
    assert _close(itl["mean"], float(pooled.mean()), rel=1e-9)
    assert _close(itl["max"], max(r["itl_max"] for r in raw if r["itl_max"] is not None) * speed, rel=1e-9)
    # at --speed 10 the chunks come 1/10 as far apart in real time and are often read together: the report says so
    assert any("ITL of wide at --speed 10" in w for w in report["warnings"]), report["warnings"]
    met = sum(1 for r in raw if (r["itl_max"] is None and r["t_first_token"] is not None)
              or (r["itl_max"] is not None and r["itl_max"] * speed <= limit))
    assert entry["slo"]["met"] == met and 0 < met < len(raw)


def test_per_server_series_against_the_cap_and_telemetry(runs: Path) -> None:
    """The per-server plot data: each server's in-flight count (from the records) never above its cap, the cap as
    steps, and sglang's own waiting count and KV usage from telemetry.jsonl on the simulated clock."""
    from tracebench.report.load import load_runs
    from tracebench.report.metrics import build_report

    loaded = load_runs(["narrow", "wide"], runs / "reports")
    report = build_report(loaded, 0, bootstrap=0, with_series=True)
    narrow, wide = report.series
    assert len(narrow.servers) == 2
    for srv in narrow.servers:
        assert list(srv.cap_v) == [1.0] and srv.in_flight.max() <= 1.0 + 1e-9 and srv.in_flight.max() > 0.5
        assert srv.telemetry_t.size > 5 and srv.kv_usage.size == srv.telemetry_t.size
        assert np.nanmax(srv.kv_usage) <= 1.0 and np.nanmax(srv.kv_usage) > 0
    meta = json.loads((runs / "reports" / "narrow" / "run.json").read_text())
    telemetry = [json.loads(line) for line in (runs / "reports" / "narrow" / "telemetry.jsonl").open()]
    assert narrow.servers[0].telemetry_t.max() == pytest.approx(max(t["t"] for t in telemetry) * meta["speed"])
    assert max(srv.in_flight.max() for srv in wide.servers) > 1.5  # cap 8: more at once
    # the in-flight of all servers adds up to the run's in-flight curve
    assert np.allclose(sum(srv.in_flight for srv in wide.servers), wide.in_flight)
    assert wide.by_arrival[0].size == 300 and np.all(np.diff(wide.by_arrival[0]) >= 0)


def test_cap_change_labels() -> None:
    from tracebench.report.metrics import _cap_labels

    changes = [{"t": 3.0, "server": 0, "cap": 8}, {"t": 3.0, "server": 1, "cap": 8}, {"t": 6.0, "server": 1, "cap": 2}]
    assert _cap_labels(changes, 2) == [(3.0, "all=8"), (6.0, "server1=2")]


def test_output_into_a_read_only_folder_is_one_line(runs: Path, tmp_path: Path, read_only) -> None:
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    done = _report(runs, "wide", "-o", str(folder / "r.md"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"tracebench: error: -o {folder / 'r.md'}: cannot write it (")
    assert done.stderr.endswith("; nothing was written\n") and not list(folder.iterdir())


@pytest.mark.parametrize("args", [
    ("wide", "narrow", "stopped"),  # the terminal table, warnings on stderr
    ("wide", "narrow", "--format", "md", "--slo", "ttft=0.001", "--fail-on-slo"),  # SloMissed: exit 3
    ("narrow", "--format", "perfetto"),  # bytes written to stdout's buffer
    ("wide", "other"),  # different traces: bad input, exit 2
])
def test_report_answers_the_same_in_process(runs: Path, args: tuple[str, ...]) -> None:
    """run_cli runs `report` inside the pytest process (tests/conftest.py run_cli_in_process): it must answer as
    `python -m tracebench report` does (tests/test_cli_in_process.py compares the other commands)."""
    from conftest import run_cli_in_process, run_cli_process

    inside, process = run_cli_in_process("report", *args, cwd=runs), run_cli_process("report", *args, cwd=runs)
    assert (inside.returncode, inside.stdout, inside.stderr) == (process.returncode, process.stdout, process.stderr)
    assert inside.returncode == {"--fail-on-slo": 3, "other": 2}.get(args[-1], 0), inside.stderr

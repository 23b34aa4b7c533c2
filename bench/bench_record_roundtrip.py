"""The record round trip, measured: trace A (48 requests with shared prefixes) replayed through `tracebench record`
into a sim-server, per --api and stream mode -> recorded trace B.

    .venv/bin/python bench/bench_record_roundtrip.py [--requests 48] [--rate 30]

Prints per case: requests in A and B, whether every (input_len, output_len) is exact, the p99 error of B's arrival
offsets against A's schedule and against the moments the replay sent each request (the constant shift between the
clocks taken out), and whether the prefix structure (leading blocks shared by every pair of requests) is A's. The
same checks as tests/test_record.py (whose helpers it uses), with the figures printed instead of asserted. Then A and
B are replayed again side by side, each into a fresh sim-server, and `tracebench report` compares the two runs: the
largest difference of a latency median (total, server latency, TTFT, TPOT; % of A), target < 10% (the record issue's
"replaying B gives the same run": a measurement of a quiet machine, so here and not in the test suite).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from conftest import free_port, run_cli, tracebench_cmd  # noqa: E402
from test_record import (  # noqa: E402
    SERVED_METRICS, WORDLEVEL, Recording, in_order_of, leading_pattern, p99_offset_error, records,
    replay_side_by_side, trace_a,
)

from tracebench.trace.format import load_trace  # noqa: E402


def sim_server(log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(tracebench_cmd("sim-server", "--port", str(port)), stdout=log.open("wb"),
                            stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                sys.exit(f"sim-server did not start: {log.read_text()[-2000:]}")
            time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--rate", type=float, default=30.0)
    args = parser.parse_args()
    print(f"cpus {os.cpu_count()}, load average at start {os.getloadavg()[0]:.1f}")
    print("api          stream  A   B   lengths  p99 vs A (ms)  p99 vs sent (ms)  prefix structure  "
          "A vs B medians, largest (% of A)")
    for api in ("generate", "completions", "chat"):
        for stream in (True, False):
            with tempfile.TemporaryDirectory() as tmp_name:
                tmp = Path(tmp_name)
                a = trace_a(tmp / "a.jsonl", n=args.requests, rate=args.rate)
                _, reqs_a = load_trace(a)
                sim, url = sim_server(tmp / "sim.log")
                rec = Recording(tmp, url, tmp / "b.jsonl", "--tokenizer", str(WORDLEVEL))
                try:
                    proc = run_cli("replay", str(a), "--attach", rec.url, "--api", api,
                                   "--stream" if stream else "--no-stream", "--out-dir", str(tmp / "runs"),
                                   "--run-name", "a", "--quiet")
                    assert proc.returncode == 0, proc.stderr
                    rec.stop()
                finally:
                    for p in (rec.proc, sim):
                        if p.poll() is None:
                            p.kill()
                            p.wait()
                _, recorded = load_trace(tmp / "b.jsonl")
                reqs_b = in_order_of(reqs_a, recorded) if len(recorded) == len(reqs_a) else recorded
                exact = [(r.input_len, r.output_len) for r in reqs_b] == [(r.input_len, r.output_len) for r in reqs_a]
                sent = np.array([r["t_dispatch"] for r in records(tmp / "runs" / "a")])
                arrivals_b = np.array([r.arrival_s for r in reqs_b])
                vs_a = p99_offset_error(np.array([r.arrival_s for r in reqs_a]), arrivals_b) * 1e3
                vs_sent = p99_offset_error(sent, arrivals_b) * 1e3
                same = leading_pattern(reqs_a) == leading_pattern(reqs_b)
                # A and B again, side by side, each into a fresh server: the latencies the workload sets, compared
                sims = [sim_server(tmp / f"sim-{name}.log") for name in ("a2", "b2")]
                try:
                    run_a2, run_b2 = replay_side_by_side(
                        tmp, [(a, sims[0][1], "a2"), (tmp / "b.jsonl", sims[1][1], "b2")], api, stream)
                finally:
                    for p, _ in sims:
                        p.kill()
                        p.wait()
                proc = run_cli("report", str(run_a2), str(run_b2), "--allow-different-traces", "--format", "json")
                assert proc.returncode == 0, proc.stderr
                deltas = json.loads(proc.stdout)["runs"][1]["delta"]["latency"]
                p50 = {m: stats["p50"]["pct"] for m, stats in deltas.items() if m in SERVED_METRICS}
                worst = max(p50, key=lambda m: abs(p50[m]))
                print(f"{api:<12} {str(stream):<6} {len(reqs_a):>3} {len(recorded):>3}  {'exact' if exact else 'DIFFER':<7}"
                      f"  {vs_a:>13.2f}  {vs_sent:>16.2f}  {'same' if same else 'differs':<16}  "
                      f"{worst} {p50[worst]:+.1f}% ({'< 10%' if abs(p50[worst]) < 10 else 'OVER 10%'})")
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()

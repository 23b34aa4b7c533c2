"""How well does the replay engine keep the trace's schedule? Release lag (t_released - t_arrival) at rising request
rates, against simulated sglang servers on this machine; prints the figures and the highest rate whose lag p99 is
under 5 ms (the goal: 1,000 req/s).

    .venv/bin/python bench/bench_replay.py [--rates 100,250,500,1000,2000,3000,4000] [--seconds 5] [--servers 2]
    .venv/bin/python bench/bench_replay.py --rates 1000 --prefix     # a shared-prefix trace (block tokens)
    .venv/bin/python bench/bench_replay.py --rates 1000 --replay-args "--metrics-interval 0"   # without /metrics scrapes

Each rate is one `tracebench replay --attach ...` run (a real process, as a user runs it) of a Poisson trace with
short requests (input 32-128 tokens, output 1-4), so the servers are not the bottleneck: the simulators run at
--speed 50. With --prefix, every prompt is 8 blocks of 64 tokens (512 tokens): the first 4 one of 8 shared "system
prompts", the rest its own, so the replay builds every prompt from its blocks. Everything shares this machine's CPUs:
the figures are for the machine they were taken on.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

from tracebench.trace.format import format_request_line, write_trace

GOAL_LAG_P99_S = 0.005


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_sim(log: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    """A `tracebench sim-server ARGS` process in its own session on a free port, once /health is 200 (also used by
    bench/prefix_sim_vs_real.py)."""
    port = free_port()
    with log.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "tracebench", "sim-server", "--port", str(port), *args],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"sim-server did not start: {log.read_text()[-2000:]}")


PREFIX_BLOCK = 64
PREFIX_BLOCKS = 8
PREFIX_SHARED = 4
PREFIX_GROUPS = 8


def make_trace(path: Path, rate: float, seconds: float, seed: int, prefix: bool) -> int:
    rng = np.random.default_rng(seed)
    n = int(rate * seconds)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    header: dict[str, object] = {"num_requests": n, "duration_s": float(arrivals[-1])}
    if not prefix:
        lines = [format_request_line(i, float(arrivals[i]), int(rng.integers(32, 128)), int(rng.integers(1, 5)))
                 for i in range(n)]
    else:
        header["block_size"] = PREFIX_BLOCK
        lines = []
        for i in range(n):
            group = int(rng.integers(PREFIX_GROUPS))
            blocks = [group * 100 + k for k in range(PREFIX_SHARED)]
            blocks += [10_000 + i * PREFIX_BLOCKS + k for k in range(PREFIX_BLOCKS - PREFIX_SHARED)]
            lines.append(format_request_line(i, float(arrivals[i]), PREFIX_BLOCK * PREFIX_BLOCKS,
                                             int(rng.integers(1, 5)), {"prefix_blocks": blocks}))
    write_trace(path, header, lines)
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="100,250,500,1000,2000,3000,4000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--speed", type=float, default=50.0)
    parser.add_argument("--prefix", action="store_true", help="a shared-prefix trace (prompts made of blocks)")
    parser.add_argument("--replay-args", default="",
                        help="more `tracebench replay` arguments, split like a shell, e.g. '--metrics-interval 0' "
                             "(what the /metrics scrape costs: compare with and without)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    sims = [start_sim(work / f"sim-{i}.log", "--speed", str(args.speed)) for i in range(args.servers)]
    print(f"machine: {os.cpu_count()} CPUs; {args.servers} sim-server(s) at --speed {args.speed:g}; "
          f"{args.seconds:g} s of Poisson arrivals per rate{' (shared-prefix trace)' if args.prefix else ''}; "
          f"{'replay ' + args.replay_args + '; ' if args.replay_args else ''}"
          f"run folders in {work}")
    print(f"{'rate':>7} {'requests':>8} {'lag p50 ms':>10} {'lag p99 ms':>10} {'lag max ms':>10} "
          f"{'done/s':>8} {'ok':>6} {'not ok':>6}")
    best = None
    try:
        for rate in rates:
            trace = work / f"trace-{rate:g}.jsonl"
            n = make_trace(trace, rate, args.seconds, seed=int(rate), prefix=args.prefix)
            attach = [a for _, url in sims for a in ("--attach", url)]
            name = f"rate-{rate:g}"
            result = subprocess.run(
                [sys.executable, "-m", "tracebench", "replay", str(trace), *attach, "--policy", "round_robin",
                 "--run-name", name, "--out-dir", str(work), "--quiet", "--poll-interval", "0.5",
                 *shlex.split(args.replay_args)],
                capture_output=True, text=True,
            )
            if result.returncode != 0:
                raise SystemExit(f"replay at {rate:g} req/s failed:\n{result.stderr}")
            run = json.loads((work / name / "run.json").read_text())
            records = [json.loads(line) for line in (work / name / "requests.jsonl").read_text().splitlines()]
            lags = np.array([r["t_released"] - r["t_arrival"] for r in records])
            ok = sum(r["status"] == "ok" for r in records)
            p99 = float(np.percentile(lags, 99))
            print(f"{rate:7.0f} {n:8d} {np.percentile(lags, 50) * 1e3:10.3f} {p99 * 1e3:10.3f} {lags.max() * 1e3:10.3f} "
                  f"{n / run['t_end']:8.0f} {ok:6d} {n - ok:6d}", flush=True)
            if p99 < GOAL_LAG_P99_S and ok == n:
                best = rate if best is None else max(best, rate)
    finally:
        for proc, _ in sims:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
    verdict = "none" if best is None else f"{best:g} req/s"
    print(f"highest rate with release lag p99 < {GOAL_LAG_P99_S * 1e3:g} ms and every request ok: {verdict} "
          f"(goal: 1000 req/s)")


if __name__ == "__main__":
    main()

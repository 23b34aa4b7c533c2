"""Fidelity of the sim-server against real sglang 0.5.17 on sglang's own bench_serving run.

The captured run (tests/data/sglang-0.5.17/bench_serving.jsonl, a copy of the shared capture): Poisson 8 req/s, 400 requests, 512 in / 128 out,
one H200, llama-2-7b-hf, triton attention. Acceptance: E2E p50 and TTFT p50 within 15% of real sglang.

    .venv/bin/python bench/bench_sim_fidelity.py                  # (a) virtual clock, then (b) HTTP at --speeds 4
    .venv/bin/python bench/bench_sim_fidelity.py --speeds 1 4     # (b) at speed 1 (~50 s) and 4 (~13 s)
    .venv/bin/python bench/bench_sim_fidelity.py --no-http        # (a) only

(a) runs the workload through tracebench.sim.model on a virtual clock (deterministic, instant), for a few seeds of the
Poisson arrivals (bench_serving's own arrival draw is not in the capture, so the arrival realisation differs).
(b) starts a real `tracebench sim-server` process and drives it over HTTP with a small aiohttp streaming client that
releases requests on an absolute Poisson schedule; at --speed K every time is K times shorter, and the figures are
multiplied back by K before the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.profiles import load_profile  # noqa: E402
from tracebench.replay.client import SENT_HEADER  # noqa: E402
from tracebench.sim.model import Limits, resolve_max_running_requests, simulate  # noqa: E402

BENCH_FILE = REPO / "tests" / "data" / "sglang-0.5.17" / "bench_serving.jsonl"
RATE, NUM, ILEN, OLEN = 8.0, 400, 512, 128


@dataclass
class Figures:
    e2e_p50: float
    e2e_p99: float
    ttft_p50: float
    tpot_p50: float
    throughput: float   # requests/s over the run (first arrival to last completion)


def figures(e2e: list[float], ttft: list[float], tpot: list[float], duration: float) -> Figures:
    return Figures(statistics.median(e2e) * 1e3, float(np.percentile(e2e, 99)) * 1e3, statistics.median(ttft) * 1e3,
                   statistics.median(tpot) * 1e3, len(e2e) / duration)


def real_figures() -> Figures:
    run = json.loads(BENCH_FILE.read_text().splitlines()[0])
    return Figures(run["median_e2e_latency_ms"], run["p99_e2e_latency_ms"], run["median_ttft_ms"],
                   run["median_tpot_ms"], run["request_throughput"])


def arrivals(seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(t) for t in np.cumsum(rng.exponential(1.0 / RATE, NUM))]


def print_row(label: str, fig: Figures, real: Figures) -> None:
    def cell(v: float, r: float) -> str:
        return f"{v:8.1f} ({v / r - 1:+5.1%})"
    print(f"{label:<26} {cell(fig.e2e_p50, real.e2e_p50)} {cell(fig.e2e_p99, real.e2e_p99)} "
          f"{cell(fig.ttft_p50, real.ttft_p50)} {fig.tpot_p50:6.2f} ({fig.tpot_p50 / real.tpot_p50 - 1:+5.1%}) "
          f"{fig.throughput:6.2f}")


def header() -> None:
    print(f"{'':<26} {'E2E p50 ms':>17} {'E2E p99 ms':>17} {'TTFT p50 ms':>17} {'TPOT p50 ms':>15} {'req/s':>6}")


def virtual(profile_name: str, seeds: list[int], real: Figures) -> None:
    profile = load_profile(profile_name)
    limits = Limits(resolve_max_running_requests(None, profile.max_total_num_tokens, profile.context_length),
                    profile.max_total_num_tokens, profile.chunked_prefill_size)
    for seed in seeds:
        t0 = time.perf_counter()
        outs = simulate(profile, limits, [(t, ILEN, OLEN) for t in arrivals(seed)])
        duration = max(o.t_finished for o in outs) - outs[0].t_arrival + profile.client_overhead_s
        fig = figures([o.e2e for o in outs], [o.ttft for o in outs], [o.tpot for o in outs], duration)
        print_row(f"(a) virtual seed {seed} [{(time.perf_counter() - t0) * 1e3:.0f} ms]", fig, real)


async def _one(session, url: str, t_send: float, loop_start: float, ids: list[int], results: list) -> None:
    import aiohttp  # noqa: F401  (session is an aiohttp.ClientSession)
    loop = asyncio.get_running_loop()
    delay = loop_start + t_send - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    payload = {"input_ids": ids, "sampling_params": {"max_new_tokens": OLEN, "ignore_eos": True, "temperature": 0.0},
               "stream": True}
    t_start = loop.time()
    t_first = None
    last = b""
    # the moment it is sent (wall clock), as tracebench's client says it: the simulator takes the request in sglang's
    # intake time after it (docs/sim-server.md "Intake"), as real sglang took bench_serving's
    async with session.post(url, json=payload, headers={SENT_HEADER: repr(time.time())}) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            if t_first is None:
                t_first = loop.time()
            last = line
    t_end = loop.time()
    final = json.loads(last[6:])
    if len(final["output_ids"]) != OLEN:
        raise RuntimeError(f"got {len(final['output_ids'])} output ids, wanted {OLEN}")
    results.append((t_start, t_first, t_end))


async def drive(url: str, speed: float, seed: int) -> Figures:
    import aiohttp
    rng = np.random.default_rng(seed + 1000)
    schedule = [t / speed for t in arrivals(seed)]
    prompts = [rng.integers(0, 32000, ILEN).tolist() for _ in schedule]
    results: list = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=600)) as session:
        loop = asyncio.get_running_loop()
        loop_start = loop.time() + 0.2
        await asyncio.gather(*[_one(session, url, t, loop_start, ids, results) for t, ids in zip(schedule, prompts)])
    e2e = [(end - start) * speed for start, _, end in results]
    ttft = [(first - start) * speed for start, first, _ in results]
    tpot = [(e - f) / (OLEN - 1) for e, f in zip(e2e, ttft)]
    duration = (max(end for _, _, end in results) - min(start for start, _, _ in results)) * speed
    return figures(e2e, ttft, tpot, duration)


def http(profile_name: str, speeds: list[float], seed: int, real: Figures) -> None:
    import socket
    for speed in speeds:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        proc = subprocess.Popen([sys.executable, "-m", "tracebench", "sim-server", "--port", str(port), "--profile",
                                 profile_name, "--speed", str(speed)], cwd=REPO, stdout=subprocess.PIPE)
        try:
            line = proc.stdout.readline().decode()
            if "listening" not in line:
                raise RuntimeError(f"sim-server did not start: {line!r}")
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
                assert resp.status == 200
            t0 = time.perf_counter()
            fig = asyncio.run(drive(f"http://127.0.0.1:{port}/generate", speed, seed))
            print_row(f"(b) HTTP speed {speed:g} [{time.perf_counter() - t0:.0f} s]", fig, real)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="llama-2-7b-h200-triton")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--speeds", type=float, nargs="+", default=[4.0])
    parser.add_argument("--no-http", action="store_true")
    opts = parser.parse_args()
    real = real_figures()
    header()
    print(f"{'real sglang (H200)':<26} {real.e2e_p50:8.1f} {'':8} {real.e2e_p99:8.1f} {'':8} {real.ttft_p50:8.1f} {'':8} "
          f"{real.tpot_p50:6.2f} {'':8} {real.throughput:6.2f}")
    virtual(opts.profile, opts.seeds, real)
    if not opts.no_http:
        http(opts.profile, opts.speeds, opts.seeds[0], real)


if __name__ == "__main__":
    main()

"""Can one sim-server process sustain 1,000 short requests/s? (target: yes, on a 2-core machine)

    .venv/bin/python bench/bench_sim_throughput.py [--rate 1000] [--seconds 5] [--speed 100]

Starts `tracebench sim-server` as its own process; this script is the client (a separate process): an aiohttp client
that releases requests of 16 input / 4 output tokens on an absolute schedule at --rate per second (open loop), once
non-streaming and once streaming, and prints the achieved completion rate, the latency percentiles, how late the client
sent (to tell a slow client from a slow server) and the server's CPU time per request (from /proc).

It measures the HTTP server, not the timing model, hence --speed 100 by default: at speed 1, 1,000 arrivals/s keep
sglang's prefill-first scheduler busy with prefill steps (each >= 12.7 ms admits the ~13 requests that arrived during
the previous one) and decoding starves, as it would on the GPU, so latency there says what the model predicts.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]


async def run_load(url: str, rate: float, seconds: float, stream: bool) -> dict:
    import aiohttp
    import orjson

    n = int(rate * seconds)
    payload = orjson.dumps({"input_ids": list(range(1, 17)), "sampling_params": {"max_new_tokens": 4,
                                                                                  "ignore_eos": True},
                            "stream": stream})
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    lateness: list[float] = []
    errors: list[str] = []
    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)

    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def one(t_due: float) -> None:
            delay = t_due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            t_send = loop.time()
            lateness.append(t_send - t_due)
            async with session.post(url, data=payload, headers=headers) as resp:
                body = await resp.read()
                if resp.status != 200:
                    errors.append(f"{resp.status} {body[:200]!r}")
                    return
                if stream and not body.endswith(b"data: [DONE]\n\n"):
                    errors.append(f"stream not ended by [DONE]: {body[-100:]!r}")
                    return
            latencies.append(loop.time() - t_send)

        t0 = loop.time() + 0.3
        t_start = time.perf_counter()
        await asyncio.gather(*[one(t0 + i / rate) for i in range(n)])
        elapsed = time.perf_counter() - t_start - 0.3
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return {
        "requests": n, "achieved_per_s": n / elapsed,
        "send_late_p50_ms": statistics.median(lateness) * 1e3,
        "send_late_p99_ms": float(np.percentile(lateness, 99)) * 1e3,
        "lat_p50_ms": statistics.median(latencies) * 1e3, "lat_p99_ms": float(np.percentile(latencies, 99)) * 1e3,
    }


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--speed", type=float, default=100.0,
                        help="sim-server --speed (default 100: at speed 1, 1,000 arrivals/s keep sglang's scheduler in "
                             "prefill steps and decode starves, as it would on the GPU: that measures the model, not "
                             "the server)")
    opts = parser.parse_args()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tracebench", "sim-server", "--port", str(port), "--speed",
                             str(opts.speed)], cwd=REPO, stdout=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        if "listening" not in line:
            raise RuntimeError(f"sim-server did not start: {line!r}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            assert resp.status == 200
        print(f"sim-server (pid {proc.pid}, speed {opts.speed:g}), client in this process; 16 in / 4 out; "
              f"target {opts.rate:g} req/s for {opts.seconds:g} s")
        for stream in (False, True):
            cpu_before = cpu_seconds(proc.pid)
            res = asyncio.run(run_load(f"http://127.0.0.1:{port}/generate", opts.rate, opts.seconds, stream))
            cpu_per_req = (cpu_seconds(proc.pid) - cpu_before) / res["requests"]
            print(f"  {'stream    ' if stream else 'non-stream'}: {res['requests']} requests, achieved "
                  f"{res['achieved_per_s']:7.1f} req/s, latency p50 {res['lat_p50_ms']:6.1f} ms p99 "
                  f"{res['lat_p99_ms']:6.1f} ms, client send lateness p50 {res['send_late_p50_ms']:.1f} ms p99 "
                  f"{res['send_late_p99_ms']:.1f} ms; server CPU {cpu_per_req * 1e6:.0f} us/request "
                  f"(= {1 / cpu_per_req:.0f} req/s per core)")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()

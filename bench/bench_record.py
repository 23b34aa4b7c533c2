"""What does `tracebench record` add? Latency per request (p50/p99) and the proxy's throughput ceiling.

    .venv/bin/python bench/bench_record.py [--requests 400] [--seconds 4]

Starts a sim-server (--speed 1000: its answers come almost at once, so what is measured is HTTP, not the model) and
a recording proxy in front of it, both as their own processes; this script is the client.

1. Added latency: one request at a time (/generate, 16 input ids, 4 output tokens, streamed), alternately straight
   to the sim-server and through the proxy; the difference of the two latency distributions' p50 and p99.
2. Throughput ceiling: closed loop with 64 clients through the proxy for --seconds; the completed requests/s, and
   the proxy's CPU time per request (from /proc), whose inverse is what one core can carry (the proxy is one
   single-threaded process: its ceiling is one core, whatever else runs on the other).
It prints the figures, and the trace the proxy wrote is checked (every request recorded).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from conftest import free_port  # noqa: E402  (the tests' free-port helper)

BODY_STREAM = b'{"input_ids":[%s],"sampling_params":{"max_new_tokens":4,"ignore_eos":true},"stream":true}' % (
    b",".join(b"%d" % i for i in range(1000, 1016)))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_up(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"{what} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/model_info", timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"{what} did not come up")


async def one(session, url: str) -> float:
    t0 = time.perf_counter()
    async with session.post(f"{url}/generate", data=BODY_STREAM, headers={"Content-Type": "application/json"}) as resp:
        body = await resp.read()
    assert resp.status == 200 and body.endswith(b"data: [DONE]\n\n"), body[-200:]
    return time.perf_counter() - t0


async def added_latency(direct: str, proxied: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for _ in range(20):  # warm both paths
            await one(session, direct)
            await one(session, proxied)
        lat_direct, lat_proxy = [], []
        for _ in range(n):
            lat_direct.append(await one(session, direct))
            lat_proxy.append(await one(session, proxied))
    return np.array(lat_direct), np.array(lat_proxy)


async def ceiling(url: str, seconds: float, clients: int) -> tuple[int, float]:
    import aiohttp

    done = 0
    stop = time.perf_counter() + seconds

    async def client(session) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await one(session, url)
            done += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        return done, time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="sequential requests per path (latency)")
    parser.add_argument("--seconds", type=float, default=4.0, help="closed-loop time (ceiling)")
    parser.add_argument("--clients", type=int, default=64)
    args = parser.parse_args()
    tb = [sys.executable, "-m", "tracebench"]
    sim_port, proxy_port = free_port(), free_port()
    direct, proxied = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{proxy_port}"
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "recorded.jsonl"
        sim = subprocess.Popen([*tb, "sim-server", "--port", str(sim_port), "--speed", "1000"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        proxy = None
        try:
            wait_up(direct, sim, "sim-server")
            proxy = subprocess.Popen([*tb, "record", "--listen", f"127.0.0.1:{proxy_port}", "--upstream", direct,
                                      "-o", str(trace), "--quiet"], stdout=subprocess.DEVNULL)
            wait_up(proxied, proxy, "record")
            lat_direct, lat_proxy = asyncio.run(added_latency(direct, proxied, args.requests))
            cpu0 = cpu_seconds(proxy.pid)
            done, wall = asyncio.run(ceiling(proxied, args.seconds, args.clients))
            cpu = cpu_seconds(proxy.pid) - cpu0
            sim_done, sim_wall = asyncio.run(ceiling(direct, args.seconds, args.clients))
            proxy.send_signal(signal.SIGINT)
            assert proxy.wait(timeout=60) == 0
            recorded = len(trace.read_bytes().splitlines()) - 1
        finally:
            for proc in (proxy, sim):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
    expected = 20 + args.requests + done
    print(f"cpus: {os.cpu_count()}, load average {os.getloadavg()[0]:.2f} (other work on the machine skews latency)")
    for q in (50, 99):
        d, p = np.percentile(lat_direct, q) * 1e3, np.percentile(lat_proxy, q) * 1e3
        print(f"latency p{q}: direct {d:.2f} ms, through the proxy {p:.2f} ms -> added {p - d:.2f} ms")
    print(f"closed loop, {args.clients} clients: through the proxy {done / wall:.0f} req/s "
          f"(the sim-server alone: {sim_done / sim_wall:.0f} req/s)")
    print(f"proxy CPU per request: {cpu / done * 1e6:.0f} us -> ceiling of one core: {done / cpu:.0f} req/s")
    print(f"recorded: {recorded} of {expected} requests sent through the proxy")
    assert recorded == expected, "every request through the proxy is a trace line"


if __name__ == "__main__":
    main()

"""What the virtual loop alone costs per request (issue #32, "Fast"): the floor under any replay built on asyncio.

    .venv/bin/python bench/bench_loop_floor.py [--requests N] [--rate R] [--repeat K]

A skeleton of a request's life on `replay/loop.py`'s VirtualLoop, with no router, model or record: the arrivals are
released by one coroutine at their Poisson times (a sleep per arrival, as a replay's engine waited before stop 41),
and each request is a task that waits on two timed futures (the hop to its server, its answer). A real replay does
this and more (the policy, the batch model's steps, the radix cache, the record), so its CPU per request cannot be
below this figure; issue 32's 20,000 requests per wall second leave 50 µs per request for everything.
Prints the best of K runs in µs per request and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tracebench.replay.loop import run_virtual  # noqa: E402


async def one_request(loop: asyncio.AbstractEventLoop) -> None:
    hop = loop.create_future()
    loop.call_at(loop.time() + 0.002, hop.set_result, None)      # dispatch -> the server's receipt
    await hop
    answer = loop.create_future()
    loop.call_at(loop.time() + 0.5, answer.set_result, None)     # the answer's end
    await answer


async def replay(arrivals: list[float]) -> None:
    loop = asyncio.get_running_loop()
    tasks = []
    for t in arrivals:
        if t > loop.time():
            await asyncio.sleep(t - loop.time())
        tasks.append(loop.create_task(one_request(loop)))
    await asyncio.gather(*tasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--rate", type=float, default=600.0)
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    rng = random.Random(0)
    arrivals, t = [], 0.0
    for _ in range(opts.requests):
        t += rng.expovariate(opts.rate)
        arrivals.append(t)
    best = min(_timed(arrivals) for _ in range(opts.repeat))
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    print(f"{opts.requests:,} requests at {opts.rate:g} req/s: {best / opts.requests * 1e6:.1f} µs per request "
          f"({opts.requests / best:,.0f} requests per second), best of {opts.repeat}; {os.cpu_count()} cores ({cpu}), "
          f"Python {platform.python_version()}, load {os.getloadavg()[0]:.1f}")


def _timed(arrivals: list[float]) -> float:
    t0 = time.perf_counter()
    run_virtual(replay(arrivals))
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()

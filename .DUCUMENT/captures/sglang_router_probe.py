"""How sglang-router 0.3.2's `cache_aware` routes, checked on two `tracebench sim-server`s (CPU only).

Run from the repo root with the router installed (`pip install -e '.[router]'`):
    python .DUCUMENT/captures/sglang_router_probe.py > .DUCUMENT/captures/sglang-router-0.3.2-sim.txt

Which worker served a request is read from the workers' own `sglang:num_requests_total` (a delta per request: the
requests of the sequential phases are sent one at a time). Prompts: 4 prefixes P0..P3 of 400 random ids each plus a
unique 100-id suffix; as `input_ids`, then the same ids as words (`text`: "w<id> ..."). The sim-servers' model is
llama-2-7b-hf (vocab 32000).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

PY = sys.executable


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def counter(metrics: str, name: str) -> float:
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", metrics, re.M))


class Setup:
    def __init__(self, speed: float) -> None:
        self.ports = [free_port(), free_port()]
        self.router_port, self.prom_port, self.hub_port = free_port(), free_port(), free_port()
        self.procs: list[subprocess.Popen[bytes]] = []
        log = open(os.devnull, "wb")
        for port in self.ports:
            self.procs.append(subprocess.Popen([PY, "-m", "tracebench", "sim-server", "--port", str(port),
                                                "--speed", str(speed)], stdout=log, stderr=log))
        self.workers = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.router = f"http://127.0.0.1:{self.router_port}"
        self.router_log = Path(os.environ.get("ROUTER_LOG") or Path(tempfile.gettempdir()) / "sglang-router-probe.log")

    def start_router(self) -> None:
        env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{self.hub_port}", "NO_COLOR": "1"}
        self.procs.append(subprocess.Popen(
            [PY, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.router_port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.prom_port), "--policy", "cache_aware",
             "--disable-retries", "--worker-urls", *self.workers],
            stdout=self.router_log.open("wb"), stderr=subprocess.STDOUT, env=env))

    def stop(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            proc.wait(timeout=20)


async def wait_ok(session: aiohttp.ClientSession, url: str) -> None:
    for _ in range(300):
        try:
            async with session.get(url) as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} never answered 200")


async def counts(session: aiohttp.ClientSession, workers: list[str]) -> list[int]:
    out = []
    for url in workers:
        async with session.get(f"{url}/metrics") as resp:
            out.append(int(counter(await resp.text(), "sglang:num_requests_total")))
    return out


async def generate(session: aiohttp.ClientSession, url: str, ids: list[int], as_text: bool, max_new: int) -> None:
    body = {"sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}}
    body["text" if as_text else "input_ids"] = " ".join(f"w{i}" for i in ids) if as_text else ids
    async with session.post(f"{url}/generate", json=body) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()


async def sequential(session, s: Setup, prompts: list[tuple[str, list[int]]], as_text: bool) -> str:
    got = []
    for label, ids in prompts:
        before = await counts(session, s.workers)
        await generate(session, s.router, ids, as_text, 4)
        after = await counts(session, s.workers)
        (worker,) = [i for i in range(2) if after[i] != before[i]]
        got.append(f"{label}->w{worker}")
    return " ".join(got)


async def main() -> None:
    rng = random.Random(0)
    prefixes = [[rng.randrange(1000, 32000) for _ in range(400)] for _ in range(5)]

    def prompt(p: int, prefix_len: int = 400, suffix_len: int = 100) -> list[int]:
        return prefixes[p][:prefix_len] + [rng.randrange(1000, 32000) for _ in range(suffix_len)]

    s = Setup(speed=1.0)
    try:
        async with aiohttp.ClientSession() as session:
            for url in s.workers:
                await wait_ok(session, f"{url}/health")
            s.start_router()
            await wait_ok(session, f"{s.router}/health")
            for _ in range(100):  # both workers registered and healthy
                async with session.get(f"{s.router}/workers") as resp:
                    workers = (await resp.json())["workers"]
                if len(workers) == 2 and all(w["is_healthy"] for w in workers):
                    break
                await asyncio.sleep(0.1)
            order = [(f"P{i % 4}", prompt(i % 4)) for i in range(24)]
            print("A. 24 sequential requests, prefixes P0 P1 P2 P3 in turn, input_ids:")
            print("  ", await sequential(session, s, order, as_text=False))
            print("B. the same 24 prompts as text ('w<id> ...': strings the tree has not seen, so prefixes new to it again):")
            print("  ", await sequential(session, s, [(lbl, prompt(int(lbl[1]))) for lbl, _ in order], as_text=True))
            # C. load: a long request keeps w0 busy (load 1 vs 0); a new prefix P4 then goes to the least loaded
            print("C. w0 busy with one long P0 request; then P4 (new prefix) is sent:")
            busy = asyncio.ensure_future(generate(session, s.router, prompt(0), False, 3000))
            await asyncio.sleep(0.5)
            print("  ", await sequential(session, s, [("P4", prompt(4))], as_text=False))
            busy.cancel()
            await asyncio.gather(busy, return_exceptions=True)
            await asyncio.sleep(0.5)
            print("D. all idle again; sequential P4, P0, P4, P1 (P4 now in w1's tree):")
            print("  ", await sequential(session, s, [(f"P{p}", prompt(p)) for p in (4, 0, 4, 1)], as_text=False))
            print("E. P4 sharing only its first 100 of 400 ids (match 100/500 = 0.2 <= 0.3), idle workers:")
            print("  ", await sequential(session, s, [("P4/100", prompt(4, 100, 400))], as_text=False))
            print("F. P4 sharing 200 of 400 ids (match 200/400 = 0.5 > 0.3):")
            print("  ", await sequential(session, s, [("P4/200", prompt(4, 200, 200))], as_text=False))
            # G. imbalance: 100 concurrent long P0 requests; cache affinity keeps them on w0 until
            # (max - min) > 64 and max > 1.5 min, then new ones go to the least loaded worker
            print("G. 100 concurrent P0 requests (all match w0's tree):")
            before = await counts(session, s.workers)
            await asyncio.gather(*(generate(session, s.router, prompt(0), False, 200) for _ in range(100)))
            after = await counts(session, s.workers)
            print(f"   w0 got {after[0] - before[0]}, w1 got {after[1] - before[1]}")
    finally:
        s.stop()
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln) for ln in s.router_log.read_text().splitlines()]
    print("router start-up line:", next(ln for ln in lines if "Starting router on" in ln))
    print("router tokenizer lines (HF_ENDPOINT = a local port that refuses):",
          *[ln for ln in lines if "Tokenizer path" in ln or "Failed to load tokenizer" in ln][:2], sep="\n  ")


if __name__ == "__main__":
    start = time.time()
    asyncio.run(main())
    print(f"({time.time() - start:.1f} s)")

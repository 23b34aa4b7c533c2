"""Does one sim-server keep up with a prefix-heavy trace? (issue 12: the Mooncake synthetic trace at its own rate,
speed 4, without falling behind)

    .venv/bin/python bench/bench_sim_prefix.py traces/mooncake_synthetic_trace.jsonl \
        [--speed 4] [--max-requests N] [--disable-radix-cache]

(the whole trace: github.com/kvcache-ai/Mooncake, FAST25-release/traces/synthetic_trace.jsonl, sha256 bd070915…,
downloaded into the ignored traces/; its last 1,000 rows are in the repository as
tests/data/mooncake_synthetic_trace_last1000.jsonl.)

Reads a Mooncake JSONL trace (`timestamp` ms, `input_length`, `output_length`, `hash_ids`: one id per 512-token block),
clamps it to the 4,096-token context as `tracebench generate --dataset` does (a prompt longer than 4,089 tokens is cut
to 4,089 with its blocks, the answer shortened to fit), and sends each request's prompt as token ids built from its
blocks (block id -> 512 deterministic ids in [1000, 32000); a cut last block keeps its first tokens) to a
`tracebench sim-server --speed K` started as its own process, at the trace's arrival times divided by K (open loop,
non-streaming; this script is the client). Prompts are built before the run, so building them adds no lag.

Prints how late the client sent (a slow client), the HTTP path's own time = client latency - sglang's e2e_latency
(p50/p99/max: a server whose loop falls behind delivers late, and this grows), the server's CPU time (per request and
as a share of one core over the run), and the cache: cached_tokens / prompt tokens against the trace's ceiling (one
unbounded cache, leading blocks seen before).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_sim_throughput import cpu_seconds  # noqa: E402

BLOCK = 512
CONTEXT = 4096
PROMPT_RESERVE = 7   # sglang 0.5.17 refuses prompts longer than context - 7 (tracebench.trace.lengths)


def load(path: Path, max_requests: int | None) -> list[tuple[float, list[int], int]]:
    """(arrival seconds, block ids after the clamp, input_len, output_len) per request, in arrival order."""
    rows = []
    with path.open() as fh:
        for line_no, line in enumerate(fh, 1):
            if max_requests is not None and len(rows) >= max_requests:
                break
            row = json.loads(line)
            input_len = min(row["input_length"], CONTEXT - PROMPT_RESERVE)
            output_len = min(row["output_length"], CONTEXT - input_len)
            blocks = row["hash_ids"][:-(-input_len // BLOCK)]
            if len(blocks) != -(-input_len // BLOCK):
                raise ValueError(f"{path}:{line_no}: hash_ids: {len(row['hash_ids'])} ids for "
                                 f"{row['input_length']} tokens")
            rows.append((row["timestamp"] / 1e3, blocks, input_len, output_len))
    return rows


def block_tokens(block_id: int) -> np.ndarray:
    return np.random.default_rng(1_000_003 * block_id + 7).integers(1000, 32000, BLOCK)


def ceiling(rows) -> tuple[int, int]:
    """Prompt tokens reusable with one unbounded cache (a leading run of blocks seen as a leading run), and all."""
    seen: set[tuple[int, ...]] = set()
    reusable = total = 0
    for _, blocks, input_len, _ in rows:
        total += input_len
        hit = 0
        for k in range(1, len(blocks) + 1):
            if tuple(blocks[:k]) not in seen:
                break
            hit = min(k * BLOCK, input_len)
        reusable += min(hit, input_len - 1)
        seen.update(tuple(blocks[:k]) for k in range(1, len(blocks) + 1))
    return reusable, total


async def run(url: str, payloads: list[tuple[float, bytes]], speed: float) -> dict:
    import aiohttp

    loop = asyncio.get_running_loop()
    late, overhead, cached, prompt = [], [], [], []
    errors: list[str] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def one(t_due: float, body: bytes) -> None:
            delay = t_due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            t_send = loop.time()
            late.append(t_send - t_due)
            async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
                raw = await resp.read()
            t_done = loop.time()
            if resp.status != 200:
                errors.append(f"{resp.status} {raw[:200]!r}")
                return
            meta = json.loads(raw)["meta_info"]
            overhead.append(t_done - t_send - meta["e2e_latency"])
            cached.append(meta["cached_tokens"])
            prompt.append(meta["prompt_tokens"])

        t0 = loop.time() + 0.5
        await asyncio.gather(*[one(t0 + t / speed, body) for t, body in payloads])
    if errors:
        raise RuntimeError(f"{len(errors)} failed requests, first: {errors[0]}")
    return {"late": np.array(late), "overhead": np.array(overhead), "cached": sum(cached), "prompt": sum(prompt)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--speed", type=float, default=4.0)
    parser.add_argument("--max-requests", type=int, default=None, help="only the first N requests (default: all)")
    parser.add_argument("--disable-radix-cache", action="store_true")
    opts = parser.parse_args()
    rows = load(opts.trace, opts.max_requests)
    t_first = rows[0][0]
    tokens: dict[int, np.ndarray] = {}
    payloads = []
    for t, blocks, input_len, output_len in rows:
        for b in blocks:
            if b not in tokens:
                tokens[b] = block_tokens(b)
        ids = np.concatenate([tokens[b] for b in blocks])[:input_len].tolist()
        body = json.dumps({"input_ids": ids, "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True}})
        payloads.append((t - t_first, body.encode()))
    reusable, total = ceiling(rows)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, "-m", "tracebench", "sim-server", "--port", str(port), "--speed", str(opts.speed)]
    if opts.disable_radix_cache:
        cmd.append("--disable-radix-cache")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE)
    try:
        line = proc.stdout.readline().decode()
        if "listening" not in line:
            raise RuntimeError(f"sim-server did not start: {line!r}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            assert resp.status == 200
        span = payloads[-1][0] / opts.speed
        print(f"{opts.trace.name}: {len(rows)} requests over {payloads[-1][0]:.0f} s of trace ({span:.0f} s at speed "
              f"{opts.speed:g}, {len(rows) / span:.1f} req/s), mean prompt {total / len(rows):.0f} tokens; "
              f"radix cache {'off' if opts.disable_radix_cache else 'on'}")
        cpu_before, wall_before = cpu_seconds(proc.pid), time.monotonic()
        res = asyncio.run(run(f"http://127.0.0.1:{port}/generate", payloads, opts.speed))
        cpu, wall = cpu_seconds(proc.pid) - cpu_before, time.monotonic() - wall_before
        late, over = res["late"] * 1e3, res["overhead"] * 1e3
        print(f"  client send lateness ms: p50 {np.percentile(late, 50):.1f} p99 {np.percentile(late, 99):.1f} "
              f"max {late.max():.1f}")
        print(f"  HTTP path (client latency - e2e_latency) ms: p50 {np.percentile(over, 50):.1f} "
              f"p99 {np.percentile(over, 99):.1f} max {over.max():.1f}")
        print(f"  server CPU {cpu:.1f} s over {wall:.0f} s ({cpu / wall:.0%} of one core), "
              f"{cpu / len(rows) * 1e3:.2f} ms/request")
        print(f"  cached_tokens / prompt tokens {res['cached'] / res['prompt']:.3f} "
              f"(trace ceiling, one unbounded cache: {reusable / total:.3f})")
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()

"""Decode step cost over a grid of batch sizes and per-request contexts (issue 36), on one idle sglang server.

Each point sends B streamed requests at once (fresh random prompts after a cache flush, `ignore_eos`, the same
max_new_tokens N), then measures the decode step while all B decode together: the window from the last request's
first token to the first request's last token. Within it every step gives one token to each of the B requests, so
per request (t_b - t_a) / (tokens_b - tokens_a) over its chunks inside the window is the mean step; the point's step is
the median over requests. The context of request i at a step is its input + tokens so far; the point records the
window's mean batch KV (sum over requests) and each request's mean context, so a cost model can be evaluated on it.
sglang's own figure comes from its log (`Decode batch ... gen throughput`, every `--decode-log-interval` steps):
bench/gpu/decode_grid_log.py pairs those lines with the points afterwards (each point's start/end is stamped here).

    python3 bench/gpu/decode_grid.py http://127.0.0.1:30000 decode-grid.json [--quick] [--kv-capacity N]

Points: uniform batches (every request L tokens) over B x L, and mixed batches (long and short requests together) that
tell a cost in the total KV from one in each request's context. A point that would not fit the KV pool (B x (L + N)
above --kv-capacity, default the server's max_total_num_tokens minus 2%) is given the largest L that fits, rounded
down to 100. Every id is < 32000 (an id outside llama-2's vocabulary kills a real server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

import aiohttp
import numpy as np

VOCAB_LOW, VOCAB_HIGH = 1000, 32000
OUTPUT_TOKENS = 64
CONTEXT_LIMIT = 4094 - OUTPUT_TOKENS  # input + output <= 4094: sglang generates every asked token (context 4096)
BATCHES = (1, 2, 4, 8, 16, 32, 48, 64)
CONTEXTS = (128, 512, 1024, 2048, 3072, 3968)
ODD_BATCHES = (3, 6, 12, 24, 40)       # between sglang's decode CUDA-graph sizes, at 1024 tokens
MIXED = (                               # (label, [(count, input length), ...])
    ("1x3968+3x512", [(1, 3968), (3, 512)]),
    ("1x3968+7x128", [(1, 3968), (7, 128)]),
    ("4x3968+4x128", [(4, 3968), (4, 128)]),
    ("1x3968+31x128", [(1, 3968), (31, 128)]),
    ("8x3968+24x256", [(8, 3968), (24, 256)]),
    ("2x3968+30x1024", [(2, 3968), (30, 1024)]),
    ("16 spread 128..3968", [(1, n) for n in np.linspace(128, 3968, 16).astype(int).tolist()]),
    ("48 spread 128..3968", [(1, n) for n in np.linspace(128, 3968, 48).astype(int).tolist()]),
)


class GridError(RuntimeError):
    """A point that cannot be measured as asked (the server answered otherwise, or no full-batch window)."""


def ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(VOCAB_LOW, VOCAB_HIGH, n).tolist()


async def stream(session: aiohttp.ClientSession, url: str, input_ids: list[int], max_new_tokens: int,
                 t0: float) -> dict:
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
    chunks: list[tuple[float, int]] = []
    last = None
    async with session.post(f"{url}/generate", json=body) as resp:
        if resp.status != 200:
            raise GridError(f"/generate answered {resp.status}: {(await resp.text())[:300]}")
        buf = b""
        async for piece in resp.content.iter_any():
            now = time.perf_counter() - t0
            buf += piece
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: ") or event == b"data: [DONE]":
                    continue
                obj = json.loads(event[6:])
                if "error" in obj:
                    raise GridError(f"stream error: {obj}")
                chunks.append((now, obj["meta_info"]["completion_tokens"]))
                last = obj
    if last is None:
        raise GridError("a stream ended without any event")
    meta = last["meta_info"]
    if meta["completion_tokens"] != max_new_tokens:
        raise GridError(f"asked {max_new_tokens} tokens, got {meta['completion_tokens']} (input {len(input_ids)})")
    return {"chunks": chunks, "meta": meta}


def window_step(lens: list[int], runs: list[dict]) -> dict:
    """The full-batch window's mean decode step and the batch's state in it."""
    firsts = [next(t for t, c in r["chunks"] if c > 0) for r in runs]
    lasts = [r["chunks"][-1][0] for r in runs]
    start, end = max(firsts), min(lasts)
    steps, mids, spans = [], [], []
    for r in runs:
        inside = [(t, c) for t, c in r["chunks"] if start <= t <= end and c > 0]
        if len(inside) < 2 or inside[-1][1] - inside[0][1] < 8:
            continue
        (ta, ca), (tb, cb) = inside[0], inside[-1]
        steps.append((tb - ta) / (cb - ca))
        spans.append(cb - ca)
        mids.append((ca + cb) / 2)
    if len(steps) < max(1, len(runs) // 2):
        raise GridError(f"no full-batch decode window long enough (batch {len(runs)}, window {end - start:.3f} s)")
    # every request of the batch has about the same number of tokens at a step (decoding starts once all prefilled)
    mid = float(np.median(mids))
    return {"step_s": statistics.median(steps), "step_s_mean": float(np.mean(steps)),
            "step_s_spread": float(np.max(steps) - np.min(steps)), "window_steps": int(np.median(spans)),
            "window_s": end - start, "mid_tokens": mid, "kv_tokens": float(sum(lens) + len(lens) * mid),
            "requests_measured": len(steps)}


async def flush(session: aiohttp.ClientSession, url: str) -> None:
    """/flush_cache; sglang answers 400 while a request is still being released, so it is asked again for 3 s."""
    for _ in range(30):
        async with session.post(f"{url}/flush_cache") as resp:
            text = await resp.text()
            if resp.status == 200:
                return
        await asyncio.sleep(0.1)
    raise GridError(f"/flush_cache answered {resp.status} for 3 s: {text[:200]}")


async def point(session: aiohttp.ClientSession, url: str, label: str, lens: list[int], seed: int, t0: float) -> dict:
    await flush(session, url)
    t_start = time.perf_counter() - t0
    wall_start = time.time()
    runs = await asyncio.gather(*(stream(session, url, ids(n, seed * 1000 + i), OUTPUT_TOKENS, t0)
                                  for i, n in enumerate(lens)))
    w = window_step(lens, runs)
    return {"label": label, "batch": len(lens), "lens": lens, "t_start": t_start,
            "t_end": time.perf_counter() - t0, "wall_start": wall_start, "wall_end": time.time(), **w,
            "cached": [r["meta"].get("cached_tokens") for r in runs],
            "first_token": [next(t for t, c in r["chunks"] if c > 0) for r in runs],
            "prefill_finished": [r["meta"].get("prefill_finished_time") for r in runs],
            "request_finished": [r["meta"].get("request_finished_ts") for r in runs],
            "chunks": [[[round(t - t_start, 5), c] for t, c in r["chunks"]] for r in runs]}


def plan(capacity: int, quick: bool) -> list[tuple[str, list[int]]]:
    points: list[tuple[str, list[int]]] = []
    batches = (1, 8, 32) if quick else BATCHES
    contexts = (128, 2048, 3968) if quick else CONTEXTS
    for b in batches:
        for n in contexts:
            fit = min(n, (capacity // b - OUTPUT_TOKENS - 1) // 100 * 100)
            if fit < 128:
                raise GridError(f"batch {b} does not fit the KV pool {capacity} at 128 tokens")
            points.append((f"{b}x{fit}", [fit] * b))
    for label, parts in MIXED[:2] if quick else MIXED:
        lens = [n for count, n in parts for _ in range(count)]
        if sum(n + OUTPUT_TOKENS + 1 for n in lens) > capacity:
            raise GridError(f"mixed point {label} does not fit the KV pool {capacity}")
        points.append((label, lens))
    if not quick:
        points += [(f"{b}x1024", [1024] * b) for b in ODD_BATCHES]
    for _, lens in points:
        if max(lens) > CONTEXT_LIMIT:
            raise GridError(f"input {max(lens)} + {OUTPUT_TOKENS} output tokens passes the 4,094-token rule")
    return points


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kv-capacity", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=420.0, help="stop (keeping what was measured) past this")
    parser.add_argument("--pass", dest="pass_no", type=int, default=0, help="a repeat of the grid: other prompts")
    opts = parser.parse_args()
    url = opts.url.rstrip("/")
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.get(f"{url}/server_info") as resp:
            info = await resp.json()
        async with session.get(f"{url}/v1/loads") as resp:
            accelerator = (await resp.json()).get("accelerator")
        capacity = opts.kv_capacity or int(info["max_total_num_tokens"] * 0.98)
        doc: dict = {"server_info": {k: info.get(k) for k in (
            "max_total_num_tokens", "max_running_requests", "context_length", "chunked_prefill_size",
            "attention_backend", "cuda_graph_max_bs", "decode_log_interval", "version", "triton_attention_num_kv_splits")},
            "accelerator": accelerator, "output_tokens": OUTPUT_TOKENS, "wall_t0": time.time() - (time.perf_counter() - t0),
            "points": [], "skipped": []}
        await flush(session, url)
        for seed, n in enumerate((64, 512)):  # warm-up (JIT of the decode kernels at both lengths), not recorded
            await asyncio.gather(*(stream(session, url, ids(n, 77 + 10 * seed + i), 16, t0) for i in range(4)))
        points = plan(capacity, opts.quick)
        for k, (label, lens) in enumerate(points):
            if time.perf_counter() - t0 > opts.budget_s:
                doc["skipped"] = [lb for lb, _ in points[k:]]
                print(f"budget {opts.budget_s:.0f} s reached: {len(points) - k} points left out", flush=True)
                break
            p = await point(session, url, label, lens, 100 + k + 10_000 * opts.pass_no, t0)
            p["pass"] = opts.pass_no
            doc["points"].append(p)
            print(f"{label:>22}: B={p['batch']:3d} kv={p['kv_tokens']:9.0f} step {p['step_s'] * 1e3:7.3f} ms "
                  f"(spread {p['step_s_spread'] * 1e3:.3f}, {p['window_steps']} steps) at {p['t_end']:.0f} s",
                  flush=True)
    doc["seconds"] = time.perf_counter() - t0
    opts.out.write_text(json.dumps(doc) + "\n")
    print(f"{opts.out}: {len(doc['points'])} points in {doc['seconds']:.0f} s")


if __name__ == "__main__":
    asyncio.run(main())

"""Timing calibration of one sglang server, for fitting a simulator profile (`tracebench/sim/fit.py`).

Measures what the fit reads, on one idle server (started with --skip-tokenizer-init --enable-metrics):
- `prefill`: one request at a time, 1 output token, prompts of 64..4089 fresh tokens (until 2026-11-26: 64..3968): server-side prefill time
  (prefill_finished_time - forward_entry_time), queue_time, sglang's e2e_latency and the client's e2e.
- `decode`: B streams of 512 in / 128 out sent at once, B = 1..256: inter-token latency (the gaps between stream
  chunks; sglang's default stream_interval is 1), TTFT and e2e medians.
- `prefix`: the prefix-cache series of tests/data/sglang-0.5.17/prefix-cache-h200.json, same shapes and seeds
  (A shared 2048-token prefix, B unique prompts, C a 1000-token shared part, D after a flush, E a burst of 8, F the
  first rows of the Mooncake slice built from their 512-token blocks), sent one at a time.
- (the H100 file of 2026-11-25 also holds a `clip` series: input 4089 asking 1..7 tokens, input 4000 asking 93..96;
  bench/gpu/clip_probe.py is the probe of sglang's context rule now.)
- `singles`: the meta_info of single non-streamed and streamed requests (per-request server overheads).
- `server_info`: what the server says of itself (max_total_num_tokens: the KV capacity on this GPU).

    python3 bench/gpu/calibrate.py http://127.0.0.1:30000 calibration.json [--quick]

Every id is < 32000 (llama-2's vocabulary; an id outside it kills a real server). --quick: fewer repeats and batch
sizes (a check of the script against a sim-server). Runs in about a minute on one GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import lzma
import statistics
import time
from pathlib import Path

import aiohttp
import numpy as np

REPO = Path(__file__).resolve().parents[2]
MOONCAKE = REPO / "tests" / "data" / "mooncake_synthetic_trace_last1000.jsonl.xz"
VOCAB_LOW, VOCAB_HIGH = 1000, 32000  # ids drawn in [1000, 32000): no special tokens, inside llama-2's vocabulary


def ids(n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(VOCAB_LOW, VOCAB_HIGH, n).tolist()


class Server:
    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self.session = session
        self.url = url

    async def generate(self, input_ids: list[int], max_new_tokens: int) -> dict:
        """One non-streamed request; its meta_info plus the client's own e2e."""
        body = {"input_ids": input_ids, "stream": False,
                "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
        t0 = time.perf_counter()
        async with self.session.post(f"{self.url}/generate", json=body) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise RuntimeError(f"/generate answered {resp.status}: {text[:300]}")
        client = time.perf_counter() - t0
        meta = json.loads(text)["meta_info"]
        return {"meta": meta, "client_e2e": client}

    async def stream(self, input_ids: list[int], max_new_tokens: int) -> dict:
        """One streamed request: the arrival time of every chunk that carries new tokens, and the final meta_info."""
        body = {"input_ids": input_ids, "stream": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
        t0 = time.perf_counter()
        chunks, last = [], None
        async with self.session.post(f"{self.url}/generate", json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"/generate answered {resp.status}: {(await resp.text())[:300]}")
            buf = b""
            async for piece in resp.content.iter_any():
                buf += piece
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if not event.startswith(b"data: ") or event == b"data: [DONE]":
                        continue
                    obj = json.loads(event[6:])
                    if "error" in obj:
                        raise RuntimeError(f"stream error: {obj}")
                    chunks.append((time.perf_counter() - t0, obj["meta_info"]["completion_tokens"]))
                    last = obj
        assert last is not None
        return {"chunks": chunks, "meta": last["meta_info"], "client_e2e": time.perf_counter() - t0}

    async def flush(self) -> None:
        async with self.session.post(f"{self.url}/flush_cache") as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"/flush_cache answered {resp.status}")


async def prefill_series(server: Server, quick: bool) -> list[dict]:
    out = []
    # up to 4,089: the longest prompt sglang takes with context 4,096 (max_req_input_len 4,090: .DUCUMENT/failure-modes.md)
    lengths = (64, 256, 1024, 2048, 4089) if quick else (64, 256, 512, 1024, 1536, 2048, 2560, 3072, 3584, 3968, 4000,
                                                          4089)
    for rep in range(2 if quick else 4):
        for n in lengths:
            r = await server.generate(ids(n, 1_000 + 10 * n + rep), 1)
            m = r["meta"]
            out.append({"ilen": n, "client_e2e": r["client_e2e"], "server_e2e": m["e2e_latency"],
                        "prefill": m["prefill_finished_time"] - m["forward_entry_time"], "queue_time": m["queue_time"],
                        "cached": m["cached_tokens"]})
    return out


async def decode_series(server: Server, quick: bool) -> list[dict]:
    out = []
    for b in (1, 8, 32) if quick else (1, 8, 16, 32, 64, 128, 256):
        await server.flush()
        runs = await asyncio.gather(*(server.stream(ids(512, 50_000 + 1_000 * b + i), 128) for i in range(b)))
        gaps, ttfts = [], []
        for r in runs:
            times = [t for t, count in r["chunks"] if count > 0]
            ttfts.append(times[0])
            gaps += list(np.diff(times))
        out.append({"batch": b, "itl_p50_ms": float(np.median(gaps)) * 1e3, "itl_mean_ms": float(np.mean(gaps)) * 1e3,
                    "ttft_p50_ms": float(np.median(ttfts)) * 1e3,
                    "e2e_p50": statistics.median(r["client_e2e"] for r in runs),
                    "server_e2e_p50": statistics.median(r["meta"]["e2e_latency"] for r in runs)})
    return out


async def prefix_series(server: Server, quick: bool) -> dict:
    """The series of prefix-cache-h200.json (same shapes and seeds as the H200 probe that made it)."""

    async def one(input_ids: list[int], out: int = 16) -> dict:
        r = await server.generate(input_ids, out)
        m = r["meta"]
        return {"prompt": m["prompt_tokens"], "cached": m["cached_tokens"],
                "prefill_s": m["prefill_finished_time"] - m["forward_entry_time"], "e2e": m["e2e_latency"],
                "client": r["client_e2e"]}

    res: dict = {}
    await server.flush()
    shared = ids(2048, 1)
    res["A_shared_prefix_seq"] = [await one(shared + ids(64, 100 + i)) for i in range(12)]
    res["B_unique_seq"] = [await one(ids(2112, 200 + i)) for i in range(12)]
    res["C_partial"] = [await one(shared[:1000] + ids(1112, 300 + i)) for i in range(4)]
    await server.flush()
    res["D_after_flush"] = [await one(shared + ids(64, 400))]
    await server.flush()
    res["E_burst_same_prefix"] = list(await asyncio.gather(*(one(shared + ids(64, 500 + i)) for i in range(8))))
    await server.flush()
    blocks: dict[int, list[int]] = {}
    rows = [json.loads(line) for line in lzma.decompress(MOONCAKE.read_bytes()).decode().splitlines()[: 30 if quick else 120]]
    seen: set[int] = set()
    expected, got = [], []
    for row in rows:
        hashes = row["hash_ids"][:7]  # at most 7 blocks of 512 = 3584 tokens: inside the 4096 context
        prompt = [t for h in hashes for t in blocks.setdefault(h, ids(512, 10_000_000 + h))]
        lead = 0
        for h in hashes:
            if h not in seen:
                break
            lead += 1
        expected.append(lead * 512)
        seen.update(hashes)
        got.append(await one(prompt, 8))
    res["F_mooncake_blocks"] = {"expected_cached_if_never_evicted": expected, "cached": [g["cached"] for g in got],
                                "prompt": [g["prompt"] for g in got], "prefill_s": [g["prefill_s"] for g in got]}
    return res


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    t0 = time.perf_counter()
    # limit=0: every stream of a decode point at once (aiohttp's default connector holds at most 100 connections)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        server = Server(session, opts.url.rstrip("/"))
        async with session.get(f"{server.url}/server_info") as resp:
            info = await resp.json()
        doc: dict = {"server_info": {k: info.get(k) for k in (
            "max_total_num_tokens", "max_running_requests", "context_length", "chunked_prefill_size", "page_size",
            "max_prefill_tokens", "schedule_policy", "mem_fraction_static", "attention_backend", "version")}}
        async with session.get(f"{server.url}/v1/loads") as resp:
            doc["accelerator"] = (await resp.json()).get("accelerator")
        doc["client"] = {"max_streams": None}   # tracebench/sim/fit.py: no limit on streams at once
        await server.flush()
        await server.generate(ids(64, 7), 4)  # warm-up, not recorded
        doc["singles"] = [(await server.generate(ids(256, 900 + i), 16))["meta"] for i in range(3)]
        doc["singles"] += [(await server.stream(ids(256, 950 + i), 16))["meta"] for i in range(2)]
        await server.flush()
        doc["prefill"] = await prefill_series(server, opts.quick)
        doc["decode"] = await decode_series(server, opts.quick)
        doc["prefix"] = await prefix_series(server, opts.quick)
    doc["seconds"] = time.perf_counter() - t0
    opts.out.write_text(json.dumps(doc, indent=1) + "\n")
    pre = {}
    for p in doc["prefill"]:
        pre.setdefault(p["ilen"], []).append(p["prefill"] * 1e3)
    print(f"{opts.out}: {doc['seconds']:.0f} s; server {doc['server_info']}; accelerator {doc['accelerator']}")
    print("prefill ms:", {n: round(statistics.median(v), 1) for n, v in pre.items()})
    print("decode ITL p50 ms:", {d["batch"]: round(d["itl_p50_ms"], 2) for d in doc["decode"]})
    f = doc["prefix"]["F_mooncake_blocks"]
    print("prefix F: expected", sum(f["expected_cached_if_never_evicted"]), "cached", sum(f["cached"]))


if __name__ == "__main__":
    asyncio.run(main())

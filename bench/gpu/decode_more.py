"""More decode (and prefill) points on one idle sglang server, after the first decode grid (issue 36, second pass).

The grid of decode_grid.py measured mostly uniform batches at sglang's CUDA-graph batch sizes (1, 2, 4, 8, 16, 32,
48, 64), where its triton decode attention splits each request's KV the fewest ways. Serving batches are mixed and
mostly of padded sizes (a batch of 22 runs as the graph of 24, its padding rows of length 1 make every request split
up to 8 ways), and the held-out runs decode few long requests. Families, in this order (each point as decode_grid.py
measures it: B streamed requests sent at once after a cache flush, 64 output tokens each, the mean step inside the
window where all B decode; sglang's own figure comes from its log, bench/gpu/decode_grid_log.py):

- `small`: B = 1…7 requests of 2,048…4,030 tokens (the region of the held-out Mooncake runs);
- `shared`: B requests in G groups, each group's requests sharing a 2,048-token prefix through the prefix cache (a
  first request per group puts it there), 256 own tokens each: what a decode step costs when the running requests
  read the same KV pages (the shared-prompt runs);
- `mixed`: B = 2…64 requests with contexts drawn from real traces (Azure conversation lengths: input + a uniform part
  of the output, as a running batch holds them; Mooncake's; short 128…1,024), at padded and unpadded batch sizes;
- `prefill`: single fresh prompts of 1,024…4,089 tokens, 1 output token, 3 each (calibrate.py's `prefill` layout),
  and prompts behind a cached prefix;
- `grid`: decode_grid.py's 61 points again (`--pass`: other prompts), its repeatability;
- `prefix` (issue 36, third pass): prefill steps behind a cached prefix of 1,024/2,048/3,072 tokens with 64…1,024 new
  tokens, 3 each, fresh prompts of 128…768 tokens, and 2…6 requests sent at once behind one cached 2,048-token prefix
  (256 own tokens each, as the shared-prompt node run): each request's sglang stamps (a batch shares one
  `forward_entry_time`). Not in the default families.

    python3 bench/gpu/decode_more.py http://127.0.0.1:30000 OUT_DIR [--families small,shared,...] [--budget-s S]
        [--azure TRACE] [--mooncake TRACE] [--quick]

Writes OUT_DIR/decode-more-<family>.json after each family (a call killed at its limit keeps the finished ones). A
family past the budget is cut (its measured points kept, the rest listed as `skipped`). Every id is < 32000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import lzma
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_grid import (OUTPUT_TOKENS, GridError, flush, ids, plan, point, stream,  # noqa: E402
                         window_step)

REPO = Path(__file__).resolve().parents[2]
AZURE = REPO / "reports" / "examples" / "h200x2-routing" / "azure.jsonl"
MOONCAKE = REPO / "tests" / "data" / "mooncake_synthetic_trace_last1000.jsonl.xz"
MAX_INPUT = 4094 - OUTPUT_TOKENS  # 4,030: input + 64 outputs within sglang's 4,094-token rule
SHARED_PREFIX, SHARED_OWN = 2048, 256
FAMILIES = ("small", "shared", "mixed", "prefill", "grid", "prefix")
DEFAULT_FAMILIES = FAMILIES[:5]


def small_points(quick: bool) -> list[tuple[str, list[int]]]:
    lens = (2048, 3072, 4030) if quick else (2048, 2560, 3072, 3584, 4030)
    out = [(f"{b}x{n}", [n] * b) for b in ((1, 3) if quick else (1, 2, 3, 4)) for n in lens]
    if not quick:
        out += [(f"{b}x{n}", [n] * b) for b in (5, 6, 7) for n in (3072, 4030)]
        out += [("1x4030+1x2048", [4030, 2048]), ("2x4030+1x1024", [4030, 4030, 1024]),
                ("1x4030+3x3000", [4030, 3000, 3000, 3000])]
    return out


def shared_points(quick: bool) -> list[tuple[str, int, list[int]]]:
    """(label, batch, group of each request)."""
    shapes = ((8, 1), (8, 8), (32, 4)) if quick else (
        (8, 1), (8, 2), (8, 8), (32, 1), (32, 8), (32, 32), (64, 1), (64, 16), (64, 64), (80, 1), (80, 20), (80, 80))
    out = [(f"{b} in {g} groups", b, [i % g for i in range(b)]) for b, g in shapes]
    if not quick:   # like the shared-prompt node run: requests drawn from 64 prompts (about 48 distinct among 80)
        draw = np.random.default_rng(7).integers(0, 64, 80).tolist()
        out.append(("80 drawn from 64 groups", 80, draw))
    return out


def trace_lengths(azure: Path, mooncake: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Input and output lengths of the two traces."""
    rows = [json.loads(line) for line in azure.read_text().splitlines()[1:] if line.strip()]
    az = (np.array([r["input_len"] for r in rows]), np.array([r["output_len"] for r in rows]))
    data = mooncake.read_bytes()
    if mooncake.suffix == ".xz":
        data = lzma.decompress(data)
    mrows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    mc = (np.array([r["input_length"] for r in mrows]), np.array([r["output_length"] for r in mrows]))
    return {"azure": az, "mooncake": mc}


def mixed_points(lengths: dict[str, tuple[np.ndarray, np.ndarray]], quick: bool) -> list[tuple[str, list[int]]]:
    """Running batches of real traces' requests: each holds its input and a uniform part of its output (as a request
    that has decoded for a while), clipped to MAX_INPUT; the 64 measured tokens come on top."""
    rng = np.random.default_rng(36)
    out = []
    plans = {"azure": (5, 8, 22, 40) if quick else (3, 5, 7, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 36, 40,
                                                     48, 56, 64),
             "mooncake": (2, 4) if quick else (2, 3, 4, 5, 6, 8, 12, 16, 24)}
    for name, batches in plans.items():
        inputs, outputs = lengths[name]
        for b in batches:
            pick = rng.integers(0, len(inputs), b)
            ctx = np.minimum(inputs[pick] + (rng.random(b) * outputs[pick]).astype(int), MAX_INPUT)
            out.append((f"{name} {b}", np.maximum(ctx, 16).tolist()))
    for b in (8, 32) if quick else (8, 16, 22, 32, 64):
        out.append((f"short {b}", rng.integers(128, 1025, b).tolist()))
    return out


async def shared_point(session: aiohttp.ClientSession, url: str, label: str, groups: list[int], seed: int,
                       t0: float) -> dict:
    """B requests whose group's 2,048-token prefix is in the cache (one request per group put it there first)."""
    await flush(session, url)
    prefixes = {g: ids(SHARED_PREFIX, seed * 1000 + 500 + g) for g in sorted(set(groups))}
    await asyncio.gather(*(stream(session, url, p + ids(1, seed * 1000 + 900 + g), 1, t0) for g, p in prefixes.items()))
    prompts = [prefixes[g] + ids(SHARED_OWN, seed * 1000 + i) for i, g in enumerate(groups)]
    t_start = time.perf_counter() - t0
    runs = await asyncio.gather(*(stream(session, url, p, OUTPUT_TOKENS, t0) for p in prompts))
    lens = [len(p) for p in prompts]
    w = window_step(lens, runs)
    return {"label": label, "batch": len(lens), "lens": lens, "groups": groups, "prefix": SHARED_PREFIX,
            "t_start": t_start, "t_end": time.perf_counter() - t0, "wall_start": time.time() - (time.perf_counter() - t0 - t_start),
            "wall_end": time.time(), **w, "cached": [r["meta"].get("cached_tokens") for r in runs],
            "chunks": [[[round(t - t_start, 5), c] for t, c in r["chunks"]] for r in runs]}


async def one(session: aiohttp.ClientSession, url: str, input_ids: list[int]) -> dict:
    body = {"input_ids": input_ids, "stream": False,
            "sampling_params": {"max_new_tokens": 1, "ignore_eos": True, "temperature": 0}}
    t = time.perf_counter()
    async with session.post(f"{url}/generate", json=body) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise GridError(f"/generate answered {resp.status}: {text[:300]}")
    client = time.perf_counter() - t
    m = json.loads(text)["meta_info"]
    return {"ilen": len(input_ids), "client_e2e": client, "server_e2e": m["e2e_latency"],
            "prefill": m["prefill_finished_time"] - m["forward_entry_time"], "queue_time": m["queue_time"],
            "cached": m["cached_tokens"], "forward_entry": m["forward_entry_time"],
            "prefill_finished": m["prefill_finished_time"], "received": m["request_received_ts"]}


async def prefix_family(session: aiohttp.ClientSession, url: str, quick: bool) -> list[dict]:
    """Prefill steps behind a cached prefix (single requests and a few at once) and short fresh prompts."""
    out = []
    news = (256,) if quick else (64, 128, 192, 256, 320, 384, 512, 768, 1024)
    for rep in range(1 if quick else 3):
        for cached in (2048,) if quick else (1024, 2048, 3072):
            for new in news:
                if cached + new > 4094:
                    continue
                await flush(session, url)
                prefix = ids(cached, 90_000 + cached + 7 * rep)
                await one(session, url, prefix + ids(1, 91_000 + rep))
                r = await one(session, url, prefix + ids(new, 92_000 + 3 * new + rep))
                out.append({**r, "series": "behind_prefix"})
        for new in (256,) if quick else (128, 192, 256, 320, 384, 512, 768):
            out.append({**await one(session, url, ids(new, 93_000 + 10 * new + rep)), "series": "fresh"})
        for k in (2,) if quick else (2, 3, 4, 6):
            await flush(session, url)
            prefix = ids(2048, 94_000 + 10 * k + rep)
            await one(session, url, prefix + ids(1, 95_000 + rep))
            runs = await asyncio.gather(*(one(session, url, prefix + ids(256, 96_000 + 100 * k + 10 * i + rep))
                                          for i in range(k)))
            out += [{**r, "series": f"together_{k}"} for r in runs]
    return out


async def prefill_family(session: aiohttp.ClientSession, url: str, quick: bool) -> list[dict]:
    """calibrate.py's `prefill` layout (fresh prompts, one at a time) plus prompts behind a cached prefix."""
    out = []
    lengths = (1024, 4089) if quick else (1024, 2048, 3072, 3584, 3840, 3968, 4000, 4032, 4064, 4089)
    for rep in range(1 if quick else 3):
        for n in lengths:
            out.append({**await one(session, url, ids(n, 70_000 + 10 * n + rep)), "series": "fresh"})
    for cached, new in ((2048, 512),) if quick else ((2048, 512), (2048, 2041), (3072, 1017), (1024, 3065)):
        for rep in range(1 if quick else 3):
            await flush(session, url)
            prefix = ids(cached, 80_000 + cached + rep)
            await one(session, url, prefix + ids(1, 81_000 + rep))
            r = await one(session, url, prefix + ids(new, 82_000 + new + rep))
            out.append({**r, "series": "behind_prefix"})
    return out


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--families", default=",".join(DEFAULT_FAMILIES))
    parser.add_argument("--budget-s", type=float, default=400.0, help="stop (keeping what was measured) past this")
    parser.add_argument("--azure", type=Path, default=AZURE)
    parser.add_argument("--mooncake", type=Path, default=MOONCAKE)
    parser.add_argument("--pass", dest="pass_no", type=int, default=1, help="the grid family's pass (other prompts)")
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    families = opts.families.split(",")
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        parser.error(f"--families: unknown {', '.join(unknown)} (known: {', '.join(FAMILIES)})")
    url = opts.url.rstrip("/")
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    lengths = trace_lengths(opts.azure, opts.mooncake)
    t0 = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300),
                                     connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.get(f"{url}/server_info") as resp:
            info = await resp.json()
        async with session.get(f"{url}/v1/loads") as resp:
            accelerator = (await resp.json()).get("accelerator")
        capacity = int(info["max_total_num_tokens"] * 0.98)
        head = {"server_info": {k: info.get(k) for k in (
            "max_total_num_tokens", "max_running_requests", "context_length", "chunked_prefill_size",
            "attention_backend", "cuda_graph_max_bs", "decode_log_interval", "version", "triton_attention_num_kv_splits",
            "cuda_graph_config")}, "accelerator": accelerator, "output_tokens": OUTPUT_TOKENS,
            "wall_t0": time.time() - (time.perf_counter() - t0)}
        await flush(session, url)
        for seed, n in enumerate((64, 512, 3000)):   # warm-up (kernel JITs), not recorded
            await asyncio.gather(*(stream(session, url, ids(n, 77 + 10 * seed + i), 16, t0) for i in range(4)))
        for k, family in enumerate(families):
            doc: dict = {**head, "family": family, "points": [], "skipped": []}
            if family in ("prefill", "prefix"):
                if time.perf_counter() - t0 > opts.budget_s:
                    doc["skipped"] = [family]
                else:
                    doc["points"] = await (prefill_family if family == "prefill" else prefix_family)(
                        session, url, opts.quick)
            else:
                if family == "shared":
                    todo = shared_points(opts.quick)
                elif family == "small":
                    todo = small_points(opts.quick)
                elif family == "mixed":
                    todo = mixed_points(lengths, opts.quick)
                else:
                    todo = plan(capacity, opts.quick)
                for j, item in enumerate(todo):
                    if time.perf_counter() - t0 > opts.budget_s:
                        doc["skipped"] = [x[0] for x in todo[j:]]
                        print(f"budget {opts.budget_s:.0f} s reached: {len(todo) - j} {family} points left out", flush=True)
                        break
                    seed = 200_000 + 1_000 * k + j + 10_000 * opts.pass_no
                    label = item[0]
                    try:   # a point without a full-batch window is a measurement that failed: said, not dropped
                        if family == "shared":
                            p = await shared_point(session, url, label, item[2], seed, t0)
                        else:
                            p = await point(session, url, label, item[1], seed, t0)
                    except GridError as err:
                        doc.setdefault("failed", []).append({"label": label, "error": str(err)})
                        print(f"{family:>7} {label:>24}: failed: {err}", flush=True)
                        continue
                    p["family"] = family
                    doc["points"].append(p)
                    print(f"{family:>7} {label:>24}: B={p['batch']:3d} kv={p['kv_tokens']:9.0f} step "
                          f"{p['step_s'] * 1e3:7.3f} ms ({p['window_steps']} steps) at {p['t_end']:.0f} s", flush=True)
            doc["seconds"] = time.perf_counter() - t0
            path = opts.out_dir / f"decode-more-{family}.json"
            path.write_text(json.dumps(doc) + "\n")
            print(f"{path}: {len(doc['points'])} points, {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    asyncio.run(main())

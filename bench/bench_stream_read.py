"""What reading a streamed answer costs the client, by output length: sglang 0.5.17 sends the cumulative `output_ids`
in every stream event (unless the server runs with `--incremental-streaming-output`), so an answer of n tokens is
~n^2/2 ids on the wire (issue 19's lead; docs/overhead.md). Client CPU per request (process time), for:

- `aiohttp`: aiohttp alone reading the stream (`iter_any`, nothing parsed): the floor for these bytes;
- `tracebench`: `SglangClient.generate` (what the replay runs: events split, the first token parsed, the last event
  parsed at [DONE], one item per event);

against a small server process streaming `data: {...}` events like sglang's /generate (one event per token, every
event with the ids so far, or with `--incremental` only the new one).

    .venv/bin/python bench/bench_stream_read.py [--tokens 7,100,1000,2000] [--requests 20] [--incremental]

CPU time on a shared machine varies with the load: compare the two columns of one run, and give the load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import urllib.request

import aiohttp

from tracebench.replay.client import SglangClient

SERVER = r'''
import sys, orjson
from aiohttp import web
incremental = sys.argv[2] == "1"
async def generate(request):
    n = int(request.query["n"])
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    ids = []
    for i in range(n):
        ids.append(1000 + i)
        meta = {"completion_tokens": i + 1, "prompt_tokens": 8, "cached_tokens": 0, "e2e_latency": 0.01,
                "finish_reason": {"type": "length", "length": n} if i == n - 1 else None}
        out = ids[-1:] if incremental else ids
        await resp.write(b"data: " + orjson.dumps({"output_ids": out, "meta_info": meta}) + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    return resp
async def health(request):
    return web.Response(text="ok")
app = web.Application()
app.router.add_post("/generate", generate)
app.router.add_get("/health", health)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
'''


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def measure(url: str, n: int, requests: int) -> tuple[float, float, int]:
    """(aiohttp ms, tracebench ms) of client CPU per request, and the bytes of one answer."""
    client = SglangClient(None, True)
    target = f"{url}/generate?n={n}"
    size = 0
    try:
        for _ in range(3):  # warm up both paths
            async with client.session.post(target, data=b"{}") as resp:
                size = len(await resp.read())
            async for _item in client.generate(target, b"{}"):
                pass
        t0 = time.process_time()
        for _ in range(requests):
            async with client.session.post(target, data=b"{}") as resp:
                async for _piece in resp.content.iter_any():
                    pass
        plain = (time.process_time() - t0) / requests
        t0 = time.process_time()
        for _ in range(requests):
            async for _item in client.generate(target, b"{}"):
                pass
        ours = (time.process_time() - t0) / requests
    finally:
        await client.close()
    return plain * 1e3, ours * 1e3, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="7,100,1000,2000")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--incremental", action="store_true", help="events carry only their new ids")
    args = parser.parse_args()
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), "1" if args.incremental else "0"],
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the stream server did not start") from None
                time.sleep(0.05)
        print(f"load average: {os.getloadavg()[0]:.2f}; {'incremental' if args.incremental else 'cumulative'} "
              f"output_ids; {args.requests} requests per length; aiohttp {aiohttp.__version__}")
        print(f"{'tokens':>7} {'answer bytes':>13} {'aiohttp ms':>11} {'tracebench ms':>14} {'ours on top':>12}")
        for n in (int(t) for t in args.tokens.split(",")):
            plain, ours, size = asyncio.run(measure(url, n, args.requests))
            print(f"{n:7d} {size:13,d} {plain:11.3f} {ours:14.3f} {ours - plain:+12.3f}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()

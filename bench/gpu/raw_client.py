"""A minimal HTTP client replaying a tracebench trace: the yardstick for tracebench's own overhead (issue 19 part 2,
docs/overhead.md). What a request costs a client that does nothing else, on the same servers, with the same load.

Same requests as `tracebench replay TRACE --attach S0 --attach S1 ... --policy round_robin` (streamed /generate):
the same input ids (tracebench's InputIds: the trace's sha256, its prefix blocks, the vocabulary size), the same
max_new_tokens, the same arrival times (each request sent at its arrival_s after the start), the servers in turn in
arrival order (what round_robin does with no cap). Nothing else: every body is built before the clock starts, the
schedule is plain asyncio sleeps (asyncio's own loop, so its millisecond timers show in the release lag), a request
is one task, and only the stream's last event is parsed (for its meta_info); the first token is the first data event
(sglang's first /generate event carries the first token). No answer checks, no records written until the end.

    python3 bench/gpu/raw_client.py TRACE --attach http://127.0.0.1:30100 --attach http://127.0.0.1:30101 \\
        --vocab-size 32000 --out raw-aiohttp.jsonl [--http aiohttp|socket]

`--http socket` drops aiohttp too: HTTP/1.1 written and read by hand on asyncio streams (keep-alive connections,
chunked responses), the floor of what Python's asyncio costs. Each output line has the same field names as
tracebench's requests.jsonl where the meaning is the same (t_arrival, t_released, t_dispatch, t_written, t_headers,
t_first_token, t_last_chunk, t_finish, t_parsed, server, status, completion_tokens, server_received, ...), on this
client's own clock (monotonic seconds since its start; sglang's stamps converted with its wall-clock anchor), so
bench/gpu/overhead_compare.py reads it like a run's records.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import orjson

from tracebench.replay.clock import RunClock
from tracebench.replay.tokens import InputIds, vocab_size_from_model
from tracebench.trace.format import load_trace_table

_STAMPS = (("request_received_ts", "server_received"), ("api_server_dispatch_finish_ts", "server_dispatched"),
           ("forward_entry_time", "server_forward_entry"), ("prefill_finished_time", "server_prefill_finished"),
           ("response_sent_to_client_ts", "server_first_sent"), ("request_finished_ts", "server_finished"))
_DONE = b"data: [DONE]"


def build_requests(trace: Path, vocab: int) -> list[dict[str, Any]]:
    """Every request's record stub and body (tracebench's ids for this trace; the body GenerateApi sends)."""
    header, table, sha = load_trace_table(trace)
    ids = InputIds(sha, vocab, header.block_size)
    out = []
    for row in range(len(table)):
        req = table.request(row)
        if req.after is not None:
            raise SystemExit(f"{trace}: closed-loop requests (after/delay_s) are not replayed by this client")
        input_ids = ids.ids(req.id, req.input_len) if req.prefix_blocks is None else ids.block_ids(req.prefix_blocks, req.input_len)
        body = orjson.dumps({"input_ids": input_ids, "sampling_params": {"max_new_tokens": req.output_len,
                             "ignore_eos": True, "temperature": 0}, "stream": True}, option=orjson.OPT_SERIALIZE_NUMPY)
        out.append({"rec": {"id": req.id, "input_len": req.input_len, "output_len": req.output_len,
                            "t_arrival": req.arrival_s}, "body": body})
    out.sort(key=lambda r: (r["rec"]["t_arrival"], r["rec"]["id"]))
    return out


def finish(rec: dict[str, Any], last: bytes | None, clock: RunClock) -> None:
    """The last event parsed: completion tokens and sglang's stamps (the only parse this client does)."""
    if last is None:
        rec["status"] = "error"
        return
    meta = orjson.loads(last[len(b"data: "):]).get("meta_info") or {}
    rec["status"] = "ok"
    rec["completion_tokens"] = meta.get("completion_tokens")
    rec["prompt_tokens"] = meta.get("prompt_tokens")
    rec["server_e2e_latency"] = meta.get("e2e_latency")
    rec["server_queue_time"] = meta.get("queue_time")
    for key, field in _STAMPS:
        if meta.get(key) is not None:
            rec[field] = clock.from_wall(meta[key])
    rec["t_parsed"] = clock.now()


class StampedBody(aiohttp.BytesPayload):
    """t_written once aiohttp has handed the body to the socket (as tracebench's client stamps it)."""

    def __init__(self, body: bytes, rec: dict[str, Any], clock: RunClock) -> None:
        super().__init__(body, content_type="application/json")
        self.rec, self.clock = rec, clock

    async def write(self, writer: Any) -> None:
        await super().write(writer)
        self.rec["t_written"] = self.clock.now()

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        await super().write_with_length(writer, content_length)
        self.rec["t_written"] = self.clock.now()


class AiohttpSender:
    def __init__(self, clock: RunClock) -> None:
        self.clock = clock
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None))

    async def send(self, url: str, body: bytes, rec: dict[str, Any]) -> None:
        now = self.clock.now
        first = last = None
        tail = b""
        rec["t_dispatch"] = now()
        async with self.session.post(f"{url}/generate", data=StampedBody(body, rec, self.clock)) as resp:
            rec["t_headers"] = now()
            if resp.status != 200:
                rec["status"], rec["error"] = "error", f"HTTP {resp.status}"
                return
            async for piece in resp.content.iter_any():
                t = now()
                events = (tail + piece).split(b"\n\n")
                tail = events.pop()
                for event in events:
                    if event == _DONE:
                        rec["t_finish"] = t
                        finish(rec, last, self.clock)
                        return
                    if first is None:
                        first = rec["t_first_token"] = t
                    last, rec["t_last_chunk"] = event, t
        rec["status"], rec["error"] = "error", "stream ended before [DONE]"

    async def close(self) -> None:
        await self.session.close()


class SocketSender:
    """HTTP/1.1 by hand: one keep-alive connection per request in flight, reused (a free list per server)."""

    def __init__(self, clock: RunClock) -> None:
        self.clock = clock
        self.free: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}

    async def send(self, url: str, body: bytes, rec: dict[str, Any]) -> None:
        now = self.clock.now
        rec["t_dispatch"] = now()
        pool = self.free.setdefault(url, [])
        parts = urlsplit(url)
        if pool:
            reader, writer = pool.pop()
        else:
            reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
        writer.write(b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                     % (parts.netloc.encode(), len(body)) + body)
        rec["t_written"] = now()
        head = await reader.readuntil(b"\r\n\r\n")
        rec["t_headers"] = now()
        if not head.startswith(b"HTTP/1.1 200"):
            rec["status"], rec["error"] = "error", head.split(b"\r\n", 1)[0].decode()
            writer.close()
            return
        first = last = None
        tail = b""
        while True:  # chunked transfer coding: size line, data, CRLF; size 0 ends it
            size = int((await reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            data = (await reader.readexactly(size + 2))[:-2]
            t = now()
            events = (tail + data).split(b"\n\n")
            tail = events.pop()
            for event in events:
                if event == _DONE:
                    rec["t_finish"] = t
                    continue
                if first is None:
                    first = rec["t_first_token"] = t
                last, rec["t_last_chunk"] = event, t
        pool.append((reader, writer))
        if "t_finish" not in rec:
            rec["status"], rec["error"] = "error", "stream ended before [DONE]"
            return
        finish(rec, last, self.clock)

    async def close(self) -> None:
        for pool in self.free.values():
            for _, writer in pool:
                writer.close()


async def replay(requests: list[dict[str, Any]], urls: list[str], http: str, flush: bool) -> RunClock:
    if flush:
        async with aiohttp.ClientSession() as session:
            for url in urls:
                async with session.post(f"{url}/flush_cache") as resp:
                    if resp.status != 200:
                        raise SystemExit(f"{url}/flush_cache answered {resp.status}: {await resp.text()}")
    clock = RunClock()
    sender = AiohttpSender(clock) if http == "aiohttp" else SocketSender(clock)
    loop = asyncio.get_running_loop()
    tasks = []
    for k, item in enumerate(requests):
        rec = item["rec"]
        while (delay := rec["t_arrival"] - clock.now()) > 0:
            await asyncio.sleep(delay)
        rec["t_released"] = clock.now()
        rec["server"] = k % len(urls)
        coro = sender.send(urls[rec["server"]], item["body"], rec)
        # start it at once where asyncio can (3.12+), as aiohttp itself does for its body writes
        tasks.append(asyncio.Task(coro, loop=loop, eager_start=True) if sys.version_info >= (3, 12)
                     else loop.create_task(coro))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for item, result in zip(requests, results):
        if isinstance(result, BaseException):
            item["rec"]["status"], item["rec"]["error"] = "error", f"{type(result).__name__}: {result}"
    await sender.close()
    return clock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--attach", action="append", required=True, help="a server's URL (repeat: in turn)")
    vocab = parser.add_mutually_exclusive_group(required=True)
    vocab.add_argument("--vocab-size", type=int)
    vocab.add_argument("--model", help="a model folder (its config.json's vocab_size)")
    parser.add_argument("--out", type=Path, required=True, help="JSONL: one line per request")
    parser.add_argument("--http", choices=("aiohttp", "socket"), default="aiohttp")
    parser.add_argument("--no-flush-cache", action="store_true", help="leave the servers' prefix caches as they are")
    args = parser.parse_args()
    size = args.vocab_size if args.vocab_size is not None else vocab_size_from_model(args.model)
    requests = build_requests(args.trace, size)
    t0 = time.monotonic()
    asyncio.run(replay(requests, [u.rstrip("/") for u in args.attach], args.http, not args.no_flush_cache))
    with args.out.open("wb") as fh:
        for item in requests:
            fh.write(orjson.dumps(item["rec"]) + b"\n")
    ok = sum(item["rec"].get("status") == "ok" for item in requests)
    print(f"raw client ({args.http}): {len(requests)} requests in {time.monotonic() - t0:.1f} s, ok {ok}, "
          f"records in {args.out}")


if __name__ == "__main__":
    main()

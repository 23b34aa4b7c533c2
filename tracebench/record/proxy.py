"""`tracebench record`: an HTTP proxy in front of an sglang server (or router) that turns the traffic it forwards
into a trace (docs/record.md).

Requests to /generate, /v1/completions and /v1/chat/completions are forwarded unchanged (streamed or not, errors
included) and recorded; every other path is passed through without a record. Per recorded request the proxy keeps
the arrival moment (when its headers arrived), the input and output lengths as the server counted them
(`meta_info.prompt_tokens` / `completion_tokens`, or OpenAI `usage`), salted chained prefix block ids (blocks.py)
and how it ended (ok / error / cancelled). Nothing of the prompt or the answer is stored.

Each request's arrival and end are appended to the recording's part file at once (part.py: it is also the lock that
keeps a second recorder off the name); when the recording stops (Ctrl-C, SIGTERM) the part file becomes the trace (ok
requests, in arrival order, trace format v1) and the status file (every request), neither written over an existing
file. An upstream that breaks off an answer mid-stream gets the client's connection broken off too (no clean end).
One exception to "unchanged": an OpenAI stream whose client did not ask for usage gets `stream_options.include_usage`
added (the only place the server reports the lengths of a stream); the usage-only chunk this adds is held back, so
the client receives exactly what it would have received without the proxy.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson
from aiohttp import web

from tracebench.errors import ConfigError
from tracebench.record.blocks import Tokenize, prefix_blocks
from tracebench.record.part import (TEXT_NO_TOKENIZER, TOKENIZER_HINT, PartFile, Recorded, claim, read_part, status_path,
                                    write_outputs)

RECORDED_PATHS = {"/generate": "generate", "/v1/completions": "completions", "/v1/chat/completions": "chat"}
# hop-by-hop and framing headers: aiohttp sets its own on each side
_SKIP_HEADERS = frozenset(("host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade",
                           "proxy-connection", "te", "trailer"))
_DATA = b"data: "
UPSTREAM_CHECK_TIMEOUT_S = 10.0
STOPPED = "the recording stopped while the request was in flight"


@dataclass(frozen=True)
class RecordConfig:
    host: str
    port: int
    upstream: str
    output: Path
    block_size: int
    tokenizer: Tokenize | None
    tokenizer_desc: str | None
    quiet: bool = False

    @property
    def status_path(self) -> Path:
        return status_path(self.output)


class Recorder:
    """Collects the requests: each one's arrival and end in the part file at once (part.py), the trace and the
    status file when the recording stops."""

    def __init__(self, cfg: RecordConfig, part: PartFile) -> None:
        self.cfg = cfg
        self.salt = os.urandom(16)  # per recording, never written: block ids mean nothing outside this file
        self.part = part
        self.next_id = 0
        self.in_flight: dict[int, Recorded] = {}
        self.stopping = False  # set when the recording stops: handlers cancelled from then on were not the client's doing
        self.counts = {"ok": 0, "error": 0, "cancelled": 0}

    def arrive(self, path: str, t_arrival: float) -> Recorded:
        rec = Recorded(self.next_id, t_arrival, path, stream=False)
        self.next_id += 1
        self.in_flight[rec.id] = rec
        self.part.arrived(rec.id, t_arrival, path)
        return rec

    def finish(self, rec: Recorded) -> None:
        del self.in_flight[rec.id]
        self.counts[rec.status] += 1
        self.part.ended(rec)  # a crash keeps what finished (the part file), Ctrl-C turns it into the trace

    def close(self) -> tuple[int, Path, Path, int]:
        """Record what is still in flight as cancelled, then write the trace and the status file (never over a
        file, never half-written) and remove the part file. Returns (trace lines, trace path, status path, trace
        lines of text prompts without prefix blocks). When
        they cannot be written, the part file stays, with every request: the error says how to recover it."""
        for rec in list(self.in_flight.values()):
            rec.status, rec.error = "cancelled", STOPPED
            self.finish(rec)
        _, recs, lost = read_part(self.part.path)
        assert lost == 0, f"{lost} request(s) of the part file have no end"
        try:
            count, _, text_without_blocks = write_outputs(self.cfg.output, self.part.meta, recs)
        except ConfigError as err:
            self.part.release(remove=False)
            raise ConfigError(f"{err}; every request of the recording is kept in {self.part.path}: move the "
                              f"file in the way, then: tracebench record --recover -o {self.cfg.output}") from None
        self.part.release(remove=True)
        return count, self.cfg.output, self.cfg.status_path, text_without_blocks


# ---- what a request and its answer say ----------------------------------------------------------------------------


def _prompt_tokens(api: str, obj: dict[str, Any], tokenize: Tokenize | None) -> list[int] | str | None:
    """The prompt's token ids as the client sent them, or tokenized from its text; a string saying why there are
    none (a batch, no --tokenizer for a text prompt); None when the body holds no usable prompt (the server refused
    it, or answered without one we can read)."""
    batch = "batch request (several prompts): not recorded as trace lines"
    if api == "chat":
        messages = obj.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            return None
        prompt: Any = "".join([m["content"] + " " for m in messages])  # contents in order; the template's tokens are unseen
    elif api == "generate":
        prompt = obj.get("input_ids") if obj.get("input_ids") is not None else obj.get("text")
    else:
        prompt = obj.get("prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (list, str)):
        return batch
    if not isinstance(prompt, str):
        return None
    if tokenize is None:
        return TEXT_NO_TOKENIZER
    return tokenize(prompt)


def _lengths(api: str, final: bytes) -> tuple[int, int] | str:
    """(prompt_tokens, completion_tokens) from the final answer object, or why they are not there."""
    try:
        obj = orjson.loads(final)
    except orjson.JSONDecodeError:
        return f"answer is not JSON: {final[:120]!r}"
    if isinstance(obj, list):
        return "batch request (several prompts): not recorded as trace lines"
    if not isinstance(obj, dict):
        return f"answer is not a JSON object: {final[:120]!r}"
    if api == "generate":
        finish = obj.get("meta_info", {}).get("finish_reason") if isinstance(obj.get("meta_info"), dict) else None
        if isinstance(finish, dict) and finish.get("type") == "abort":
            return f"aborted by the server: {finish.get('message')}"
    else:
        choices = obj.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict) and choices[0].get("finish_reason") == "abort":
            return "aborted by the server (finish_reason abort)"
    counts = obj.get("meta_info") if api == "generate" else obj.get("usage")
    if not isinstance(counts, dict):
        return f"answer without {'meta_info' if api == 'generate' else 'usage'}: {final[:120]!r}"
    prompt, completion = counts.get("prompt_tokens"), counts.get("completion_tokens")
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return f"answer without prompt_tokens/completion_tokens: {final[:120]!r}"
    return prompt, completion


def _error_of(data: bytes) -> str | None:
    """The message of an error object (sglang's `{"error": {...}}` or OpenAI's `{"object": "error", ...}`)."""
    if not (data.startswith(b'{"error"') or b'"object":"error"' in data[:40]):
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return data.decode("utf-8", "replace")[:300]
    err = obj.get("error", obj) if isinstance(obj, dict) else obj
    message = err.get("message") if isinstance(err, dict) else err
    return str(message)[:300]


def _is_usage_chunk(data: bytes) -> bool:
    return b'"choices":[]' in data and b'"usage":{' in data


# ---- the proxy ----------------------------------------------------------------------------------------------------


class _ClientGone(Exception):
    """Writing to the client failed: it disconnected."""


async def _send(resp: web.StreamResponse, data: bytes) -> None:
    try:
        await resp.write(data)
    except ConnectionResetError as err:  # aiohttp's ClientConnectionResetError is one too
        raise _ClientGone(type(err).__name__) from None


def _break_off(request: web.Request) -> None:
    """End the client's connection without the answer's end (no terminating chunk): the upstream broke off, and a
    client must see that (curl: exit 18, aiohttp: ClientPayloadError) as it would without the proxy, not a clean end.
    What was written is flushed first; aiohttp's own end-of-answer write then finds the connection closing and stops."""
    if request.transport is not None:
        request.transport.close()


def _response_headers(up: aiohttp.ClientResponse) -> dict[str, str]:
    return {k: v for k, v in up.headers.items() if k.lower() not in _SKIP_HEADERS}


class Proxy:
    def __init__(self, cfg: RecordConfig, recorder: Recorder, session: aiohttp.ClientSession) -> None:
        self.cfg = cfg
        self.recorder = recorder
        self.session = session
        self.upstream = cfg.upstream
        self.warned_text = False

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        api = RECORDED_PATHS.get(request.path) if request.method in ("POST", "PUT") else None
        if api is None:
            return await self._pass_through(request)
        rec = self.recorder.arrive(request.path, time.perf_counter())
        try:
            return await self._recorded(request, api, rec)
        except asyncio.CancelledError:  # the client went away (aiohttp cancels the handler), or the proxy stops
            if not rec.delivered:
                rec.status, rec.error = "cancelled", (STOPPED if self.recorder.stopping else
                                                      "the client disconnected before the answer was complete")
            raise
        except _ClientGone as err:
            rec.status, rec.error = "cancelled", f"the client disconnected before the answer was complete ({err})"
            raise asyncio.CancelledError from None
        finally:
            if rec.id in self.recorder.in_flight:
                self.recorder.finish(rec)

    def _headers(self, request: web.Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _SKIP_HEADERS}

    async def _pass_through(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            async with self.session.request(request.method, f"{self.upstream}{request.rel_url}", data=body,
                                            headers=self._headers(request)) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason, headers=_response_headers(up))
                await resp.prepare(request)
                try:
                    async for piece in up.content.iter_any():
                        await resp.write(piece)
                except aiohttp.ClientPayloadError:  # the upstream broke off its answer: so does the proxy
                    _break_off(request)
                    return resp
                await resp.write_eof()
                return resp
        except aiohttp.ClientConnectorError as err:
            return web.Response(status=502, text=f"tracebench record: upstream {self.upstream}: {err}\n")

    async def _recorded(self, request: web.Request, api: str, rec: Recorded) -> web.StreamResponse:
        body = await request.read()
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            obj = None  # forwarded as it is: the server's answer (a 400) is recorded
        if not isinstance(obj, dict):
            obj = None
        rec.stream = obj is not None and obj.get("stream") is True
        hold_usage = False
        if obj is not None and rec.stream and api != "generate":
            options = obj.get("stream_options")
            if not (isinstance(options, dict) and options.get("include_usage")):
                # the only way to learn a stream's lengths; the usage chunk this adds is not passed on
                obj["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
                body = orjson.dumps(obj)
                hold_usage = True
        try:
            async with self.session.post(f"{self.upstream}{request.rel_url}", data=body,
                                         headers=self._headers(request)) as up:
                rec.http_status = up.status
                if rec.stream and up.status == 200 and up.content_type == "text/event-stream":
                    return await self._relay_stream(request, up, hold_usage, rec, api)
                answer = await up.read()
                resp = web.Response(status=up.status, reason=up.reason, body=answer, headers=_response_headers(up))
                try:
                    await resp.prepare(request)
                    await resp.write_eof()
                except ConnectionResetError as err:
                    raise _ClientGone(type(err).__name__) from None
                error = _error_of(answer)
                if up.status != 200:
                    error = f"HTTP {up.status}: {error or answer[:300].decode('utf-8', 'replace')}"
                self._take(rec, api, answer, error)
                return resp
        except aiohttp.ClientError as err:  # the upstream before its answer started (writes to the client raise _ClientGone)
            rec.status, rec.error = "error", f"upstream {self.upstream}: {type(err).__name__}: {err}"
            return web.Response(status=502, text=f"tracebench record: upstream {self.upstream}: {err}\n")
        finally:
            # after the answer went out (also when the client closed right after its last byte)
            if rec.delivered and rec.status == "ok" and rec.not_in_trace is None:
                self._blocks(rec, api, obj)

    async def _relay_stream(self, request: web.Request, up: aiohttp.ClientResponse, hold_usage: bool,
                            rec: Recorded, api: str) -> web.StreamResponse:
        """Pass the SSE events on as they complete. The final data object (the last event before [DONE]:
        /generate's final meta_info, an OpenAI stream's usage chunk) gives the lengths; they are taken before the
        piece holding [DONE] goes out, since the client may close as soon as it has [DONE]."""
        resp = web.StreamResponse(status=up.status, reason=up.reason, headers=_response_headers(up))
        try:
            await resp.prepare(request)
        except ConnectionResetError as err:
            raise _ClientGone(type(err).__name__) from None
        last = b""
        usage: bytes | None = None
        error: str | None = None
        done = False
        broken = False
        buf = b""
        pieces = up.content.iter_any()
        while True:
            try:
                piece = await pieces.__anext__()
            except StopAsyncIteration:
                break
            except aiohttp.ClientError as err:  # the upstream broke off mid-stream: the client must see the same
                error = error or f"upstream {self.upstream} broke off the stream: {type(err).__name__}: {err}"
                broken = True
                break
            buf += piece
            out = []
            start = 0
            while (end := buf.find(b"\n\n", start)) >= 0:
                event = buf[start:end + 2]
                start = end + 2
                if event.startswith(_DATA):
                    data = event[6:-2]
                    if data == b"[DONE]":
                        done = True
                        self._take(rec, api, usage if usage is not None else last, error)
                    else:
                        if error is None and data.startswith(b'{"error"'):
                            error = _error_of(data)
                        if hold_usage and _is_usage_chunk(data):
                            usage = data
                            continue  # added by the proxy: the client did not ask for it
                        last = data
                out.append(event)
            buf = buf[start:]
            if out:
                await _send(resp, b"".join(out))
        if buf:
            await _send(resp, buf)
        if not done:
            self._take(rec, api, b"", error or "the stream ended before data: [DONE] (upstream closed it)")
        if broken:
            _break_off(request)
            return resp
        try:
            await resp.write_eof()
        except ConnectionResetError:
            pass  # the client had the whole answer ([DONE]) and closed before the stream's end marker
        return resp

    def _take(self, rec: Recorded, api: str, final: bytes, error: str | None) -> None:
        """How the request ended, from its final answer object (or the error seen); lengths as the server counted."""
        rec.delivered = True
        if error is not None:
            rec.status, rec.error = "error", error
            return
        counted = _lengths(api, final)
        if isinstance(counted, str):
            if counted.startswith("aborted"):
                rec.status, rec.error = "error", counted
            else:
                rec.not_in_trace = counted
            return
        rec.input_len, rec.output_len = counted
        if rec.input_len < 1 or rec.output_len < 1:
            rec.not_in_trace = "no input or no output token (a trace line needs at least one of each)"

    def _blocks(self, rec: Recorded, api: str, obj: dict[str, Any] | None) -> None:
        """Prefix blocks from the request's prompt (after the answer went out: off the answer's path)."""
        if obj is not None and api != "generate" and obj.get("n", 1) != 1:
            rec.not_in_trace = "n > 1 (several completions of one prompt): usage sums them"
            return
        tokens = _prompt_tokens(api, obj, self.cfg.tokenizer) if obj is not None else None
        if isinstance(tokens, str):
            if tokens.startswith("batch"):
                rec.not_in_trace = tokens
            else:
                rec.no_blocks = tokens
                if not self.warned_text:
                    self.warned_text = True
                    print(f"tracebench record: request {rec.id} has a text prompt and no --tokenizer was given: such "
                          f"requests are recorded without prefix blocks (no prefix structure; the count comes at the "
                          f"end): {TOKENIZER_HINT}", file=sys.stderr)
            return
        if tokens is None:
            return
        assert rec.input_len is not None
        if len(tokens) != rec.input_len:
            rec.hashed_tokens = len(tokens)
        rec.prefix_blocks = prefix_blocks(tokens, rec.input_len, self.cfg.block_size, self.recorder.salt)


async def check_upstream(session: aiohttp.ClientSession, upstream: str) -> None:
    """Fail at start when nothing answers at the upstream URL (any HTTP answer counts: it may be a router)."""
    try:
        async with session.get(f"{upstream}/model_info", timeout=aiohttp.ClientTimeout(total=UPSTREAM_CHECK_TIMEOUT_S)) as resp:
            await resp.read()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
        raise ConfigError(f"--upstream {upstream}: no answer ({type(err).__name__}: {err}); is the server up?") from None


async def _record(cfg: RecordConfig, part: PartFile, out: IO[str]) -> tuple[int, Path, Path, dict[str, int], int]:
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None),
                                    auto_decompress=False)
    recorder = Recorder(cfg, part)
    try:
        await check_upstream(session, cfg.upstream)
        proxy = Proxy(cfg, recorder, session)
        runner = web.AppRunner(proxy.make_app(), handle_signals=False, access_log=None, handler_cancellation=True)
        await runner.setup()
        try:
            site = web.TCPSite(runner, cfg.host, cfg.port, backlog=1024, reuse_address=True, shutdown_timeout=0.5)
            try:
                await site.start()
            except OSError as err:
                raise ConfigError(f"--listen {cfg.host}:{cfg.port}: cannot listen there ({err.strerror})") from None
            await _warm_up(session, cfg)
            # what start-up made lives as long as the proxy: out of the collector's sight, a full collection (a
            # pause of the loop, so late arrival stamps) does not walk it again and again
            gc.collect()
            gc.freeze()
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            if not cfg.quiet:
                print(f"tracebench record: listening on http://{cfg.host}:{cfg.port} -> {cfg.upstream}; writing "
                      f"{cfg.output} on Ctrl-C", file=out, flush=True)
            await stop.wait()
        finally:
            recorder.stopping = True
            await runner.cleanup()  # in-flight handlers are cancelled: recorded as cancelled
            for sig in (signal.SIGINT, signal.SIGTERM):
                asyncio.get_running_loop().remove_signal_handler(sig)
        count, trace, status, text_without_blocks = recorder.close()
        return count, trace, status, recorder.counts, text_without_blocks
    finally:
        # a recording that never saw a request leaves nothing; one that did keeps its part file (--recover)
        part.release(remove=recorder.next_id == 0)
        await session.close()


async def _warm_up(session: aiohttp.ClientSession, cfg: RecordConfig) -> None:
    """One pass-through request to itself before the first client's: the first request through a fresh aiohttp
    server and client pays for lazy set-up (~10 ms here), which would otherwise shift the first arrival stamp."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(cfg.host, cfg.host)
    host = f"[{host}]" if ":" in host else host
    async with session.get(f"http://{host}:{cfg.port}/model_info") as resp:
        await resp.read()


def run_record(cfg: RecordConfig, out: IO[str]) -> tuple[int, Path, Path, dict[str, int], int]:
    """Record until SIGINT or SIGTERM. Returns (trace lines, trace path, status path, counts by status, trace lines of
    text prompts without prefix blocks). The name is
    claimed first (part.claim: refused when taken, or when a stopped recording left its part file there)."""
    part = claim(cfg.output, {"trace": cfg.output.name, "upstream": cfg.upstream, "block_size": cfg.block_size,
                              "tokenizer": cfg.tokenizer_desc,
                              "recorded_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
    return asyncio.run(_record(cfg, part, out))

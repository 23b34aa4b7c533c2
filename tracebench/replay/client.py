"""sglang's HTTP API as the replay uses it: `POST /generate` (or, with --api, `/v1/completions` or
`/v1/chat/completions`: the `Api` objects at the end), `GET /health`, `/model_info`, `/server_info`, `/v1/loads`
(facts: .DUCUMENT/endpoints.md, .DUCUMENT/openai-api.md).

Shapes checked against what real sglang 0.5.17 answered (tests/data/sglang-0.5.17/api_capture.json) and its
http_server.py:
- `/generate` with `stream: true` answers `data: {json}\\n\\n` events carrying the cumulative `output_ids` and a
  `meta_info` whose `completion_tokens` counts the tokens so far; the last event before `data: [DONE]` carries the
  final `meta_info` (`finish_reason` set, `e2e_latency`, and with `--enable-metrics` the server's time.time() stamps).
  A request sglang refuses while streaming comes as HTTP 200 with `data: {"error": {"message": ...}}` then [DONE];
  without streaming as HTTP 400 `{"error": {"message": ...}}` (FastAPI validation: `{"message": ...}`).
- An aborted request finishes with `finish_reason: {"type": "abort", "message": ...}`.
- `/health` answers 503 while starting, 200 when up (real sglang takes ~1 s: it runs a one-token generation, so it
  is polled at start-up only; liveness during the run is `/model_info`).

This module is the one place where errors are caught, because here they are measurements: a refused, dropped or
timed-out request becomes an Answer with status `error` or `timeout`. An answer that breaks the contract (a 200
without meta_info, an event that is not JSON) is a ServerProtocolError and stops the run.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np
import orjson

from tracebench.errors import ServerProtocolError

if TYPE_CHECKING:
    from tracebench.replay.http_session import StampedBody

_JSON_HEADERS = {"Content-Type": "application/json"}
# when a request was sent (this host's wall clock): tracebench's simulated server takes it in the profile's
# request_hop_s after, as real sglang would (sim/validate.py receipt_time); sglang ignores it
SENT_HEADER = "X-Tracebench-Sent"
_DATA = b"data: "
_DONE = b"[DONE]"
_ERROR_EVENT = b'{"error"'
FIRST_TOKEN = "first_token"  # yielded by SglangClient.generate when the first output token arrived
CHUNK = "chunk"  # yielded for every later event of the stream (more output tokens): the inter-token gaps


@dataclass(slots=True)
class Answer:
    """How one /generate ended. `meta` is the final meta_info (status ok only). `connection_lost` says the failure
    was the connection itself (refused, dropped): the router then checks the server's health."""

    status: Literal["ok", "error", "timeout"]
    error: str | None = None
    meta: dict[str, Any] | None = None
    connection_lost: bool = False


# The meta_info keys the router reads of an answer (router.Router._take_answer: the counts, the latencies, sglang's
# stamps, a simulator's lag): a sender process passes on only these (router.py checks at import that it reads no
# other), so that every answer's pipe message carries a dozen numbers, not sglang's whole meta_info
METAINFO_READ = ("completion_tokens", "prompt_tokens", "cached_tokens", "e2e_latency", "queue_time",
                 "tracebench_sim_lag", "request_received_ts", "forward_entry_time", "prefill_finished_time",
                 "request_finished_ts", "api_server_dispatch_finish_ts", "response_sent_to_client_ts")


@dataclass(slots=True)
class Fetched:
    """A GET's outcome: the parsed JSON body, or why there is none (`connection_lost`: the server was not reached;
    `timed_out`: it was reached but gave no answer in time)."""

    obj: Any
    error: str | None = None
    connection_lost: bool = False
    timed_out: bool = False


_SSE_IGNORED = (b"event", b"id", b"retry")  # legal SSE fields that carry nothing the replay reads


def sse_data(url: str, event: bytes) -> bytes | None:
    """The data of one server-sent event (the text between two blank lines), as the SSE spec reads it: comment lines
    (`: keepalive`) and the `event:`, `id:` and `retry:` fields are ignored, `data:` lines are joined with newlines
    (one space after the colon is dropped). None when the event carries no data (a keep-alive). A line that is none
    of these is a ServerProtocolError: tracebench reads only sglang's streams."""
    data: list[bytes] = []
    for line in event.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        name, colon, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data" and colon:
            data.append(value)
        elif name not in _SSE_IGNORED or not colon:
            raise ServerProtocolError(f"{url}: {line[:200]!r} is not a line of a server-sent event this client reads "
                                      "(data:, event:, id:, retry:, or a : comment)")
    return b"\n".join(data) if data else None


def _error_text(body: bytes) -> str:
    """sglang's message from an error body (`{"error": {"message"}}` or `{"message"}`), else the body itself."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:500]
    if isinstance(obj, dict):
        inner = obj.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(obj.get("message"), str):
            return obj["message"]
    return body.decode("utf-8", "replace").strip()[:500]


class Stamps(Protocol):
    """The moments `SglangClient.generate` stamps on its caller's record (replay/records.py RequestRecord)."""

    t_written: float | None
    t_headers: float | None


# How long a pooled connection may sit idle and still be reused (issue 33 B7). sglang 0.5.17's uvicorn closes a
# connection idle for 5 s (SGLANG_TIMEOUT_KEEP_ALIVE, http_server.py); aiohttp keeps idle ones 15 s by default and
# reuses the one idle longest first (its pool is a FIFO: connector.py _get, popleft), so under bursts a request could
# be written into a connection the server was closing at that moment: it failed with "Connection reset by peer" or
# ServerDisconnectedError, never stamped by sglang (2 of 7,961 at 400 req/s on 4 H200s). Below the server's limit,
# with a margin for the answer's last bytes in flight, tracebench closes such a connection first and opens a new one.
KEEPALIVE_S = 4.0


def timeout_text(request_timeout: float) -> str:
    """What a record says of a request --timeout ended (its run seconds), unless the caller names it otherwise."""
    return f"no complete answer within --timeout {request_timeout:g} s"


class SglangClient:
    """One aiohttp session for the whole run: no connection limit (the router decides what is in flight), no
    session-wide timeout (aiohttp's default of 300 s would cut long requests); `request_timeout` applies per
    /generate, from send to the last byte. A pooled connection idle for more than `keepalive` seconds is closed, not
    reused (KEEPALIVE_S: below the server's own keep-alive)."""

    def __init__(self, request_timeout: float | None, stream: bool, timeout_reason: str | None = None,
                 api: Api | None = None, keepalive: float = KEEPALIVE_S) -> None:
        """`request_timeout`: run seconds; `timeout_reason`: what a timed-out record says (default: names it);
        `api`: which HTTP API the requests speak (default: sglang's native /generate)."""
        self.api = api if api is not None else GenerateApi()
        self.stream = stream
        self.request_timeout = request_timeout
        if timeout_reason is None and request_timeout is not None:
            timeout_reason = timeout_text(request_timeout)
        self.timeout_reason = timeout_reason
        # aiohttp is imported here, not with this module: a virtual run uses this module's names but no socket
        from tracebench.replay import http_session

        self._errors = http_session.CLIENT_ERRORS
        self._timeout = http_session.ClientTimeout
        self._stamped_body = http_session.StampedBody
        self._gen_timeout = http_session.ClientTimeout(total=request_timeout)
        self.session = http_session.new_session(keepalive)

    async def close(self) -> None:
        await self.session.close()

    async def generate(self, generate_url: str, body: bytes, stamps: Stamps | None = None,
                       now: Callable[[], float] | None = None) -> AsyncIterator[Answer | str]:
        """POST the request (a body made by `self.api`); yields FIRST_TOKEN when the first output token arrives
        (streaming only), CHUNK for each later event (sglang sends one per stream_interval tokens, the last with the
        last tokens and finish_reason), then exactly one Answer. The caller stamps the moments as the items arrive;
        the two it cannot see are stamped on `stamps` with `now` (the run clock), when given: `t_written` (the body
        went to the socket: _StampedBody) and `t_headers` (the response's headers arrived)."""
        api = self.api
        data: bytes | StampedBody = body
        if stamps is not None:
            assert now is not None
            data = self._stamped_body(body, stamps, now)
        try:
            headers = {**_JSON_HEADERS, SENT_HEADER: repr(time.time())}
            async with self.session.post(generate_url, data=data, headers=headers, timeout=self._gen_timeout) as resp:
                if stamps is not None:
                    stamps.t_headers = now()  # type: ignore[misc]
                if resp.status != 200:
                    yield Answer("error", f"HTTP {resp.status}: {_error_text(await resp.read())}")
                    return
                if not self.stream:
                    yield api.final_answer(generate_url, await resp.read())
                    return
                first_seen = False
                # the last data event so far, as (bytes, start, end): kept by reference, copied only at [DONE] (events
                # after the first token are not parsed, and sglang's grow with the output: copying each would cost
                # as much again as reading them)
                last: tuple[bytes, int, int] | None = None
                refused: bytes | None = None  # an OpenAI stream's error event (more events may follow it)
                tail = b""  # the start of an event whose end has not come yet
                async for piece in resp.content.iter_any():
                    chunk = tail + piece if tail else piece
                    if b"\r" in chunk:  # CRLF line ends (legal SSE): read as LF; a CR at the end may be half of one
                        keep = chunk.endswith(b"\r")
                        chunk = chunk[:-1].replace(b"\r\n", b"\n") + b"\r" if keep else chunk.replace(b"\r\n", b"\n")
                    find = chunk.find
                    start = 0
                    # an event ends at a blank line: found through its first line end (a one-byte search runs at
                    # memchr's speed, a two-byte one ~15x slower: it was most of the client's time on long answers)
                    while (end := find(b"\n", start)) >= 0:
                        single = chunk.startswith(b"\n", end + 1)  # a one-line event
                        if not single and (end := find(b"\n\n", end + 1)) < 0:
                            break  # its end has not come yet
                        if single and chunk.startswith(_DATA, start):  # sglang's one data line
                            source, d0, d1 = chunk, start + len(_DATA), end
                            start = end + 2
                        else:
                            parsed = sse_data(generate_url, chunk[start:end])
                            start = end + 2
                            if parsed is None:
                                continue  # a comment or keep-alive
                            source, d0, d1 = parsed, 0, len(parsed)
                        if d1 - d0 == len(_DONE) and source.startswith(_DONE, d0):
                            final = refused if refused is not None else b"" if last is None else last[0][last[1]:last[2]]
                            yield api.final_answer(generate_url, final)
                            return
                        last = (source, d0, d1)
                        if refused is None and source.startswith(_ERROR_EVENT, d0):
                            refused = source[d0:d1]
                        # Only events up to the first token are parsed: later ones are cumulative and grow with
                        # the output, and only the last one (the final meta_info or usage) matters.
                        if first_seen:
                            yield CHUNK
                        elif api.tokens_so_far(generate_url, source[d0:d1]) > 0:
                            first_seen = True
                            yield FIRST_TOKEN
                    tail = chunk[start:]
                yield Answer("error", "the stream ended before data: [DONE] (connection closed)", connection_lost=True)
        except asyncio.TimeoutError:
            yield Answer("timeout", self.timeout_reason)
        except self._errors as err:
            yield Answer("error", f"{type(err).__name__}: {err}", connection_lost=True)

    async def get_json(self, url: str, timeout: float) -> Fetched:
        """GET a JSON endpoint. A server that cannot be reached or does not answer 200 gives `Fetched.error`; a 200
        that is not JSON is a ServerProtocolError."""
        try:
            async with self.session.get(url, timeout=self._timeout(total=timeout)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    return Fetched(None, f"HTTP {resp.status}: {_error_text(body)}")
        except asyncio.TimeoutError:
            return Fetched(None, f"no answer within {timeout:g} s", timed_out=True)
        except self._errors as err:
            return Fetched(None, f"{type(err).__name__}: {err}", connection_lost=True)
        try:
            return Fetched(orjson.loads(body))
        except orjson.JSONDecodeError as err:
            raise ServerProtocolError(f"{url}: answered 200 with a body that is not JSON ({err}): {body[:200]!r}") from None

    async def get_text(self, url: str, timeout: float) -> Fetched:
        """GET a text endpoint (`/metrics`): `Fetched.obj` is the body as text, or `Fetched.error` says why not."""
        try:
            async with self.session.get(url, timeout=self._timeout(total=timeout)) as resp:
                body = await resp.read()
                if resp.status != 200:
                    return Fetched(None, f"HTTP {resp.status}: {_error_text(body)}")
                return Fetched(body.decode("utf-8", "replace"))
        except asyncio.TimeoutError:
            return Fetched(None, f"no answer within {timeout:g} s", timed_out=True)
        except self._errors as err:
            return Fetched(None, f"{type(err).__name__}: {err}", connection_lost=True)

    async def health(self, base_url: str, timeout: float) -> str | None:
        """None when `GET /health` answers 200, else why not. For start-up only: on sglang 0.5.17 each call takes
        >= 1 s and puts a one-token generation into the scheduler (.DUCUMENT/endpoints.md)."""
        return await self._answers_200(f"{base_url}/health", timeout)

    async def alive(self, base_url: str, timeout: float) -> str | None:
        """None when `GET /model_info` answers 200, else why not: the liveness check during a measured run (cheap,
        no generation, unlike /health)."""
        return await self._answers_200(f"{base_url}/model_info", timeout)

    async def flush_cache(self, base_url: str, timeout: float) -> str | None:
        """None when `POST /flush_cache` emptied the server's radix cache, else why not. sglang 0.5.17 answers 200 when
        it flushed and 400 (same text) when requests were running or waiting, so nothing was flushed
        (.DUCUMENT/radix-cache.md)."""
        url = f"{base_url}/flush_cache"
        try:
            async with self.session.post(url, timeout=self._timeout(total=timeout)) as resp:
                body = await resp.read()
                if resp.status == 200:
                    return None
                return f"/flush_cache answered HTTP {resp.status} (not flushed: requests running or waiting there?): {_error_text(body)}"
        except asyncio.TimeoutError:
            return f"/flush_cache gave no answer within {timeout:g} s"
        except self._errors as err:
            return f"/flush_cache: {type(err).__name__}: {err}"

    async def _answers_200(self, url: str, timeout: float) -> str | None:
        path = url[url.index("/", url.index("//") + 2):]
        try:
            async with self.session.get(url, timeout=self._timeout(total=timeout)) as resp:
                await resp.read()
                return None if resp.status == 200 else f"{path} answered HTTP {resp.status}"
        except asyncio.TimeoutError:
            return f"{path} gave no answer within {timeout:g} s"
        except self._errors as err:
            return f"{path}: {type(err).__name__}: {err}"


def _loads(url: str, data: bytes) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as err:
        raise ServerProtocolError(f"{url}: answer is not JSON ({err}): {data[:200]!r}") from None
    if not isinstance(obj, dict):
        raise ServerProtocolError(f"{url}: expected a JSON object, got {type(obj).__name__}: {data[:200]!r}")
    return obj


def _refusal(obj: dict[str, Any]) -> Answer | None:
    """An error object (`{"error": {...}}`, or OpenAI's `{"object": "error", "message": ...}`) as an Answer."""
    if "error" in obj:
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else err
        return Answer("error", f"refused by the server: {message}")
    if obj.get("object") == "error":
        return Answer("error", f"refused by the server: {obj.get('message')}")
    return None


# ---- the three APIs: request body, first-token test and final answer per API ------------------------------------
# The router builds every body through `SglangClient.api.body` and reads every answer as the Answer made here, so
# its timestamps are the same for all three (facts: .DUCUMENT/endpoints.md, .DUCUMENT/openai-api.md).


class Api:
    """How one request is sent and its answer read. `server_meta`: answers carry sglang's `meta_info`
    (e2e_latency and, with --enable-metrics, the server's stamps); OpenAI answers carry only `usage`.
    `cache_reported`: every server reports the prompt tokens its prefix cache served (/generate always, in
    meta_info.cached_tokens; the OpenAI routes only when the server runs with --enable-cache-report, in
    usage.prompt_tokens_details, left out when 0). Without it a record's cached_tokens is null: unknown."""

    name = ""
    path = ""
    server_meta = False
    cache_reported = True

    def body(self, input_ids: np.ndarray, output_len: int, stream: bool) -> bytes:
        raise NotImplementedError

    def tokens_so_far(self, url: str, data: bytes) -> int:
        """Output tokens produced so far, from one stream event (0 for events that carry none)."""
        raise NotImplementedError

    def final_answer(self, url: str, data: bytes) -> Answer:
        """The Answer from the final object (the last stream event, or the whole non-streamed body): a refusal the
        server sent as an object of its own, else what `_answer` reads from the object."""
        if not data:
            raise ServerProtocolError(f"{url}: the stream ended with [DONE] before any answer")
        obj = _loads(url, data)
        refused = _refusal(obj)
        return refused if refused is not None else self._answer(url, obj, data)

    def _answer(self, url: str, obj: dict[str, Any], data: bytes) -> Answer:
        raise NotImplementedError


class GenerateApi(Api):
    """sglang's native `POST /generate` with `input_ids`."""

    name = "generate"
    path = "/generate"
    server_meta = True

    def body(self, input_ids: np.ndarray, output_len: int, stream: bool) -> bytes:
        return orjson.dumps(
            {
                "input_ids": input_ids,
                "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True, "temperature": 0},
                "stream": stream,
            },
            option=orjson.OPT_SERIALIZE_NUMPY,
        )

    def tokens_so_far(self, url: str, data: bytes) -> int:
        obj = _loads(url, data)
        if "error" in obj:
            return 0
        meta = obj.get("meta_info")
        count = meta.get("completion_tokens") if isinstance(meta, dict) else None
        if not isinstance(count, int):
            raise ServerProtocolError(f"{url}: stream event without meta_info.completion_tokens: {data[:200]!r}")
        return count

    def _answer(self, url: str, obj: dict[str, Any], data: bytes) -> Answer:
        meta = obj.get("meta_info")
        if not isinstance(meta, dict):
            raise ServerProtocolError(f"{url}: answer without meta_info: {data[:300]!r}")
        finish = meta.get("finish_reason")
        if not isinstance(finish, dict) or not isinstance(finish.get("type"), str):
            raise ServerProtocolError(f"{url}: final answer without meta_info.finish_reason.type: {data[:300]!r}")
        if finish["type"] == "abort":
            return Answer("error", f"aborted by the server: {finish.get('message')}")
        return Answer("ok", meta=meta)


# Streams ask for usage on every chunk (`continuous_usage_stats`): the first chunk whose usage counts an output
# token is the first token, as /generate's meta_info.completion_tokens says it; `include_usage` adds the final
# usage-only chunk (choices []) the lengths are read from.
_STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


class _OpenAIApi(Api):
    cache_reported = False  # until the servers' /server_info say enable_cache_report (run.py _server_facts)

    def _request(self, output_len: int, stream: bool) -> dict[str, Any]:
        request: dict[str, Any] = {"max_tokens": output_len, "temperature": 0, "ignore_eos": True, "stream": stream}
        if stream:
            request["stream_options"] = _STREAM_OPTIONS
        return request

    def tokens_so_far(self, url: str, data: bytes) -> int:
        obj = _loads(url, data)
        usage = obj.get("usage")
        if usage is None:
            return 0  # chat's role chunk and finish chunk, an error event
        count = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if not isinstance(count, int):
            raise ServerProtocolError(f"{url}: stream chunk with usage but no usage.completion_tokens: {data[:200]!r}")
        return count

    def _answer(self, url: str, obj: dict[str, Any], data: bytes) -> Answer:
        usage = obj.get("usage")
        if not isinstance(usage, dict):
            raise ServerProtocolError(f"{url}: final answer without usage: {data[:300]!r}")
        meta: dict[str, Any] = {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": usage.get("completion_tokens")}
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):  # only with sglang's --enable-cache-report
            meta["cached_tokens"] = details.get("cached_tokens")
        elif self.cache_reported:  # with it, sglang leaves the details out when nothing was cached (usage_processor.py)
            meta["cached_tokens"] = 0
        choices = obj.get("choices")
        if choices:  # non-stream answers; a stream's final chunk has choices []
            finish = choices[0].get("finish_reason") if isinstance(choices[0], dict) else None
            if finish == "abort":
                return Answer("error", "aborted by the server (finish_reason abort)")
        return Answer("ok", meta=meta)


class CompletionsApi(_OpenAIApi):
    """`POST /v1/completions` with the token ids as `prompt` (sglang takes a list of ints there: exact lengths)."""

    name = "completions"
    path = "/v1/completions"

    def body(self, input_ids: np.ndarray, output_len: int, stream: bool) -> bytes:
        return orjson.dumps({"prompt": input_ids, **self._request(output_len, stream)}, option=orjson.OPT_SERIALIZE_NUMPY)


class ChatApi(_OpenAIApi):
    """`POST /v1/chat/completions` with one user message. Chat takes no token ids: the message is the ids written
    as words `w<id>` of the word-level tokenizer (one word, one token; its chat template adds no token), so the
    prompt has exactly `input_len` tokens there. With another tokenizer the lengths differ; the record's
    prompt_tokens shows by how much."""

    name = "chat"
    path = "/v1/chat/completions"

    def __init__(self) -> None:
        # w<id> for every id up to the largest sent so far, made once (a body is then 4x faster to make)
        self._words = np.empty(0, dtype=object)

    def body(self, input_ids: np.ndarray, output_len: int, stream: bool) -> bytes:
        words = self._words
        if input_ids.size and (top := int(input_ids.max())) >= len(words):
            more = np.array([f"w{i}" for i in range(len(words), top + 1)], dtype=object)
            words = self._words = np.concatenate((words, more))
        content = " ".join(words[input_ids].tolist())
        return orjson.dumps({"messages": [{"role": "user", "content": content}], **self._request(output_len, stream)})


APIS: dict[str, type[Api]] = {api.name: api for api in (GenerateApi, CompletionsApi, ChatApi)}

"""The sim-server's OpenAI-compatible routes, /v1/completions and /v1/chat/completions, as sglang 0.5.17's
serving_completions.py / serving_chat.py answer them (facts and sources: .DUCUMENT/openai-api.md; sse_utils.py,
protocol.py). One class per route, registered by its path; like sglang's serving_base.py each follows one template:
validate, convert to a /generate request (`validate.parse_generate`, `engine.submit`), then stream or answer whole.
Only the request's prompt and the answer's shapes differ between the two; nothing here touches the scheduler."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import TYPE_CHECKING

import orjson

# aiohttp is imported where it is used, not here: the virtual clock (--clock virtual) runs these servers in-process
# and opens no socket, and aiohttp costs ~120 ms to import (the real-time server imports it when it starts serving)
if TYPE_CHECKING:
    from aiohttp import web

from tracebench.sim.answers import JSON, SSE, Answers, bad_json, json_response
from tracebench.sim.args import SimArgs
from tracebench.sim.engine import LiveEngine, Pending, all_finished, crash, until_receipt
from tracebench.sim.validate import BadRequest, FatalInput, SchedulerAbort, parse_generate


def _sse(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict:
    """UsageInfo as dumped by pydantic: prompt_tokens_details {"cached_tokens": n} only when the server runs with
    --enable-cache-report (`cached_tokens` given) and n > 0, else null (usage_processor.py L13-15, L39-45)."""
    details = {"cached_tokens": cached_tokens} if cached_tokens else None
    return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens, "prompt_tokens_details": details, "reasoning_tokens": 0}


def _openai_error(message: str) -> web.Response:
    """serving_base.create_error_response: what the OpenAI routes answer to a request sglang refuses."""
    body = {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    return json_response(body, 400)


def _openai_validation_error(message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return json_response(body, 400)


class OpenAIRoute:
    """The template of one OpenAI route; a subclass gives its path, its prompt and its answer's shapes."""

    path: str
    answer_object: str      # "object" of a whole answer
    chunk_object: str       # "object" of a stream chunk

    def __init__(self, args: SimArgs, engine: LiveEngine, answers: Answers) -> None:
        self.args = args
        self.engine = engine
        self.answers = answers

    # ---- what differs per route
    def prompt(self, obj: dict) -> tuple[object, object]:
        """The request's prompt (text or ids) and its max_tokens."""
        raise NotImplementedError

    def choice(self, index: int, text: str) -> dict:
        """One choice of a whole answer."""
        raise NotImplementedError

    def chunks(self, head: dict, delta: str, first: bool, final: bool, usage: dict | None) -> list[dict]:
        """The stream chunks for one output of the model: `delta` is the new text, `first` the first output."""
        raise NotImplementedError

    def usage_chunk(self, head: dict, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
                    ) -> dict:
        """The last chunk when the client asked for usage."""
        return {**head, "choices": [], "usage": _usage(prompt_tokens, completion_tokens, cached_tokens)}

    def cached(self, pend: Pending) -> int | None:
        """The prompt tokens the cache served, as usage reports them: only with --enable-cache-report."""
        return pend.sim.cached_tokens if self.args.enable_cache_report else None

    def continuous_usage(self, prompt_tokens: int, sent: int, pend: Pending) -> dict:
        """A chunk's usage with continuous_usage_stats (completions: no cached tokens, serving_completions.py L383-388)."""
        return _usage(prompt_tokens, sent)

    # ---- the template
    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        t_received = asyncio.get_running_loop().time()
        wall_arrived = time.time()   # read with it: the checks and the parse below are not the hop's (receipt_time)
        if request.content_type != JSON:  # sglang's validate_json_request dependency
            return _openai_validation_error("1 validation error:\n  {'loc': ['header', 'content-type'], 'msg': "
                                            "\"Unsupported Media Type: Only 'application/json' is allowed\", "
                                            "'type': 'value_error'}")
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            return bad_json(str(err).split(": line ")[0], request.path)
        if not isinstance(obj, dict):
            return bad_json("Input should be a valid dictionary", request.path)
        stream = obj.get("stream") is True
        try:
            t_received = self.engine.receive(request.headers, t_received, wall_arrived)
            generate, model = self.to_generate(obj)
            # validation errors are 400 JSON for streams too: sglang pulls the first chunk before answering 200
            single, items, rids = parse_generate(generate, False, self.args, self.engine.rids_in_flight)
            if stream and not single:
                raise BadRequest("tracebench sim-server: streaming a batch is not supported; send one prompt per stream.")
        except FatalInput as err:
            crash(err)
        except BadRequest as err:
            await until_receipt(t_received)
            return _openai_error(str(err))
        except SchedulerAbort as err:
            await until_receipt(t_received)
            if not stream:
                return _openai_error(str(err))
            return await self._stream_abort(request, obj, model, str(err))
        pendings = self.engine.submit(items, rids, stream, t_received)
        done = False
        try:
            if stream:
                response = await self._stream(request, pendings[0], model, obj.get("stream_options"))
            else:
                await all_finished(pendings)
                await self.engine.until_answer_end(pendings)
                outs = [self._final_out(p, is_stream=False) for p in pendings]
                response = json_response(self.response(outs, model))
            done = True
            return response
        finally:
            self.engine.release(pendings, done)

    def to_generate(self, obj: dict) -> tuple[dict, str]:
        """The /generate body an OpenAI request stands for, and the `model` the answer names."""
        if self.args.skip_tokenizer_init:
            # tracebench's own refusal: sglang's OpenAI routes need the tokenizer (UNVERIFIED how 0.5.17 fails)
            raise BadRequest("tracebench sim-server: the OpenAI-compatible routes need the tokenizer; this server "
                             "runs with --skip-tokenizer-init")
        model = obj.get("model", "default")
        if not isinstance(model, str):
            raise BadRequest("model must be a string.")
        if obj.get("n", 1) != 1:
            raise BadRequest("tracebench sim-server: n > 1 is not supported.")
        prompt, max_tokens = self.prompt(obj)
        key = "text" if isinstance(prompt, str) or (isinstance(prompt, list) and isinstance(prompt[0], str)) else "input_ids"
        params = {"max_new_tokens": max_tokens}
        return {key: prompt, "sampling_params": params}, model

    def response(self, outs: list[dict], model: str) -> dict:
        """A whole answer from the /generate outputs (one per prompt)."""
        choices = [self.choice(index, out["text"]) for index, out in enumerate(outs)]
        metas = [out["meta_info"] for out in outs]
        cached = sum(m["cached_tokens"] for m in metas) if self.args.enable_cache_report else None
        usage = _usage(sum(m["prompt_tokens"] for m in metas), sum(m["completion_tokens"] for m in metas), cached)
        return {"id": metas[0]["id"], "object": self.answer_object, "created": int(time.time()), "model": model,
                "choices": choices, "usage": usage, "metadata": {"weight_version": "default"}}

    def _final_out(self, pend: Pending, is_stream: bool) -> dict:
        out = self.answers.final_out(pend, is_stream)
        self.engine.count_finished(pend)
        return out

    async def _stream(self, request: web.Request, pend: Pending, model: str, stream_options: object
                      ) -> web.StreamResponse:
        from aiohttp import web

        include_usage = continuous = False
        if isinstance(stream_options, dict):  # should_include_usage (stream_response_default_include_usage off)
            include_usage = bool(stream_options.get("include_usage"))
            continuous = bool(stream_options.get("continuous_usage_stats"))
        response = web.StreamResponse(headers={"Content-Type": SSE})
        await response.prepare(request)
        created = int(time.time())
        head = {"id": pend.rid, "object": self.chunk_object, "created": created, "model": model}
        prompt_tokens = pend.sim.input_len
        sent, text_sent = 0, 0
        while True:
            if pend.visible == sent and not pend.finished:
                pend.event.clear()
                await pend.event.wait()
            final = pend.finished
            if final:
                await self.engine.until_answer_end([pend])
                out = self._final_out(pend, is_stream=True)
                sent = pend.sim.output_len
            else:
                sent = pend.visible
                out = self.answers.partial_out(pend, sent)
            text = out["text"]
            first = text_sent == 0
            delta, text_sent = text[text_sent:], len(text)
            usage = self.continuous_usage(prompt_tokens, sent, pend) if continuous else None
            for chunk in self.chunks(head, delta, first, final, usage):
                await response.write(_sse(chunk))
            if final:
                break
        if include_usage:
            await response.write(_sse(self.usage_chunk(head, prompt_tokens, sent, self.cached(pend))))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _stream_abort(self, request: web.Request, obj: dict, model: str, message: str) -> web.StreamResponse:
        """The scheduler's abort (status_code set) in a stream: an error event, the usage chunk if asked, [DONE]."""
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": SSE})
        await response.prepare(request)
        error = {"object": "error", "message": message, "type": "BAD_REQUEST", "param": None, "code": 400}
        await response.write(b"data: " + orjson.dumps({"error": error}) + b"\n\n")
        options = obj.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            head = {"id": uuid.uuid4().hex, "object": self.chunk_object, "created": int(time.time()), "model": model}
            # the aborted request's meta_info: prompt_tokens 1, completion_tokens 1
            await response.write(_sse(self.usage_chunk(head, 1, 1)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


class CompletionsRoute(OpenAIRoute):
    """/v1/completions (serving_completions.py)."""

    path = "/v1/completions"
    answer_object = "text_completion"
    chunk_object = "text_completion"

    def prompt(self, obj: dict) -> tuple[object, object]:
        prompt = obj.get("prompt")
        if not prompt or (isinstance(prompt, list) and all(not p for p in prompt)):
            raise BadRequest("Prompt cannot be empty")
        # CompletionRequest.max_tokens defaults to 16; it has no max_completion_tokens field, so one sent is ignored
        # (protocol.py L317-331, serving_completions.py L146)
        return prompt, obj.get("max_tokens", 16)

    def choice(self, index: int, text: str) -> dict:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": "length", "matched_stop": None}

    def chunks(self, head: dict, delta: str, first: bool, final: bool, usage: dict | None) -> list[dict]:
        choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": "length" if final else None,
                  "matched_stop": None}
        return [{**head, "choices": [choice], "usage": usage}]

    def usage_chunk(self, head: dict, prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None
                    ) -> dict:
        chunk = super().usage_chunk(head, prompt_tokens, completion_tokens, cached_tokens)
        if chunk["usage"]["prompt_tokens_details"] is None:
            del chunk["usage"]["prompt_tokens_details"]  # completions dump the usage chunk with exclude_none
        return chunk


def _chat_choice(delta: dict, finish_reason: str | None = None) -> dict:
    """sse_utils.StreamChoice: delta omits role/content when unset, the other keys are always there."""
    return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason, "matched_stop": None}


class ChatRoute(OpenAIRoute):
    """/v1/chat/completions (serving_chat.py)."""

    path = "/v1/chat/completions"
    answer_object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    def prompt(self, obj: dict) -> tuple[object, object]:
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("Messages cannot be empty.")
        if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
            raise BadRequest("tracebench sim-server: each message needs a string content.")
        # the word-level tokenizer's chat template: "{% for m in messages %}{{ m['content'] }} {% endfor %}"
        prompt = "".join([m["content"] + " " for m in messages])
        # sglang: max_completion_tokens or max_tokens (a null or 0 max_completion_tokens falls through; serving_chat.py
        # L855, protocol.py L1013)
        return prompt, obj.get("max_completion_tokens") or obj.get("max_tokens")

    def continuous_usage(self, prompt_tokens: int, sent: int, pend: Pending) -> dict:
        """chat's chunks report the cached tokens too (serving_chat.py L645-652 _continuous_usage_cached_details)."""
        return _usage(prompt_tokens, sent, self.cached(pend))

    def choice(self, index: int, text: str) -> dict:
        message = {"role": "assistant", "content": text, "reasoning_content": None, "tool_calls": None}
        return {"index": index, "message": message, "logprobs": None, "finish_reason": "length", "matched_stop": None}

    def chunks(self, head: dict, delta: str, first: bool, final: bool, usage: dict | None) -> list[dict]:
        out = []
        if first:  # the first output: a role chunk goes first
            out.append({**head, "choices": [_chat_choice({"reasoning_content": None, "role": "assistant",
                                                          "content": ""})]})
        if delta:  # serving_chat sends a content chunk only for new text
            chunk = {**head, "choices": [_chat_choice({"reasoning_content": None, "content": delta})]}
            if usage is not None:
                chunk["usage"] = usage
            out.append(chunk)
        if final:
            out.append({**head, "choices": [_chat_choice({"reasoning_content": None}, "length")]})
        return out


ROUTES: tuple[type[OpenAIRoute], ...] = (CompletionsRoute, ChatRoute)

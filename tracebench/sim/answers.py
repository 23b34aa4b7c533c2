"""The sim-server's answers, shaped like sglang 0.5.17's: /generate outputs (`meta_info`, partial and final), the
error bodies FastAPI writes, /model_info. Formatters only: they count nothing (the faces feed `prom.SimStats`) and
schedule nothing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson

# aiohttp is imported where it is used, not here: the virtual clock (--clock virtual) runs these servers in-process
# and opens no socket, and aiohttp costs ~120 ms to import (the real-time server imports it when it starts serving)
if TYPE_CHECKING:
    from aiohttp import web

from tracebench.sim.args import MODEL_NAME, SimArgs
from tracebench.sim.engine import Pending
from tracebench.sim.model import token_ids

JSON = "application/json"
SSE = "text/event-stream; charset=utf-8"


def render_text(ids: list[int]) -> str:
    """The word-level tokenizer's rendering (`w<id>` per token), like the captured answers."""
    return "".join([f" w{i}" for i in ids])


class Answers:
    """/generate outputs of one server: its flags decide the keys, `wall` turns loop times into its stamps."""

    def __init__(self, args: SimArgs, wall: Callable[[float], float], end_hold: float,
                 now_loop: Callable[[], float] = time.monotonic, now_wall: Callable[[], float] = time.time) -> None:
        """`end_hold`: the engine's (an answer's end is due that long after its model finished it); `now_loop`: the
        engine's clock (asyncio's loop.time(): the real monotonic one, or an in-process server's virtual one);
        `now_wall`: the stamps' clock (time.time(), or the virtual run's seconds)."""
        self.args = args
        self.wall = wall
        self.end_hold = end_hold
        self.now_loop = now_loop
        self.now_wall = now_wall
        # what a real 0.5.17 decode server sends as every answer's prefill_finished_time: one stale value, the host's
        # boot time (a monotonic stamp near 0 made wall time; .DUCUMENT/pd-disaggregation.md section 3)
        self.stale_prefill_finished = time.time() - time.monotonic()

    def with_text(self, ids: list[int], meta: dict, pend: Pending | None = None) -> dict:
        if self.args.skip_tokenizer_init:
            return {"output_ids": ids, "meta_info": meta}
        if pend is not None and len(ids) == len(pend.output_ids):
            text = pend.text   # the rendering of every id drawn so far, grown as they are (not redone per chunk)
        else:
            text = render_text(ids)
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def ids(self, pend: Pending, n: int) -> list[int]:
        """The first n output ids of `pend` (drawn once, from its seed, as they are first needed; their text is
        rendered as they are drawn)."""
        have = len(pend.output_ids)
        if n > have:
            new = token_ids(pend.ids_seed + have, n - have, self.args.vocab_size)
            pend.output_ids.extend(new)
            if not self.args.skip_tokenizer_init:
                pend.text += render_text(new)
        # the list itself when all of it is asked (the usual case: the answer is serialised before the next draw
        # extends it), not a copy per chunk
        return pend.output_ids if n == len(pend.output_ids) else pend.output_ids[:n]

    def meta_common(self, pend: Pending, completion_tokens: int, finish_reason: dict | None) -> dict:
        sim = pend.sim
        meta: dict = {"id": pend.rid, "finish_reason": finish_reason, "prompt_tokens": sim.input_len,
                      "weight_version": "default", "num_retractions": 0}
        if self.args.enable_metrics:
            meta["forward_entry_time"] = self.wall(sim.t_forward_entry)
            if sim.t_prefill_finished is not None:
                meta["prefill_finished_time"] = self.wall(sim.t_prefill_finished)
            elif self.args.disaggregation_mode == "decode":   # none of its own, yet one is sent
                meta["prefill_finished_time"] = self.stale_prefill_finished
            meta["queue_time"] = sim.t_forward_entry - sim.t_ready
        else:
            meta["queue_time"] = 0.0
        meta["reasoning_tokens"] = 0
        meta["completion_tokens"] = completion_tokens
        cached = sim.cached_tokens
        meta["cached_tokens"] = cached
        meta["cached_tokens_details"] = {"device": cached, "host": 0} if cached else None
        meta["dp_rank"] = None
        return meta

    def partial_out(self, pend: Pending, n: int) -> dict:
        """A stream chunk with the first n tokens (the first chunk stamps response_sent_to_client_ts)."""
        ids = self.ids(pend, n)
        meta = self.meta_common(pend, n, None)
        if pend.t_first_sent_wall == 0.0:
            pend.t_first_sent_wall = self.now_wall()
            meta["response_sent_to_client_ts"] = pend.t_first_sent_wall
            pend.lag = max(pend.lag, self.now_loop() - pend.t_first_token)   # the handler's own delay counts too
        return self.with_text(ids, meta, pend)

    def final_out(self, pend: Pending, is_stream: bool) -> dict:
        """The finished request's output; the caller sets response_sent_to_client_ts (and counts it finished)."""
        n = pend.sim.output_len
        ids = self.ids(pend, n)
        return self.with_text(ids, self.final_meta(pend, is_stream), pend)

    def final_meta(self, pend: Pending, is_stream: bool) -> dict:
        """The finished request's meta_info (final_out's; an in-process server's whole answer: it has no ids to
        send)."""
        sim = pend.sim
        n = sim.output_len
        meta = self.meta_common(pend, n, {"type": "length", "length": n})
        meta["e2e_latency"] = pend.e2e
        if self.args.enable_metrics:
            meta["request_received_ts"] = self.wall(pend.t_received)
            meta["api_server_dispatch_finish_ts"] = self.wall(pend.t_dispatched)
            if is_stream:
                meta["response_sent_to_client_ts"] = 0.0  # placeholder keeps sglang's key order; set by caller
            meta["request_finished_ts"] = self.wall(pend.t_finished)
            decode_latency = pend.t_finished - pend.t_first_token
            if decode_latency > 0.0 and n > 1:
                meta["decode_throughput"] = (n - 1) / decode_latency
            if not is_stream:
                meta["response_sent_to_client_ts"] = 0.0  # sglang appends it last; set by caller, before ours
            # tracebench's own key (sglang has none): how late this server handed out the request's first token and
            # its end against its model's schedule (the larger), wall seconds (engine._deliver, and the answer
            # formatted now, due end_hold after the finish: loop.time()'s clock)
            pend.lag = max(pend.lag, self.now_loop() - (pend.t_finished + self.end_hold))
            meta["tracebench_sim_lag"] = pend.lag
        return meta

    def abort_out(self, rid: str, message: str, out_id: list[int], t_received: float, t_dispatched: float,
                  now: float) -> dict:
        """sglang's scheduler-side abort in a stream: one chunk with one token, prompt_tokens 1, an abort reason."""
        meta: dict = {"id": rid, "finish_reason": {"type": "abort", "message": message, "status_code": 400,
                                                    "err_type": "BadRequestError"},
                      "prompt_tokens": 1, "weight_version": "default", "num_retractions": 0}
        if self.args.enable_metrics:
            meta.update({"forward_entry_time": self.wall(now), "prefill_finished_time": self.wall(now),
                         "queue_time": 0.0})
        else:
            meta["queue_time"] = 0.0
        meta.update({"reasoning_tokens": 0, "completion_tokens": 1, "cached_tokens": 0,
                     "cached_tokens_details": None, "dp_rank": None, "e2e_latency": now - t_received})
        if self.args.enable_metrics:
            meta.update({"request_received_ts": self.wall(t_received),
                         "api_server_dispatch_finish_ts": self.wall(t_dispatched),
                         "request_finished_ts": self.wall(now)})
        meta["response_sent_to_client_ts"] = self.now_wall()
        return self.with_text(out_id, meta)


def json_response(obj: object, status: int = 200) -> web.Response:
    from aiohttp import web

    return web.Response(status=status, body=orjson.dumps(obj), content_type=JSON)


def query_error(kind: str, msg: str, raw: str, ctx: dict | None = None) -> web.Response:
    """FastAPI's 422 for a query parameter that fails validation (`timeout` of /flush_cache)."""
    from aiohttp import web

    detail: dict = {"type": kind, "loc": ["query", "timeout"], "msg": msg, "input": raw}
    if ctx is not None:
        detail["ctx"] = ctx
    return web.Response(status=422, body=orjson.dumps({"detail": [detail]}), content_type=JSON)


def bad_json(why: str, path: str = "/generate") -> web.Response:
    """sglang's (FastAPI's) answer to a body that is not JSON (the capture: /generate, handler line 869)."""
    from aiohttp import web

    detail = (f"[{{'type': 'json_invalid', 'loc': ('body', 1), 'msg': 'JSON decode error', 'input': {{}}, "
              f"'ctx': {{'error': {why!r}}}}}]")
    message = (f"1 validation error:\n  {detail[1:-1]}\n\n  File \"site-packages/sglang/srt/entrypoints/http_server.py\","
               f" line 869, in generate_request\n    POST {path} {detail}")
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return web.Response(status=400, body=orjson.dumps(body), content_type=JSON)


def model_info() -> dict:
    """/model_info: what sglang 0.5.17 answers for llama-2-7b-hf."""
    return {
        "model_path": MODEL_NAME, "tokenizer_path": MODEL_NAME, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": "llama", "architectures": ["LlamaForCausalLM"],
        "embedding": {"family": "none", "task": "none", "execution": "none", "attention": "none",
                      "pooling": "model_defined", "normalize": False, "postprocessor": "none",
                      "tokenizer_special_tokens": "model_default", "supports_dimensions": False,
                      "supports_token_embeddings": False, "supports_multimodal": False,
                      "requires_embedding_flag": False, "auto_enable_embedding": False, "bcg_eligibility": "disabled",
                      "safe_disable_kv_cache": False, "safe_disable_radix_cache": False,
                      "safe_disable_chunked_prefill": False, "enabled": False, "matryoshka_dimensions": [],
                      "bcg": {"prefill_backend": "breakable", "enabled": True, "capture_token_budget": 4096,
                              "capture_batch_sizes": [4, 8, 12, 16, 20, 24, 28, 32, 48, 64, 80, 96, 112, 128, 144,
                                                      160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416,
                                                      448, 480, 512, 576, 640, 704, 768, 832, 896, 960, 1024, 1280,
                                                      1536, 1792, 2048, 2304, 2560, 2816, 3072, 3328, 3584, 3840,
                                                      4096]},
                      "cache": {"kv_cache_disabled": False, "radix_cache_disabled": False,
                                "chunked_prefill_disabled": False}},
    }

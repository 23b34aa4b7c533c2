"""The simulated sglang 0.5.17 server: an aiohttp app with sglang's routes and answers, timed by `model.BatchModel`.

This file builds the app and answers sglang's native routes (/generate, the info and load routes, /metrics,
/flush_cache). The rest lives apart, imported one way (faces -> engine -> model): `engine.py` runs the model on the
clock, `validate.py` checks requests, `answers.py` shapes the outputs, `openai_routes.py` serves /v1/completions and
/v1/chat/completions, `prom.py` keeps the metrics. The `meta_info` stamps are wall-clock seconds: the engine's
monotonic times shifted by one anchor read at start-up, so they agree with a client's `time.time()`.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import time
import uuid
from datetime import datetime, timezone
from importlib import resources
from typing import TYPE_CHECKING

import orjson

# aiohttp is imported where it is used, not here: the virtual clock (--clock virtual) runs these servers in-process
# and opens no socket, and aiohttp costs ~120 ms to import (the real-time server imports it when it starts serving)
if TYPE_CHECKING:
    from aiohttp import web

from tracebench import precise_loop
from tracebench.sim.answers import SSE, Answers, bad_json, json_response, model_info, query_error
from tracebench.sim.args import MODEL_NAME, SGLANG_VERSION, SimArgs
from tracebench.sim.engine import LiveEngine, Pending, all_finished, crash, until_receipt
from tracebench.sim.model import BatchModel, Limits, token_ids
from tracebench.sim.openai_routes import ROUTES
from tracebench.sim.pd import KV_BYTES_PER_TOKEN, PdFace, make_role
from tracebench.sim.prom import SimStats, metrics_text
from tracebench.sim.validate import BadRequest, FatalInput, SchedulerAbort, parse_generate


_KV_BYTES_PER_TOKEN = 2 * 32 * 4096 * 2   # llama-2-7b fp16 K and V (the capture: 231818 tokens = 113.193 GB)
_FLUSH_TEXT = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
               "requests, the operation will not be performed.)\n")
_FLUSH_FAILED_TEXT = "Flush cache failed.\n"   # sglang: busy (requests running or waiting), no ?timeout
_FLUSH_TIMEOUT_TEXT = "Timed out waiting for idle state."
_FLUSH_BUSY_TEXT = "Another flush_cache is already in progress."


class SimServer:
    """The app, the model and the engine task of one sim-server process."""

    def __init__(self, args: SimArgs, *, over_http: bool) -> None:
        """`over_http`: served over HTTP (_serve), not in process (sim/inprocess.py): LiveEngine's."""
        self.args = args
        # real sglang 0.5.17's /server_info (--skip-tokenizer-init, one H200): the keys the sim answers, with the
        # values that reflect its own flags overwritten in server_info(). A verbatim copy of the capture
        # tests/data/sglang-0.5.17/server_info_skip_tokenizer.json, shipped as package data.
        captured = resources.files("tracebench.sim").joinpath("sglang_server_info.json")
        self.captured_server_info = orjson.loads(captured.read_bytes())
        self.limits = Limits(
            max_running_requests=args.effective_max_running_requests,
            max_total_num_tokens=args.effective_max_total_num_tokens,
            chunked_prefill_size=args.chunked_prefill_size,
            overlap_schedule=not args.disable_overlap_schedule,
            # a PD decode server's KV is a chunk cache (pd_disaggregation_hook.py L55-84)
            radix_cache=not args.disable_radix_cache and args.disaggregation_mode != "decode",
        )
        self.model = BatchModel(args.profile, self.limits, args.speed)
        self.stats = SimStats(observe_ttft=args.disaggregation_mode != "prefill")
        self.engine = LiveEngine(self.model, self.stats, args.profile, args.speed, args.seed,
                                 over_http=over_http)
        self.engine_task: asyncio.Task[None] | None = None
        self.answers = Answers(args, self.engine.wall, self.engine.end_hold)
        # PD disaggregation (pd.py): the role's queues and handshake; /generate goes through its face
        self.pd = make_role(args, self.engine, self.answers)
        self.pd_face = None if self.pd is None else PdFace(self.pd, self.engine, self.answers, self._stream,
                                                           self._final_out)
        self.t_ready_at = 0.0           # loop time when /health turns 200
        self.created = int(time.time())
        self.flush_pending = False       # a /flush_cache?timeout=S is waiting for the server to idle

    # ---------------------------------------------------------------- app
    def make_app(self) -> web.Application:
        from aiohttp import web

        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/generate", self.handle_generate)
        app.router.add_put("/generate", self.handle_generate)
        app.router.add_post("/set_internal_state", self.handle_set_internal_state)
        app.router.add_put("/set_internal_state", self.handle_set_internal_state)
        app.router.add_get("/health", self.handle_health)
        app.router.add_get("/health_generate", self.handle_health)
        app.router.add_get("/server_info", self.handle_server_info)
        app.router.add_get("/get_server_info", self.handle_server_info)
        app.router.add_get("/model_info", self.handle_model_info)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_get("/v1/loads", self.handle_loads)
        app.router.add_get("/get_load", self.handle_get_load)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_post("/flush_cache", self.handle_flush_cache)
        app.router.add_get("/flush_cache", self.handle_flush_cache)
        for route_class in ROUTES:   # /v1/completions, /v1/chat/completions
            route = route_class(self.args, self.engine, self.answers)
            app.router.add_post(route.path, route.handle)
        if self.pd is not None:
            self.pd.routes(app)
        return app

    def start_engine(self) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self.t_ready_at = now + self.args.startup_delay
        self.engine_task = self.engine.start(now)

    def ready(self) -> bool:
        return asyncio.get_running_loop().time() >= self.t_ready_at

    # ---------------------------------------------------------------- /generate
    async def handle_generate(self, request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        body = await request.read()
        # stamped once the body is in (as sglang stamps request_received_ts), with no await until submit(): requests
        # reach the model in the order of their stamps (a stamp before the read let a slow upload be overtaken)
        t_received = loop.time()
        wall_arrived = time.time()   # read with it: the parse below is not the hop's (receipt_time)
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            return bad_json(str(err).split(": line ")[0])
        if not isinstance(obj, dict):
            return bad_json("Input should be a valid dictionary")
        stream = bool(obj.get("stream", False))
        try:
            t_received = self.engine.receive(request.headers, t_received, wall_arrived)
            single, items, rids = parse_generate(obj, stream, self.args, self.engine.rids_in_flight)
            boot = None if self.pd_face is None else self.pd_face.bootstrap(obj, items)
        except FatalInput as err:
            crash(err)
        except BadRequest as err:
            await until_receipt(t_received)
            if stream:
                return await self._stream_error(request, str(err))
            return json_response({"error": {"message": str(err)}}, 400)
        except SchedulerAbort as err:
            await until_receipt(t_received)
            if stream:
                return await self._stream_abort(request, obj, str(err), t_received)
            return json_response({"error": {"message": str(err)}}, 400)

        if boot is not None:
            assert self.pd_face is not None
            return await self.pd_face.generate(request, boot, items, rids, stream, t_received)
        pendings = self.engine.submit(items, rids, stream, t_received)
        done = False
        try:
            if stream:
                response = await self._stream(request, pendings[0])
            else:
                await all_finished(pendings)
                await self.engine.until_answer_end(pendings)
                outs = [self._final_out(p, is_stream=False) for p in pendings]
                t_sent = time.time()
                for out in outs:
                    out["meta_info"]["response_sent_to_client_ts"] = t_sent
                response = json_response(outs[0] if single else outs)
            done = True
            return response
        finally:
            self.engine.release(pendings, done)

    async def _stream_error(self, request: web.Request, message: str) -> web.StreamResponse:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": SSE})
        await response.prepare(request)
        error = {"error": {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}}
        await response.write(b"data: " + orjson.dumps(error) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _stream_abort(self, request: web.Request, obj: dict, message: str, t_received: float
                            ) -> web.StreamResponse:
        """sglang's scheduler-side abort in a stream: one chunk with one token, prompt_tokens 1, an abort reason."""
        from aiohttp import web

        rid = obj.get("rid") if isinstance(obj.get("rid"), str) else uuid.uuid4().hex
        now = asyncio.get_running_loop().time()
        out_id = token_ids(self.engine.rng.getrandbits(64), 1, self.args.vocab_size)
        out = self.answers.abort_out(rid, message, out_id, t_received, t_received + self.engine.dispatch_delay, now)
        response = web.StreamResponse(headers={"Content-Type": SSE})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(out) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _stream(self, request: web.Request, pend: Pending) -> web.StreamResponse:
        from aiohttp import web

        response = web.StreamResponse(headers={"Content-Type": SSE})
        await response.prepare(request)
        sent = 0
        while True:
            if pend.visible == sent and not pend.finished:
                pend.event.clear()
                await pend.event.wait()
            if pend.finished:
                await self.engine.until_answer_end([pend])
                out = self._final_out(pend, is_stream=True)
                if pend.t_first_sent_wall == 0.0:
                    pend.t_first_sent_wall = time.time()
                out["meta_info"]["response_sent_to_client_ts"] = pend.t_first_sent_wall
                await response.write(b"data: " + orjson.dumps(out) + b"\n\n")
                break
            sent = pend.visible
            chunk = self.answers.partial_out(pend, sent)
            await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _final_out(self, pend: Pending, is_stream: bool) -> dict:
        """The finished request's output, counted as finished at this moment (as sglang's tokenizer manager does)."""
        out = self.answers.final_out(pend, is_stream)
        self.engine.count_finished(pend)
        return out

    # ---------------------------------------------------------------- other routes
    async def handle_health(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.Response(status=200 if self.ready() else 503)

    def server_info(self) -> dict:
        args = self.args
        info = dict(self.captured_server_info)
        overrides = {
            "model_path": MODEL_NAME, "tokenizer_path": MODEL_NAME, "served_model_name": MODEL_NAME,
            "host": args.host, "port": args.port,
            "context_length": args.context_length,
            "max_running_requests": args.max_running_requests,
            "max_total_tokens": args.max_total_tokens,
            "chunked_prefill_size": args.chunked_prefill_size,
            "random_seed": args.seed,
            "enable_metrics": args.enable_metrics,
            "disable_overlap_schedule": args.disable_overlap_schedule,
            "skip_tokenizer_init": args.skip_tokenizer_init,
            "disable_radix_cache": args.disable_radix_cache,
            "enable_cache_report": args.enable_cache_report,
        }
        if self.pd is not None:
            overrides.update(self.pd.server_info())
        info.update(overrides)
        info["status"] = "ready" if self.ready() else "starting"
        info["max_total_num_tokens"] = self.limits.max_total_num_tokens
        info["max_req_input_len"] = self.args.max_req_input_len
        internal = dict(self.captured_server_info["internal_states"][0])
        internal.update(overrides)
        internal["last_gen_throughput"] = self.stats.current_gen_throughput(self.model)
        internal["effective_max_running_requests_per_dp"] = self.limits.max_running_requests
        memory = dict(internal["memory_usage"])
        memory["token_capacity"] = self.limits.max_total_num_tokens
        internal["memory_usage"] = memory
        info["internal_states"] = [internal]
        info["tracebench_sim"] = {"profile": args.profile.name, "speed": args.speed,
                                  "accelerator": args.profile.accelerator,
                                  "max_running_requests": self.limits.max_running_requests,
                                  "vocab_size": args.vocab_size,
                                  # the report's --speed conversion: a token leaves the simulator output_s after
                                  # its step (simulated seconds)
                                  "output_s": args.profile.output_s,
                                  # and it takes a request in request_hop_s after the client sent it (simulated
                                  # seconds; validate.receipt_time), and sends an answer's end answer_end_s after
                                  # request_finished_ts (simulated seconds; Profile.answer_end_s)
                                  "request_hop_s": args.profile.request_hop_s,
                                  "answer_end_s": args.profile.answer_end_s}
        if self.pd is not None:   # the simulated KV transfer (pd.py)
            info["tracebench_sim"].update({"kv_transfer_bandwidth_gib_s": args.kv_transfer_bandwidth,
                                           "kv_transfer_latency_s": args.kv_transfer_latency,
                                           "kv_bytes_per_token": KV_BYTES_PER_TOKEN})
        return info

    async def handle_server_info(self, request: web.Request) -> web.Response:
        return json_response(self.server_info())

    async def handle_model_info(self, request: web.Request) -> web.Response:
        return json_response(model_info())

    async def handle_models(self, request: web.Request) -> web.Response:
        body = {"object": "list", "data": [{"id": MODEL_NAME, "object": "model", "created": self.created,
                                            "owned_by": "sglang", "root": MODEL_NAME, "parent": None,
                                            "max_model_len": self.args.context_length}]}
        return json_response(body)

    def load_figures(self) -> tuple[int, int, float, float]:
        """/v1/loads' num_running_reqs, num_waiting_reqs, token_usage and gen_throughput now (`_load`'s; what a
        poller reads of them: telemetry.parse_loads)."""
        model = self.model
        return (model.num_decoding, model.num_waiting, round(model.kv_used_tokens() / self.limits.max_total_num_tokens, 4),
                self.stats.current_gen_throughput(model))

    def _load(self, now_wall: float) -> dict:
        model, limits = self.model, self.limits
        running, waiting, usage, throughput = self.load_figures()
        used = model.kv_used_tokens()
        waiting_tokens = sum(r.input_len for r in model.waiting)
        if model.chunked is not None:
            waiting_tokens += model.chunked.input_len - model.chunked.prefilled
        cap = limits.max_total_num_tokens
        return {
            "timestamp": now_wall, "dp_rank": 0,
            "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": waiting_tokens,
            "num_used_tokens": used, "num_total_tokens": used + waiting_tokens,
            "num_active_tokens": used + waiting_tokens,
            "max_total_num_tokens": cap, "max_running_requests": limits.max_running_requests,
            "token_usage": usage, "gen_throughput": throughput,
            "cache_hit_rate": round(self.stats.cache_hit_rate, 4), "utilization": 0.0,
            "total_prefill_uncached_tokens": model.total_prefill_tokens,
            "total_prefill_busy_us": int(model.total_prefill_busy_s * 1e6),
            "decode_moments": model.decode_moments,
            "memory": {"weight_gb": 12.57, "kv_cache_gb": round(cap * _KV_BYTES_PER_TOKEN / 2**30, 3),
                       "graph_gb": 0.895, "token_capacity": cap},
            "disaggregation": self.pd.loads() if self.pd is not None else {
                "mode": "null", "prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
                "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0},
            "queues": {"waiting": model.num_waiting, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
        }

    async def handle_loads(self, request: web.Request) -> web.Response:
        now = time.time()
        body = {"timestamp": datetime.fromtimestamp(now, timezone.utc).isoformat(), "version": SGLANG_VERSION,
                "accelerator": self.args.profile.accelerator, "num_accelerators": 1, "loads": [self._load(now)]}
        return json_response(body)

    async def handle_get_load(self, request: web.Request) -> web.Response:
        load = self._load(time.time())
        body = [{"dp_rank": 0, "num_reqs": load["num_running_reqs"] + load["num_waiting_reqs"],
                 "num_waiting_reqs": load["num_waiting_reqs"], "num_tokens": load["num_total_tokens"],
                 "num_pending_tokens": load["num_total_tokens"] - load["num_used_tokens"],
                 "ts_tic": time.perf_counter()}]
        return json_response(body)

    async def handle_set_internal_state(self, request: web.Request) -> web.Response:
        """sglang 0.5.17 accepts only `pp_max_micro_batch_size` in [1, max_running_requests] here: a run-time cap on
        admission (running requests are not preempted). Anything else answers [false], like sglang."""
        try:
            obj = orjson.loads(await request.read())
        except orjson.JSONDecodeError as err:
            return bad_json(str(err).split(": line ")[0])
        server_args = obj.get("server_args") if isinstance(obj, dict) else None
        if not isinstance(server_args, dict):
            return json_response({"error": {"message": "server_args must be an object"}}, 400)
        ok = True
        for key, value in server_args.items():
            if key == "pp_max_micro_batch_size" and type(value) is int and 1 <= value <= self.limits.max_running_requests:
                self.model.set_admission_cap(value)
                self.engine.kick()
            else:
                ok = False
        return json_response([ok])

    async def handle_metrics(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if not self.args.enable_metrics:
            return web.Response(text="", content_type="text/plain", charset="utf-8")
        return web.Response(text=self.metrics_text(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    def metrics_text(self) -> str:
        """/metrics' text (a PD server's with its role's families)."""
        if self.pd is None:
            return metrics_text(self.stats, self.model)
        return metrics_text(self.stats, self.model, self.pd.mode, self.pd.metrics_lines)

    async def handle_flush_cache(self, request: web.Request) -> web.Response:
        """sglang's /flush_cache[?timeout=S]: empties the prefix cache when nothing runs or waits; otherwise 400, or
        with a timeout, waits for the server to idle (400 when it does not in time)."""
        from aiohttp import web

        raw = request.query.get("timeout", "0")
        try:
            timeout = float(raw)
        except ValueError:
            return query_error("float_parsing", "Input should be a valid number, unable to parse string as a number",
                                raw)
        if not timeout >= 0.0:
            return query_error("greater_than_equal", "Input should be greater than or equal to 0", raw, {"ge": 0.0})
        if self.flush_pending:
            return web.Response(status=400, text=_FLUSH_BUSY_TEXT, content_type="text/plain")
        if self.model.flush_cache():
            return web.Response(text=_FLUSH_TEXT, content_type="text/plain")
        if timeout == 0.0:
            return web.Response(status=400, text=_FLUSH_FAILED_TEXT, content_type="text/plain")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        self.flush_pending = True
        try:
            while loop.time() < deadline:
                await asyncio.sleep(0.005)   # sglang's scheduler looks again on each loop turn
                if self.model.flush_cache():
                    return web.Response(text=_FLUSH_TEXT, content_type="text/plain")
        finally:
            self.flush_pending = False
        return web.Response(status=400, text=_FLUSH_TIMEOUT_TEXT, content_type="text/plain")


async def _serve(args: SimArgs) -> None:
    from aiohttp import web

    # served over HTTP, an answer's end leaves when sglang's would (in process the reader adds the whole hop)
    server = SimServer(args, over_http=True)
    runner = web.AppRunner(server.make_app(), handle_signals=False, access_log=None, handler_cancellation=True)
    await runner.setup()
    # A short grace: in-flight requests are cut on SIGTERM (the replay stops servers with SIGTERM, then SIGKILL).
    site = web.TCPSite(runner, args.host, args.port, backlog=1024, reuse_address=True, shutdown_timeout=0.1)
    server.start_engine()
    if server.pd is not None:
        await server.pd.start()   # a prefill server's bootstrap server listens before /generate does
    await site.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    pd = "" if server.pd is None else f", PD {server.pd.mode}"
    if args.disaggregation_mode == "prefill":
        pd += f" (bootstrap port {args.disaggregation_bootstrap_port})"
    sys.stdout.write(f"sim-server listening on http://{args.host}:{args.port} (profile {args.profile.name}, "
                     f"speed {args.speed:g}{pd})\n")
    sys.stdout.flush()
    engine = server.engine_task
    assert engine is not None
    stopper = loop.create_task(stop.wait())
    await asyncio.wait([stopper, engine], return_when=asyncio.FIRST_COMPLETED)
    if engine.done():
        engine.result()  # the engine died: raise its error (fail fast)
    engine.cancel()
    await runner.shutdown()
    await runner.cleanup()
    if server.pd is not None:
        await server.pd.stop()


def serve(args: SimArgs) -> None:
    """Run the sim-server until SIGINT or SIGTERM, on the precise loop: its steps' timers wake when due, not up to
    1 ms later (asyncio's epoll wait: the simulator's lag was ~0.9 ms p50 on a quiet host)."""
    precise_loop.run(_serve(args))

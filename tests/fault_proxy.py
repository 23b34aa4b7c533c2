"""A proxy in front of a real sim-server that injects the faults the replay must survive (tests/test_replay_robust.py).

    python tests/fault_proxy.py --port P --upstream http://127.0.0.1:Q [--sse-noise] [--break-nth N]
                                [--model-info-delay S] [--hold-nth N] [--freeze-after S] [--idle-reset S]

--sse-noise         every streamed answer also carries legal SSE lines a client must ignore: a comment event
                    (`: keepalive`) before each event, and `event:`, `id:` and `retry:` lines inside each data event.
--break-nth N       the N-th POST /generate (counting from 1) gets its first event, then its connection is cut.
--model-info-delay  GET /model_info answers only after S seconds (a slow liveness probe).
--hold-nth N        the N-th POST /generate gets its first event, then nothing more: its connection stays open (one
                    request stalled after its first token while the server serves the others).
--freeze-after S    S seconds after the first POST /generate the server hangs behind a live HTTP side, as sglang does
                    when its scheduler is stuck: streams stop, new requests get nothing, GET /v1/loads answers the last
                    snapshot again (sglang's HTTP side reads it from shared memory); /model_info still answers.
--idle-reset S      a request that comes on a connection idle for more than S seconds since its last answer is reset
                    (the connection aborted, no answer): what a client sees when it writes into a connection the server
                    closes for idling (uvicorn's keep-alive: 5 s in sglang) at that moment, made certain.

It is a separate process (nothing in the replay is mocked); everything else is passed through unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import aiohttp
from aiohttp import web


def make_app(upstream: str, sse_noise: bool, break_nth: int | None, model_info_delay: float,
             hold_nth: int | None = None, freeze_after: float | None = None,
             idle_reset: float | None = None) -> web.Application:
    state: dict = {"generate": 0, "frozen_at": None, "loads": None, "resets": 0}
    answered: dict = {}  # transport -> when its last answer ended (--idle-reset)

    def frozen() -> bool:
        return state["frozen_at"] is not None and time.monotonic() >= state["frozen_at"]

    async def hang() -> None:
        await asyncio.Future()  # until the client goes (aiohttp cancels the handler)

    session: dict[str, aiohttp.ClientSession] = {}

    async def on_startup(app: web.Application) -> None:
        session["s"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))

    async def on_cleanup(app: web.Application) -> None:
        await session["s"].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        transport = request.transport
        last = answered.pop(transport, None)
        if idle_reset is not None and last is not None and time.monotonic() - last > idle_reset:
            state["resets"] += 1
            print(f"idle-reset {state['resets']}: {request.method} {request.path} on a connection idle "
                  f"{time.monotonic() - last:.2f} s", flush=True)
            transport.abort()  # RST: the request is never answered
            raise ConnectionResetError("idle connection reset")
        try:
            return await answer(request)
        finally:
            answered[transport] = time.monotonic()

    async def answer(request: web.Request) -> web.StreamResponse:
        if request.path == "/model_info" and model_info_delay:
            await asyncio.sleep(model_info_delay)
        body = await request.read()
        number = None
        if request.path == "/v1/loads" and frozen():
            return web.Response(body=state["loads"], content_type="application/json")
        if request.method == "POST" and request.path == "/generate":
            state["generate"] += 1
            number = state["generate"]
            if freeze_after is not None and state["frozen_at"] is None:
                state["frozen_at"] = time.monotonic() + freeze_after
            if frozen():
                await hang()
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with session["s"].request(request.method, f"{upstream}{request.path_qs}", data=body or None,
                                        headers=headers) as up:
            if "text/event-stream" not in up.headers.get("Content-Type", ""):
                answer = await up.read()
                if request.path == "/v1/loads":
                    state["loads"] = answer
                if number is not None and frozen():
                    await hang()
                return web.Response(status=up.status, body=answer,
                                    content_type=up.headers.get("Content-Type", "application/json").split(";")[0])
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            buf = b""
            sent = 0
            async for piece in up.content.iter_any():
                buf += piece
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    if (number is not None and number == hold_nth and sent == 1) or frozen():
                        await hang()
                    if sse_noise:
                        await resp.write(b": keepalive\n\n")
                        event = b"event: message\nid: %d\nretry: 1000\n" % sent + event
                    await resp.write(event + b"\n\n")
                    sent += 1
                    if number is not None and number == break_nth:
                        request.transport.close()  # cut mid-stream: no [DONE]
                        return resp
            await resp.write_eof()
            return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--sse-noise", action="store_true")
    parser.add_argument("--break-nth", type=int, default=None)
    parser.add_argument("--model-info-delay", type=float, default=0.0)
    parser.add_argument("--hold-nth", type=int, default=None)
    parser.add_argument("--freeze-after", type=float, default=None)
    parser.add_argument("--idle-reset", type=float, default=None)
    args = parser.parse_args()
    web.run_app(make_app(args.upstream, args.sse_noise, args.break_nth, args.model_info_delay, args.hold_nth,
                         args.freeze_after, args.idle_reset), host="127.0.0.1", port=args.port, print=None, access_log=None,
                shutdown_timeout=1.0)  # held connections must not hold up the exit


if __name__ == "__main__":
    main()

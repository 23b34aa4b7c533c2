"""The localhost control endpoint of a real-time run (`--control-port`): the caps changed over HTTP. Apart from caps.py
so that a virtual run (no control endpoint) does not import aiohttp; a real-time run imports it before its clock
starts."""

from __future__ import annotations

import socket
from collections.abc import Callable

from aiohttp import web

from tracebench.options import INT64_MAX
from tracebench.replay.caps import SetCap


class ControlServer:
    """`POST /cap {"server": i | "all", "max_running_requests": n}` -> 200 with the caps now in force;
    `GET /caps` -> the caps. Bad input gets 400 with the reason (the run goes on)."""

    def __init__(self, sock: socket.socket, num_servers: int, set_cap: SetCap, caps: Callable[[], list[int]]) -> None:
        self.sock = sock
        self.port: int = sock.getsockname()[1]
        self._num_servers = num_servers
        self._set_cap = set_cap
        self._caps = caps
        app = web.Application()
        app.router.add_post("/cap", self._post_cap)
        app.router.add_get("/caps", self._get_caps)
        self._runner = web.AppRunner(app, access_log=None)

    async def start(self) -> None:
        await self._runner.setup()
        await web.SockSite(self._runner, self.sock).start()

    async def stop(self) -> None:
        await self._runner.cleanup()

    async def _get_caps(self, request: web.Request) -> web.Response:
        return web.json_response({"caps": self._caps()})

    async def _post_cap(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as err:
            return _bad(f"body is not JSON: {err}")
        if not isinstance(body, dict) or set(body) != {"server", "max_running_requests"}:
            return _bad('expected {"server": i | "all", "max_running_requests": n}')
        server, cap = body["server"], body["max_running_requests"]
        if server == "all":
            index = None
        elif isinstance(server, int) and not isinstance(server, bool) and 0 <= server < self._num_servers:
            index = server
        else:
            return _bad(f'"server" must be "all" or an index 0..{self._num_servers - 1}, got {server!r}')
        if not isinstance(cap, int) or isinstance(cap, bool) or not 1 <= cap <= INT64_MAX:
            return _bad(f'"max_running_requests" must be an integer from 1 to 2^63-1, got {cap!r}')
        self._set_cap(index, cap, "control")
        return web.json_response({"caps": self._caps()})


def _bad(why: str) -> web.Response:
    return web.json_response({"error": {"message": why}}, status=400)

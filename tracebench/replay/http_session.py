"""The aiohttp pieces of `client.SglangClient`, apart so that importing client.py (its answers, APIs and constants,
which the virtual clock uses too) does not import aiohttp (~120 ms: its connector builds SSL contexts at import). A
real-time run imports this module when it makes its client, before the run clock starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

if TYPE_CHECKING:
    from tracebench.replay.client import Stamps

# what a request that did not reach its server, or lost it, raises (a measurement: the client records it)
CLIENT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, ConnectionError)
ClientTimeout = aiohttp.ClientTimeout


class StampedBody(aiohttp.BytesPayload):
    """A request body that stamps `t_written` once aiohttp has handed it to the socket: the moment the kernel has the
    request (a body this size goes out in one send()). aiohttp writes a body through `write_with_length` (3.12+) or
    `write` (before); both are stamped. Passing the payload ready-made also spares aiohttp's payload lookup, and no
    request tracing (TraceConfig: ~30 µs a request) is needed for the stamp."""

    def __init__(self, body: bytes, stamps: Stamps, now: Callable[[], float]) -> None:
        super().__init__(body, content_type="application/json")
        self._stamps = stamps
        self._now = now

    async def write(self, writer: Any) -> None:
        await super().write(writer)
        self._stamps.t_written = self._now()

    async def write_with_length(self, writer: Any, content_length: int | None) -> None:
        await super().write_with_length(writer, content_length)
        self._stamps.t_written = self._now()


def new_session(keepalive: float) -> aiohttp.ClientSession:
    """No connection limit (the router decides what is in flight), no session-wide timeout (aiohttp's default of
    300 s would cut long requests); a pooled connection idle for more than `keepalive` seconds is closed."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive),
                                 timeout=aiohttp.ClientTimeout(total=None))

"""Send and receive: how one dispatched request reaches its server and its answer comes back.

The router decides (queue, caps, policy) and records; a **sender** carries one assigned request to its server and
stamps the moments only the carrying can see, then hands back how it ended (an `Answer`, read by the router). Two
senders, one contract:

- `HttpSender`: sglang's HTTP API (`client.SglangClient`), on the real clock. It makes the request body (the trace's
  token ids through `--api`'s `Api`), ahead of the arrival when the engine has time (`prepare_body`).
- `inprocess.InProcessSender`: a direct call into an in-process simulated server, on the virtual clock (`--clock
  virtual`): no body, no socket; the HTTP hops are the profile's constants.

What a sender stamps on the record: `t_built`, `t_dispatch`, `t_written`, `t_headers`, `t_first_token`,
`t_last_chunk`, `t_finish`, the inter-token gaps (`itl_max`, `itl_hist`); and the request's progress as it comes
(`flight.t_progress`, `server.t_heard`: what the router's watchdog reads). Everything else of the record (status,
meta_info, answer check, `t_parsed`) is the router's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tracebench.itl import ItlGaps
from tracebench.replay.client import CHUNK, FIRST_TOKEN, Answer, Api, SglangClient
from tracebench.replay.records import RequestRecord
from tracebench.replay.tokens import InputIds
from tracebench.trace.format import TraceRequest


class Progress(Protocol):
    """What a sender updates as a request's answer comes (router._Flight)."""

    t_progress: float


class Destination(Protocol):
    """The server a request goes to, as a sender sees it (router.ServerState): where, and its last sign of work."""

    index: int
    generate_url: str
    t_heard: float


class Sender(Protocol):
    """Carries one request to its server and back (module docstring)."""

    stream: bool
    api: Api
    prepares_ahead: bool  # prepare_body is worth calling while the engine waits for the next arrival

    def prepare_body(self, request: TraceRequest) -> None: ...

    async def exchange(self, rec: RequestRecord, server: Destination, flight: Progress,
                       blocks: tuple[int, ...] | None, now: Callable[[], float]) -> Answer: ...


class HttpSender:
    """sglang's HTTP API: the body made from the trace's ids, POSTed through the run's one aiohttp session."""

    prepares_ahead = True

    def __init__(self, client: SglangClient, input_ids: InputIds) -> None:
        self.client = client
        self.input_ids = input_ids
        self.stream = client.stream
        self.api = client.api
        # (request id, body) made ahead by prepare_body: the next arrival's, while the engine waits for it
        self._ready_body: tuple[int, bytes] | None = None

    def prepare_body(self, request: TraceRequest) -> None:
        self._ready_body = (request.id, self.make_body(request.id, request.input_len, request.output_len,
                                                       request.prefix_blocks))

    def body(self, rec: RequestRecord, blocks: tuple[int, ...] | None) -> bytes:
        """The request body of `rec`: the one made ahead if it is this request's, else made now."""
        ready = self._ready_body
        if ready is not None and ready[0] == rec.id:
            self._ready_body = None
            return ready[1]
        return self.make_body(rec.id, rec.input_len, rec.output_len, blocks)

    def make_body(self, rid: int, input_len: int, output_len: int, blocks: tuple[int, ...] | None) -> bytes:
        # the body of the run's --api (client.Api): /generate, /v1/completions or /v1/chat/completions
        ids = self.input_ids.ids(rid, input_len) if blocks is None else self.input_ids.block_ids(blocks, input_len)
        return self.api.body(ids, output_len, self.stream)

    async def exchange(self, rec: RequestRecord, server: Destination, flight: Progress,
                       blocks: tuple[int, ...] | None, now: Callable[[], float]) -> Answer:
        """POST `rec` to `server` and read its answer: t_dispatch, t_first_token, t_finish as the items arrive (the
        gaps between later chunks: inter-token latency, tracebench/itl.py); each item is progress."""
        body = self.body(rec, blocks)
        answer: Answer | None = None
        gaps = ItlGaps()
        t_chunk = 0.0
        rec.t_built = rec.t_dispatch = now()
        async for item in self.client.generate(server.generate_url, body, rec, now):
            t = now()
            flight.t_progress = server.t_heard = t
            if item is CHUNK:
                gaps.add(t - t_chunk)
                t_chunk = t
            elif item is FIRST_TOKEN:
                rec.t_first_token = t_chunk = t
            else:
                rec.t_finish = t
                answer = item  # type: ignore[assignment]
        assert answer is not None  # generate() always ends with an Answer
        # the answer's last data: a stream's last event with tokens, or the whole body
        if not self.stream:
            rec.t_last_chunk = rec.t_finish
        elif rec.t_first_token is not None:
            rec.t_last_chunk = t_chunk
        rec.itl_max, rec.itl_hist = gaps.fields()
        return answer

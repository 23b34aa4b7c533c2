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

A PD run (`pd_router.PdRouter`) sends each request to a (prefill, decode) pair: `PairSender.exchange_pair`, which
both senders have, carries the request to both servers at once (with the bootstrap fields, replay/pd.py) and stamps
the same fields from the decode server's answer (its stream is the answer), plus `t_prefill_answer` (the prefill
server's answer in) and the pair's progress (`flight.other_done`, `flight.server_done`). `t_finish` is when the pair
ended: both answers in, or the first failure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tracebench.itl import ItlGaps
from tracebench.replay.client import CHUNK, FIRST_TOKEN, Answer, Api, SglangClient
from tracebench.replay.records import PdRecord, RequestRecord
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


class PairProgress(Progress, Protocol):
    """What a pair sender also updates (router._Flight): the prefill server's part is over (`other_done`: its answer
    came), the decode server's answer is whole while the prefill's is still to come (`server_done`)."""

    other_done: bool
    server_done: bool


Boot = tuple[str, int, int]  # a pair's bootstrap_host, bootstrap_port, bootstrap_room (replay/pd.py with_bootstrap)


class Sender(Protocol):
    """Carries one request to its server and back (module docstring)."""

    stream: bool
    api: Api
    prepares_ahead: bool  # prepare_body is worth calling while the engine waits for the next arrival
    # None, or a sender that carries a whole flight itself: take_over(rec, server, flight, blocks, on_end) sends it
    # and calls on_end(answer, None) once when its answer came, on_end(None, None) when it was cancelled as the
    # router asked (cancel(request id)), on_end(None, error) when it failed; the router then needs no task per
    # request (senders.ProcessSender)
    take_over: Callable[..., None] | None

    def prepare_body(self, request: TraceRequest) -> None: ...

    async def exchange(self, rec: RequestRecord, server: Destination, flight: Progress,
                       blocks: tuple[int, ...] | None, now: Callable[[], float]) -> Answer: ...

    def flush(self) -> None:
        """An assignment round is over: send what the sender holds back from it (senders.ProcessSender queues the
        requests of a round for one write per sender process; the others hold nothing back)."""
        ...


class PairSender(Sender, Protocol):
    """A sender that also carries a PD pair (module docstring)."""

    async def exchange_pair(self, rec: PdRecord, prefill: Destination, decode: Destination, flight: PairProgress,
                            blocks: tuple[int, ...] | None, boot: Boot, now: Callable[[], float]
                            ) -> tuple[Answer, Answer | None]:
        """(the pair's answer: the decode server's, or the failure that ended the pair; the prefill server's answer,
        None when the pair ended before it came)."""
        ...


class HttpSender:
    """sglang's HTTP API: the body made from the trace's ids, POSTed through the run's one aiohttp session."""

    prepares_ahead = True
    take_over = None  # the router's task for each request carries it (exchange)

    def __init__(self, client: SglangClient, input_ids: InputIds) -> None:
        self.client = client
        self.input_ids = input_ids
        self.stream = client.stream
        self.api = client.api
        # (request id, body) made ahead by prepare_body: the next arrival's, while the engine waits for it
        self._ready_body: tuple[int, bytes] | None = None

    def flush(self) -> None:
        """Nothing is held back: each request is written as it is dispatched."""

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

    async def exchange_pair(self, rec: PdRecord, prefill: Destination, decode: Destination, flight: PairProgress,
                            blocks: tuple[int, ...] | None, boot: Boot, now: Callable[[], float]
                            ) -> tuple[Answer, Answer | None]:
        """POST `rec` to its pair at once (pd.PairClient): t_dispatch when both go; the decode stream's first token and
        chunks; the prefill answer's moment; t_finish when the pair ended (PairSender)."""
        from tracebench.replay.pd import DECODE_DONE, PairClient, PrefillAnswer, with_bootstrap  # PD runs only

        body = with_bootstrap(self.body(rec, blocks), *boot)
        answer: Answer | None = None
        prefill_answer: Answer | None = None
        gaps = ItlGaps()
        t_chunk = 0.0
        # the breakdown's stamps (t_written, t_headers, t_last_chunk, sglang's) are the decode request's: its stream is
        # the answer; the prefill request goes out beside it (its moments: the prefill_* fields)
        rec.t_built = rec.t_dispatch = now()
        async for item in PairClient(self.client).generate(prefill.generate_url, decode.generate_url, body, rec, now):
            t = flight.t_progress = now()  # progress (Router.watch)
            if not isinstance(item, PrefillAnswer):
                decode.t_heard = t
            if item is CHUNK:
                gaps.add(t - t_chunk)
                t_chunk = t
            elif item is FIRST_TOKEN:
                rec.t_first_token = t_chunk = t
            elif item is DECODE_DONE:
                flight.server_done = True   # the pair waits on its prefill server's answer alone (Router.watch)
            elif isinstance(item, PrefillAnswer):
                rec.t_prefill_answer = prefill.t_heard = t
                flight.other_done = True   # from now on the pair waits on its decode server only (Router.watch)
                prefill_answer = item.answer
            else:
                rec.t_finish = t
                answer = item  # type: ignore[assignment]
        assert answer is not None  # PairClient ends with an Answer
        # the decode answer's last data: its stream's last event with tokens, or its whole body
        if not self.stream:
            rec.t_last_chunk = rec.t_finish
        elif rec.t_first_token is not None:
            rec.t_last_chunk = t_chunk
        rec.itl_max, rec.itl_hist = gaps.fields()
        return answer, prefill_answer

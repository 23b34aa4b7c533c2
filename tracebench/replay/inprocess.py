"""`--clock virtual`: the run's servers are simulated inside this process (`sim/inprocess.py`) and the run moves on
the virtual loop's clock (`loop.VirtualLoop`). Three small pieces stand where a real-time run has processes and HTTP:

- `InProcessFleet`: the servers `--backend sim` would launch, built from the same sim-server command lines (run.json
  keeps them) and started on the loop; none can fail to start, stall or die unless the engine itself raises.
- `InProcessClient`: the GET/POST side of `client.SglangClient` that the run uses outside the requests (health,
  /server_info, /v1/loads, /metrics, /flush_cache), answered by the in-process servers from the URL's path.
- `InProcessSender`: the requests themselves (`flight.Sender`): a direct call into the server's engine; no body, no
  socket. The HTTP hops a real client sees are constants (`Hops`), stated in run.json. A PD pair's request
  (`exchange_pair`) goes to both servers so, each side served as the sim-server's PD face serves it.

Everything else of the run (engine, router, policies, caps, the cap schedule, static batches, --max-concurrency, the
watchdog, the saturation stop, the records) is the real-time run's own code on the other clock.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tracebench.errors import ConfigError, ServerStartError
from tracebench.itl import ItlGaps
from tracebench.profiles import TOKEN_HOP_S, Profile
from tracebench.replay.client import Answer, Fetched, GenerateApi, timeout_text
from tracebench.replay.clock import RunClock
from tracebench.replay.flight import Boot, Destination, PairProgress, Progress
from tracebench.replay.records import PdRecord, RequestRecord
from tracebench.replay.servers import Fleet, ServerPlan
from tracebench.sim.args import SimArgs
from tracebench.sim.engine import Pending, RunDelivery
from tracebench.sim.inprocess import InProcessServer, InProcessWire, sim_args_from_command
from tracebench.sim.pd import Bootstrap, abort_body
from tracebench.sim.radix import PackedTokens
from tracebench.sim.validate import BadRequest, SchedulerAbort
from tracebench.trace.format import TraceRequest

URL_SCHEME = "inprocess://"
# The HTTP hops of a request to real sglang 0.5.17, as tracebench's client sees them, are the profile's
# request_hop_s (t_dispatch -> sglang's request_received_ts) and response_hop_s (request_finished_ts -> the client's
# read of the answer's end): medians over the profile's own real routing runs (sim/fit.py http_hops; H200 2.06 and
# 0.73 ms, H100 2.28 and 0.89 ms; the held-out committed runs 1.75-2.41 and 0.61-0.77 ms p50).
# sglang takes in one request at a time (its tokenizer manager's loop): requests sent to a server together are
# received one after another. The gap between consecutive receipts of a batch sent at once (static batches of 8,
# p50 of sglang's request_received_ts differences): 0.52 ms on H200 (reports/examples/h200-node-level/attach-static8),
# 0.57 ms on H100 (h100-waits/static8). Without it a batch sent at once would reach the scheduler at one instant and be
# prefilled as one, where sglang (and the real-time simulator) prefill the first request alone and the rest after.
INTAKE_GAP_S = 0.0005
# A streamed token's chunk reaches the client TOKEN_HOP_S after sglang handed it out (profiles.py).


@dataclass(frozen=True)
class Hops:
    """The modelled HTTP hops (seconds): dispatch -> sglang's receipt of the request; a streamed token handed out by
    sglang -> read by the client (TOKEN_HOP_S); the answer's end (its last chunk, or a whole non-streamed answer) ->
    read; and the least time between two receipts at one server (INTAKE_GAP_S)."""

    request_s: float
    response_s: float
    token_s: float = TOKEN_HOP_S
    intake_gap_s: float = INTAKE_GAP_S

    @classmethod
    def of_profile(cls, profile: Profile) -> Hops:
        return cls(profile.request_hop_s, profile.response_hop_s)

    def to_json(self) -> dict[str, Any]:
        return {"request_hop_s": self.request_s, "response_hop_s": self.response_s, "token_hop_s": self.token_s,
                "intake_gap_s": self.intake_gap_s,
                "source": "the profile's request_hop_s and response_hop_s (tracebench's client to real sglang on the "
                          "profile's routing runs, p50: dispatch -> sglang's receipt, sglang's finish -> the answer's "
                          "end read); a streamed token's chunk token_hop_s after it is handed out (real sglang's first "
                          "chunk); a server receives one request at a time, intake_gap_s apart at least (sglang's "
                          "receipts of a batch sent at once, H200 and H100)"}


class InProcessFleet(Fleet):
    """The servers of a `--backend sim` run, in this process (module docstring). `plans` are the sim-server launch
    plans (their commands configure the servers; no process is started); URLs are inprocess://server-i."""

    def __init__(self, plans: list[ServerPlan]) -> None:
        plans = [ServerPlan(index=p.index, url=f"{URL_SCHEME}server-{p.index}", command=p.command, role=p.role,
                            bootstrap_port=p.bootstrap_port) for p in plans]
        super().__init__("sim", plans)
        self.servers: list[InProcessServer] = []
        self.wire = InProcessWire()  # how PD servers reach each other (unused by others)
        self.tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Build every server from its sim-server flags (nothing runs until `wait_healthy`, on the loop)."""
        parsed: dict[tuple[str, ...], SimArgs] = {}  # the servers' flags differ by --port alone: parsed once
        for plan in self.plans:
            assert plan.command is not None
            words = plan.command[plan.command.index("sim-server") + 1:]
            at = words.index("--port")
            port, key = int(words[at + 1]), tuple(words[:at] + words[at + 2:])
            if key not in parsed:
                parsed[key] = sim_args_from_command(words)
            args = dataclasses.replace(parsed[key], port=port)
            if args.disaggregation_mode != "null":
                # named as its URL names it (server-i): a decode server reaches its prefill server at the bootstrap
                # host the router sends, the prefill server's URL's host (pd.bootstrap_host)
                args = dataclasses.replace(args, host=f"server-{plan.index}")
            self.servers.append(InProcessServer(args, self.wire))

    def first(self, count: int) -> Fleet:
        raise ServerStartError("in-process servers are not shared between runs")

    def exit_reason(self, index: int) -> str | None:
        """An in-process server is gone only if its engine raised (a bug: the run stops with it)."""
        task = self.tasks[index] if index < len(self.tasks) else None
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            return f"server {index}: its engine failed: {task.exception()!r}"
        return None

    async def wait_healthy(self, client: Any, timeout: float) -> None:
        """Start the engines on the loop (their stamps: loop seconds, which the virtual run clock converts)."""
        if not self.tasks:
            self.tasks = [server.start(run_start=0.0) for server in self.servers]

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()

    def describe(self, index: int) -> dict[str, Any]:
        return {**super().describe(index), "in_process": True}

    def server_of(self, url: str) -> tuple[int, str]:
        """The index of the server a URL names, and the URL's path."""
        if not url.startswith(URL_SCHEME):
            raise ValueError(f"not an in-process URL: {url}")
        name, _, path = url[len(URL_SCHEME):].partition("/")
        return int(name.removeprefix("server-")), "/" + path


class InProcessClient:
    """What the run asks its servers outside the requests, answered in process (module docstring)."""

    def __init__(self, fleet: InProcessFleet, stream: bool) -> None:
        self.fleet = fleet
        self.stream = stream
        self.api = GenerateApi()

    async def close(self) -> None:
        return None

    async def get_json(self, url: str, timeout: float) -> Fetched:
        index, path = self.fleet.server_of(url)
        server = self.fleet.servers[index]
        if path == "/v1/loads":
            return Fetched(server.loads())
        if path == "/server_info":
            return Fetched(server.server_info())
        raise ValueError(f"in-process server: no GET {path}")

    def loads_now(self, url: str) -> tuple[tuple[int, int, float, float], tuple[float, ...]]:
        """What the poller reads of /v1/loads' answer, given at once (telemetry.LoadsAtOnce)."""
        index, path = self.fleet.server_of(url)
        if path != "/v1/loads":
            raise ValueError(f"in-process server: no GET {path} as loads")
        return self.fleet.servers[index].load_now()

    async def get_text(self, url: str, timeout: float) -> Fetched:
        index, path = self.fleet.server_of(url)
        server = self.fleet.servers[index]
        if path != "/metrics":
            raise ValueError(f"in-process server: no GET {path} as text")
        return Fetched(server.metrics_text())

    def metrics_samples(self, url: str, names: frozenset[str]) -> dict[str, list[float]] | None:
        """/metrics' samples `names` as parsing its text would give them (server_metrics.MetricsSamples), read from
        the server's numbers without making the page; None when it serves no metrics."""
        index, path = self.fleet.server_of(url)
        if path != "/metrics":
            raise ValueError(f"in-process server: no GET {path} as metrics samples")
        return self.fleet.servers[index].metrics_samples(names)

    async def health(self, base_url: str, timeout: float) -> str | None:
        return None

    async def alive(self, base_url: str, timeout: float) -> str | None:
        return self.fleet.exit_reason(self.fleet.server_of(base_url)[0])

    async def flush_cache(self, base_url: str, timeout: float) -> str | None:
        server = self.fleet.servers[self.fleet.server_of(base_url)[0]]
        return None if server.flush_cache() else "/flush_cache: requests running or waiting there"


class _Watch:
    """One request's answer as the client would read it: each token a token hop after sglang handed it out, the end
    a response hop after it; the flight is resumed at the end's moment."""

    __slots__ = ("rec", "flight", "server", "hop", "offset", "end_offset", "gaps", "t_chunk", "done", "buckets")

    def __init__(self, rec: RequestRecord, flight: Progress, server: Destination, hop: float, token_hop: float,
                 offset: float, done: asyncio.Future[float], stream: bool, buckets: dict[float, int]) -> None:
        self.rec = rec
        self.flight = flight
        self.server = server
        self.hop = hop  # the answer's end -> read (loop seconds)
        self.offset = offset  # loop time of a token handed out -> run clock of the client's read (the hop included)
        self.end_offset = offset - token_hop + hop  # the same for the answer's end
        self.gaps = ItlGaps() if stream else None
        self.t_chunk = 0.0
        self.done = done
        self.buckets = buckets  # ItlGaps.add's memo, shared by the sender's watchers (one log per decode step)

    def on_token(self, t_visible: float) -> None:
        t = t_visible + self.offset
        self.flight.t_progress = self.server.t_heard = t
        gaps = self.gaps
        if gaps is None:
            return  # not streamed: nothing reaches the client before the whole answer
        if self.rec.t_first_token is None:
            self.rec.t_first_token = t
        else:
            gaps.add(t - self.t_chunk, self.buckets)
        self.t_chunk = t

    def on_tokens(self, run: RunDelivery) -> None:
        """A decode run's tokens, one per step (engine.RunDelivery): the same stamps and gaps as one at a time."""
        times = run.times
        offset = self.offset
        t = times[-1] + offset
        self.flight.t_progress = self.server.t_heard = t
        gaps = self.gaps
        if gaps is None:
            return
        first = times[0] + offset
        if self.rec.t_first_token is None:
            self.rec.t_first_token = first
        else:
            gaps.add(first - self.t_chunk, self.buckets)
        counts, largest = run.gaps(offset)
        gaps.merge(counts, largest)
        self.t_chunk = t

    def on_done(self, t_visible: float) -> None:
        t = t_visible + self.end_offset
        self.flight.t_progress = self.server.t_heard = t
        asyncio.get_running_loop().call_at(t_visible + self.hop, _resolve, self.done, t)


def _resolve(done: asyncio.Future[float], t: float) -> None:
    if not done.done():
        done.set_result(t)


KEY_BASE = 1 << 62  # prefix keys are positive, apart from the negative tags of cached output (sim/model.py)


def prefix_keys(blocks: tuple[int, ...], block_size: int | None, n: int) -> PackedTokens:
    """A prompt of prefix blocks as the in-process radix cache needs it: one key per token, the same key for the same
    token of the same block (token j of block b: KEY_BASE + b * block_size + j) and no two tokens alike otherwise,
    packed (radix.PackedTokens). The real-time run sends the ids `InputIds.block_ids` makes, which are alike exactly
    where these keys are, but for a chance match of two random ids (~1 in 31,000 per compared token, which the
    real-time server's cache then counts as a hit); building these costs no hashing and no Python int per token."""
    if block_size is None:
        raise ConfigError("the trace has prefix_blocks but its header gives no block_size")
    firsts = np.asarray(blocks, dtype=np.int64) * block_size + KEY_BASE
    keys = (firsts[:, None] + np.arange(block_size, dtype=np.int64)[None, :]).ravel()[:n]
    return PackedTokens(keys.astype("<i8", copy=False).tobytes())


class InProcessSender:
    """`flight.Sender` for in-process servers: the request goes into its server's engine at dispatch + the request
    hop; its tokens reach the record a response hop after they are handed out (`_Watch`)."""

    prepares_ahead = False  # no body to make
    take_over = None  # the router's task for each request carries it (exchange)

    def flush(self) -> None:
        """Nothing is held back: each request enters its server's engine as it is dispatched."""

    def __init__(self, fleet: InProcessFleet, block_size: int | None, stream: bool, hops: Hops, clock: RunClock,
                 request_timeout: float | None = None, timeout_reason: str | None = None) -> None:
        """`block_size`: the trace's (its prefix blocks' tokens, prefix_keys); `request_timeout` (run seconds;
        --timeout): from dispatch to the answer's end, as the HTTP client's; `timeout_reason`: what a timed-out
        record says."""
        self.fleet = fleet
        self.request_timeout = request_timeout
        self.timeout_reason = timeout_reason or (None if request_timeout is None else timeout_text(request_timeout))
        self.stream = stream
        self.api = GenerateApi()
        self.hops = hops
        self.clock = clock
        self.buckets: dict[float, int] = {}  # _Watch.buckets
        self.block_size = block_size
        self.last_received = [-math.inf] * len(fleet.plans)  # each server's latest receipt (loop time): Hops.intake_gap_s

    def prepare_body(self, request: TraceRequest) -> None:
        return None

    def _received_at(self, index: int, t_hop: float) -> float:
        """When server `index` takes in a request that reaches it at `t_hop` (loop time): one at a time, at least
        Hops.intake_gap_s after the one before."""
        t = max(t_hop, self.last_received[index] + self.hops.intake_gap_s)
        self.last_received[index] = t
        return t

    async def exchange(self, rec: RequestRecord, server: Destination, flight: Progress,
                       blocks: tuple[int, ...] | None, now: Callable[[], float]) -> Answer:
        srv = self.fleet.servers[server.index]
        loop = asyncio.get_running_loop()
        hops = self.hops
        t = now()
        rec.t_built = rec.t_dispatch = rec.t_written = t
        t_received = self._received_at(server.index, loop.time() + hops.request_s)
        # a prompt of prefix blocks: its tokens as the server's radix cache tells them apart (prefix_keys); a prompt
        # of its own (the trace gives no blocks): content that matches nothing (the real-time server is sent random
        # ids, which hit its cache by chance only: a 1-token match about once in 32,000/N, N the prompts it holds)
        ids = None if blocks is None else prefix_keys(blocks, self.block_size, rec.input_len)
        try:
            pend = srv.submit(rec.input_len, rec.output_len, ids, t_received, self.stream)
        except BadRequest as err:
            # the refusal comes back one round trip later: an SSE error event (stream) or HTTP 400
            await asyncio.sleep(hops.request_s + hops.response_s)
            rec.t_headers = rec.t_finish = now()
            return self._refusal(err)
        except SchedulerAbort as err:
            await asyncio.sleep(hops.request_s + hops.response_s)
            rec.t_headers = rec.t_finish = now()
            if not self.stream:
                return self._refusal(err)
            rec.t_first_token = rec.t_last_chunk = rec.t_finish
            out = srv.abort_answer(str(err), t_received, t_received)
            return self.api.final_answer(server.generate_url, orjson.dumps(out))
        done: asyncio.Future[float] = loop.create_future()
        watch = _Watch(rec, flight, server, hops.response_s, hops.token_s, hops.token_s - self.clock.mono_start, done,
                       self.stream, self.buckets)
        pend.watcher = watch
        if self.stream:
            rec.t_headers = t + hops.request_s + hops.token_s  # the handler answers its headers at once
        try:
            if self.request_timeout is None:
                rec.t_finish = await done
            else:
                rec.t_finish = await asyncio.wait_for(done, t + self.request_timeout - now())
        except asyncio.TimeoutError:
            srv.engine.release([pend], False)  # the client gave up: the server aborts it, as sglang does
            rec.t_finish = now()
            if self.stream and rec.t_first_token is not None:
                rec.t_last_chunk = watch.t_chunk
                rec.itl_max, rec.itl_hist = watch.gaps.fields()  # type: ignore[union-attr]
            return Answer("timeout", self.timeout_reason)
        except BaseException:
            srv.engine.release([pend], False)  # the client went away (the run stopped it): the server aborts it
            raise
        if self.stream:
            rec.t_last_chunk = rec.t_finish if rec.t_first_token is not None else None
            rec.itl_max, rec.itl_hist = watch.gaps.fields()  # type: ignore[union-attr]
        else:
            rec.t_headers = rec.t_last_chunk = rec.t_finish
        return self._answer(srv, pend, server.generate_url)

    def _answer(self, srv: InProcessServer, pend: Pending, url: str) -> Answer:
        """A finished request's answer as the HTTP client reads it (its meta_info included)."""
        # response_sent_to_client_ts: a stream's first chunk, or the whole answer, left the server
        sent = pend.t_first_token if self.stream and pend.t_first_token > 0.0 else pend.t_finished
        return self.api.final_answer(url, orjson.dumps(srv.final_answer(pend, self.stream, srv.engine.wall(sent))))

    # ---- a PD pair (flight.PairSender) -------------------------------------------------------------------------

    async def exchange_pair(self, rec: PdRecord, prefill: Destination, decode: Destination, flight: PairProgress,
                            blocks: tuple[int, ...] | None, boot: Boot, now: Callable[[], float]
                            ) -> tuple[Answer, Answer | None]:
        """The request reaches both servers of its pair a request hop after dispatch, each side served as the
        sim-server's PD face serves it (`_prefill_side`, `_decode_side`), and the pair ends as pd.PairClient ends it:
        with both answers, or at the first failure (the other side is closed then, as sglang-router drops it)."""
        loop = asyncio.get_running_loop()
        hops = self.hops
        t = now()
        rec.t_built = rec.t_dispatch = rec.t_written = t
        t_hop = loop.time() + hops.request_s
        t_received_d, t_received_p = self._received_at(decode.index, t_hop), self._received_at(prefill.index, t_hop)
        ids = None if blocks is None else prefix_keys(blocks, self.block_size, rec.input_len)
        srv_p, srv_d = self.fleet.servers[prefill.index], self.fleet.servers[decode.index]
        bootstrap = Bootstrap(*boot)
        try:
            # both servers check a request alike (one command line but the role); the real-time pair reads the decode
            # server's refusal first (its answer is the stream the client reads), and so does this one
            pend_d = srv_d.submit_pd(rec.input_len, rec.output_len, ids, t_received_d, self.stream)
            try:
                pend_p = srv_p.submit_pd(rec.input_len, rec.output_len, ids, t_received_p, self.stream)
            except BaseException:
                srv_d.end_pd(pend_d, bootstrap, False, False)   # the pair is closed: its decode side too
                raise
        except (BadRequest, SchedulerAbort) as err:
            await asyncio.sleep(hops.request_s + hops.response_s)
            rec.t_headers = rec.t_finish = now()
            return Answer("error", f"decode server: {self._refusal(err).error}"), None
        done: asyncio.Future[float] = loop.create_future()
        watch = _Watch(rec, flight, decode, hops.response_s, hops.token_s, hops.token_s - self.clock.mono_start,
                       done, self.stream, self.buckets)
        pend_d.watcher = watch
        prefill_side = loop.create_task(self._prefill_side(srv_p, pend_p, bootstrap, prefill.generate_url))
        decode_side = loop.create_task(self._decode_side(srv_d, pend_d, bootstrap, rec, done, decode.generate_url))
        waiting = {prefill_side, decode_side}
        answer: Answer | None = None
        decode_answer: Answer | None = None
        prefill_answer: Answer | None = None
        t_decode: float | None = None
        try:
            while answer is None:
                left = None if self.request_timeout is None else t + self.request_timeout - now()
                ended, waiting = await asyncio.wait(waiting, timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if not ended:   # --timeout: the client gives up on both (the decode request's is what it says)
                    rec.t_finish = now()
                    answer = Answer("timeout", f"decode server: {self.timeout_reason}")
                    break
                if prefill_side in ended:
                    prefill_answer, t_p = prefill_side.result()
                    rec.t_prefill_answer = prefill.t_heard = flight.t_progress = t_p
                    flight.other_done = True   # from now on the pair waits on its decode server only (Router.watch)
                    if prefill_answer.status != "ok":
                        rec.t_finish = t_p
                        answer = Answer(prefill_answer.status, f"prefill server: {prefill_answer.error}")
                        break
                if decode_side in ended:
                    decode_answer, t_decode = decode_side.result()
                    decode.t_heard = flight.t_progress = t_decode
                    if decode_answer.status != "ok":
                        rec.t_finish = t_decode
                        answer = Answer(decode_answer.status, f"decode server: {decode_answer.error}")
                        break
                    flight.server_done = prefill_answer is None   # it waits on its prefill server alone (Router.watch)
                if decode_answer is not None and prefill_answer is not None:
                    rec.t_finish = now()
                    answer = decode_answer
        finally:
            for side in (prefill_side, decode_side):
                side.cancel()
            await asyncio.gather(prefill_side, decode_side, return_exceptions=True)
        # the decode answer's last data: its stream's end, or (not streamed) the pair's end, as the HTTP pair's
        if not self.stream:
            rec.t_last_chunk = rec.t_finish
        elif rec.t_first_token is not None:
            rec.t_last_chunk = t_decode if t_decode is not None else watch.t_chunk
        if watch.gaps is not None:
            rec.itl_max, rec.itl_hist = watch.gaps.fields()
        return answer, prefill_answer

    def _refusal(self, err: BadRequest | SchedulerAbort) -> Answer:
        """A request its server refuses, as the HTTP client reads the refusal."""
        if not self.stream:
            return Answer("error", f"HTTP 400: {err}")
        if isinstance(err, BadRequest):
            return Answer("error", f"refused by the server: {err}")
        return Answer("error", f"aborted by the server: {err}")

    def _aborted(self, srv: InProcessServer, pend: Pending, why: str, url: str) -> Answer:
        """A PD request sglang aborted (pd.PdAbort) as the HTTP client reads its 500 (PdFace._abort)."""
        if not self.stream:
            return Answer("error", f"HTTP 500: {abort_body(why).decode()}")
        return self.api.final_answer(url, orjson.dumps(srv.pd_abort_out(pend, why)))

    async def _prefill_side(self, srv: InProcessServer, pend: Pending, boot: Bootstrap, url: str
                            ) -> tuple[Answer, float]:
        """The prefill server's part from the request's receipt: its role's (bootstrap, prefill, the KV's transfer),
        then its answer, read a response hop later (answer, run time read)."""
        loop = asyncio.get_running_loop()
        gone = True   # until it is answered: its client went away (the server aborts it)
        try:
            await asyncio.sleep(pend.t_received - loop.time())
            why = await srv.serve_pd(pend, boot)
            gone = False
            if why is not None:
                answer = self._aborted(srv, pend, why, url)
            else:
                out = srv.prefill_answer(pend, self.stream, srv.engine.wall(loop.time()))
                answer = self.api.final_answer(url, orjson.dumps(out))
            await asyncio.sleep(self.hops.response_s)
            return answer, self.clock.now()
        finally:
            srv.end_pd(pend, boot, not gone, False)

    async def _decode_side(self, srv: InProcessServer, pend: Pending, boot: Bootstrap, rec: PdRecord,
                           done: asyncio.Future[float], url: str) -> tuple[Answer, float]:
        """The decode server's part from the request's receipt: its role's (the handshake, the KV's room, the KV),
        then its tokens (the `_Watch` stamps them on the record) and its answer (answer, run time read)."""
        loop = asyncio.get_running_loop()
        hops = self.hops
        gone = True
        answered = False
        try:
            await asyncio.sleep(pend.t_received - loop.time())
            why = await srv.serve_pd(pend, boot)
            if self.stream:   # the PD face answers its headers once the KV is in (or with the abort)
                rec.t_headers = self.clock.now() + hops.token_s
            if why is not None:
                gone = False
                answer = self._aborted(srv, pend, why, url)
                await asyncio.sleep(hops.response_s)
                t_end = self.clock.now()
            else:
                t_end = await done
                gone = False
                answered = True
                answer = self._answer(srv, pend, url)
            if not self.stream:
                rec.t_headers = t_end
            return answer, t_end
        finally:
            srv.end_pd(pend, boot, not gone, answered)

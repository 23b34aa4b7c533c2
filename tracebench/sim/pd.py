"""PD (prefill/decode) disaggregation in the simulator: a sim-server started with `--disaggregation-mode prefill` or
`decode` plays sglang 0.5.17's prefill or decode server. Facts and sources: .DUCUMENT/pd-disaggregation.md.

- **Prefill** (`PrefillRole`): serves sglang's bootstrap server on `--disaggregation-bootstrap-port` (`GET /route`,
  `GET /health`) and keeps each request in its bootstrap queue until the decode server has named the KV destination
  of the request's `bootstrap_room`; only then is it prefilled (max_new_tokens 1, the radix cache as in a plain
  server). Its KV then goes over the server's one outgoing link; the prefill answer (one token, finish_reason length
  0) is sent when the decode server has acknowledged the KV, as sglang's inflight queue does.
- **Decode** (`DecodeRole`): looks the prefill server up on its bootstrap server (the handshake), pre-allocates the
  request's KV when a request slot and the KV fit (FIFO), sends the KV destination to the prefill server, and admits
  the request only when its KV arrived: a prebuilt step hands out the prefill's first token, then it decodes.
- sglang's data plane is ZMQ between the ranks plus the transfer engine; here it is two HTTP routes between the two
  processes on 127.0.0.1: the KV destination (`POST /tracebench_sim/kv_dest` on the prefill's bootstrap port) and the
  KV itself (`POST /tracebench_sim/kv_arrived` on the decode server, sent when the simulated transfer ends). How a
  role reaches the other is its `wire` (`PdWire`): `HttpWire` between sim-server processes; on the virtual clock
  (`tracebench/sim/inprocess.py` `InProcessWire`) a direct call into the other role, taking no simulated time.
- **The transfer** moves the whole prompt's KV (cached prefix included, as sglang sends it) at `KV_BYTES_PER_TOKEN`
  bytes per token over the prefill server's link at `--kv-transfer-bandwidth` GiB/s, first come first served, then
  arrives `--kv-transfer-latency` seconds later (a fixed cost per transfer that does not hold the link: the next
  transfer's bytes start as soon as this one's bytes are through); at `--speed K` both take 1/K as long, like every
  simulated duration.

Simplification (said in docs/sim-server.md): the prefill model frees a request's KV when its prefill ends, where
sglang holds it until the transfer is done; only a prefill server short of KV would notice.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import orjson

# aiohttp is imported where it is used, not here: the virtual clock (--clock virtual) runs these servers in-process
# and opens no socket, and aiohttp costs ~120 ms to import (the real-time server imports it when it starts serving)
if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web

from tracebench.sim.answers import Answers, json_response
from tracebench.sim.args import SimArgs
from tracebench.sim.engine import LiveEngine, Pending, all_finished, until_receipt
from tracebench.sim.model import ReqState
from tracebench.sim.prom import Histogram
from tracebench.sim.validate import BadRequest

# llama-2-7b (config.json: 32 layers, 32 KV heads, head dim 4096/32, float16): the KV of one token is every layer's
# K and V, 32 x 32 x 128 x 2 x 2 = 524,288 bytes (sglang's transfer_total_bytes, common/conn.py L1141-1149).
KV_LAYERS, KV_HEADS, HEAD_DIM, KV_DTYPE_BYTES = 32, 32, 128, 2
KV_BYTES_PER_TOKEN = KV_LAYERS * KV_HEADS * HEAD_DIM * 2 * KV_DTYPE_BYTES
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # disaggregation/utils.py L47: no transfer (sglang's own health checks)
MAX_ROOM = 2**63 - 1
KV_DEST_PATH = "/tracebench_sim/kv_dest"
KV_ARRIVED_PATH = "/tracebench_sim/kv_arrived"
# sglang's timeouts (environ.py L413, L417), read from the same environment variables
BOOTSTRAP_TIMEOUT_S = float(os.environ.get("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "300"))
WAITING_TIMEOUT_S = float(os.environ.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", "300"))
ENSURE_RETRIES, ENSURE_INTERVAL_S = 15, 1.0  # decode.py L344-347: the prefill's parallel info, looked up this often

_HIST_MS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0)  # metrics_collector.py L544-555
_LAT_MS = (1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0)  # L517-522
_MB = (1.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 5000.0, 10000.0)  # L556-561
_GB_S = (0.1, 0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 200.0, 400.0)  # L511-516
_STAGE = tuple(0.001 * 1.62 ** i for i in range(30))  # exponential_buckets(0.001, 1.62, 30), L734-740


def kv_bytes(tokens: int) -> int:
    """The bytes of KV a transfer of `tokens` prompt tokens moves."""
    return tokens * KV_BYTES_PER_TOKEN


def transfer_seconds(tokens: int, bandwidth_gib_s: float) -> float:
    """Seconds to move `tokens` tokens of KV at `bandwidth_gib_s` GiB/s (simulated seconds, before --speed)."""
    return kv_bytes(tokens) / (bandwidth_gib_s * 2**30)


class PdAbort(Exception):
    """A PD request sglang aborts with status 500 (bootstrap or transfer failed): non-streamed, HTTP 500 with
    FastAPI's `{"detail": message}` (tokenizer_manager.py L1639-1657); streamed, one chunk with an abort reason."""


@dataclass(frozen=True)
class Bootstrap:
    """The request's PD fields (io_struct.py L257-260), as sglang-router's PD mode adds them."""

    host: str
    port: int | None
    room: int

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"


def parse_bootstrap(obj: dict[str, Any], mode: str) -> Bootstrap:
    """The bootstrap fields of a /generate body. sglang does not check them up front (a missing one fails later,
    UNVERIFIED how); the simulator refuses such a request with 400 naming what is missing."""
    host, port, room = obj.get("bootstrap_host"), obj.get("bootstrap_port"), obj.get("bootstrap_room")
    if host == FAKE_BOOTSTRAP_HOST:
        return Bootstrap(host, port if isinstance(port, int) else None, room if isinstance(room, int) else 0)
    missing = [k for k, v in (("bootstrap_host", host), ("bootstrap_port", port), ("bootstrap_room", room)) if v is None]
    if missing:
        raise BadRequest(f"tracebench sim-server: a PD {mode} server needs bootstrap_host, bootstrap_port and "
                         f"bootstrap_room in the request (missing: {', '.join(missing)}); sglang-router's PD mode and "
                         "tracebench --pd add them")
    if not isinstance(host, str) or not host:
        raise BadRequest(f"bootstrap_host must be a host name, got {host!r}")
    if type(port) is not int or not 0 < port < 65536:
        raise BadRequest(f"bootstrap_port must be a port number, got {port!r}")
    if type(room) is not int or not 0 <= room <= MAX_ROOM:
        raise BadRequest(f"bootstrap_room must be an integer in [0, 2^63 - 1], got {room!r}")
    return Bootstrap(host, port, room)


class KvLink:
    """The prefill server's outgoing link: the bytes go one transfer at a time, first come first served, at a fixed
    bandwidth; each transfer then arrives a fixed latency later, which overlaps the next transfer's bytes. Two
    figures because the real link (mooncake_tcp, reports/examples/h200x2-pd/sim-vs-real.md) moved 1.54 GiB/s back
    to back while a lone transfer took its bytes at that rate plus ~70 ms: the decode server's poll and the status
    message, which do not hold the link."""

    def __init__(self, bandwidth_gib_s: float, latency_s: float, speed: float) -> None:
        self.bandwidth_gib_s = bandwidth_gib_s
        self.latency_s = latency_s
        self.speed = speed
        self.free_at = 0.0

    def book(self, t_ready: float, tokens: int) -> tuple[float, float]:
        """(start, arrival) of a transfer of `tokens` tokens ready at `t_ready` (loop clock): its bytes hold the link
        from start to start + bytes / bandwidth; it arrives --kv-transfer-latency after that."""
        start = max(t_ready, self.free_at)
        self.free_at = start + transfer_seconds(tokens, self.bandwidth_gib_s) / self.speed
        return start, self.free_at + self.latency_s / self.speed


class PdStats:
    """The PD families of sglang's /metrics (metrics_collector.py L484-560, L734-740): the queue gauges, the KV
    transfer histograms and failure counters, the per-stage latencies. A histogram or counter appears once
    observed (prometheus_client label children); the gauges always. Values in the simulator's seconds."""

    def __init__(self) -> None:
        self.stages: dict[str, Histogram] = {}
        self.hists: dict[str, Histogram] = {}
        self.counters: dict[str, int] = {}
        self.last_latency_ms = 0.0   # /v1/loads kv_transfer_latency_ms, kv_transfer_speed_gb_s: the last transfer's
        self.last_speed_gb_s = 0.0

    def stage(self, name: str, seconds: float) -> None:
        self.stages.setdefault(name, Histogram(_STAGE)).observe(max(0.0, seconds))

    def observe(self, name: str, bounds: tuple[float, ...], value: float) -> None:
        self.hists.setdefault(name, Histogram(bounds)).observe(value)

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def transfer(self, seconds: float, nbytes: int) -> None:
        """One finished transfer, as sglang's compute_and_observe_kv_transfer_metrics (req_time_stats.py L888-932)."""
        mb = nbytes / 2**20
        self.last_latency_ms = seconds * 1000
        self.last_speed_gb_s = mb / 1024 / seconds if seconds > 0 else 0.0
        self.observe("sglang:kv_transfer_latency_ms", _LAT_MS, self.last_latency_ms)
        self.observe("sglang:kv_transfer_total_mb", _MB, mb)
        self.observe("sglang:kv_transfer_speed_gb_s", _GB_S, self.last_speed_gb_s)

    def bootstrap(self, bootstrap_s: float, alloc_s: float) -> None:
        self.observe("sglang:kv_transfer_bootstrap_ms", _HIST_MS, bootstrap_s * 1000)
        self.observe("sglang:kv_transfer_alloc_ms", _HIST_MS, alloc_s * 1000)

    def render(self, labels: str, gauges: dict[str, int]) -> list[str]:
        lines: list[str] = []
        for name, value in gauges.items():
            lines += [f"# HELP {name} {_DOCS[name]}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {float(value)!r}"]
        for name, hist in self.hists.items():
            lines += [f"# HELP {name} {_DOCS[name]}", f"# TYPE {name} histogram", *hist.render(name, labels)]
        for name, value in self.counters.items():
            lines += [f"# HELP {name} {_DOCS[name]}", f"# TYPE {name} counter", f"{name}{{{labels}}} {float(value)!r}"]
        if self.stages:
            name = "sglang:per_stage_req_latency_seconds"
            lines += [f"# HELP {name} {_DOCS[name]}", f"# TYPE {name} histogram"]
            for stage, hist in self.stages.items():
                lines += hist.render(name, _with_label(labels, "stage", stage))
        return lines


def _with_label(labels: str, key: str, value: str) -> str:
    parts = [*labels.split(","), f'{key}="{value}"']
    parts.sort(key=lambda p: p.split("=", 1)[0])
    return ",".join(parts)


_DOCS = {
    "sglang:num_prefill_bootstrap_queue_reqs": "The number of requests in the prefill bootstrap queue.",
    "sglang:num_prefill_inflight_queue_reqs": "The number of requests in the prefill inflight queue.",
    "sglang:num_decode_prealloc_queue_reqs": "The number of requests in the decode prealloc queue.",
    "sglang:num_decode_transfer_queue_reqs": "The number of requests in the decode transfer queue.",
    "sglang:kv_transfer_speed_gb_s": "Histogram of KV cache transfer speed in GB/s.",
    "sglang:kv_transfer_latency_ms": "Histogram of KV cache transfer latency in ms.",
    "sglang:kv_transfer_total_mb": "Histogram of KV cache transfer size in MB.",
    "sglang:kv_transfer_bootstrap_ms": "Histogram of KV transfer bootstrap time in ms.",
    "sglang:kv_transfer_alloc_ms": "Histogram of KV transfer allocation waiting time in ms.",
    "sglang:num_bootstrap_failed_reqs_total": "The number of bootstrap failed requests.",
    "sglang:num_transfer_failed_reqs_total": "The number of transfer failed requests.",
    "sglang:per_stage_req_latency_seconds": "The latency of each stage of requests.",
}


class PdWire(Protocol):
    """How a PD role reaches the other server of its pair: a GET of the bootstrap server's JSON (the handshake) and a
    POST of a PD message, each answering why it failed (None: it did not)."""

    async def get_json(self, url: str) -> tuple[Any, str | None]: ...

    async def post(self, url: str, msg: dict[str, Any]) -> str | None: ...


class HttpWire:
    """`PdWire` over HTTP between sim-server processes (one aiohttp session per role)."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self.session = session

    async def get_json(self, url: str) -> tuple[Any, str | None]:
        import aiohttp

        try:
            async with self.session.get(url) as resp:
                if resp.status == 200:
                    return orjson.loads(await resp.read()), None
                return None, f"HTTP {resp.status}"
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as err:
            return None, f"{type(err).__name__}: {err}"

    async def post(self, url: str, msg: dict[str, Any]) -> str | None:
        """POST a PD message to the other server: None when it answered 200, else why not."""
        import aiohttp

        try:
            async with self.session.post(url, data=orjson.dumps(msg), headers={"Content-Type": "application/json"}) as resp:
                body = await resp.read()
                return None if resp.status == 200 else f"HTTP {resp.status}: {body[:200]!r}"
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as err:
            return f"{type(err).__name__}: {err}"


@dataclass(eq=False)
class _Waiter:
    """One request of a PD role between the HTTP face and the model."""

    pend: Pending
    boot: Bootstrap
    t_entry: float                              # entered the role's first queue (loop clock)
    done: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    t_bootstrapped: float | None = None


class PdRole:
    """What both roles share: the PD stats, the wire to the other server (`PdWire`), the /server_info and /v1/loads
    fields."""

    mode = ""

    def __init__(self, args: SimArgs, engine: LiveEngine, answers: Answers) -> None:
        self.args = args
        self.engine = engine
        self.answers = answers
        self.stats = PdStats()
        self.session: aiohttp.ClientSession | None = None
        self.wire: PdWire | None = None   # HttpWire once started; an in-process server sets its own

    @property
    def base_url(self) -> str:
        """Where the other role reaches this server's /generate side (the decode's kv_arrived, a prefill_url)."""
        return f"http://{self.args.host}:{self.args.port}"

    async def start(self) -> None:
        import aiohttp

        self.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30.0))
        self.wire = HttpWire(self.session)

    async def stop(self) -> None:
        if self.session is not None:
            await self.session.close()

    def routes(self, app: web.Application) -> None:
        """Routes the role adds to the server's own app."""

    def server_info(self) -> dict[str, Any]:
        args = self.args
        backend = "mooncake" if args.disaggregation_transfer_backend == "mooncake_tcp" else args.disaggregation_transfer_backend
        info = {"disaggregation_mode": self.mode, "disaggregation_transfer_backend": backend,
                "disaggregation_bootstrap_port": args.disaggregation_bootstrap_port}
        if self.mode == "prefill":   # --load-balance-method auto on a prefill server (server_args.py L3849-3864)
            info["load_balance_method"] = "follow_bootstrap_room"
        return info

    def gauges(self) -> dict[str, int]:
        raise NotImplementedError

    def loads(self) -> dict[str, Any]:
        g = self.gauges()
        return {"mode": self.mode,
                "prefill_bootstrap_queue_reqs": g.get("sglang:num_prefill_bootstrap_queue_reqs", 0),
                "prefill_inflight_queue_reqs": g.get("sglang:num_prefill_inflight_queue_reqs", 0),
                "decode_prealloc_queue_reqs": g.get("sglang:num_decode_prealloc_queue_reqs", 0),
                "decode_transfer_queue_reqs": g.get("sglang:num_decode_transfer_queue_reqs", 0),
                "decode_retracted_queue_reqs": 0, "kv_transfer_speed_gb_s": self.stats.last_speed_gb_s,
                "kv_transfer_latency_ms": self.stats.last_latency_ms}

    def metrics_lines(self, labels: str) -> list[str]:
        return self.stats.render(labels, self.gauges())

    async def admit(self, pend: Pending, boot: Bootstrap) -> None:
        """Bring the request into the model (waiting as this role waits); PdAbort when sglang would abort it."""
        raise NotImplementedError

    async def through(self, pend: Pending, boot: Bootstrap) -> None:
        """The role's part of a request before its answer goes out (both faces: the HTTP one, PdFace, and the
        in-process one): admitted; a prefill server's request also prefilled and its KV at the decode server.
        PdAbort when sglang would abort it."""
        await self.admit(pend, boot)
        if self.mode == "prefill":   # its answer waits for the KV to reach the decode server
            await all_finished([pend])
            await self.answered(pend, boot)

    async def answered(self, pend: Pending, boot: Bootstrap) -> None:
        """The prefill role: the model finished the request; what must happen before its answer goes out."""
        raise NotImplementedError

    def on_finished(self, pend: Pending) -> None:
        """The answer went out: the per-stage latencies known only now."""

    def forget(self, pend: Pending, boot: Bootstrap) -> None:
        """The request left (answered, aborted or its client gone)."""


class PrefillRole(PdRole):
    mode = "prefill"

    def __init__(self, args: SimArgs, engine: LiveEngine, answers: Answers) -> None:
        super().__init__(args, engine, answers)
        self.link = KvLink(args.kv_transfer_bandwidth, args.kv_transfer_latency, args.speed)
        self.dests: dict[int, dict[str, Any]] = {}      # room -> the decode's KV destination (kv_dest message)
        self.bootstrap_queue: dict[int, _Waiter] = {}   # room -> request waiting for its destination
        self.inflight = 0                                # prefilled, KV on its way (sglang's inflight queue)
        self.runner: web.AppRunner | None = None

    # ---- the bootstrap server (common/conn.py L1528-1800) ----
    def bootstrap_app(self) -> web.Application:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/route", self.handle_route)
        app.router.add_get("/health", self.handle_bootstrap_health)
        app.router.add_post(KV_DEST_PATH, self.handle_kv_dest)
        return app

    async def start(self) -> None:
        from aiohttp import web

        await super().start()
        self.runner = web.AppRunner(self.bootstrap_app(), handle_signals=False, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.args.host, self.args.disaggregation_bootstrap_port, reuse_address=True,
                           shutdown_timeout=0.1)
        await site.start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
        await super().stop()

    async def handle_bootstrap_health(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.Response(text="OK")

    async def handle_route(self, request: web.Request) -> web.Response:
        from aiohttp import web

        if request.method == "PUT":
            return web.Response(text="OK")   # a rank registering: this one-rank server is registered already
        if request.method != "GET":
            return web.Response(text="Method not allowed", status=405, content_type="application/json")
        q = request.query
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if not all(q.get(k) for k in keys):
            return web.Response(text="Missing inputs for bootstrap server.", status=400)
        ranks = [int(q[k]) for k in keys]
        if ranks == [-1, -1, -1, -1]:   # the server's parallel info (PrefillServerInfo)
            return json_response(self.parallel_info())
        if ranks != [0, 0, 0, 0]:
            return web.Response(text=f"Bootstrap info not found for dp_rank={ranks[0]} cp_rank={ranks[1]} "
                                     f"tp_rank={ranks[2]} pp_rank={ranks[3]}", status=404)
        return json_response({"rank_ip": self.args.host, "rank_port": self.args.disaggregation_bootstrap_port})

    def parallel_info(self) -> dict[str, Any]:
        """The bootstrap server's answer to the handshake (all ranks -1): this one-rank server's parallel info."""
        return {"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": 1,
                "kv_cache_dtype": "auto", "follow_bootstrap_room": True, "enable_dsa_cache_layer_split": False,
                "prefill_http_port": self.args.port}

    async def handle_kv_dest(self, request: web.Request) -> web.Response:
        from aiohttp import web

        self.take_kv_dest(orjson.loads(await request.read()))
        return web.Response(text="OK")

    def take_kv_dest(self, msg: dict[str, Any]) -> None:
        """The decode server pre-allocated a request's KV: where it goes (sglang: the decode's send_metadata)."""
        room = msg["room"]
        msg["t_loop"] = asyncio.get_running_loop().time()   # bootstrap done for this room
        self.dests[room] = msg
        waiter = self.bootstrap_queue.pop(room, None)
        if waiter is not None and not waiter.done.done():
            waiter.done.set_result(asyncio.get_running_loop().time())

    # ---- requests ----
    def gauges(self) -> dict[str, int]:
        return {"sglang:num_prefill_bootstrap_queue_reqs": len(self.bootstrap_queue),
                "sglang:num_prefill_inflight_queue_reqs": self.inflight,
                "sglang:num_decode_prealloc_queue_reqs": 0, "sglang:num_decode_transfer_queue_reqs": 0}

    async def admit(self, pend: Pending, boot: Bootstrap) -> None:
        loop = asyncio.get_running_loop()
        pend.sim.max_new_tokens = 1   # prefill.py L365-369: the prefill server computes one token
        t_entry = pend.t_received + self.engine.queue_entry_delay   # in the bootstrap queue (scheduler)
        if boot.fake or boot.room in self.dests:
            t_bootstrapped = max(t_entry, self.dests[boot.room]["t_loop"] if boot.room in self.dests else t_entry)
        else:
            waiter = _Waiter(pend, boot, t_entry)
            self.bootstrap_queue[boot.room] = waiter
            try:
                t_bootstrapped = await asyncio.wait_for(asyncio.shield(waiter.done), BOOTSTRAP_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.stats.count("sglang:num_bootstrap_failed_reqs_total")
                raise PdAbort(f"Prefill bootstrap failed for request rank=0 req.rid='{pend.rid}' "
                              f"req.bootstrap_room={boot.room} with exception Request {boot.room} timed out after "
                              f"{BOOTSTRAP_TIMEOUT_S:.1f}s in KVPoll.Bootstrapping") from None
            finally:
                self.bootstrap_queue.pop(boot.room, None)
            t_bootstrapped = max(t_entry, t_bootstrapped)
        model = self.engine.model
        # FCFS: the model takes requests in ready order (a destination that came a moment before an earlier one)
        t_ready = max(t_bootstrapped, model.waiting[-1].t_ready if model.waiting else t_bootstrapped, loop.time())
        pend.sim.t_ready = t_ready
        self.stats.stage("prefill_bootstrap", t_ready - t_entry)
        self.stats.bootstrap(t_bootstrapped - t_entry, t_ready - t_bootstrapped)
        model.submit(pend.sim)
        self.engine.kick()

    async def answered(self, pend: Pending, boot: Bootstrap) -> None:
        """The prefill is done: send the KV, wait for the decode's acknowledgement, then the answer may go."""
        loop = asyncio.get_running_loop()
        sim = pend.sim
        room = boot.room
        dest = None if boot.fake else self.dests.pop(room, None)
        self.stats.stage("prefill_forward", sim.t_prefill_finished - sim.t_forward_entry)  # type: ignore[operator]
        if dest is None:   # fake bootstrap host: no transfer
            return
        self.inflight += 1
        try:
            t0 = sim.t_prefill_finished
            _, t_arrival = self.link.book(t0, sim.input_len)  # type: ignore[arg-type]
            await asyncio.sleep(max(0.0, t_arrival - loop.time()))
            nbytes = kv_bytes(sim.input_len)
            msg = {"room": room, "first_output_id": self.answers.ids(pend, 1)[0], "cached_tokens": sim.cached_tokens,
                   "kv_bytes": nbytes, "prefill_url": self.base_url}
            assert self.wire is not None
            why = await self.wire.post(dest["decode_url"] + KV_ARRIVED_PATH, msg)
            if why is not None:
                self.stats.count("sglang:num_transfer_failed_reqs_total")
                raise PdAbort(f"Prefill transfer failed for request rank=0 req.rid='{pend.rid}' "
                              f"req.bootstrap_room={room} with exception {why}")
            t_done = loop.time()
            self.stats.stage("prefill_transfer_kv_cache", t_done - t0)  # type: ignore[operator]
            self.stats.transfer(t_done - t0, nbytes)  # type: ignore[operator]
        finally:
            self.inflight -= 1
        # the answer leaves through the detokenizer like any other (sglang: stream_output after the poll)
        await asyncio.sleep(self.engine.output_delay)
        pend.t_finished = loop.time()

    def forget(self, pend: Pending, boot: Bootstrap) -> None:
        waiter = self.bootstrap_queue.get(boot.room)
        if waiter is not None and waiter.pend is pend:
            del self.bootstrap_queue[boot.room]


class DecodeRole(PdRole):
    mode = "decode"

    def __init__(self, args: SimArgs, engine: LiveEngine, answers: Answers) -> None:
        super().__init__(args, engine, answers)
        self.prealloc_queue: deque[_Waiter] = deque()       # handshaking or waiting for KV room, FIFO
        self.transfer_queue: dict[int, _Waiter] = {}        # room -> pre-allocated, waiting for its KV
        self.prefill_info: dict[str, dict[str, Any]] = {}   # bootstrap addr -> its parallel info (the handshake)

    def routes(self, app: web.Application) -> None:
        app.router.add_post(KV_ARRIVED_PATH, self.handle_kv_arrived)

    def server_info(self) -> dict[str, Any]:
        # pd_disaggregation_hook.py L55-84: the decode server's KV is a chunk cache
        return {**super().server_info(), "disable_radix_cache": True}

    def gauges(self) -> dict[str, int]:
        return {"sglang:num_prefill_bootstrap_queue_reqs": 0, "sglang:num_prefill_inflight_queue_reqs": 0,
                "sglang:num_decode_prealloc_queue_reqs": len(self.prealloc_queue),
                "sglang:num_decode_transfer_queue_reqs": len(self.transfer_queue)}

    async def _handshake(self, boot: Bootstrap) -> None:
        """The prefill's parallel info from its bootstrap server (decode.py L806-848), looked up once per address."""
        if boot.addr in self.prefill_info:
            return
        url = (f"http://{boot.addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1"
               f"&target_pp_rank=-1")
        assert self.wire is not None
        last = ""
        for attempt in range(ENSURE_RETRIES):
            info, why = await self.wire.get_json(url)
            if why is None:
                self.prefill_info[boot.addr] = info
                return
            last = why
            if attempt + 1 < ENSURE_RETRIES:
                await asyncio.sleep(ENSURE_INTERVAL_S)
        self.stats.count("sglang:num_bootstrap_failed_reqs_total")
        raise PdAbort(f"Could not fetch prefill parallel info from {boot.addr} after {ENSURE_RETRIES} attempts "
                      f"({last})")

    async def admit(self, pend: Pending, boot: Bootstrap) -> None:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(pend, boot, pend.t_received + self.engine.queue_entry_delay)
        self.stats.stage("decode_prepare", self.engine.queue_entry_delay)
        self.prealloc_queue.append(waiter)
        try:
            if not boot.fake:
                await self._handshake(boot)
            waiter.t_bootstrapped = loop.time()
            self.try_prealloc()
            await waiter.done   # pre-allocated (or refused: PdAbort set by try_prealloc)
        finally:
            if waiter in self.prealloc_queue:
                self.prealloc_queue.remove(waiter)
        t_transfer_entry = loop.time()
        self.stats.stage("decode_bootstrap", t_transfer_entry - waiter.t_entry)
        self.stats.bootstrap(waiter.t_bootstrapped - waiter.t_entry, t_transfer_entry - waiter.t_bootstrapped)
        if boot.fake:   # no prefill: its KV is "here" at once, its first token made up
            self.engine.model.arrive(pend.sim, loop.time())
            self.engine.kick()
            return
        arrived = loop.create_future()
        self.transfer_queue[boot.room] = _Waiter(pend, boot, t_transfer_entry, arrived)
        try:
            msg = {"room": boot.room, "decode_url": self.base_url, "tokens": pend.sim.input_len}
            assert self.wire is not None
            why = await self.wire.post(f"http://{boot.addr}{KV_DEST_PATH}", msg)
            if why is not None:
                self.stats.count("sglang:num_transfer_failed_reqs_total")
                raise PdAbort(f"Decode transfer failed for request rank=0 decode_req.req.rid='{pend.rid}' "
                              f"decode_req.req.bootstrap_room={boot.room} with exception send_metadata to prefill "
                              f"{boot.addr} failed: {why}")
            try:
                await asyncio.wait_for(asyncio.shield(arrived), WAITING_TIMEOUT_S)
            except asyncio.TimeoutError:
                self.stats.count("sglang:num_transfer_failed_reqs_total")
                raise PdAbort(f"Decode transfer failed for request rank=0 decode_req.req.rid='{pend.rid}' "
                              f"decode_req.req.bootstrap_room={boot.room} with exception Request {boot.room} timed "
                              f"out after {WAITING_TIMEOUT_S:.1f}s in KVPoll.WaitingForInput") from None
        finally:
            self.transfer_queue.pop(boot.room, None)
        self.stats.stage("decode_transferred", pend.sim.t_arrived - t_transfer_entry)  # type: ignore[operator]

    def try_prealloc(self) -> None:
        """sglang's pop_preallocated: in queue order, requests whose handshake is done get their KV reserved while
        it fits; the first that does not fit stops the scan (decode.py L894-1308)."""
        model = self.engine.model
        for waiter in list(self.prealloc_queue):
            if waiter.t_bootstrapped is None or waiter.done.done():
                continue
            if not model.prealloc(waiter.pend.sim):
                break
            self.prealloc_queue.remove(waiter)
            waiter.done.set_result(None)

    async def handle_kv_arrived(self, request: web.Request) -> web.Response:
        from aiohttp import web

        why = self.take_kv_arrived(orjson.loads(await request.read()))
        if why is not None:
            return json_response({"error": {"message": why}}, 404)
        return web.Response(text="OK")

    def take_kv_arrived(self, msg: dict[str, Any]) -> str | None:
        """The prefill server's KV for a room is here (sglang: the transfer's Success status); why it is refused
        (None: taken)."""
        waiter = self.transfer_queue.get(msg["room"])
        if waiter is None or waiter.done.done():
            return f"no request waits for room {msg['room']}"
        loop = asyncio.get_running_loop()
        pend = waiter.pend
        assert not pend.output_ids, "no output id is drawn before the first token"
        pend.output_ids.append(msg["first_output_id"])   # decode.py L1879: the prefill's token is the first
        pend.sim.cached_tokens = msg["cached_tokens"]    # decode.py L1881: the prefill's cache hit
        self.engine.model.arrive(pend.sim, loop.time())
        self.engine.kick()
        waiter.done.set_result(None)
        return None

    def on_finished(self, pend: Pending) -> None:
        sim = pend.sim
        if sim.t_arrived is not None and sim.t_forward_entry is not None:
            self.stats.stage("decode_waiting", sim.t_forward_entry - sim.t_arrived)
            self.stats.stage("fake_output", 0.0)   # the prebuilt batch takes no forward pass here

    def forget(self, pend: Pending, boot: Bootstrap) -> None:
        for waiter in list(self.prealloc_queue):
            if waiter.pend is pend:
                self.prealloc_queue.remove(waiter)
        waiter = self.transfer_queue.get(boot.room)
        if waiter is not None and waiter.pend is pend:
            del self.transfer_queue[boot.room]
        # the request's KV (if any) is free now, or will be at the model's next step: others may fit
        asyncio.get_running_loop().call_soon(self.try_prealloc)


def make_role(args: SimArgs, engine: LiveEngine, answers: Answers) -> PdRole | None:
    if args.disaggregation_mode == "prefill":
        return PrefillRole(args, engine, answers)
    if args.disaggregation_mode == "decode":
        return DecodeRole(args, engine, answers)
    return None


class PdFace:
    """/generate of a PD server: validated by the plain face, then through the role, answered by the plain face's
    formatters. `stream` and `final_out` are the plain face's (SSE chunks, final output counted as finished)."""

    def __init__(self, role: PdRole, engine: LiveEngine, answers: Answers,
                 stream: Callable[[web.Request, Pending], Awaitable[web.StreamResponse]],
                 final_out: Callable[[Pending, bool], dict]) -> None:
        self.role = role
        self.engine = engine
        self.answers = answers
        self.stream = stream
        self.final_out = final_out

    def bootstrap(self, obj: dict[str, Any], items: list) -> Bootstrap:
        """The request's bootstrap fields; BadRequest (the face answers it as any refusal) when they do not do."""
        if len(items) != 1:
            raise BadRequest(f"tracebench sim-server: a PD {self.role.mode} server takes one request per /generate "
                             "(a batch would need one bootstrap_room per item)")
        return parse_bootstrap(obj, self.role.mode)

    async def generate(self, request: web.Request, boot: Bootstrap, items: list, rids: list[str], stream: bool,
                       t_received: float) -> web.StreamResponse:
        role = self.role
        (pend,) = pendings = self.engine.submit(items, rids, stream, t_received, to_model=False)
        done = False
        try:
            # the role's part (the bootstrap queue, the decode's handshake) starts at the receipt, as in-process
            await until_receipt(t_received)
            try:
                await role.through(pend, boot)
            except PdAbort as err:
                done = True
                return await self._abort(request, pend, str(err), stream)
            if role.mode == "prefill":
                # prefill.py L870-876 and schedule_batch.py L240-249: it ends as FINISH_LENGTH(length=0)
                await self.engine.until_answer_end([pend])
                response = await self._prefill_answer(request, pend, stream)
            elif stream:
                response = await self.stream(request, pend)
            else:
                await all_finished(pendings)
                await self.engine.until_answer_end(pendings)
                out = self.final_out(pend, False)
                out["meta_info"]["response_sent_to_client_ts"] = time.time()
                response = json_response(out)
            role.on_finished(pend)
            done = True
            return response
        finally:
            self.engine.release(pendings, done)
            role.forget(pend, boot)

    async def _prefill_answer(self, request: web.Request, pend: Pending, stream: bool) -> web.StreamResponse:
        from aiohttp import web

        out = self.final_out(pend, stream)
        out["meta_info"]["finish_reason"] = PREFILL_FINISH
        out["meta_info"]["response_sent_to_client_ts"] = time.time()
        if not stream:
            return json_response(out)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(out) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _abort(self, request: web.Request, pend: Pending, message: str, stream: bool) -> web.StreamResponse:
        """sglang's 500 abort: HTTPException(500, detail) non-streamed; streamed, an abort chunk then [DONE]."""
        from aiohttp import web

        abort_request(self.engine, pend)
        if not stream:
            return web.Response(status=500, body=abort_body(message), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        await response.write(b"data: " + orjson.dumps(abort_chunk(self.answers, pend, message)) + b"\n\ndata: [DONE]\n\n")
        await response.write_eof()
        return response


# prefill.py L870-876 and schedule_batch.py L240-249: a prefill server's answer ends as FINISH_LENGTH(length=0)
PREFILL_FINISH = {"type": "length", "length": 0}


def abort_request(engine: LiveEngine, pend: Pending) -> None:
    """A PD request sglang aborts (PdAbort): out of the model, counted aborted (both faces)."""
    engine.model.abort(pend.sim)
    engine.pending.pop(pend.sim, None)
    engine.stats.on_abort()


def abort_body(message: str) -> bytes:
    """The body of sglang's non-streamed 500 abort: FastAPI's HTTPException detail."""
    return orjson.dumps({"detail": message})


def abort_chunk(answers: Answers, pend: Pending, message: str) -> dict[str, Any]:
    """The one chunk of sglang's streamed 500 abort (an abort finish_reason, no tokens)."""
    meta = {"id": pend.rid, "finish_reason": {"type": "abort", "message": message, "status_code": 500,
                                              "err_type": "InternalServerError"},
            "prompt_tokens": pend.sim.input_len, "completion_tokens": 0, "cached_tokens": 0,
            "e2e_latency": asyncio.get_running_loop().time() - pend.t_received}
    return answers.with_text([], meta)

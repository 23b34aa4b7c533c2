"""The simulated sglang server inside the replay's own process: the sim-server's model, engine, metrics and answers,
with no HTTP (the in-process face, beside `server.py`'s HTTP one). `--clock virtual` runs one per server on the
virtual loop (`tracebench/replay/loop.py`), so its steps and the replay's router move on one simulated clock.

It is the same `SimServer` the sim-server process runs (built from the same flags), so the batch model, the radix
cache, the step costs, the `meta_info` and /server_info and /v1/loads are the HTTP server's own; what is not here is
the socket. A request is submitted as the HTTP handler submits it, and its answer is formatted by the same code;
the client's side of the HTTP hop is the caller's (`replay/inprocess.py`).

A PD server (`--disaggregation-mode prefill|decode`) plays its role (`sim/pd.py`) with the same code as the
sim-server process; what its HTTP face and its bootstrap server do is here (`submit_pd`, `serve_pd`), and the roles
reach each other through `InProcessWire`: the handshake, the KV destination and the KV's arrival are direct calls
into the other role, taking no simulated time (the link's own time, `--kv-transfer-bandwidth` and
`--kv-transfer-latency`, is the role's `KvLink`, as in the process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import click

from tracebench.errors import ConfigError
from tracebench.sim.args import SGLANG_VERSION, SimArgs
from tracebench.sim.engine import Pending
from tracebench.sim.pd import (
    KV_ARRIVED_PATH, KV_DEST_PATH, PREFILL_FINISH, Bootstrap, DecodeRole, PdAbort, PdRole, PrefillRole, abort_chunk,
    abort_request,
)
from tracebench.sim.prom import metrics_samples
from tracebench.sim.server import SimServer
from tracebench.sim.validate import check_item, check_scheduler, clip_max_new


# Decode steps that nothing can change run as one, up to this many (model.BatchModel.start_decode_run): what a
# simulated clock gains by not waking per step. The tokens of a run reach the reader together at its end, so what
# the server reports meanwhile (/v1/loads) is up to this many steps old: sglang's own scheduler refreshes that
# snapshot every 15 decode steps (scheduler.py L3925-3962 of 0.5.17).
FOLD_STEPS = 15


def sim_args_from_command(words: Sequence[str]) -> SimArgs:
    """The SimArgs a `tracebench sim-server ...` command line would run with (the flags after `sim-server`), parsed
    by the sim-server's own click command: an in-process server is configured exactly as the process would be."""
    from tracebench.sim.commands import resolve_sim_args, sim_server

    try:
        ctx = sim_server.make_context("sim-server", list(words))
    except click.ClickException as err:
        raise ConfigError(f"sim-server {' '.join(words)}: {err.format_message()}") from None
    return resolve_sim_args(**ctx.params)


class InProcessWire:
    """`pd.PdWire` between in-process PD servers: each role is known by the base URLs the other would reach it at
    (a prefill server's bootstrap address, a decode server's own), and a message is the other role's handler called
    at once: no simulated time passes, nothing can fail but a message for no one (a decode request gone)."""

    def __init__(self) -> None:
        self.roles: dict[str, PdRole] = {}

    def add(self, role: PdRole) -> None:
        self.roles[role.base_url] = role
        if isinstance(role, PrefillRole):
            self.roles[f"http://{role.args.host}:{role.args.disaggregation_bootstrap_port}"] = role

    def _role(self, url: str) -> tuple[PdRole | None, str]:
        scheme, _, rest = url.partition("://")
        host, slash, path = rest.partition("/")
        return self.roles.get(f"{scheme}://{host}"), slash + path

    async def get_json(self, url: str) -> tuple[Any, str | None]:
        role, path = self._role(url)
        if not isinstance(role, PrefillRole) or not path.startswith("/route?"):
            return None, f"no bootstrap server answers {url}"
        return role.parallel_info(), None   # the decode's handshake (all ranks -1, pd.DecodeRole._handshake)

    async def post(self, url: str, msg: dict[str, Any]) -> str | None:
        role, path = self._role(url)
        if path == KV_DEST_PATH and isinstance(role, PrefillRole):
            role.take_kv_dest(msg)
            return None
        if path == KV_ARRIVED_PATH and isinstance(role, DecodeRole):
            return role.take_kv_arrived(msg)
        return f"no in-process PD server takes {url}"


class InProcessServer:
    """One simulated server in this process. Its stamps (meta_info, /v1/loads) are in the run clock's seconds: its
    wall clock is anchored so that the run's start is 0 (`start`). A PD server needs the fleet's `wire`."""

    def __init__(self, args: SimArgs, wire: InProcessWire | None = None) -> None:
        self.args = args
        self.sim = SimServer(args, over_http=False)   # the reader adds the HTTP hops (replay/inprocess.py)
        self.engine = self.sim.engine
        self.engine.fold_steps = FOLD_STEPS
        self._seq = 0  # rids: the request's position at this server (unique, and the same every run)
        self.pd = self.sim.pd
        if self.pd is not None:
            if wire is None:
                raise ValueError("an in-process PD server needs the wire to its pair (InProcessWire)")
            self.pd.wire = wire
            wire.add(self.pd)

    def start(self, run_start: float) -> asyncio.Task[None]:
        """Start the engine on the running loop; `run_start` is the loop time the run clock counts from."""
        loop = asyncio.get_running_loop()
        answers = self.sim.answers
        answers.now_loop = loop.time
        answers.now_wall = lambda: loop.time() - run_start
        now = loop.time()
        self.sim.t_ready_at = now
        return self.engine.start(now, wall_now=now - run_start)

    def submit(self, input_len: int, max_new_tokens: int, tokens: Sequence | None, t_received: float,
               stream: bool, to_model: bool = True) -> Pending:
        """Hand one request to the model as the HTTP handler does once its body is in (`t_received`, loop clock).
        `tokens`: its input ids for the prefix cache (ids the caller made within the vocabulary), None for content
        that matches nothing. Raises validate.BadRequest or SchedulerAbort as sglang refuses. `to_model` False (a PD
        server: `submit_pd`): registered only; its role brings it to the model (`serve_pd`)."""
        asked = check_item(input_len, max_new_tokens, None, self.args)
        check_scheduler(input_len, self.args)
        item = (input_len, clip_max_new(input_len, asked, self.args), tokens)
        rid = f"r{self._seq}"
        self._seq += 1
        [pend] = self.engine.submit([item], [rid], stream, t_received, to_model=to_model)
        return pend

    # ---- a PD server (sim/pd.py): what its HTTP face, PdFace, does, without the HTTP ----
    def submit_pd(self, input_len: int, max_new_tokens: int, tokens: Sequence | None, t_received: float,
                  stream: bool) -> Pending:
        """`submit` for a PD server's request (checked alike; its role brings it to the model in `serve_pd`)."""
        assert self.pd is not None
        return self.submit(input_len, max_new_tokens, tokens, t_received, stream, to_model=False)

    async def serve_pd(self, pend: Pending, boot: Bootstrap) -> str | None:
        """The role's part of a request from its receipt (now) until its answer may go (pd.PdRole.through): None, or
        why sglang aborted it (it is out of the model then: its answer is `pd_abort_out`)."""
        assert self.pd is not None
        try:
            await self.pd.through(pend, boot)
        except PdAbort as err:
            abort_request(self.engine, pend)
            return str(err)
        return None

    def prefill_answer(self, pend: Pending, stream: bool, t_sent_wall: float) -> dict:
        """A prefill server's answer (`final_answer` with its finish: FINISH_LENGTH(length=0))."""
        out = self.final_answer(pend, stream, t_sent_wall)
        out["meta_info"]["finish_reason"] = PREFILL_FINISH
        return out

    def pd_abort_out(self, pend: Pending, message: str) -> dict:
        """The streamed answer of a request sglang aborted with 500 (pd.abort_chunk)."""
        return abort_chunk(self.sim.answers, pend, message)

    def end_pd(self, pend: Pending, boot: Bootstrap, done: bool, answered: bool) -> None:
        """The request left the PD server: answered (`answered`: the decode role's per-stage figures), aborted, or
        its client gone (`done` False: the server aborts it, as sglang does)."""
        assert self.pd is not None
        if answered:
            self.pd.on_finished(pend)
        self.engine.release([pend], done)
        self.pd.forget(pend, boot)

    def final_answer(self, pend: Pending, stream: bool, t_sent_wall: float) -> dict:
        """The finished request's answer as /generate sends it (meta_info; no ids: nobody reads them here), counted
        finished now, as the HTTP face does."""
        lag = pend.lag
        meta = self.sim.answers.final_meta(pend, stream)
        # formatted when the client reads it (a response hop after the server handed it out), not late: the
        # server's lag is its delivery's alone (0 on the virtual clock)
        meta["tracebench_sim_lag"] = pend.lag = lag
        meta["response_sent_to_client_ts"] = t_sent_wall
        self.engine.count_finished(pend)
        self.engine.release([pend], True)
        return {"meta_info": meta}

    def abort_answer(self, message: str, t_received: float, now: float) -> dict:
        """sglang's scheduler-side abort in a stream (one chunk, an abort finish_reason), as the HTTP face sends it."""
        from tracebench.sim.model import token_ids

        out_id = token_ids(self.engine.rng.getrandbits(64), 1, self.args.vocab_size)
        rid = f"r{self._seq}"  # its own: the next request's was this one's too (its answer's id)
        self._seq += 1
        return self.sim.answers.abort_out(rid, message, out_id, t_received,
                                          t_received + self.engine.dispatch_delay, now)

    def server_info(self) -> dict:
        return self.sim.server_info()

    def loads(self) -> dict:
        """/v1/loads' body (its `timestamp` is for show: the run's seconds)."""
        now = self.sim.answers.now_wall()
        return {"timestamp": f"{now:.6f}", "version": SGLANG_VERSION,
                "accelerator": self.args.profile.accelerator, "num_accelerators": 1, "loads": [self.sim._load(now)]}

    def load_now(self) -> tuple[tuple[int, int, float, float], tuple[float, ...]]:
        """What a poller reads of `loads()` (telemetry.parse_loads, snapshot_stamps), without the body: the figures
        and the snapshot's stamp (its one `loads` entry's `timestamp`)."""
        return self.sim.load_figures(), (self.sim.answers.now_wall(),)

    def flush_cache(self) -> bool:
        return self.sim.model.flush_cache()

    def metrics_text(self) -> str:
        return self.sim.metrics_text() if self.args.enable_metrics else ""

    def metrics_samples(self, names: frozenset[str]) -> dict[str, list[float]] | None:
        """The values `metrics_text` prints for the samples `names` (prom.metrics_samples), without the text; None
        when the server serves no metrics (its page is empty)."""
        if not self.args.enable_metrics:
            return None
        return metrics_samples(self.sim.stats, self.sim.model, names)

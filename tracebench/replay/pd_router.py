"""The router of a PD run: the same queue, caps, health checks and records as `router.Router`, with the servers in
two pools and each request sent to a (prefill, decode) pair (pd.py has the pieces: pairing, body, client).

Only assignment, the carrying of a request (the sender's `exchange_pair`: HTTP, or in-process on the virtual clock)
and a flight's end differ from a plain run: the flight itself is the router's own (`Router._serve`). A plain run
never imports this module. `server` of a record is the decode server (its stream is the answer) and the server_*
stamps are its own; the prefill side goes to the prefill_* fields (records.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from tracebench.errors import ServerProtocolError
from tracebench.policies.base import Policy, ServerView, free_slots_text
from tracebench.replay.client import Answer
from tracebench.replay.pd import Rooms, assign_pairs
from tracebench.replay.records import COMPLETED, PdRecord, RequestRecord
from tracebench.replay.router import Router, ServerState

# the decode server's meta_info stamps that must come with --enable-metrics (a decode server sends no
# prefill_finished_time: .DUCUMENT/pd-disaggregation.md section 3, "Stamps")
_DECODE_STAMPS = ("server_received", "server_forward_entry", "server_finished", "server_queue_time")
# the prefill answer's meta_info -> record field (run clock for the *_ts / *_time stamps)
_PREFILL_STAMPS = (("request_received_ts", "prefill_received"), ("forward_entry_time", "prefill_forward_entry"),
                   ("prefill_finished_time", "prefill_done"), ("request_finished_ts", "prefill_finished"))


@dataclass
class PdPools:
    """The run's two pools (indices into the run's servers), their policies and each prefill server's bootstrap
    address (its URL's host, the port from its /server_info)."""

    prefill: list[int]
    decode: list[int]
    prefill_policy: Policy
    decode_policy: Policy
    bootstrap: dict[int, tuple[str, int]]
    require_stamps: dict[int, bool]   # the server runs with --enable-metrics


class PdRouter(Router):
    """`policy` (the base class's) is the decode pool's; the prefill pool's is `pools.prefill_policy`."""

    def __init__(self, *, pools: PdPools, seed: int, **kwargs: Any) -> None:
        super().__init__(policy=pools.decode_policy, **kwargs)
        if self.static:
            raise ValueError("PD runs are continuous (--mode static is refused with --pd)")
        self.pools = pools
        self.policy_time.name = f"{pools.prefill_policy.name} (prefill) / {pools.decode_policy.name} (decode)"
        self.refresh_report_ages = pools.prefill_policy.reads_report_age or pools.decode_policy.reads_report_age
        self._observe(pools.prefill_policy.reads_observed or pools.decode_policy.reads_observed)
        self.rooms = Rooms(seed)
        if not hasattr(self.sender, "exchange_pair"):
            raise ValueError("a PD run's sender carries pairs (flight.PairSender)")

    def _can_assign(self, free: list[int]) -> bool:
        """A pair is possible: a free slot in each pool."""
        return any(free[i] for i in self.pools.prefill) and any(free[i] for i in self.pools.decode)

    def _ask(self, now: float, views: list[ServerView]) -> float | None:
        """Each pool's policy in turn (pd.assign_pairs, timed as one call); the pairs are dispatched."""
        self.pools.prefill_policy.now = self.policy.now = now
        triples = self.policy_time.call("assign", assign_pairs, self._queue, self.pools.prefill_policy, self.policy,
                                        [views[i] for i in self.pools.prefill], [views[i] for i in self.pools.decode])
        if not triples:
            return None   # what a policy raises, or a rule it breaks, is a PolicyError already
        chosen = {req.id for req, _, _ in triples}
        self._queue = [q for q in self._queue if q.id not in chosen]
        t_assigned = self.clock.now()
        for req, prefill_view, decode_view in triples:
            del self._queued[req.id]
            rec = self._pending[req.id]
            self._assigned(rec, t_assigned)
            self._dispatch_pair(rec, self.servers[prefill_view.index], self.servers[decode_view.index])
        return t_assigned

    def _policy_label(self) -> str:
        return (f"policies {self.pools.prefill_policy.name!r} (prefill pool) and {self.policy.name!r} "
                "(decode pool)")

    def _free_text(self, views: list[ServerView]) -> str:
        prefill = free_slots_text([views[i] for i in self.pools.prefill])
        decode = free_slots_text([views[i] for i in self.pools.decode])
        return f"prefill: {prefill}; decode: {decode}"

    def _none_left(self) -> str | None:
        """A pair needs a server of each pool: the run cannot go on once either pool is all down."""
        for role, pool in (("prefill", self.pools.prefill), ("decode", self.pools.decode)):
            if all(self.servers[i].state == "down" for i in pool):
                return f"every {role} server is down"
        return None

    def _dispatch_pair(self, rec: RequestRecord, prefill: ServerState, decode: ServerState) -> None:
        rec = self._pending[rec.id] = PdRecord.of(rec)   # a plain run's records stay without the prefill fields
        rec.prefill_server, rec.bootstrap_room = prefill.index, self.rooms.next()
        # the router's one flight (Router._serve), of the decode server, that also occupies the prefill one (the
        # watchdog: Router._launch); only its carrying (`_carry`) and its end (`_finish`) know of the pair
        self._launch(rec, decode, partial(self._serve, rec, decode), other=prefill)
        prefill.in_flight += 1

    async def _carry(self, rec: PdRecord, server: ServerState, flight: Any) -> Answer:  # type: ignore[override]
        """The pair's exchange (flight.PairSender: HTTP or in-process); the prefill answer's meta_info is taken here,
        the decode answer's by Router._take_answer."""
        prefill = flight.other
        host, port = self.pools.bootstrap[prefill.index]
        answer, prefill_answer = await self.sender.exchange_pair(  # type: ignore[attr-defined]
            rec, prefill, server, flight, self._prefix_blocks.get(rec.id), (host, port, rec.bootstrap_room),
            self.clock.now)
        if prefill_answer is not None and prefill_answer.connection_lost:
            self.suspect(prefill.index, f"request {rec.id} (prefill): {prefill_answer.error}")
        if answer.status == "ok":   # a pair ends ok only with both answers in
            assert prefill_answer is not None
            self._take_prefill(rec, prefill, prefill_answer)
        return answer

    def _check_answer(self, rec: RequestRecord, server: ServerState) -> None:
        self._check_decode_stamps(rec, server)
        super()._check_answer(rec, server)   # the decode answer against the trace: ok or mismatch

    def _finish(self, rec: RequestRecord, server: ServerState) -> None:
        prefill = self.servers[rec.prefill_server]  # type: ignore[attr-defined]
        prefill.in_flight -= 1
        if rec.status == "not_sent":  # never went out: no pair, no room (run-format.md), as no server (Router)
            rec.prefill_server = rec.bootstrap_room = None  # type: ignore[attr-defined]
        super()._finish(rec, server)   # the record first: what the prefill policy raises below stops the run
        if not self._closing:
            self.policy_time.call("on_complete", self.pools.prefill_policy.on_complete, rec.id, prefill.index,
                                  rec.status in COMPLETED)

    def _take_prefill(self, rec: PdRecord, prefill: ServerState, answer: Answer) -> None:
        meta = answer.meta
        if meta is None:
            raise ServerProtocolError(f"{prefill.generate_url}: the prefill answer has no meta_info, request {rec.id}")
        self._take_stamps(rec, prefill, meta, _PREFILL_STAMPS, self.pools.require_stamps[prefill.index],
                          "prefill meta_info")
        rec.prefill_queue_time = meta.get("queue_time")
        rec.prefill_e2e_latency = meta.get("e2e_latency")

    def _check_decode_stamps(self, rec: RequestRecord, decode: ServerState) -> None:
        if not self.pools.require_stamps[decode.index]:
            return
        for field in _DECODE_STAMPS:
            if getattr(rec, field) is None:
                raise ServerProtocolError(f"{decode.generate_url}: decode meta_info has no {field.removeprefix('server_')} "
                                          f"stamp (the server runs with --enable-metrics), request {rec.id}")


def pool_states(states: Sequence[ServerState]) -> None:
    """The decode servers' stamps are checked by PdRouter (they lack prefill_finished_time), not by Router."""
    for state in states:
        state.require_stamps = False

"""The run's duration in simulated seconds at --speed K, counted as `tracebench report` counts it, for the summary
line at the end of a replay (the replay never imports the report: this mirrors report/speed.py's conversion).

The report's duration is the first arrival to the last completed (ok or mismatch) finish, on the simulated timeline: the simulators' own
time x K, tracebench's host time (release lag, HTTP hops, the client reading the stream, and the router wait of an
uncapped continuous run) as measured. Multiplying the whole run clock by K instead counts host time K times.
For a completed record with the simulator's stamps, report/speed.py's finish reduces to
  K x t_arrival + (t_finish - t_arrival) + (K - 1) x (server_finished - server_received + intake + end)
                                                                                  (router wait: host time)
  K x t_dispatch + (t_finish - t_dispatch) + (K - 1) x (server_finished - server_received + intake + end)
                                                                                  (capped: waiting for a slot)
where intake is the simulator's modelled intake on the run clock, the hop server_received - t_dispatch up to its
request_hop_s / K, and end its modelled answer's end, the hop server_finished -> t_finish up to its answer_end_s / K
(each 0 for a simulator that does not report it), and to K x t_finish when the simulators did not report `output_s`
or the run is a PD run (every time x K)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

from tracebench.replay.records import COMPLETED, RequestRecord


# a simulator's /server_info `tracebench_sim` keys for the parts of the HTTP hops it models (simulated seconds)
MODELLED_HOPS = ("request_hop_s", "answer_end_s")


class ModelledHops(NamedTuple):
    """What a server models of the HTTP hops (simulated seconds; docs/sim-server.md "Intake", "Answer's end"):
    it took a request in `intake` after the client sent it (so that much of dispatch -> received is its model's time),
    and sent an answer's end `end` after its model finished the request (that much of server_finished -> t_finish).
    0: not modelled (real sglang; a simulator from before 2026-11-29 took a request in on arrival, and one from before
    that day's stop 43 sent an answer's end at once: all host time)."""

    intake: float
    end: float


def modelled_hops(server_infos: Sequence[dict[str, Any] | None]) -> list[ModelledHops]:
    """Each server's ModelledHops, from its /server_info. The replay's summary and the report (report/speed.py) read
    them alike."""
    hops = []
    for info in server_infos:
        sim = (info or {}).get("tracebench_sim")
        sim = sim if isinstance(sim, dict) else {}
        hops.append(ModelledHops(*(float(sim[key]) if key in sim else 0.0 for key in MODELLED_HOPS)))
    return hops


class SimulatedSpan:
    """Running maxima of a completed record's simulated finish (both router-wait cases) and the first arrival."""

    __slots__ = ("k", "paced", "first_arrival", "finish_host_wait", "finish_capped", "finish_scaled")

    def __init__(self, speed: float, hops: Sequence[ModelledHops]) -> None:
        """`hops`: each server's modelled parts of the HTTP hops (`modelled_hops`), simulated seconds."""
        self.k = speed
        self.paced = [ModelledHops(hop.intake / speed, hop.end / speed) for hop in hops]   # on the run clock
        self.first_arrival = math.inf
        self.finish_host_wait = self.finish_capped = self.finish_scaled = -math.inf

    def add(self, rec: RequestRecord) -> None:
        if self.k == 1.0:
            return
        k = self.k
        if rec.t_arrival < self.first_arrival:
            self.first_arrival = rec.t_arrival
        if rec.status not in COMPLETED:
            return
        tf, ta, td = rec.t_finish, rec.t_arrival, rec.t_dispatch
        assert tf is not None and td is not None
        self.finish_scaled = max(self.finish_scaled, k * tf)
        sr, sf = rec.server_received, rec.server_finished
        if sr is not None and sf is not None:
            server = rec.server
            # (sglang-router: no server, nothing modelled)
            intake, end = self.paced[server] if server is not None else (0.0, 0.0)
            inside = (k - 1) * (sf - sr + min(max(sr - td, 0.0), intake) + min(max(tf - sf, 0.0), end))
            host_wait = k * ta + (tf - ta) + inside
            capped = k * td + (tf - td) + inside
        else:  # no simulator stamps: K x everything after dispatch
            host_wait = k * ta + (td - ta) + k * (tf - td)
            capped = k * tf
        self.finish_host_wait = max(self.finish_host_wait, host_wait)
        self.finish_capped = max(self.finish_capped, capped)

    def duration(self, host_wait: bool, output_s_known: bool, pd: bool) -> float | None:
        """First arrival to last completed finish in simulated seconds (None: none completed). `host_wait`: the run had no
        cap and continuous batching (report/speed.py `uncapped`); `output_s_known`: every simulator reported
        output_s; `pd`: a PD run. Without output_s, and for a PD run, the report multiplies every time by K."""
        end = (self.finish_scaled if pd or not output_s_known
               else self.finish_host_wait if host_wait else self.finish_capped)
        if not math.isfinite(end):
            return None
        start = self.k * self.first_arrival
        return end - start if end > start else None

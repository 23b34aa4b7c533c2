"""The trace of each sweep point, written into the sweep folder so a point can be replayed on its own.

- A rate point: the same requests in the same order, their arrivals rescaled to the rate. A trace's rate is the one
  `tracebench inspect` prints, its mean rate (requests - 1) / (last arrival - first arrival); the point's arrivals
  are (arrival_s - first arrival) x (trace rate / point rate), so its mean rate is the point's rate, it starts at 0,
  and the gaps keep their shape (a bursty trace stays as bursty).
  With --point-duration S only the requests whose rescaled arrival is within S trace seconds are kept: a prefix of
  the trace, in order, so every point lasts about S whatever its rate (a trace too short for S at a high rate
  gives a shorter point; the summary says how long each point's arrivals lasted).
- A concurrency point: the same requests, every one arriving at 0 (all released at once; the replay's
  --max-concurrency N keeps at most N in flight).
Every other field of a request (prefix_blocks, extra fields) is written as it was. A closed-loop trace (requests with
`after`) is refused: its follow-up turns are released by their predecessors' answers, not by the arrival schedule, so
it has no rate to rescale.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from tracebench.errors import ConfigError
from tracebench.trace.format import TraceHeader, TraceRequest, sha256_file, write_trace


def trace_rate(requests: list[TraceRequest]) -> float:
    """(requests - 1) / (last arrival - first arrival): `tracebench inspect`'s mean rate."""
    span = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    if len(requests) < 2 or span <= 0:
        raise ConfigError(f"the trace has {len(requests)} request(s) arriving within {span:g} s: a rate sweep needs "
                          "at least two requests at different times (its rate is (requests - 1) / span)")
    return (len(requests) - 1) / span


def refuse_closed_loop(path: Path, requests: list[TraceRequest]) -> None:
    follower = next((r for r in requests if r.after is not None), None)
    if follower is not None:
        raise ConfigError(f"{path}: request {follower.id} is closed-loop (after {follower.after}): its arrival comes "
                          "from an answer, not from the schedule, so the trace cannot be rescaled or released at once; "
                          "sweep an open-loop trace (tracebench generate without --closed-loop)")


def _line(request: TraceRequest, arrival_s: float) -> bytes:
    obj: dict[str, Any] = {"id": request.id, "arrival_s": round(arrival_s, 6), "input_len": request.input_len,
                           "output_len": request.output_len}
    if request.prefix_blocks is not None:
        obj["prefix_blocks"] = list(request.prefix_blocks)
    if request.extra:
        obj.update(request.extra)
    return orjson.dumps(obj) + b"\n"


def write_point_trace(path: Path, source: Path, header: TraceHeader, requests: list[TraceRequest], *,
                      rate: float | None = None, at_once: bool = False, duration: float | None = None) -> Path:
    """The trace of one point: rescaled to `rate` requests/s (only the requests arriving within `duration` trace
    seconds, when given), or with every arrival at 0 (`at_once`). Its header is the source's, with num_requests and
    duration_s updated and `sweep_point` saying where it came from and how it was made."""
    if (rate is None) == (not at_once):
        raise ValueError("write_point_trace: give rate or at_once")
    first = requests[0].arrival_s
    if at_once:
        arrivals = [0.0] * len(requests)
        made: dict[str, Any] = {"arrivals": "all at 0 (released at once)"}
    else:
        assert rate is not None
        source_rate = trace_rate(requests)
        factor = source_rate / rate
        arrivals = [(r.arrival_s - first) * factor for r in requests]
        made = {"arrivals": "rescaled", "rate": rate, "source_rate": source_rate, "scale": factor,
                "rule": "arrival_s = (source arrival_s - first arrival) x source_rate / rate"}
        if duration is not None:
            keep = sum(1 for a in arrivals if a <= duration)
            requests, arrivals = requests[:keep], arrivals[:keep]
            made["point_duration_s"] = duration
    fields = {k: v for k, v in header.fields.items() if k != "tracebench_trace"}
    fields["num_requests"] = len(requests)
    fields["duration_s"] = round(arrivals[-1], 6)
    fields["sweep_point"] = {"source": str(source), "source_sha256": sha256_file(source), **made}
    return write_trace(path, fields, (_line(r, a) for r, a in zip(requests, arrivals)))

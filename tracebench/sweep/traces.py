"""The trace of each sweep point, written into the sweep folder so a point can be replayed on its own.

- A rate point: the same requests in the same order, their arrivals rescaled to the rate. A trace's rate is the one
  `tracebench inspect` prints, its mean rate (requests - 1) / (last arrival - first arrival); the point's arrivals
  are (arrival_s - first arrival) x (trace rate / point rate), so its mean rate is the point's rate, it starts at 0,
  and the gaps keep their shape (a bursty trace stays as bursty).
  With --point-duration S the point offers its rate over its window: it replays the first n = round(rate x S) + 1
  requests of the trace, in order, their arrivals rescaled so that they span (n - 1) / rate (about S): (n - 1) /
  span is the point's rate exactly, whatever that slice's own rate in the trace (rescaling the whole trace and
  keeping what fell within S replayed a quiet opening slice of a bursty trace at a fraction of the rate: 1.87
  req/s offered for a point of 8.34, issue 33). A trace with fewer than n requests gives all of them at the rate, a
  shorter window (the summary warns). The point's header (`sweep_point`) says which slice it replays: how many
  source requests, their span and their own rate.
  A point whose last arrival would pass MAX_ARRIVAL_S (31.7 years: `--rates 1e-300`) or that has fewer than two
  requests is refused (ConfigError) before anything starts.
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
from tracebench.trace.arrivals import MAX_ARRIVAL_S
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
    """The trace of one point: rescaled to `rate` requests/s (with `duration`: its window of that many trace seconds,
    rate_window), or with every arrival at 0 (`at_once`). Its header is the source's, with num_requests and
    duration_s updated and `sweep_point` saying where it came from and how it was made."""
    if (rate is None) == (not at_once):
        raise ValueError("write_point_trace: give rate or at_once")
    first = requests[0].arrival_s
    if at_once:
        arrivals = [0.0] * len(requests)
        made: dict[str, Any] = {"arrivals": "all at 0 (released at once)"}
    else:
        assert rate is not None
        keep, factor, made = rate_window(requests, rate, duration)
        requests = requests[:keep]
        arrivals = [(r.arrival_s - first) * factor for r in requests]
    fields = {k: v for k, v in header.fields.items() if k != "tracebench_trace"}
    fields["num_requests"] = len(requests)
    fields["duration_s"] = round(arrivals[-1], 6)
    fields["sweep_point"] = {"source": str(source), "source_sha256": sha256_file(source), **made}
    return write_trace(path, fields, (_line(r, a) for r, a in zip(requests, arrivals)))


def rate_window(requests: list[TraceRequest], rate: float, duration: float | None) -> tuple[int, float, dict[str, Any]]:
    """A rate point's slice of the trace: (how many requests from the first, the factor on their arrivals, what the
    point trace's header says of it). Its mean rate is `rate` exactly: the whole trace rescaled by its own mean
    rate, or (with `duration`) the first round(rate x duration) + 1 requests rescaled by theirs (module doc).
    ConfigError for a point of fewer than two requests or one lasting past MAX_ARRIVAL_S."""
    if not (rate > 0 and rate == rate):
        raise ConfigError(f"a rate point needs a rate > 0, got {rate!r}")
    first = requests[0].arrival_s
    if duration is None:
        source_rate = trace_rate(requests)
        keep, factor = len(requests), source_rate / rate
        made: dict[str, Any] = {"arrivals": "rescaled", "rate": rate, "source_rate": source_rate, "scale": factor,
                                "rule": "arrival_s = (source arrival_s - first arrival) x source_rate / rate"}
    else:
        want = round(rate * duration) + 1  # the requests a window of `duration` s holds at `rate`
        if want < 2:
            raise ConfigError(f"a rate point of {rate:g} req/s over --point-duration {duration:g} s holds "
                              f"{rate * duration:.3g} gaps between requests: it needs at least two requests (raise the "
                              "rate or --point-duration)")
        keep = min(want, len(requests))
        span = requests[keep - 1].arrival_s - first
        if keep < 2 or span <= 0:
            raise ConfigError(f"the trace's first {keep} request(s) arrive within {span:g} s: a rate point needs at least "
                              "two requests at different times (its rate is (requests - 1) / span)")
        factor = (keep - 1) / rate / span
        made = {"arrivals": "window", "rate": rate, "point_duration_s": duration, "source_requests": keep,
                "source_span_s": span, "source_window_rate": (keep - 1) / span, "scale": factor,
                "rule": "the first round(rate x point_duration_s) + 1 requests, arrival_s = (source arrival_s - first "
                        "arrival) x scale, so that (requests - 1) / span = rate: the point offers its rate over its window"}
    last = (requests[keep - 1].arrival_s - first) * factor
    if not last <= MAX_ARRIVAL_S:
        raise ConfigError(f"a rate point of {rate:g} req/s puts its last arrival at {last:.3g} s, past "
                          f"{MAX_ARRIVAL_S:,.0f} s (31.7 years): give a higher rate")
    return keep, factor, made

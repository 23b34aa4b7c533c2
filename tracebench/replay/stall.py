"""How long a request may go without progress before the replay gives up on it (the stall bound), derived from the
trace unless `--stall-timeout S` gives it.

No request may wait forever: a server that stops answering (a hung process, a stopped one: `kill -STOP`) leaves its
streams open with nothing on them, and its load polls unanswered. But a request waiting in a busy server's own queue
gets nothing on its stream either, until its first token: its long wait is a true time to first token, not a fault.
So a request is never cut for lack of its own progress while its server shows progress. The router's watchdog
(Router.watch):
- takes a server out of routing when requests wait on it and nothing showed its progress for the bound (no stream
  event, no answer, no /v1/loads snapshot newer than the last: sglang's scheduler rewrites it while it works, and the
  HTTP side answers with the old one when the scheduler hangs): event `server_down` ("stalled"), its requests in
  flight `timeout`. A PD pair waits on its prefill server until the prefill answer (or the first token) came, then
  on its decode server;
- records `timeout` for a streamed request that got its first token and then nothing for the bound while its server
  showed progress (a stall of that request); before its first token only its server's silence, or --timeout, ends it;
- non-streamed requests are bounded by their server's progress the same way (the polls show it); only where nothing
  is polled (behind sglang-router) is an answer the one sign of a server's work: a request is then `timeout` when no
  answer came from its server (to it or another) within the no-stream total bound.
The same bound limits how long a policy may leave requests queued while servers have free slots (Router.watch).

Defaults, in trace seconds (the trace's time: divided by K at --speed K, like --timeout):
- no progress: max(60 s, the longest prompt prefilled at a pessimistic 1000 tokens/s, twice over);
- no-stream total: that plus the longest output decoded at a pessimistic 5 tokens/s.
On the run clock the default never goes below 5 s (the host's own delays do not shrink with --speed); a bound given
with --stall-timeout is taken as given. run.json `stall` records the bounds used and where they came from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tracebench.replay.clock import run_seconds

STALL_FLOOR_S = 60.0  # trace seconds: the default is never shorter
PREFILL_TOKENS_PER_S = 1000.0  # a pessimistic prefill rate: the longest prompt, twice over, must fit in the bound
DECODE_TOKENS_PER_S = 5.0  # a pessimistic decode rate: the longest non-streamed answer must fit in its total bound
HOST_FLOOR_S = 5.0  # run seconds: the default bound on the run clock at --speed K never goes below this


@dataclass(frozen=True)
class StallBounds:
    """The bounds of one run: trace seconds (as given or derived) and run seconds (what the watchdog uses)."""

    no_progress_s: float
    no_stream_total_s: float
    run_no_progress_s: float
    run_no_stream_total_s: float
    source: str  # "--stall-timeout", or how the default was derived

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "rule": RULE}


# run.json `stall.rule`: what the bounds apply to (the module docstring says why)
RULE = ("no_progress_s: a server stalls when requests wait on it and nothing showed its progress for it (a stream "
        "event, an answer, a new /v1/loads snapshot); a streamed request stalls after its first token, never before "
        "(a busy server's queue); no_stream_total_s: a non-streamed request when nothing is polled (sglang-router) "
        "and no answer came from its server for it")


def stall_bounds(input_len: np.ndarray, output_len: np.ndarray, speed: float | None, given: float | None) -> StallBounds:
    """The stall bounds of a trace (its input and output lengths) at --speed `speed` (None: real time), or the bound
    `given` with --stall-timeout (trace seconds)."""
    k = speed if speed is not None else 1.0
    longest_out = int(output_len.max()) if output_len.size else 0
    decode = longest_out / DECODE_TOKENS_PER_S
    if given is not None:
        run = run_seconds(given, k)
        return StallBounds(given, given + decode, run, run_seconds(given + decode, k), "--stall-timeout")
    longest_in = int(input_len.max()) if input_len.size else 0
    bound = max(STALL_FLOOR_S, 2 * longest_in / PREFILL_TOKENS_PER_S)
    source = (f"default: max({STALL_FLOOR_S:g} s, 2 x the longest prompt ({longest_in} tokens) at "
              f"{PREFILL_TOKENS_PER_S:g} tokens/s); no-stream total adds the longest output ({longest_out} tokens) at "
              f"{DECODE_TOKENS_PER_S:g} tokens/s; at least {HOST_FLOOR_S:g} s of run time")
    return StallBounds(bound, bound + decode, max(HOST_FLOOR_S, run_seconds(bound, k)),
                       max(HOST_FLOOR_S, run_seconds(bound + decode, k)), source)

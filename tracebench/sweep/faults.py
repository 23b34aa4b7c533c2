"""Faults are not capacity (issue 33 A2). A point whose run had a server down, a stalled request or a request that
failed (status `error`: the client's side, a connection reset, an HTTP error) says nothing about the rate: its
latencies and SLO checks measure the fault. Such a point is marked `fault` with its reasons (summary.json `faults`),
never `met`/`missed`, and the sweep stops there, saying why (summary.json `error`, the terminal): a server that is
down would fault every later point too.

A request ended by a stall has status `timeout` (replay/router.py: its server stalled, or nothing more came on its
stream): a fault. A request ended by `--timeout`, the user's own limit per request (its error says "no complete answer
within --timeout"), is a latency the run asked to bound, not a fault: it counts as a miss of every limit, as the SLO
check counts any request that did not finish."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from tracebench.errors import RunFailed

FAULT_STATUSES = ("error", "timeout")
USER_TIMEOUT = "no complete answer within --timeout"  # replay/client.py, run.py: the --timeout reason


class PointFault(RunFailed):
    """A sweep point had a fault (this module): the sweep stops, naming it."""

    def __init__(self, point: str, reasons: list[str]) -> None:
        self.point = point
        self.reasons = reasons
        super().__init__(f"point {point}: a fault, not a capacity answer: {'; '.join(reasons)}; the sweep stops here "
                         "(fix the servers and run it again)")

    def __reduce__(self) -> tuple[object, ...]:  # picklable (a sweep's worker process hands it over)
        return (type(self), (self.point, self.reasons))


def point_faults(run_dir: Path, run_json: dict[str, Any]) -> list[str]:
    """Why the point's run is not a measurement of its rate (empty: it is): its servers that went down, and its
    requests that stalled or failed, counted with the first reason of each."""
    reasons = [f"server {e['server']} down at run second {e['t']:.2f} ({e['detail']})"
               for e in run_json.get("events") or [] if e.get("kind") == "server_down"]
    counts: Counter[str] = Counter()
    first: dict[str, str] = {}
    path = run_dir / "requests.jsonl"
    if path.is_file():
        with path.open("rb") as fh:
            for line in fh:
                rec = orjson.loads(line)
                status = rec.get("status")
                if status == "timeout" and str(rec.get("error")).startswith(USER_TIMEOUT):
                    continue  # the user's own --timeout: a miss, not a fault
                if status in FAULT_STATUSES:
                    counts[status] += 1
                    first.setdefault(status, str(rec.get("error")))
    words = {"timeout": "stalled", "error": "failed (errors of the client's side or the server's)"}
    for status in FAULT_STATUSES:
        if counts[status]:
            reasons.append(f"{counts[status]} request(s) {words[status]}, the first: {first[status]}")
    if run_json.get("status") not in ("completed", "saturated"):
        reasons.append(f"the run {run_json.get('status')}: {run_json.get('error')}")
    return reasons

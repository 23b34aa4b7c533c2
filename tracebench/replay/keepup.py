"""Whether the client kept up with the trace (issue 33 B8). Every record's release lag (t_arrival -> t_released: the
engine woke late) and tracebench's own time before the wire (t_arrival -> t_written less the waits the run asked
for: the client gate's, the wait for a free slot, the wait for a static batch; report/breakdown.py OWN_BEFORE) are
kept as the records are written; at the end, when the p99 of either passes KEEPUP_BOUND_S, the run says so on the
terminal, in run.json `client_keepup.behind` and in the report: "the client could not keep up".

The bound: at 100-400 req/s on 4 H200s tracebench's own time before the wire was 0.51-0.66 ms p50 and its release lag
0.11-0.12 ms p50; at 800 req/s one client process could not keep up (release lag p99 117 ms, own time p99 ~230 ms).
10 ms at the p99 is far above the first and far below the second: past it a request in a hundred went out that much
later than the trace says, and its latencies carry it. The report's Host lag check (report/metrics/lag.py) weighs
the same own time against the latencies themselves."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

KEEPUP_BOUND_S = 0.010  # p99 of the release lag, or of the own time before the wire


class KeepUp:
    """The release lag and the own time before the wire of every record written (seconds of the run clock: host
    time at any --speed)."""

    def __init__(self) -> None:
        self.release: array[float] = array("d")
        self.own: array[float] = array("d")

    def note(self, rec: Any) -> None:
        if rec.t_released is None:
            return  # never released (the run stopped first): no lag to count
        self.release.append(rec.t_released - rec.t_arrival)
        if rec.t_written is not None:
            # what the run asked for is not tracebench's own time; a field a record lacks is a wait it did not have
            gate = rec.t_admitted - rec.t_released if rec.t_admitted is not None else 0.0
            waits = gate + (rec.slot_wait_s if rec.slot_wait_s is not None else 0.0) + (
                rec.batch_wait_s if rec.batch_wait_s is not None else 0.0)
            self.own.append(rec.t_written - rec.t_arrival - waits)

    @staticmethod
    def _stats(values: array[float]) -> dict[str, Any] | None:
        if not len(values):
            return None
        v = np.frombuffer(values, dtype=np.float64)
        p50, p99 = np.percentile(v, [50, 99])
        return {"requests": int(v.size), "p50": float(p50), "p99": float(p99), "max": float(v.max())}

    def behind(self) -> str | None:
        """"the client could not keep up: ..." when a p99 passes the bound, else None."""
        release, own = self._stats(self.release), self._stats(self.own)
        over = [f"{what} p99 {s['p99'] * 1e3:.1f} ms (p50 {s['p50'] * 1e3:.2f} ms)"
                for what, s in (("release lag", release), ("own time before the wire", own))
                if s is not None and s["p99"] > KEEPUP_BOUND_S]
        if not over:
            return None
        return (f"the client could not keep up: {', '.join(over)}, over the bound of {KEEPUP_BOUND_S * 1e3:.0f} ms: "
                "requests went out later than the trace says and their latencies include that; split the load over "
                "several client processes or machines, or run on a quieter host")

    def describe(self) -> dict[str, Any]:
        """run.json `client_keepup`."""
        return {"bound_p99_s": KEEPUP_BOUND_S, "release_lag_s": self._stats(self.release),
                "own_before_wire_s": self._stats(self.own), "behind": self.behind()}

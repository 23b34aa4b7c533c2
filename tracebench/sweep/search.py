"""Capacity search: the highest arrival rate whose points meet every SLO, found by bracketing then bisecting.

A point at rate r is judged by its SLO check (report/headline.py): for each `--slo` key, the P-th percentile of the
requests' values (a request that did not finish counts as infinite) with its 95% bootstrap interval.
- met: every key's interval ends within its limit (upper bound <= limit);
- missed: some key's interval starts above its limit (lower bound > limit), or the point was over-saturated;
- uncertain: otherwise (an interval contains a limit: this trace cannot tell at this rate).
Only "met" counts as meeting the SLO: a rate is reported only when even the interval's upper end meets it.

The search, one per (--gpus, --policy) combination:
1. bracket: start at the start rate; while points are met, double the rate; while they are not, halve it; until one
   met rate (lo) and one not-met rate (hi) are known, at most a factor 2 apart;
2. bisect: evaluate (lo + hi) / 2; met -> it is the new lo, otherwise the new hi;
3. stop when the bracket is narrow, (hi - lo) / lo <= --rate-tolerance; or when two bisection points in a row were
   uncertain (the boundary is within the trace's resolution there: a longer trace narrows the intervals); or after
   --max-points points (then the result says so).
Reported: lo, the highest rate that met every SLO (each percentile's interval upper bound within its limit), and hi,
the lowest rate that did not; the capacity lies between them. No lo: even the lowest rate tried missed; no hi: every
rate tried met (raise --max-points or --start-rate).
"""

from __future__ import annotations

from dataclasses import dataclass, field

RULE = ("Capacity search per (--gpus, --policy): a point meets the SLO when, for every --slo key, the 95% bootstrap "
        "interval of its --slo-percentile (requests that did not finish count as infinite) ends within the limit; "
        "missed when an interval starts above a limit or the point was over-saturated; uncertain otherwise. Bracket: "
        "from the start rate, double while met, halve while not; then bisect (lo + hi) / 2. Stop when (hi - lo) / lo "
        "<= --rate-tolerance, after two uncertain bisection points in a row (the trace's resolution), or at "
        "--max-points. Reported: the highest rate that met (lo) and the lowest that did not (hi).")
MIN_RATE_FRACTION = 1 / 1024  # halving stops below start rate x this: nothing met the SLO


@dataclass
class SearchResult:
    lo: float | None  # highest rate met
    hi: float | None  # lowest rate not met
    reason: str  # why the search stopped
    points: list[tuple[float, str]] = field(default_factory=list)  # (rate, verdict) in the order evaluated

    def to_json(self) -> dict[str, object]:
        return {"max_rate": self.lo, "lowest_rate_not_met": self.hi, "stopped": self.reason,
                "points": [{"rate": rate, "verdict": verdict} for rate, verdict in self.points]}


class RateSearch:
    """The bracket-then-bisect state machine. `next_rate()` says what to evaluate (None: done), `record()` takes
    its verdict ("met", "missed", "uncertain")."""

    def __init__(self, start: float, tolerance: float, max_points: int) -> None:
        if not start > 0 or not tolerance > 0 or max_points < 2:
            raise ValueError("RateSearch: start and tolerance must be > 0, max_points >= 2")
        self.start = start
        self.tolerance = tolerance
        self.max_points = max_points
        self.points: list[tuple[float, str]] = []
        self.lo: float | None = None
        self.hi: float | None = None
        self._uncertain_bisections = 0
        self.reason: str | None = None

    def next_rate(self) -> float | None:
        if self.reason is not None:
            return None
        if not self.points:
            return self.start
        bracketed = self.lo is not None and self.hi is not None
        if bracketed and (self.hi - self.lo) / self.lo <= self.tolerance:  # type: ignore[operator]
            self.reason = f"bracket within --rate-tolerance {self.tolerance:g}"
            return None
        if bracketed and self._uncertain_bisections >= 2:
            self.reason = ("two bisection points in a row were uncertain (an interval contained a limit): the "
                           "trace cannot resolve the boundary more finely")
            return None
        if len(self.points) >= self.max_points:
            self.reason = f"--max-points {self.max_points} reached"
            return None
        if bracketed:
            return (self.lo + self.hi) / 2  # type: ignore[operator]
        last = self.points[-1][0]
        if self.lo is None:  # nothing met yet: go down
            if last / 2 < self.start * MIN_RATE_FRACTION:
                self.reason = f"no rate met the SLO, down to {last:g} req/s"
                return None
            return last / 2
        return self.lo * 2  # everything met so far (or only below the highest met rate): go up

    def record(self, rate: float, verdict: str) -> None:
        if verdict not in ("met", "missed", "uncertain"):
            raise ValueError(f"RateSearch.record: verdict {verdict!r}")
        bisecting = self.lo is not None and self.hi is not None
        self.points.append((rate, verdict))
        if verdict == "met":
            self.lo = rate if self.lo is None else max(self.lo, rate)
        else:
            self.hi = rate if self.hi is None else min(self.hi, rate)
        if self.lo is not None and self.hi is not None and self.hi < self.lo:
            # a higher rate met while a lower one did not (noise, or a non-monotone system): keep the highest met
            # rate and look above it
            self.hi = None
        self._uncertain_bisections = self._uncertain_bisections + 1 if bisecting and verdict == "uncertain" else 0

    def result(self) -> SearchResult:
        reason = self.reason or "stopped before the end (interrupted or failed)"
        return SearchResult(self.lo, self.hi, reason, list(self.points))

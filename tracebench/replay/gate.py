"""`replay --max-concurrency N`: the benchmark client's own limit, as sglang's bench_serving has it (an
asyncio.Semaphore(N) taken before a request is sent and given back when its answer is done:
.DUCUMENT/bench_serving.md, .DUCUMENT/max-running-requests.md).

At most N requests are admitted at once across the run, whatever the policy, mode or router: a request is admitted
when it is released and fewer than N admitted requests are unfinished, else it waits here, in arrival order, until one
finishes. Only admitted requests enter the router queue, so the policy never sees the others (the gate stands before
the router, as bench_serving's semaphore stands before its HTTP call). A request's record is written when it ends,
and that frees its slot. The wait is each record's t_admitted - t_released.

This is not a server's --max-running-requests (sglang's cap on its running batch) nor tracebench's per-server
router cap: those act after the gate, on admitted requests.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

Item = TypeVar("Item")


class ConcurrencyGate(Generic[Item]):
    """At most `limit` items admitted and unfinished; the rest wait in arrival order."""

    __slots__ = ("limit", "admitted", "peak", "_waiting")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"a concurrency limit is >= 1, got {limit}")
        self.limit = limit
        self.admitted = 0  # admitted and not finished
        self.peak = 0  # the most admitted at once (a check: never above limit)
        self._waiting: deque[Item] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def full(self) -> bool:
        return self.admitted >= self.limit

    def offer(self, item: Item) -> bool:
        """A released item: True when it is admitted now (the caller sends it on), False when it waits here."""
        if self._waiting or self.full:  # arrival order: nobody overtakes an item already waiting
            self._waiting.append(item)
            return False
        self._take()
        return True

    def finished(self, admit_next: bool = True) -> Item | None:
        """An admitted item finished: its slot is free. Returns the next waiting item, now admitted (the caller sends
        it on), or None; `admit_next=False` (the run is closing) admits nobody."""
        self.admitted -= 1
        if not admit_next or not self._waiting:
            return None
        self._take()
        return self._waiting.popleft()

    def _take(self) -> None:
        self.admitted += 1
        self.peak = max(self.peak, self.admitted)

"""Per-run work of the report done for all runs at once, one thread per run.

Reading a run and computing its statistics is mostly polars and numpy, which release the GIL: with two runs the
second one's JSON parsing or sorting fills the core the first leaves idle (issue 23: `report` on two 1M-request
runs). Results come back in the order of the items, and an error is raised as a loop would raise it: the first
item's (in order) that failed."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def per_run(work: Callable[[Item], Result], items: Sequence[Item]) -> list[Result]:
    if len(items) < 2:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(len(items), 4), thread_name_prefix="report-run") as pool:
        futures = [pool.submit(work, item) for item in items]
        return [future.result() for future in futures]

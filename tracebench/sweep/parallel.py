"""A virtual-clock sweep's independent parts at once, one worker process each (`--jobs N`).

On the virtual clock a point needs no server of the sweep's (its servers are inside its own replay) and no host
time, so points that do not wait on each other can run side by side: every point of a rate or concurrency sweep,
and each (setup, policy) search of a capacity search (the bisection's next rate waits on the last verdict, so a
search stays in one process). A part runs in a fresh process (multiprocessing's spawn: nothing of this process's
threads or loop is copied) with the sweep as it was set up here, and runs there exactly as it would run here: the
same code (`Sweep.run_point`, `Sweep.search_one`), the same run folders; only their order on the terminal changes.
A worker takes the next part when it is free (it is started once: a new Python process costs ~1 s of imports).
What it does comes back over a pipe: its progress lines, each row as it is added (the summary is rewritten here
after each, in the parts' order, as a one-process sweep would order them), its search, its end or its error.

The first error stops the sweep as it stops a one-process one: the parts under way are stopped the way Ctrl-C stops
a replay (SIGINT: each point's run folder whole, its requests in flight cancelled), none starts after it, and the
error is raised here (a typed error as it is, a bug with the worker's traceback). Ctrl-C reaches the workers too
(they are in the terminal's process group); they stop their points and this process waits for them.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import IO, Any, Callable, Protocol

from tracebench.errors import TracebenchError

FIGURE_MODULE = "tracebench.report.render.load_latency"  # what Sweep._write_figure imports at the end
STOP_WAIT_S = 60.0  # how long a stopped worker may take to close its point (its run folder) before it is killed


@dataclass(frozen=True)
class Part:
    """One independent piece of a sweep: a point (`kind` "rate" or "concurrency", `value`), or a capacity search
    (`kind` "search")."""

    kind: str
    gpus: int
    pd: str | None
    policy: str
    value: float = 0.0

    def label(self) -> str:
        servers = f"PD {self.pd}" if self.pd is not None else f"{self.gpus} server(s)"
        what = "search" if self.kind == "search" else f"{self.kind} {self.value:g}"
        return f"{what}, {servers}, policy {self.policy}"


class Sweep(Protocol):
    """What this module uses of a sweep (sweep/run.py's Sweep, which imports this module, not the other way)."""

    stderr: IO[str]
    rows: list[dict[str, Any]]
    searches: list[dict[str, Any]]
    part_sink: Callable[[dict[str, Any]], None] | None

    def write_summary(self) -> None: ...

    def search_one(self, gpus: int, pd: str | None, policy: str, shared: None) -> dict[str, Any]: ...

    def run_point(self, kind: str, value: float, gpus: int, policy: str, shared: None,
                  pd: str | None = None) -> dict[str, Any]: ...


class PartFailed(RuntimeError):
    """A part's worker raised something that is not one of tracebench's typed errors (a bug): its traceback."""


def run_parts(sweep: Sweep, parts: list[Part], jobs: int) -> None:
    """Run `parts` on at most `jobs` worker processes, each taking the next part when it is free; `sweep.rows` and
    `sweep.searches` end as a one-process sweep's would (in the parts' order). Raises the first part's error after
    every worker has stopped."""
    ctx = multiprocessing.get_context("spawn")
    blob = pickle.dumps(sweep)
    rows: list[list[dict[str, Any]]] = [[] for _ in parts]
    searches: list[dict[str, Any] | None] = [None] * len(parts)
    waiting = list(range(len(parts)))
    workers: dict[Connection, Any] = {}  # connection -> process
    busy: dict[Connection, int] = {}  # connection -> the part it runs
    first_error: BaseException | None = None

    def merge() -> None:
        sweep.rows = [row for part_rows in rows for row in part_rows]
        sweep.searches = [entry for entry in searches if entry is not None]

    def hand_out(conn: Connection) -> None:
        """Give an idle worker the next part, or tell it to go."""
        if waiting and first_error is None:
            busy[conn] = waiting.pop(0)
            conn.send(parts[busy[conn]])
        else:
            conn.send(None)

    def take(conn: Connection) -> None:
        nonlocal first_error
        proc = workers[conn]
        try:
            kind, payload = conn.recv()
        except EOFError:  # the worker is gone
            proc.join()
            del workers[conn]
            conn.close()
            index = busy.pop(conn, None)
            if index is not None and first_error is None:
                first_error = PartFailed(f"the worker of sweep part {parts[index].label()} exited (code "
                                         f"{proc.exitcode}) without finishing it or saying why")
                stop_all()
            return
        if kind == "log":
            sweep.stderr.write(payload)
            sweep.stderr.flush()
            return
        index = busy[conn]
        if kind == "row":
            row, entry = payload
            rows[index].append(row)
            if entry is not None:
                searches[index] = entry
            merge()
            sweep.write_summary()
            return
        if kind not in ("end", "error"):
            raise RuntimeError(f"sweep worker sent {kind!r}")
        err, entry = payload
        del busy[conn]
        if entry is not None:
            searches[index] = entry
        merge()
        if kind == "error" and first_error is None:
            first_error = err
            stop_all()
        hand_out(conn)

    def stop_all() -> None:
        waiting.clear()
        for conn, proc in workers.items():
            if conn in busy and proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)

    # the figure's modules (matplotlib: ~1 s) load here while the workers run, not after them
    threading.Thread(target=importlib.import_module, args=(FIGURE_MODULE,), daemon=True).start()
    try:
        for _ in range(min(jobs, len(parts))):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(there, blob), daemon=True, name="tracebench-sweep-worker")
            proc.start()
            there.close()
            workers[here] = proc
            hand_out(here)
        while workers:
            for conn in wait(list(workers)):
                take(conn)
    except BaseException:
        # Ctrl-C (the workers got it too) or a stop signal here: let every worker close its point, then go
        stop_all()
        _drain(workers, take)
        raise
    if first_error is not None:
        raise first_error


def _drain(workers: dict[Connection, Any], take: Any) -> None:
    """Read what the stopping workers still say until each has gone; kill one that takes longer than STOP_WAIT_S."""
    deadline = time.monotonic() + STOP_WAIT_S
    while workers:
        left = deadline - time.monotonic()
        if left <= 0:
            for conn, proc in list(workers.items()):
                proc.kill()
                proc.join()
                conn.close()
            workers.clear()
            return
        for conn in wait(list(workers), timeout=left):
            take(conn)


class _Lines:
    """The worker's stderr for the sweep's progress lines: each write goes to the parent, which prints it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def write(self, text: str) -> int:
        self.conn.send(("log", text))
        return len(text)

    def flush(self) -> None:
        return None

    def isatty(self) -> bool:
        return False  # several workers share the terminal: whole lines, never a redrawn one


def _worker_main(conn: Connection, blob: bytes) -> None:
    """A worker: run the parts it is given, one at a time, saying each row, then the part's end or its error; go
    when it is given None."""
    sweep: Sweep = pickle.loads(blob)
    sweep.stderr = _Lines(conn)  # type: ignore[assignment]
    sweep.part_sink = lambda row: conn.send(("row", (row, sweep.searches[-1] if sweep.searches else None)))
    while True:
        try:
            part = conn.recv()
        except KeyboardInterrupt:  # Ctrl-C while idle: nothing of ours is under way; the parent stops the sweep
            return
        if part is None:
            return
        sweep.rows, sweep.searches = [], []
        try:
            if part.kind == "search":
                sweep.search_one(part.gpus, part.pd, part.policy, None)
            else:
                sweep.run_point(part.kind, part.value, part.gpus, part.policy, None, part.pd)
        except BaseException as err:  # handed to the parent, which raises it (run_parts)
            conn.send(("error", (_portable(err), sweep.searches[-1] if sweep.searches else None)))
            continue
        conn.send(("end", (None, sweep.searches[-1] if sweep.searches else None)))


def _portable(err: BaseException) -> BaseException:
    """`err` as the parent can raise it: a typed error or an interrupt as it is; anything else (a bug) as PartFailed
    with the worker's traceback."""
    if isinstance(err, (TracebenchError, KeyboardInterrupt)):
        try:
            pickle.loads(pickle.dumps(err))
        except Exception as why:  # a typed error that cannot travel is our bug: say which
            return PartFailed(f"{type(err).__name__} cannot be handed over from a sweep worker ({why}): {err}")
        return err
    return PartFailed("a sweep worker failed:\n" + "".join(traceback.format_exception(err)))

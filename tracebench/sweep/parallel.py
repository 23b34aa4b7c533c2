"""A virtual-clock sweep's independent parts at once, one worker process each (`--jobs N`).

On the virtual clock a point needs no server of the sweep's (its servers are inside its own replay) and no host
time, so points that do not wait on each other can run side by side: every point of a rate or concurrency sweep,
and each (setup, policy) search of a capacity search (the bisection's next rate waits on the last verdict, so a
search stays in one process). A part runs in a fresh process (multiprocessing's spawn: nothing of this process's
threads or loop is copied) with the sweep as it was set up here, and runs there exactly as it would run here: the
same code (`Sweep.run_part`), the same run folders; only their order on the terminal changes.
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

    def run_part(self, part: Part, shared: None) -> None: ...


class PartFailed(RuntimeError):
    """A part's worker raised something that is not one of tracebench's typed errors (a bug): its traceback."""


def run_parts(sweep: Sweep, parts: list[Part], jobs: int) -> None:
    """Run `parts` on at most `jobs` worker processes, each taking the next part when it is free; `sweep.rows` and
    `sweep.searches` end as a one-process sweep's would (in the parts' order). Raises the first part's error after
    every worker has stopped."""
    pool = _PartPool(sweep, parts)
    # the figure's modules (matplotlib: ~1 s) load here while the workers run, not after them
    threading.Thread(target=importlib.import_module, args=(FIGURE_MODULE,), daemon=True).start()
    try:
        pool.start_workers(min(jobs, len(parts)))
        while pool.workers:
            for conn in wait(list(pool.workers)):
                pool.take(conn)
    except BaseException:
        # Ctrl-C (the workers got it too) or a stop signal here: let every worker close its point, then go
        pool.stop_all()
        _drain(pool.workers, pool.take)
        raise
    if pool.first_error is not None:
        raise pool.first_error


class _PartPool:
    """The worker processes of one run_parts and what they have sent back: each part's rows and search, in order."""

    def __init__(self, sweep: Sweep, parts: list[Part]) -> None:
        self.sweep, self.parts = sweep, parts
        self.blob = pickle.dumps(sweep)
        self.rows: list[list[dict[str, Any]]] = [[] for _ in parts]
        self.searches: list[dict[str, Any] | None] = [None] * len(parts)
        self.waiting = list(range(len(parts)))
        self.workers: dict[Connection, Any] = {}  # connection -> process
        self.busy: dict[Connection, int] = {}  # connection -> the part it runs
        self.first_error: BaseException | None = None

    def start_workers(self, count: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        for _ in range(count):
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_worker_main, args=(there, self.blob), daemon=True,
                               name="tracebench-sweep-worker")
            proc.start()
            there.close()
            self.workers[here] = proc
            self.hand_out(here)

    def merge(self) -> None:
        self.sweep.rows = [row for part_rows in self.rows for row in part_rows]
        self.sweep.searches = [entry for entry in self.searches if entry is not None]

    def hand_out(self, conn: Connection) -> None:
        """Give an idle worker the next part, or tell it to go."""
        if self.waiting and self.first_error is None:
            self.busy[conn] = self.waiting.pop(0)
            conn.send(self.parts[self.busy[conn]])
        else:
            conn.send(None)

    def take(self, conn: Connection) -> None:
        """What a worker says: a log line, a point's row, its part's end (or error), or its end (EOF)."""
        try:
            kind, payload = conn.recv()
        except EOFError:  # the worker is gone
            self._gone(conn)
            return
        if kind == "log":
            self.sweep.stderr.write(payload)
            self.sweep.stderr.flush()
            return
        index = self.busy[conn]
        if kind == "row":
            row, entry = payload
            self.rows[index].append(row)
            if entry is not None:
                self.searches[index] = entry
            self.merge()
            self.sweep.write_summary()
            return
        if kind not in ("end", "error"):
            raise RuntimeError(f"sweep worker sent {kind!r}")
        err, entry = payload
        del self.busy[conn]
        if entry is not None:
            self.searches[index] = entry
        self.merge()
        if kind == "error" and self.first_error is None:
            self.first_error = err
            self.stop_all()
        self.hand_out(conn)

    def _gone(self, conn: Connection) -> None:
        """A worker's connection closed: it exited; if it had a part, that part failed (and the sweep stops)."""
        proc = self.workers.pop(conn)
        proc.join()
        conn.close()
        index = self.busy.pop(conn, None)
        if index is not None and self.first_error is None:
            self.first_error = PartFailed(f"the worker of sweep part {self.parts[index].label()} exited (code "
                                          f"{proc.exitcode}) without finishing it or saying why")
            self.stop_all()

    def stop_all(self) -> None:
        self.waiting.clear()
        for conn, proc in self.workers.items():
            if conn in self.busy and proc.is_alive():
                os.kill(proc.pid, signal.SIGINT)


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
            sweep.run_part(part, None)
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

"""Leaving no half-written file behind. While a command writes, SIGINT and SIGTERM become an exception (Interrupted),
so that the `finally` clauses that remove temporary files run (Python's default SIGTERM ends the process at once and
leaves them). SIGKILL cannot be caught: the next run that writes the same name finds the temporary files of processes
that no longer run and removes them, saying so (never reusing them), and leaves those of running processes alone."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterable
from pathlib import Path
from types import FrameType, TracebackType

from tracebench.errors import Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TEMP_TAG = "tmp"  # write_atomic's temporary file: .<name>.tmp-<pid>


def temp_name(path: Path) -> Path:
    """Where write_atomic writes `path` first: `.<name>.tmp-<pid>` beside it (temp_files(folder, f".{name}", TEMP_TAG)
    finds those a killed writer left)."""
    return path.with_name(f".{path.name}.{TEMP_TAG}-{os.getpid()}")


def write_atomic(path: Path, data: bytes | Iterable[bytes]) -> None:
    """Write `data` (bytes, or pieces of bytes written as they come) to `path` whole or not at all: to temp_name(path)
    first, then renamed over `path`, so a reader sees the old file or the whole new one. On any failure (OSError, a
    stop signal, an error raised while the pieces are made) the temporary file is removed and the failure raised as it
    came."""
    temp = temp_name(path)
    try:
        with temp.open("wb") as fh:
            if isinstance(data, bytes):
                fh.write(data)
            else:
                for piece in data:
                    fh.write(piece)
        os.replace(temp, path)
    finally:
        if temp.exists():  # (unlink of a missing file in a read-only folder fails with EROFS, not ENOENT)
            temp.unlink()


class StopSignals:
    """`with StopSignals("generate stopped by {signal}: nothing was written") as stop:` -- inside the block SIGINT and
    SIGTERM raise Interrupted with that message. Once the result is complete and only being put in place, `defer()`:
    a signal from then on is kept, and `check(what)` raises it after the work is done, saying so."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.deferring = False
        self.pending: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.deferring:
            self.pending = signum
            return
        self.deferring = True  # a second Ctrl-C must not cut short the clean-up the first one starts
        raise Interrupted(signum, self.message.format(signal=signal.Signals(signum).name))

    def defer(self) -> None:
        self.deferring = True

    def check(self, finished: str) -> None:
        """Raise the signal that came while deferred: `finished` says what was completed first."""
        if self.pending is not None:
            raise Interrupted(self.pending, f"{signal.Signals(self.pending).name} came while {finished}")


def pid_running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


def temp_files(folder: Path, prefix: str, tag: str) -> list[tuple[Path, int]]:
    """The temporary files `<prefix><anything>.<tag>-<pid>` in `folder`, with their writers' pids."""
    pattern = re.compile(re.escape(prefix) + r".*\." + re.escape(tag) + r"-(\d+)$")
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = pattern.match(path.name)
        if match:
            found.append((path, int(match.group(1))))
    return sorted(found)


def remove_stale(temps: list[tuple[Path, int]]) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Remove the temporary files whose writer no longer runs (killed: nothing else leaves one). Returns (removed,
    kept because their pid runs: a writer at work now, or a pid the system gave again to another process)."""
    removed, kept = [], []
    for path, pid in temps:
        if pid != os.getpid() and pid_running(pid):
            kept.append((path, pid))
        else:
            path.unlink(missing_ok=True)
            removed.append((path, pid))
    return removed, kept

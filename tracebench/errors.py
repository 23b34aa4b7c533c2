"""Typed errors. Library code raises these; only `tracebench.cli` turns them into messages and exit codes."""

from __future__ import annotations


class TracebenchError(Exception):
    """Base of every error tracebench raises on purpose. `exit_code` is what the CLI exits with."""

    exit_code = 1


class InputError(TracebenchError):
    """Bad input from the user: a file, a flag, a value. The CLI exits 2."""

    exit_code = 2


class LocatedInputError(InputError):
    """Bad input at a known place: `file:line: field: why` (line and field may be unknown)."""

    def __init__(self, path: str, line: int | None, field: str | None, why: str) -> None:
        self.path, self.line, self.field, self.why = str(path), line, field, why
        where = self.path if line is None else f"{self.path}:{line}"
        super().__init__(f"{where}: {why}" if field is None else f"{where}: field '{field}': {why}")

    def __reduce__(self) -> tuple[object, ...]:  # picklable (a sweep's worker process hands its error over)
        return (type(self), (self.path, self.line, self.field, self.why))


class TraceError(LocatedInputError):
    """A tracebench trace file is broken."""


class DatasetError(LocatedInputError):
    """A source dataset (Azure CSV, Mooncake JSONL) cannot be imported."""


class RunFolderError(LocatedInputError):
    """A run folder (run.json, requests.jsonl) is not a readable run."""


class ConfigError(InputError):
    """Contradictory or invalid options."""


class PolicyError(TracebenchError):
    """A routing policy could not be loaded, or returned an assignment the router cannot carry out."""


class ServerStartError(TracebenchError):
    """A server tracebench launched did not become healthy. The message carries the end of its log."""


class ServerProtocolError(TracebenchError):
    """A server answered something tracebench does not understand (not a measurement: a broken contract)."""


class RunFailed(TracebenchError):
    """The replay could not go on (for example: every server died)."""


class OutputWriteError(RunFailed):
    """A file of the run folder could not be written (disk full, ...): the run stops there; run.json says how many
    records reached the disk."""

    def __init__(self, message: str, path: object = None, errno: int | None = None) -> None:
        super().__init__(message)
        self.path, self.errno = path, errno

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.path, self.errno))


class CopyNotWritten(TracebenchError):
    """requests.jsonl's columnar copy (tracebench/report/columns.py) could not be written: a full disk, a read-only
    folder. The run is whole without it (the report parses requests.jsonl): the replay command warns and goes on."""


class RunInterrupted(TracebenchError):
    """The replay was stopped by Ctrl-C (SIGINT) or SIGTERM; its run folder is complete (status interrupted)."""

    exit_code = 130  # 128 + SIGINT, what a shell reports for Ctrl-C


class SloMissed(TracebenchError):
    """`tracebench report --fail-on-slo`: a run missed its service-level objectives (a CI gate's verdict, neither a
    failure of tracebench, exit 1, nor bad input, exit 2)."""

    exit_code = 3


class PolicyLoadError(PolicyError, InputError):
    """`--policy` names no loadable policy (missing file or class, not a Policy subclass, ...): bad input, exit 2."""


class Interrupted(TracebenchError):
    """A command (not replay: RunInterrupted) stopped by SIGINT or SIGTERM, after removing what it had half-written.
    The CLI exits 128 + the signal's number, what a shell reports for a process the signal killed (130, 143)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.signum, str(self)))

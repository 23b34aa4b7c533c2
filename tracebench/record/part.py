"""The part file of a recording, `.NAME.part` beside the trace `NAME`: the lock that makes a name one recording's, and
every request as it arrives and as it ends, so that however the recorder stops, no request is lost (docs/record.md).

    line 1      {"tracebench_record_part": 1, "pid", "trace", "upstream", "block_size", "tokenizer", "recorded_at"}
    arrival     {"arrived": id, "t_arrival": perf_counter seconds, "path": "/generate"}
    end         the request as the status file keeps it (proxy.Recorded: id, t_arrival, path, status, ...)

The part file appears already holding its first line and already locked (flock, held as long as the recorder lives):
it is written under a temporary name, locked, then hard-linked to `.NAME.part`, which fails when that name exists.
So a second recorder to the same name is refused at start, a live recorder is told from a killed one by the lock,
and nothing ever writes into another recording's part file. When the recording stops, the trace and the status file
are written under temporary names and hard-linked into place (never over an existing file), then the part file is
removed. A recorder killed with SIGKILL leaves the part file: `tracebench record --recover -o NAME` turns it into
the trace and the status file, the requests that had arrived and not ended recorded as cancelled.
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from tracebench.cleanup import temp_name
from tracebench.errors import ConfigError
from tracebench.trace.format import HEADER_KEY, TRACE_VERSION, format_request_line

PART_KEY = "tracebench_record_part"
PART_VERSION = 1
TEXT_NO_TOKENIZER = "text prompt and no --tokenizer"
# what to pass to --tokenizer, said wherever a recording lost prefix structure for want of one
TOKENIZER_HINT = ("record with --tokenizer wordlevel in front of a tracebench sim-server (its word-level tokenizer), "
                  "or --tokenizer PATH/tokenizer.json of the served model in front of a real one")
KILLED = ("the recorder stopped without finishing (killed?) while the request was in flight; recovered from the part "
          "file")


def part_path(output: Path) -> Path:
    """traces/x.jsonl -> traces/.x.jsonl.part"""
    return output.with_name(f".{output.name}.part")


def status_path(output: Path) -> Path:
    """traces/x.jsonl -> traces/x.status.jsonl"""
    return output.with_name(f"{output.stem}.status.jsonl")


@dataclass(slots=True)
class Recorded:
    """One request as the part file and the status file keep it. `t_arrival`: perf_counter() when its headers
    arrived. `stream` is None for a request recovered from a killed recording's arrival line (its body was unread)."""

    id: int
    t_arrival: float
    path: str
    stream: bool | None
    status: str = "ok"  # ok | error | cancelled
    http_status: int | None = None
    error: str | None = None
    input_len: int | None = None
    output_len: int | None = None
    hashed_tokens: int | None = None  # prompt tokens the proxy saw, when not equal to input_len
    prefix_blocks: tuple[int, ...] | None = None
    not_in_trace: str | None = None  # why an ok request is not a trace line
    no_blocks: str | None = None  # why a request of the trace has no prefix blocks (TEXT_NO_TOKENIZER), else None
    delivered: bool = False  # its end was seen ([DONE], or the whole body): a disconnect from now on is no cancel


class PartFile:
    """The part file a recording holds (created and locked by `claim`); lines are flushed as they are written."""

    def __init__(self, path: Path, fh: IO[bytes], meta: dict[str, Any]) -> None:
        self.path, self._fh, self.meta = path, fh, meta

    def arrived(self, rid: int, t_arrival: float, path: str) -> None:
        # before the request is forwarded: a recorder killed while it is in flight still knows it came
        self._fh.write(b'{"arrived":%d,"t_arrival":%r,"path":"%s"}\n' % (rid, t_arrival, path.encode()))
        self._fh.flush()

    def ended(self, rec: Recorded) -> None:
        self._fh.write(orjson.dumps(rec) + b"\n")
        self._fh.flush()

    def release(self, remove: bool) -> None:
        """Close (which drops the lock); `remove`: the part file goes too (its requests are in the trace now, or the
        recording never started)."""
        if self._fh.closed:  # released already (a recording whose trace could not be written keeps its part file)
            return
        if remove:
            self.path.unlink()
        self._fh.close()


def claim(output: Path, meta: dict[str, Any]) -> PartFile:
    """Make `output` this recording's: create its part file, locked, holding `meta`. Refuses (ConfigError, nothing
    changed) when the trace or its status file exists, when another recorder holds the name, when a killed
    recording left its part file there, or when the folder cannot be written."""
    for path in (output, status_path(output)):
        if path.exists():
            raise ConfigError(f"-o {output}: {path} exists already (a recording never overwrites a file: pick another "
                              f"name)")
    part = part_path(output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        temp = part.with_name(f"{part.name}-{os.getpid()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as err:
        raise ConfigError(f"-o {output}: cannot write in {output.parent} ({err.strerror})") from None
    fh = os.fdopen(fd, "wb")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocking: another recorder's probe (below) holds a lock for an instant
        fh.write(orjson.dumps({PART_KEY: PART_VERSION, "pid": os.getpid(), **meta}) + b"\n")
        fh.flush()
        try:
            os.link(temp, part)  # the name appears locked and complete, or not at all
        except FileExistsError:
            raise ConfigError(describe_existing(part, output)) from None
        except OSError as err:
            raise ConfigError(f"-o {output}: cannot create {part} ({err.strerror})") from None
    except BaseException:
        fh.close()
        raise
    finally:
        temp.unlink()
    # the trace appeared between the check above and the lock: the other recording finished just now
    for path in (output, status_path(output)):
        if path.exists():
            PartFile(part, fh, meta).release(remove=True)
            raise ConfigError(f"-o {output}: {path} exists already (a recording never overwrites a file: pick "
                              f"another name)")
    return PartFile(part, fh, meta)


def describe_existing(part: Path, output: Path) -> str:
    """Why `part` is in the way: a live recorder's (locked), or a stopped one's (not locked), and what to do."""
    try:
        with part.open("rb") as fh:
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                meta = _first_line(fh)
                return (f"-o {output}: another tracebench record (pid {meta.get('pid', '?')}) is recording to this "
                        f"name (its part file {part} is locked); two recordings never share a file: give another -o")
            meta = _first_line(fh)
            lines = sum(1 for _ in fh)
    except FileNotFoundError:  # the other recording finished between our attempt and this look
        return f"-o {output}: another tracebench record was finishing a recording to this name: try again"
    started = f", started {meta['recorded_at']}" if "recorded_at" in meta else ""
    return (f"-o {output}: {part} exists: a recording to this name (pid {meta.get('pid', '?')}{started}) stopped "
            f"without finishing (killed?) and left {lines} line(s) of requests there; nothing was changed. Turn it "
            f"into the trace and status file: tracebench record --recover -o {output} (or move it away to record "
            f"under this name again)")


def _first_line(fh: IO[bytes]) -> dict[str, Any]:
    try:
        meta = orjson.loads(fh.readline())
    except orjson.JSONDecodeError:
        return {}
    return meta if isinstance(meta, dict) else {}


def read_part(part: Path) -> tuple[dict[str, Any], list[Recorded], int]:
    """(first line, every request in id order, requests recovered as cancelled). A request that arrived and never
    ended (the recorder was killed) is cancelled with error KILLED. Only the last line may be cut short (a kill during
    its write): it is left out, its request recovered from its arrival line."""
    raw = part.read_bytes().split(b"\n")
    complete = raw[-1] == b""
    lines = raw[:-1] if complete else raw
    try:
        meta = orjson.loads(lines[0]) if lines else None
    except orjson.JSONDecodeError:
        meta = None
    if not isinstance(meta, dict) or meta.get(PART_KEY) != PART_VERSION:
        raise ConfigError(f"{part}: not a tracebench record part file (version {PART_VERSION}): its first line is "
                          f"{(lines[0] if lines else b'')[:120]!r}")
    arrived: dict[int, Recorded] = {}
    ended: dict[int, Recorded] = {}
    for number, line in enumerate(lines[1:], start=2):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if number == len(lines) and not complete:
                continue  # cut short by the kill: its request is recovered from its arrival line
            raise ConfigError(f"{part}:{number}: not JSON: {line[:120]!r}") from None
        if "arrived" in obj:
            arrived[obj["arrived"]] = Recorded(obj["arrived"], obj["t_arrival"], obj["path"], None,
                                               status="cancelled", error=KILLED)
        else:
            if obj.get("prefix_blocks") is not None:
                obj["prefix_blocks"] = tuple(obj["prefix_blocks"])
            ended[obj["id"]] = Recorded(**obj)
    lost = [rid for rid in arrived if rid not in ended]
    recs = sorted([*ended.values(), *(arrived[rid] for rid in lost)], key=lambda r: r.id)
    return meta, recs, len(lost)


def write_outputs(output: Path, meta: dict[str, Any], recs: list[Recorded],
                  extra: dict[str, Any] | None = None) -> tuple[int, dict[str, int], int]:
    """Write the trace (ok requests in arrival order, trace format v1) and the status file (every request), each
    under a temporary name then hard-linked into place: never over an existing file, never half-written. Returns
    (trace lines, counts by status, trace lines without prefix blocks for a text prompt and no --tokenizer). Raises ConfigError (nothing left at either name) when either cannot be written."""
    counts = {"ok": 0, "error": 0, "cancelled": 0}
    for rec in recs:
        counts[rec.status] += 1
    text_without_blocks = sum(1 for rec in recs if rec.status == "ok" and rec.not_in_trace is None
                              and rec.no_blocks == TEXT_NO_TOKENIZER)
    t0 = recs[0].t_arrival if recs else 0.0
    lines: list[bytes] = []
    last_arrival = 0.0
    for rec in recs:
        if rec.status != "ok" or rec.not_in_trace is not None:
            continue
        last_arrival = float("%.6f" % (rec.t_arrival - t0))
        blocks = None if rec.prefix_blocks is None else {"prefix_blocks": list(rec.prefix_blocks)}
        lines.append(format_request_line(rec.id, last_arrival, rec.input_len, rec.output_len, blocks))  # type: ignore[arg-type]
    header = {
        HEADER_KEY: TRACE_VERSION,
        "num_requests": len(lines),
        "duration_s": last_arrival,
        "block_size": meta["block_size"],
        "source": "tracebench record",
        "recorded_at": meta["recorded_at"],
        "upstream": meta["upstream"],
        "prefix_blocks": "salted chained BLAKE2b of each block's token ids (docs/record.md); the salt is not kept",
        "tokenizer": meta["tokenizer"],
        "counts": counts,
        # requests of the trace that lost their prefix structure: text prompts recorded without --tokenizer
        "text_prompts_without_blocks": text_without_blocks,
        "status_file": status_path(output).name,
        **(extra or {}),
    }
    status_lines = []
    for rec in recs:
        row = {"id": rec.id, "arrival_s": round(rec.t_arrival - t0, 6), "path": rec.path, "stream": rec.stream,
               "status": rec.status, "http_status": rec.http_status, "error": rec.error,
               "input_len": rec.input_len, "output_len": rec.output_len,
               "in_trace": rec.status == "ok" and rec.not_in_trace is None}
        if rec.not_in_trace is not None:
            row["not_in_trace"] = rec.not_in_trace
        if rec.hashed_tokens is not None:
            row["hashed_tokens"] = rec.hashed_tokens
        if rec.no_blocks is not None:
            row["no_blocks"] = rec.no_blocks
        status_lines.append(orjson.dumps(row) + b"\n")
    _write_new({output: [orjson.dumps(header) + b"\n", *lines], status_path(output): status_lines})
    return len(lines), counts, text_without_blocks


def _write_new(files: dict[Path, list[bytes]]) -> None:
    """Every file complete under a temporary name, then linked to its name (FileExistsError: never overwritten);
    on any failure no name is left behind."""
    temps: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    current: Path | None = None
    try:
        for path, chunks in files.items():
            current = path
            temp = temp_name(path)
            temps.append((temp, path))
            with temp.open("wb") as fh:
                fh.writelines(chunks)
        for temp, path in temps:
            current = path
            os.link(temp, path)
            placed.append(path)
    except OSError as err:
        for path in placed:
            path.unlink()
        why = "exists already (a recording never overwrites a file)" if isinstance(err, FileExistsError) else \
            f"cannot be written ({err.strerror})"
        raise ConfigError(f"{current}: {why}") from None
    finally:
        for temp, _ in temps:
            if temp.exists():  # (unlink of a missing file in a read-only folder fails with EROFS, not ENOENT)
                temp.unlink()


def recover(output: Path) -> tuple[int, dict[str, int], int, int]:
    """`tracebench record --recover -o NAME`: the trace and status file from a stopped recording's part file, which is
    then removed. Returns (trace lines, counts by status, requests recovered as cancelled, trace lines of text prompts
    without prefix blocks)."""
    part = part_path(output)
    try:
        fh = part.open("rb")
    except FileNotFoundError:
        raise ConfigError(f"--recover -o {output}: there is no part file {part} (nothing to recover)") from None
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"--recover -o {output}: {part} is locked: its recording is still running (stop it with "
                              f"Ctrl-C: it writes the trace itself)") from None
        meta, recs, lost = read_part(part)
        extra = {"recovered": f"from {part.name}, left by the recording of pid {meta['pid']}: {lost} request(s) that "
                              f"had not ended are recorded as cancelled"}
        count, counts, text_without_blocks = write_outputs(output, meta, recs, extra)
        part.unlink()
    return count, counts, lost, text_without_blocks

"""What a run writes per request (`requests.jsonl`), and how the run folder's growing files reach the disk.
Field meanings: docs/run-format.md."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from tracebench.errors import OutputWriteError
from tracebench.replay.keepup import KeepUp

Status = Literal["ok", "mismatch", "error", "timeout", "cancelled", "not_sent"]
STATUSES: tuple[str, ...] = ("ok", "mismatch", "error", "timeout", "cancelled", "not_sent")
# answers that finished: `ok` (what the trace asked for) and `mismatch` (finished, but the server generated or
# counted something else: the record's `mismatch` says what); the report's latencies are over these
COMPLETED: tuple[str, ...] = ("ok", "mismatch")


@dataclass(slots=True)
class RequestRecord:
    # identity and shape (from the trace)
    id: int
    input_len: int
    output_len: int
    # seconds since run start, one monotonic clock (RunClock). None = that moment never came.
    t_arrival: float  # scheduled arrival (trace arrival_s)
    t_released: float | None = None  # the engine actually released it into the router queue
    t_dispatch: float | None = None  # sent to a server
    t_first_token: float | None = None  # first output token received
    t_finish: float | None = None  # last byte of the answer received (or the failure seen)
    server: int | None = None  # index into run.json "servers"; None if never dispatched
    batch: int | None = None  # static mode: the server's batch sequence number
    status: Status = "ok"
    error: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None  # as sglang counted them
    cached_tokens: int | None = None  # prompt tokens sglang served from its radix (prefix) cache
    # sglang's meta_info, converted to the run clock (server_* stamps) or as reported (latencies, seconds)
    server_e2e_latency: float | None = None
    server_queue_time: float | None = None
    server_received: float | None = None
    server_forward_entry: float | None = None
    server_prefill_finished: float | None = None
    server_finished: float | None = None
    # inter-token latency: the gaps between the stream's chunks after the first token (tracebench/itl.py); null when
    # the answer came in one chunk or was not streamed
    itl_max: float | None = None  # the largest gap, seconds
    itl_hist: str | None = None  # "bucket:count,..." the gaps' 2% log buckets, ascending
    # status `mismatch`: what the server generated or counted that differs from the trace, and why where known
    # (replay/answer_check.py); null otherwise
    mismatch: str | None = None
    # entered the router queue (admitted by --max-concurrency's client gate, replay/gate.py; without the gate the
    # moment it was released). Client wait = t_admitted - t_released; router wait = t_dispatch - t_admitted
    t_admitted: float | None = None
    # seconds the replay loop spent inside the policy (assign, on_complete) between this request's release and its
    # end: its latencies can be too long by up to this much (null: never released)
    policy_s: float | None = None
    # a tracebench simulator's lag: how late it handed out this request's first token and its end against its
    # model's schedule (the larger), wall seconds (meta_info tracebench_sim_lag); null for real sglang
    sim_lag: float | None = None
    # where the request's time went, step by step (docs/overhead.md; the report's breakdown): run-clock stamps taken
    # as the request passes each step (null: it never got there, or the API/mode has no such step)
    t_assigned: float | None = None  # the policy's assign() returned this request's server
    t_built: float | None = None  # its request body was ready (t_dispatch follows: the HTTP request is started)
    t_written: float | None = None  # its request was written: the socket took the body's last byte (client.py)
    t_headers: float | None = None  # the response's status line and headers arrived
    t_last_chunk: float | None = None  # the answer's last data arrived (a stream's last event before [DONE])
    t_parsed: float | None = None  # the answer was read and checked: the record is complete
    # two more of sglang's meta_info stamps, on the run clock: api_server_dispatch_finish_ts (its HTTP server handed
    # the request to the scheduler) and response_sent_to_client_ts (a stream's first chunk, or the whole answer, left
    # sglang); null when the server sends none (OpenAI APIs, sglang without --enable-metrics)
    server_dispatched: float | None = None
    server_first_sent: float | None = None
    # seconds of its router wait (t_admitted -> t_assigned) that the cap chose, not tracebench: from its admission
    # until the last moment a slot freed after a spell with none free (every server at its router cap, static mode:
    # running its batch, or out of routing) before it was assigned; the rest of that span is tracebench's (the
    # loop's wake-up, the policy's calls; docs/overhead.md). 0.0 in a run without a cap whose servers stayed
    # routable; null: never assigned
    slot_wait_s: float | None = None
    # static mode: seconds from its assignment (t_assigned) until its batch was sent (full, timed out, or the last),
    # the wait for the batch that the run's --mode static chose, not tracebench's time (the rest of t_assigned ->
    # t_built is: its body, after those sent before it in the batch; docs/overhead.md). 0.0 in continuous mode (a
    # request goes out when it is assigned: there is no batch to wait for); null: never sent (never assigned, or its
    # batch never went)
    batch_wait_s: float | None = None


@dataclass(slots=True)
class PdRecord(RequestRecord):
    """A dispatched request of a PD run (--pd, --attach-prefill/--attach-decode): `server` and the server_* stamps
    are the decode server's (its stream is the answer); these fields, written after the others, are the prefill
    server's side. A plain run writes RequestRecord, without them (the report reads them as null)."""

    prefill_server: int | None = None  # index into run.json "servers"
    bootstrap_room: int | None = None  # the room both servers were sent
    t_prefill_answer: float | None = None  # the prefill server's answer complete (run clock)
    prefill_received: float | None = None  # its meta_info stamps on the run clock: request_received_ts,
    prefill_forward_entry: float | None = None  # forward_entry_time,
    prefill_done: float | None = None  # prefill_finished_time,
    prefill_finished: float | None = None  # request_finished_ts (its answer: after the KV reached the decode server)
    prefill_queue_time: float | None = None  # its queue_time (the waiting queue, after the bootstrap), seconds
    prefill_e2e_latency: float | None = None  # its e2e_latency, seconds

    @classmethod
    def of(cls, rec: RequestRecord) -> PdRecord:
        return cls(**{name: getattr(rec, name) for name in RequestRecord.__dataclass_fields__})


OnFailure = Callable[[BaseException], None]


class AppendFile:
    """A file of the run folder that grows as the run goes (requests.jsonl, telemetry.jsonl), written in whole lines.

    Lines are buffered and written with os.write; a write that fails (disk full, quota, I/O error) is cut back to the
    last whole line that reached the file (every whole line that fitted is kept), so the file never ends in half a
    line. From then on nothing more is written: `failure` says
    why, `lines_on_disk` how many lines reached the file, and `on_failure` (once) tells the run to stop. Nothing is
    lost silently: the caller counts what it gave, this counts what reached the disk."""

    def __init__(self, path: Path, on_failure: OnFailure | None = None, flush_lines: int = 256) -> None:
        self.path = path
        self.on_failure = on_failure
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size  # bytes of whole lines on disk
        self._buf = bytearray()
        self._buf_lines = 0
        self._flush_lines = flush_lines
        self.lines_on_disk = 0
        self.failure: OutputWriteError | None = None

    def write(self, line: bytes) -> None:
        """One line (ending in a newline)."""
        if self.failure is not None:
            return
        self._buf += line
        self._buf_lines += 1
        if self._buf_lines >= self._flush_lines:
            self.flush()

    def flush(self) -> None:
        if self.failure is not None or not self._buf:
            return
        view = memoryview(self._buf)
        done = 0
        try:
            while done < len(view):
                done += os.write(self._fd, view[done:])
        except OSError as err:
            view.release()
            self._failed(err, done)
            return
        view.release()
        self._size += done
        self.lines_on_disk += self._buf_lines
        self._buf.clear()
        self._buf_lines = 0

    def _failed(self, err: OSError, done: int) -> None:
        # `done` bytes of the buffer reached the file before the write failed: keep its whole lines, cut the rest
        # (truncating frees space: it works on a full disk)
        whole = self._buf.rfind(b"\n", 0, done) + 1
        self._size += whole
        self.lines_on_disk += self._buf.count(b"\n", 0, whole)
        os.ftruncate(self._fd, self._size)
        what = "disk full (no space left on the device)" if err.errno in (errno.ENOSPC, errno.EDQUOT) else (
            f"cannot write ({err.strerror})")
        self.failure = OutputWriteError(f"{what}: writing {self.path} failed after {self.lines_on_disk} line(s)",
                                        path=self.path, errno=err.errno)
        self._buf.clear()
        if self.on_failure is not None:
            self.on_failure(self.failure)

    def close(self) -> None:
        self.flush()
        os.close(self._fd)

    def __enter__(self) -> AppendFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordWriter:
    """Appends records to requests.jsonl as requests finish (AppendFile: whole lines; a write failure stops the run
    through `on_failure`). `count`: records given; `written`: records that reached the file."""

    def __init__(self, path: Path, flush_every: int = 256, on_failure: OnFailure | None = None) -> None:
        self.path = path
        self._out = AppendFile(path, on_failure, flush_every)
        self.count = 0
        self.keepup = KeepUp()  # whether the client kept up with the trace (keepup.py)

    @property
    def on_failure(self) -> OnFailure | None:
        return self._out.on_failure

    @on_failure.setter
    def on_failure(self, callback: OnFailure | None) -> None:
        self._out.on_failure = callback

    @property
    def written(self) -> int:
        return self._out.lines_on_disk

    @property
    def failure(self) -> OutputWriteError | None:
        return self._out.failure

    def write(self, record: RequestRecord) -> None:
        # orjson serialises the dataclass itself, fields in declaration order (10x faster than asdict + dumps), and
        # ends the line itself (no second copy to add the newline)
        self._out.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
        self.count += 1
        self.keepup.note(record)

    def flush(self) -> None:
        self._out.flush()

    def close(self) -> None:
        self._out.close()

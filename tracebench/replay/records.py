"""What a run writes per request (`requests.jsonl`). Field meanings: docs/run-format.md."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

import orjson

Status = Literal["ok", "mismatch", "error", "timeout", "cancelled"]
STATUSES: tuple[str, ...] = ("ok", "mismatch", "error", "timeout", "cancelled")
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


class RecordWriter:
    """Appends records to requests.jsonl as requests finish. Flushes every `flush_every` records and on close."""

    def __init__(self, path: Path, flush_every: int = 256) -> None:
        self.path = path
        self._fh: IO[bytes] = path.open("ab")
        self._flush_every = flush_every
        self._pending = 0
        self.count = 0

    def write(self, record: RequestRecord) -> None:
        # orjson serialises the dataclass itself, fields in declaration order (10x faster than asdict + dumps)
        self._fh.write(orjson.dumps(record) + b"\n")
        self.count += 1
        self._pending += 1
        if self._pending >= self._flush_every:
            self.flush()

    def flush(self) -> None:
        self._fh.flush()
        self._pending = 0

    def close(self) -> None:
        self._fh.flush()
        self._fh.close()

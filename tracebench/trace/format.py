"""Trace format v1: JSONL, a header object on line 1, then one request per line (docs/trace-format.md).

Readers stream and validate as they go (constant memory); every problem is a TraceError naming file, line and field.
Writers write to a temporary file and rename it into place, so a failed write leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import math
import os
from io import BytesIO
from collections.abc import Iterator
from itertools import chain
from operator import itemgetter
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import orjson

from tracebench.cleanup import write_atomic
from tracebench.errors import TraceError

TRACE_VERSION = 1
HEADER_KEY = "tracebench_trace"
REQUIRED_FIELDS = ("id", "arrival_s", "input_len", "output_len")
# Optional fields the reader validates and turns into TraceRequest attributes (anything else goes to `extra`).
PREFIX_FIELD = "prefix_blocks"  # block ids of the prompt, block_size tokens each (header: block_size)
AFTER_FIELD = "after"  # closed loop: released delay_s after the request with this id finished
DELAY_FIELD = "delay_s"
KNOWN_FIELDS = frozenset((*REQUIRED_FIELDS, PREFIX_FIELD, AFTER_FIELD, DELAY_FIELD))


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace. `arrival_s` is seconds from trace start.

    `prefix_blocks`: the prompt as block ids, `block_size` tokens each (the header's), the last block possibly
    partial; equal ids mean equal content, so requests whose leading ids agree share that prompt prefix.
    `after` / `delay_s` (closed loop): the request is sent `delay_s` after request `after` finished; `arrival_s` is
    then only the generator's open-loop estimate (docs/trace-format.md). `extra` holds other optional fields."""

    id: int
    arrival_s: float
    input_len: int
    output_len: int
    extra: dict[str, Any] | None = None
    prefix_blocks: tuple[int, ...] | None = None
    after: int | None = None
    delay_s: float | None = None


# TraceTable.request makes one TraceRequest per request of a run: it fills the slots through their descriptors, the
# same object as TraceRequest(...) without the frozen dataclass's __init__ (keywords, then object.__setattr__ per
# field): 0.9 µs a request instead of 1.7. The field order is checked here, so that a new field cannot go unset.
_REQUEST_FIELDS = ("id", "arrival_s", "input_len", "output_len", "extra", "prefix_blocks", "after", "delay_s")
if tuple(f.name for f in fields(TraceRequest)) != _REQUEST_FIELDS:
    raise AssertionError("TraceRequest's fields changed: update _REQUEST_FIELDS (trace/format.py)")
_SET_REQUEST = tuple(TraceRequest.__dict__[name].__set__ for name in _REQUEST_FIELDS)


@dataclass(frozen=True)
class TraceHeader:
    """Line 1 of a trace. `fields` is the whole header object as written (generator arguments, source, ...).
    `block_size`: tokens per prefix block (required when any request has `prefix_blocks`)."""

    version: int
    num_requests: int
    duration_s: float
    fields: dict[str, Any] = field(repr=False)
    block_size: int | None = None


# Ids and lengths are stored as 64-bit integers by the columnar reader (and by every consumer that uses numpy).
MAX_INT = 2**63 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def _parse_line(path: Path, lineno: int, raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise TraceError(path, lineno, None, "empty line")
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise TraceError(path, lineno, None, f"not JSON ({err})") from None
    if not isinstance(obj, dict):
        raise TraceError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
    return obj


_GZIP_MAGIC = b"\x1f\x8b"


def _parse_header(path: Path, raw: bytes | None) -> TraceHeader:
    if raw is None:
        raise TraceError(path, 1, HEADER_KEY, "empty file: missing the trace header")
    if raw.startswith(_GZIP_MAGIC):
        raise TraceError(path, None, None, "a gzip-compressed file, not a trace: decompress it first (gunzip)")
    obj = _parse_line(path, 1, raw)
    if HEADER_KEY not in obj:
        raise TraceError(path, 1, HEADER_KEY, "missing: line 1 must be the trace header (is this a tracebench trace?)")
    version = obj[HEADER_KEY]
    if version != TRACE_VERSION or not _is_int(version):
        raise TraceError(path, 1, HEADER_KEY, f"unknown trace format version {version!r} (this tracebench reads {TRACE_VERSION})")
    num = obj.get("num_requests")
    if not _is_int(num) or num < 0:
        raise TraceError(path, 1, "num_requests", f"must be an integer >= 0, got {num!r}")
    duration = obj.get("duration_s")
    if not _is_number(duration) or duration < 0:
        raise TraceError(path, 1, "duration_s", f"must be a number >= 0, got {duration!r}")
    block_size = obj.get("block_size")
    if block_size is not None and (not _is_int(block_size) or not 1 <= block_size <= MAX_INT):
        raise TraceError(path, 1, "block_size", f"must be an integer >= 1 (tokens per prefix block), got {block_size!r}")
    return TraceHeader(version=version, num_requests=num, duration_s=float(duration), fields=obj, block_size=block_size)


class _Context:
    """What validating a request needs from the lines before it: the header's block size and the ids seen (for a
    closed-loop `after`, which must name an earlier request). The columnar reader parks its batches' ids in
    `pending` and they join `ids` only when a line must be checked exactly (most traces have no closed loop)."""

    __slots__ = ("block_size", "_ids", "pending")

    def __init__(self, block_size: int | None) -> None:
        self.block_size = block_size
        self._ids: set[int] = set()
        self.pending: list[Any] = []

    @property
    def ids(self) -> set[int]:
        if self.pending:
            for ids in self.pending:
                self._ids.update(ids.tolist())
            self.pending.clear()
        return self._ids


def _parse_request(path: Path, lineno: int, obj: dict[str, Any], prev_id: int | None, prev_arrival: float,
                   ctx: _Context) -> TraceRequest:
    for name in REQUIRED_FIELDS:
        if name not in obj:
            raise TraceError(path, lineno, name, "missing")
    rid, arrival, ilen, olen = obj["id"], obj["arrival_s"], obj["input_len"], obj["output_len"]
    if not _is_int(rid):
        raise TraceError(path, lineno, "id", f"must be an integer, got {rid!r}")
    if abs(rid) > MAX_INT:
        raise TraceError(path, lineno, "id", f"too large ({rid}); at most {MAX_INT}")
    if prev_id is not None and rid <= prev_id:
        raise TraceError(path, lineno, "id", f"must increase from line to line ({rid} after {prev_id})")
    if not _is_number(arrival) or arrival < 0:
        raise TraceError(path, lineno, "arrival_s", f"must be a finite number >= 0, got {arrival!r}")
    if arrival < prev_arrival:
        raise TraceError(path, lineno, "arrival_s", f"goes backwards ({arrival} after {prev_arrival})")
    if not _is_int(ilen) or ilen < 1:
        raise TraceError(path, lineno, "input_len", f"must be an integer >= 1, got {ilen!r}")
    if ilen > MAX_INT:
        raise TraceError(path, lineno, "input_len", f"too large ({ilen}); at most {MAX_INT}")
    if not _is_int(olen) or olen < 1:
        raise TraceError(path, lineno, "output_len", f"must be an integer >= 1, got {olen!r}")
    if olen > MAX_INT:
        raise TraceError(path, lineno, "output_len", f"too large ({olen}); at most {MAX_INT}")
    if len(obj) == 4:
        ctx.ids.add(rid)
        return TraceRequest(id=rid, arrival_s=float(arrival), input_len=ilen, output_len=olen)
    blocks = _parse_blocks(path, lineno, obj.get(PREFIX_FIELD), ilen, ctx.block_size) if PREFIX_FIELD in obj else None
    after = delay = None
    if AFTER_FIELD in obj or DELAY_FIELD in obj:
        after, delay = obj.get(AFTER_FIELD), obj.get(DELAY_FIELD)
        if AFTER_FIELD not in obj:
            raise TraceError(path, lineno, AFTER_FIELD, f"missing: '{DELAY_FIELD}' is only for a closed-loop request (after = an earlier id)")
        if not _is_int(after):
            raise TraceError(path, lineno, AFTER_FIELD, f"must be the integer id of an earlier request, got {after!r}")
        if after not in ctx.ids:
            raise TraceError(path, lineno, AFTER_FIELD, f"names request {after}, which is not an earlier line of this trace")
        if DELAY_FIELD not in obj:
            raise TraceError(path, lineno, DELAY_FIELD, f"missing: a closed-loop request (after {after}) needs the delay after it finished")
        if not _is_number(delay) or delay < 0:
            raise TraceError(path, lineno, DELAY_FIELD, f"must be a finite number >= 0 (seconds), got {delay!r}")
        delay = float(delay)
    extra = {k: v for k, v in obj.items() if k not in KNOWN_FIELDS} or None
    ctx.ids.add(rid)
    return TraceRequest(id=rid, arrival_s=float(arrival), input_len=ilen, output_len=olen, extra=extra,
                        prefix_blocks=blocks, after=after, delay_s=delay)


def _parse_blocks(path: Path, lineno: int, blocks: Any, input_len: int, block_size: int | None) -> tuple[int, ...]:
    if block_size is None:
        raise TraceError(path, lineno, PREFIX_FIELD, "the trace header (line 1) has no block_size: the tokens per block are unknown")
    if not isinstance(blocks, list) or not all(_is_int(b) and abs(b) <= MAX_INT for b in blocks):
        raise TraceError(path, lineno, PREFIX_FIELD, f"must be a list of integers (64-bit), got {str(blocks)[:80]}")
    want = -(-input_len // block_size)
    if len(blocks) != want:
        raise TraceError(path, lineno, PREFIX_FIELD, f"has {len(blocks)} block(s); input_len {input_len} with block_size "
                         f"{block_size} needs ceil({input_len}/{block_size}) = {want}")
    return tuple(blocks)


def read_header(path: str | os.PathLike[str]) -> TraceHeader:
    """Read and validate line 1 only."""
    path = Path(path)
    with _open(path) as fh:
        return _parse_header(path, fh.readline() or None)


def iter_requests(path: str | os.PathLike[str]) -> Iterator[TraceRequest]:
    """Yield every request, validating as it streams. Raises TraceError at the first problem, including a request
    count that differs from the header's `num_requests` (checked when the file ends)."""
    path = Path(path)
    with _open(path) as fh:
        header = _parse_header(path, fh.readline() or None)
        ctx = _Context(header.block_size)
        prev_id: int | None = None
        prev_arrival = 0.0
        count = 0
        for lineno, raw in enumerate(fh, start=2):
            req = _parse_request(path, lineno, _parse_line(path, lineno, raw), prev_id, prev_arrival, ctx)
            prev_id, prev_arrival = req.id, req.arrival_s
            count += 1
            yield req
    if count != header.num_requests:
        raise TraceError(path, 1, "num_requests", f"header says {header.num_requests} requests, the file has {count}")


@dataclass(frozen=True)
class TraceColumns:
    """The four required fields of every request as numpy arrays, and (read_columns(with_blocks=True)) the prefix
    blocks: `block_counts[i]` ids of request i (0 = no prefix_blocks), all of them concatenated in `blocks`; with
    `with_loop=True` the closed-loop fields: `delay_s[i]` NaN for a request on the absolute schedule, else its
    delay after request `after[i]`. Other optional fields are not kept."""

    id: Any  # np.ndarray[int64]
    arrival_s: Any  # np.ndarray[float64]
    input_len: Any  # np.ndarray[int64]
    output_len: Any  # np.ndarray[int64]
    block_counts: Any = None  # np.ndarray[int64] | None
    blocks: Any = None  # np.ndarray[int64] | None (int32 with compact_blocks, where every id fits)
    after: Any = None  # np.ndarray[int64] | None (meaningless where delay_s is NaN)
    delay_s: Any = None  # np.ndarray[float64] | None


class TraceTable:
    """A whole trace held compactly for the replay: numpy columns (8 bytes a field, 8 per prefix block id) instead of
    one TraceRequest per request (~11x the file for requests with many prefix blocks). `request(i)` builds the i-th
    request (in file order) when it is needed. Optional fields other than prefix_blocks/after/delay_s are dropped
    (the replay does not use them)."""

    __slots__ = ("id", "arrival_s", "input_len", "output_len", "block_start", "blocks", "after", "delay_s", "open_loop")

    def __init__(self, columns: TraceColumns) -> None:
        import numpy as np

        self.id, self.arrival_s = columns.id, columns.arrival_s
        self.input_len, self.output_len = columns.input_len, columns.output_len
        counts = columns.block_counts
        has_blocks = counts is not None and bool(counts.any())
        # request i's blocks are blocks[block_start[i]:block_start[i + 1]] (none when equal)
        self.block_start = np.concatenate(([0], np.cumsum(counts))) if has_blocks else None
        self.blocks = columns.blocks if has_blocks else None
        self.after, self.delay_s = columns.after, columns.delay_s
        self.open_loop = np.isnan(self.delay_s) if self.delay_s is not None else np.ones(len(self.id), dtype=bool)

    def __len__(self) -> int:
        return len(self.id)

    def request(self, i: int) -> TraceRequest:
        # .item(i): the Python number at once (indexing makes a numpy scalar first); the engine calls this per request
        blocks = None
        starts = self.block_start
        if starts is not None:
            lo, hi = starts.item(i), starts.item(i + 1)
            if hi > lo:
                blocks = tuple(self.blocks[lo:hi].tolist())
        after = delay = None
        if not self.open_loop.item(i):
            after, delay = self.after.item(i), float(self.delay_s.item(i))
        request = object.__new__(TraceRequest)  # filled as TraceRequest(...) would be (_SET_REQUEST)
        set_id, set_arrival, set_input, set_output, set_extra, set_blocks, set_after, set_delay = _SET_REQUEST
        set_id(request, self.id.item(i))
        set_arrival(request, float(self.arrival_s.item(i)))
        set_input(request, self.input_len.item(i))
        set_output(request, self.output_len.item(i))
        set_extra(request, None)
        set_blocks(request, blocks)
        set_after(request, after)
        set_delay(request, delay)
        return request

    def block_counts(self) -> Any:
        """Prefix block ids per request (0: none), np.int64."""
        import numpy as np

        return np.diff(self.block_start) if self.block_start is not None else np.zeros(len(self), dtype=np.int64)

    @classmethod
    def from_requests(cls, requests: list[TraceRequest]) -> TraceTable:
        """A table of requests already in memory (tests, tools)."""
        import numpy as np

        loop = [r.after is not None for r in requests]
        return cls(TraceColumns(
            id=np.array([r.id for r in requests], dtype=np.int64),
            arrival_s=np.array([r.arrival_s for r in requests], dtype=np.float64),
            input_len=np.array([r.input_len for r in requests], dtype=np.int64),
            output_len=np.array([r.output_len for r in requests], dtype=np.int64),
            block_counts=np.array([len(r.prefix_blocks or ()) for r in requests], dtype=np.int64),
            blocks=np.array([b for r in requests for b in (r.prefix_blocks or ())], dtype=np.int64),
            after=np.array([r.after if on else 0 for r, on in zip(requests, loop)], dtype=np.int64),
            delay_s=np.array([r.delay_s if on else np.nan for r, on in zip(requests, loop)], dtype=np.float64),
        ))


class _NeedsExactCheck(Exception):
    """A batch failed a vectorised check: the exact per-line validator will name the line and field."""


# Lines per batch of the columnar reader: large enough to amortise numpy calls, small enough that the batch's parsed
# dicts stay a few tens of MB.
_COLUMN_BATCH_BYTES = 4 << 20
# Closed-loop fields are rare and checked against earlier ids: a batch with them goes to the exact validator.
_EXACT_ONLY_FIELDS = frozenset((AFTER_FIELD, DELAY_FIELD))
_GET_REQUIRED = tuple(itemgetter(name) for name in REQUIRED_FIELDS)
_NO_BLOCKS: tuple[()] = ()  # stands for an absent prefix_blocks (JSON never gives a tuple)


@dataclass
class _Batch:
    ids: Any
    arrivals: Any
    input_len: Any
    output_len: Any
    block_counts: Any
    blocks: Any
    after: Any = None
    delay_s: Any = None


def _line_batches(path: Path, fh: Any, digest: Any) -> Iterator[list[bytes]]:
    """The file's lines (each with its newline, the last one possibly without), a few MB of them at a time, read once from the start: it may be a
    pipe (`replay <(cat trace)`). Every byte read goes through `digest` (None: not hashed)."""
    rest = b""
    while True:
        try:
            chunk = fh.read(_COLUMN_BATCH_BYTES)
        except OSError as err:
            raise TraceError(path, None, None, f"cannot read: {err.strerror}") from None
        if not chunk:
            break
        if digest is not None:
            digest.update(chunk)
        data = rest + chunk if rest else chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            rest = data
            continue
        yield BytesIO(data[:cut + 1]).readlines()  # lines keep their newline, as readline gives them
        rest = data[cut + 1:]
    if rest:
        yield [rest]


def read_columns(path: str | os.PathLike[str], with_blocks: bool = False, with_loop: bool = False,
                 digest: Any = None, compact_blocks: bool = False) -> tuple[TraceHeader, TraceColumns]:
    """The header and the required fields of every request as numpy arrays (with `with_blocks`, the prefix blocks
    too; with `with_loop`, the closed-loop fields), validated exactly as `iter_requests` validates (same errors, same
    messages), but checked batch-wise with numpy, which is several times faster. The file is read once, front to
    back (a pipe works); `digest` (a hashlib object) sees every byte of it. With `compact_blocks` the block ids are
    int32 when every id fits (half the memory; values unchanged), else int64.

    A batch that fails any vectorised check is re-read line by line with the exact validator, which raises the error
    `iter_requests` would raise at the first bad line."""
    import numpy as np

    path = Path(path)
    loads = orjson.loads
    batches: list[_Batch] = []
    with _open(path) as fh:
        reader = _line_batches(path, fh, digest)
        first = next(reader, None)
        header = _parse_header(path, first[0] if first else None)
        ctx = _Context(header.block_size)
        prev_id: int | None = None
        prev_arrival = 0.0
        first_lineno = 2
        count = 0
        for lines in chain([first[1:]] if first else [], reader):
            if not lines:
                continue
            try:
                batch = _fast_columns(np, loads, lines, prev_id, prev_arrival, header.block_size, with_blocks)
                ctx.pending.append(batch.ids)
                if with_loop:
                    batch.after, batch.delay_s = np.zeros(len(lines), dtype=np.int64), np.full(len(lines), np.nan)
            except _NeedsExactCheck:
                batch = _exact_columns(np, path, first_lineno, lines, prev_id, prev_arrival, ctx, with_blocks, with_loop)
            if compact_blocks and batch.blocks is not None and (not batch.blocks.size or (
                    batch.blocks.min() >= -2**31 and batch.blocks.max() < 2**31)):
                batch.blocks = batch.blocks.astype(np.int32)  # per batch: the int64 copy is never held whole
            batches.append(batch)
            prev_id, prev_arrival = int(batch.ids[-1]), float(batch.arrivals[-1])
            first_lineno += len(lines)
            count += len(lines)
    if count != header.num_requests:
        raise TraceError(path, 1, "num_requests", f"header says {header.num_requests} requests, the file has {count}")

    def join(name: str, dtype: Any) -> Any:
        # copied into one array part by part, each part dropped once copied: the whole column is never held twice
        parts = [getattr(b, name) for b in batches]
        if not parts:
            return np.empty(0, dtype=dtype)
        out = np.empty(sum(len(p) for p in parts), dtype=np.result_type(*parts))
        del parts
        pos = 0
        for batch in batches:
            part = getattr(batch, name)
            out[pos:pos + len(part)] = part
            pos += len(part)
            setattr(batch, name, None)
        return out

    columns = TraceColumns(
        id=join("ids", np.int64),
        arrival_s=join("arrivals", np.float64),
        input_len=join("input_len", np.int64),
        output_len=join("output_len", np.int64),
        block_counts=join("block_counts", np.int64) if with_blocks else None,
        blocks=join("blocks", np.int64) if with_blocks else None,
        after=join("after", np.int64) if with_loop else None,
        delay_s=join("delay_s", np.float64) if with_loop else None,
    )
    return header, columns


def _fast_columns(np: Any, loads: Any, lines: list[bytes], prev_id: int | None, prev_arrival: float,
                  block_size: int | None, with_blocks: bool) -> _Batch:
    """Vectorised validation of one batch; raises _NeedsExactCheck whenever anything is off (never a TraceError:
    only the exact validator words errors, so the messages are the same on both paths)."""
    try:
        objs = [loads(raw) for raw in lines]
    except orjson.JSONDecodeError:
        raise _NeedsExactCheck from None
    if set(map(type, objs)) != {dict}:
        raise _NeedsExactCheck
    keys = set().union(*objs)
    if not _EXACT_ONLY_FIELDS.isdisjoint(keys):
        raise _NeedsExactCheck
    try:
        ids, arrivals, ilens, olens = (list(map(get, objs)) for get in _GET_REQUIRED)
    except KeyError:
        raise _NeedsExactCheck from None
    # bool is a subclass of int: comparing exact types keeps True/False out, as _is_int does.
    if set(map(type, ids)) != {int} or set(map(type, ilens)) != {int} or set(map(type, olens)) != {int}:
        raise _NeedsExactCheck
    if not set(map(type, arrivals)) <= {int, float}:
        raise _NeedsExactCheck
    try:
        id_arr = np.array(ids, dtype=np.int64)
        input_arr = np.array(ilens, dtype=np.int64)
        output_arr = np.array(olens, dtype=np.int64)
    except OverflowError:
        raise _NeedsExactCheck from None
    arrival_arr = np.array(arrivals, dtype=np.float64)
    if id_arr.size and (id_arr.min() < -MAX_INT or (prev_id is not None and id_arr[0] <= prev_id)):
        raise _NeedsExactCheck
    if (id_arr[1:] <= id_arr[:-1]).any():
        raise _NeedsExactCheck
    if not np.isfinite(arrival_arr).all() or arrival_arr[0] < max(prev_arrival, 0.0) or (arrival_arr[1:] < arrival_arr[:-1]).any():
        raise _NeedsExactCheck
    if input_arr.min() < 1 or output_arr.min() < 1:
        raise _NeedsExactCheck
    if PREFIX_FIELD in keys:
        counts, blocks = _fast_blocks(np, objs, input_arr, block_size, with_blocks, b"".join(lines))
    elif with_blocks:
        counts, blocks = np.zeros(len(objs), dtype=np.int64), np.empty(0, dtype=np.int64)
    else:
        counts = blocks = None
    return _Batch(id_arr, arrival_arr, input_arr, output_arr, counts, blocks)


def _fast_blocks(np: Any, objs: list[dict[str, Any]], input_arr: Any, block_size: int | None,
                 with_blocks: bool, raw_batch: bytes) -> tuple[Any, Any]:
    # true/false anywhere in the batch: the exact validator tells a bool id from an int (numpy would take it as 1)
    if block_size is None or b"true" in raw_batch or b"false" in raw_batch:
        raise _NeedsExactCheck
    lists = [obj.get(PREFIX_FIELD, _NO_BLOCKS) for obj in objs]
    if not set(map(type, lists)) <= {list, tuple}:
        raise _NeedsExactCheck
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    present = np.fromiter((type(b) is list for b in lists), dtype=bool, count=len(lists))
    want = -(-input_arr // block_size)
    if (counts[present] != want[present]).any():
        raise _NeedsExactCheck
    flat = list(chain.from_iterable(lists))
    if not flat:
        raise _NeedsExactCheck  # only empty lists: the exact validator says what is wrong
    blocks = np.array(flat)  # int64 only when every id is a 64-bit int (a float, a string, a huge int: another dtype)
    if blocks.dtype != np.int64 or blocks.min() < -MAX_INT:
        raise _NeedsExactCheck
    return (counts, blocks) if with_blocks else (None, None)


def _exact_columns(np: Any, path: Path, first_lineno: int, lines: list[bytes], prev_id: int | None,
                   prev_arrival: float, ctx: _Context, with_blocks: bool, with_loop: bool = False) -> _Batch:
    requests = []
    for lineno, raw in enumerate(lines, start=first_lineno):
        req = _parse_request(path, lineno, _parse_line(path, lineno, raw), prev_id, prev_arrival, ctx)
        prev_id, prev_arrival = req.id, req.arrival_s
        requests.append(req)
    counts = blocks = None
    if with_blocks:
        counts = np.array([len(r.prefix_blocks or ()) for r in requests], dtype=np.int64)
        blocks = np.array([b for r in requests for b in (r.prefix_blocks or ())], dtype=np.int64)
    after = delay = None
    if with_loop:
        after = np.array([r.after if r.after is not None else 0 for r in requests], dtype=np.int64)
        delay = np.array([r.delay_s if r.after is not None else np.nan for r in requests], dtype=np.float64)
    return _Batch(
        np.array([r.id for r in requests], dtype=np.int64),
        np.array([r.arrival_s for r in requests], dtype=np.float64),
        np.array([r.input_len for r in requests], dtype=np.int64),
        np.array([r.output_len for r in requests], dtype=np.int64),
        counts, blocks, after, delay,
    )


def load_trace(path: str | os.PathLike[str]) -> tuple[TraceHeader, list[TraceRequest]]:
    """The header and every request, validated (the whole file is read before anything is returned)."""
    return read_header(path), list(iter_requests(path))


def load_trace_table(path: str | os.PathLike[str]) -> tuple[TraceHeader, TraceTable, str]:
    """What the replay loads: the header, every request validated and held compactly (TraceTable), and the file's
    sha256, all from one reading of the file (so a pipe works, and the hash is of the bytes that were parsed)."""
    digest = hashlib.sha256()
    header, columns = read_columns(path, with_blocks=True, with_loop=True, digest=digest, compact_blocks=True)
    return header, TraceTable(columns), digest.hexdigest()


def _open(path: Path):
    try:
        return path.open("rb")
    except OSError as err:
        raise TraceError(path, None, None, f"cannot read: {err.strerror}") from None


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def format_request_line(rid: int, arrival_s: float, input_len: int, output_len: int, extra: dict[str, Any] | None = None) -> bytes:
    """One request line. Arrivals are written with microsecond precision so files are byte-identical across runs."""
    line = b'{"id":%d,"arrival_s":%.6f,"input_len":%d,"output_len":%d' % (rid, arrival_s, input_len, output_len)
    if extra:
        line += b"," + orjson.dumps(extra)[1:-1]
    return line + b"}\n"


_REQUEST_TEMPLATE = b'{"id":%d,"arrival_s":%.6f,"input_len":%d,"output_len":%d}\n'
# Rows per formatting batch of format_request_lines.
_FORMAT_BATCH = 8192


def format_request_lines(first_id: int, arrival_s: Any, input_len: Any, output_len: Any) -> Iterator[bytes]:
    """Request lines without optional fields, ids first_id, first_id+1, ..., from equal-length arrays, yielded in
    chunks of many lines. Byte-identical to `format_request_line` per row, several times faster: one `%`-format call
    per batch instead of one per row."""
    import numpy as np

    arrival_s = np.asarray(arrival_s, dtype=np.float64)
    input_len = np.asarray(input_len, dtype=np.int64)
    output_len = np.asarray(output_len, dtype=np.int64)
    count = len(arrival_s)
    if not len(input_len) == len(output_len) == count:
        raise ValueError("format_request_lines: the arrays differ in length")
    for start in range(0, count, _FORMAT_BATCH):
        stop = min(count, start + _FORMAT_BATCH)
        size = stop - start
        values: list[Any] = [None] * (4 * size)
        values[0::4] = range(first_id + start, first_id + stop)
        values[1::4] = arrival_s[start:stop].tolist()
        values[2::4] = input_len[start:stop].tolist()
        values[3::4] = output_len[start:stop].tolist()
        yield (_REQUEST_TEMPLATE * size) % tuple(values)


def write_trace(path: str | os.PathLike[str], header_fields: dict[str, Any], lines: Iterator[bytes] | list[bytes]) -> Path:
    """Write header + request lines atomically. `header_fields` must hold num_requests and duration_s; the version key
    is put first. Returns the path written."""
    path = Path(path)
    header = {HEADER_KEY: TRACE_VERSION, **header_fields}
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, chain([orjson.dumps(header) + b"\n"], lines))
    return path

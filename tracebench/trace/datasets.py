"""Importers of real request traces: the Azure LLM inference CSV, Mooncake JSONL and tracebench traces themselves.

- azure:      CSV with the header `TIMESTAMP,ContextTokens,GeneratedTokens`; TIMESTAMP is a date-time such as
              `2023-11-16 18:15:46.6805900` (a `T` separator, up to 9 fractional digits and a `Z` / `+HH:MM` offset are
              accepted); the token counts are integers >= 0.
- mooncake:   JSONL, one object per line: `timestamp` (ms), `input_length`, `output_length` (integers >= 0) and
              optionally `hash_ids` (a list of integers: one per 512-token block of the prompt; equal ids = shared
              prefix), carried into the trace as `prefix_blocks`. Other keys are not carried.
- tracebench: a tracebench trace (validated by the trace reader); its optional fields are carried (a closed-loop
              `after` as the index of the row it names, which is the new id when rows are taken in order).

Rows with zero input or zero output tokens cannot be replayed: they are dropped and counted (`dropped_zero_tokens`).
Everything else that is wrong is a DatasetError naming file, line and field.
"""

from __future__ import annotations

import hashlib
import lzma
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tracebench.errors import DatasetError
from tracebench.trace.format import HEADER_KEY, iter_requests, read_header, sha256_file

DATASET_FORMATS = ("auto", "azure", "mooncake", "tracebench")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# Mooncake's hash_ids name one block of this many prompt tokens each.
MOONCAKE_BLOCK_TOKENS = 512

_AZURE_TIME = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?)(Z|[+-]\d{2}:\d{2})?")


@dataclass(frozen=True)
class Dataset:
    """The usable rows of a dataset, in file order. `time_s` is seconds since the first usable row; `line` is each
    row's line number in the file (for error messages); `extras` holds each row's optional trace fields (None where
    the format has none)."""

    path: Path
    format: str
    sha256: str
    rows: int
    dropped_zero_tokens: int
    time_s: np.ndarray
    input_len: np.ndarray
    output_len: np.ndarray
    line: np.ndarray
    extras: list[dict[str, Any] | None] | None
    block_size: int | None = None  # tokens per prefix block, where rows carry prefix_blocks

    @property
    def usable_rows(self) -> int:
        return len(self.input_len)

    def check_time_order(self, needed_by: str = "--keep-timestamps") -> None:
        """Raise DatasetError at the first row whose timestamp is earlier than the row before it."""
        back = np.flatnonzero(self.time_s[1:] < self.time_s[:-1])
        if back.size:
            i = int(back[0]) + 1
            field = {"azure": "TIMESTAMP", "mooncake": "timestamp", "tracebench": "arrival_s"}[self.format]
            raise DatasetError(self.path, int(self.line[i]), field,
                               f"goes backwards ({self.time_s[i]:.6f} s after {self.time_s[i - 1]:.6f} s since the "
                               f"first row): {needed_by} needs rows in time order")

    @property
    def span_s(self) -> float:
        """Seconds from the first usable row to the last (time order not assumed)."""
        return float(self.time_s.max())

    def busiest_start(self, seconds: float) -> float:
        """The start of the `seconds`-long window [t, t + seconds) of the dataset's own time with the most arrivals,
        t one of the rows' times (the earliest such window on a tie). Rows must be in time order (DatasetError)."""
        self.check_time_order("--busiest")
        times = self.time_s
        counts = np.searchsorted(times, times + seconds, side="left") - np.arange(len(times))
        return float(times[int(np.argmax(counts))])

    def window(self, start: float, end: float) -> Dataset:
        """The rows whose time lies in [start, end) of the dataset's own time (seconds since its first usable row),
        their times shifted so that `start` is 0. The caller checks that the window holds a row."""
        keep = np.flatnonzero((self.time_s >= start) & (self.time_s < end))
        return Dataset(
            path=self.path, format=self.format, sha256=self.sha256, rows=self.rows,
            dropped_zero_tokens=self.dropped_zero_tokens, time_s=self.time_s[keep] - start,
            input_len=self.input_len[keep], output_len=self.output_len[keep], line=self.line[keep],
            extras=None if self.extras is None else [self.extras[i] for i in keep.tolist()],
            block_size=self.block_size,
        )


def _read_bytes(path: Path) -> bytes:
    """The dataset's bytes; a `.xz` file is decompressed (its sha256 is then the content's, as the plain file's)."""
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DatasetError(path, None, None, f"cannot read: {err.strerror or err}") from None
    if path.suffix != ".xz":
        return data
    try:
        return lzma.decompress(data, format=lzma.FORMAT_XZ)
    except lzma.LZMAError as err:
        raise DatasetError(path, None, None, f"not a valid .xz file ({err})") from None


def detect_format(path: str | os.PathLike[str]) -> str:
    """azure, mooncake or tracebench, from the first line of the file."""
    path = Path(path)
    if path.suffix == ".xz":
        return _detect(path, _read_bytes(path).split(b"\n", 1)[0])
    try:
        with path.open("rb") as fh:
            first = fh.readline()
    except OSError as err:
        raise DatasetError(path, None, None, f"cannot read: {err.strerror or err}") from None
    return _detect(path, first)


def _detect(path: Path, first: bytes) -> str:
    first = first.removeprefix(b"\xef\xbb\xbf").strip()
    if not first:
        raise DatasetError(path, 1, None, "empty first line: cannot tell the dataset format")
    if first.startswith(b"{"):
        try:
            obj = orjson.loads(first)
        except orjson.JSONDecodeError as err:
            raise DatasetError(path, 1, None, f"starts like JSON but is not JSON ({err})") from None
        if isinstance(obj, dict) and HEADER_KEY in obj:
            return "tracebench"
        if isinstance(obj, dict) and "input_length" in obj:
            return "mooncake"
        raise DatasetError(path, 1, None, "a JSON line that is neither a tracebench trace header (`tracebench_trace`) "
                                          "nor a Mooncake row (`input_length`): cannot tell the dataset format")
    cells = tuple(cell.strip() for cell in first.decode("utf-8", "replace").split(","))
    if cells == AZURE_COLUMNS:
        return "azure"
    raise DatasetError(path, 1, None, f"cannot tell the dataset format: line 1 is neither the Azure CSV header "
                                      f"{','.join(AZURE_COLUMNS)} nor a JSON object (give --dataset-format)")


def load_dataset(path: str | os.PathLike[str], fmt: str = "auto") -> Dataset:
    """Read and validate a whole dataset. `fmt` auto detects it from the content."""
    path = Path(path)
    if fmt not in DATASET_FORMATS:
        raise DatasetError(path, None, None, f"unknown dataset format {fmt!r} (one of {', '.join(DATASET_FORMATS)})")
    if path.is_dir():
        raise DatasetError(path, None, None, "cannot read: is a directory")
    if fmt == "tracebench":
        return _load_tracebench(path)
    data = _read_bytes(path)
    if fmt == "auto":
        fmt = _detect(path, data.split(b"\n", 1)[0])
        if fmt == "tracebench":
            return _load_tracebench(path)
    loader = _load_azure if fmt == "azure" else _load_mooncake
    return loader(path, data)


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DatasetError(path, data[: err.start].count(b"\n") + 1, None, "not UTF-8 text") from None


def _finish(path: Path, fmt: str, sha256: str, time_s: np.ndarray, input_len: np.ndarray, output_len: np.ndarray,
            line: np.ndarray, extras: list[dict[str, Any] | None] | None, block_size: int | None = None) -> Dataset:
    rows = len(input_len)
    keep = (input_len > 0) & (output_len > 0)
    kept = np.flatnonzero(keep)
    if kept.size == 0:
        raise DatasetError(path, None, None, f"no usable row: all {rows} rows have zero input or output tokens"
                                             if rows else "no data rows")
    times = time_s[kept]
    return Dataset(
        path=path, format=fmt, sha256=sha256, rows=rows, dropped_zero_tokens=rows - int(kept.size),
        time_s=times - times[0], input_len=input_len[kept], output_len=output_len[kept], line=line[kept],
        extras=None if extras is None else [extras[i] for i in kept.tolist()],
        block_size=None if extras is None else block_size,
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# ---------------------------------------------------------------------------------------------------------- azure


def _load_azure(path: Path, data: bytes) -> Dataset:
    lines = _decode(path, data).removeprefix("\ufeff").splitlines()
    if not lines:
        raise DatasetError(path, 1, None, "empty file")
    columns = tuple(cell.strip() for cell in lines[0].split(","))
    if columns != AZURE_COLUMNS:
        raise DatasetError(path, 1, None, f"expected the Azure header {','.join(AZURE_COLUMNS)}, got {lines[0]!r}")
    body = lines[1:]
    cells = [row.split(",") for row in body]
    if set(map(len, cells)) - {3}:
        for lineno, row in enumerate(cells, start=2):
            if len(row) != 3:
                why = "empty line" if body[lineno - 2].strip() == "" else f"expected 3 columns, got {len(row)}"
                raise DatasetError(path, lineno, None, why)
    stamps = [row[0].strip() for row in cells]
    input_len = _azure_counts(path, [row[1] for row in cells], "ContextTokens")
    output_len = _azure_counts(path, [row[2] for row in cells], "GeneratedTokens")
    time_ns = _azure_times(path, stamps)
    line = np.arange(2, len(body) + 2, dtype=np.int64)
    time_s = (time_ns - (time_ns[0] if len(time_ns) else 0)) / 1e9
    return _finish(path, "azure", _sha256(data), time_s, input_len, output_len, line, None)


def _azure_counts(path: Path, texts: list[str], field: str) -> np.ndarray:
    stripped = [text.strip() for text in texts]
    # str.isdigit alone would take other scripts' digits; int() would take "1_000" and "+5".
    bad = [i for i, text in enumerate(stripped) if not (text.isascii() and text.isdigit())]
    if bad:
        i = bad[0]
        raise DatasetError(path, i + 2, field, f"must be an integer >= 0, got {texts[i]!r}")
    values = [int(text) for text in stripped]
    too_big = [i for i, value in enumerate(values) if value > 2**62]
    if too_big:
        raise DatasetError(path, too_big[0] + 2, field, f"implausibly large: {values[too_big[0]]}")
    return np.array(values, dtype=np.int64)


def _azure_times(path: Path, stamps: list[str]) -> np.ndarray:
    matches = [_AZURE_TIME.fullmatch(stamp) for stamp in stamps]
    local: list[str] = []
    offsets_s: list[int] = []
    for i, match in enumerate(matches):
        if match is None:
            raise DatasetError(path, i + 2, "TIMESTAMP",
                               f"not a date-time like 2023-11-16 18:15:46.6805900, got {stamps[i]!r}")
        date, clock, zone = match.groups()
        local.append(f"{date}T{clock}")
        offsets_s.append(_offset_seconds(zone))
    try:
        times = np.array(local, dtype="datetime64[ns]").astype(np.int64)
    except ValueError:
        # numpy says that some date is impossible (month 13, ...) but not which: find the row.
        for i, text in enumerate(local):
            try:
                np.datetime64(text, "ns")
            except ValueError as err:
                raise DatasetError(path, i + 2, "TIMESTAMP", f"not a valid date-time {stamps[i]!r} ({err})") from None
        raise
    if any(offsets_s):
        times = times - np.array(offsets_s, dtype=np.int64) * 1_000_000_000
    return times


def _offset_seconds(zone: str | None) -> int:
    if zone is None or zone == "Z":
        return 0
    sign = -1 if zone[0] == "-" else 1
    return sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)


# ------------------------------------------------------------------------------------------------------- mooncake


def _load_mooncake(path: Path, data: bytes) -> Dataset:
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    extras: list[dict[str, Any] | None] = []
    lines = data.split(b"\n")
    if lines and lines[-1].strip() == b"":
        lines.pop()  # the newline that ends the last row
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            raise DatasetError(path, lineno, None, "empty line")
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError as err:
            raise DatasetError(path, lineno, None, f"not JSON ({err})") from None
        if not isinstance(obj, dict):
            raise DatasetError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
        for name in ("timestamp", "input_length", "output_length"):
            if name not in obj:
                raise DatasetError(path, lineno, name, "missing")
        stamp = obj["timestamp"]
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
            raise DatasetError(path, lineno, "timestamp", f"must be a number of milliseconds, got {stamp!r}")
        for name in ("input_length", "output_length"):
            value = obj[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value > 2**62:
                raise DatasetError(path, lineno, name, f"must be an integer >= 0, got {value!r}")
        extra: dict[str, Any] | None = None
        if "hash_ids" in obj:
            blocks = obj["hash_ids"]
            if not isinstance(blocks, list) or not all(isinstance(b, int) and not isinstance(b, bool) for b in blocks):
                raise DatasetError(path, lineno, "hash_ids", f"must be a list of integers, got {blocks!r}"[:200])
            want = -(-obj["input_length"] // MOONCAKE_BLOCK_TOKENS)
            if len(blocks) != want:
                raise DatasetError(path, lineno, "hash_ids", f"has {len(blocks)} ids; input_length {obj['input_length']} "
                                   f"needs ceil({obj['input_length']}/{MOONCAKE_BLOCK_TOKENS}) = {want}")
            extra = {"prefix_blocks": blocks}
        times.append(float(stamp) / 1000.0)
        inputs.append(obj["input_length"])
        outputs.append(obj["output_length"])
        extras.append(extra)
    return _finish(path, "mooncake", _sha256(data), np.array(times, dtype=np.float64), np.array(inputs, dtype=np.int64),
                   np.array(outputs, dtype=np.int64), np.arange(1, len(times) + 1, dtype=np.int64),
                   extras if any(e is not None for e in extras) else None, MOONCAKE_BLOCK_TOKENS)


# ----------------------------------------------------------------------------------------------------- tracebench


def _load_tracebench(path: Path) -> Dataset:
    if path.suffix == ".xz":  # a trace is read as it is replayed, from the file itself
        raise DatasetError(path, None, None, "a tracebench trace compressed with xz: decompress it first (xz -dk FILE)")
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    extras: list[dict[str, Any] | None] = []
    row_of_id: dict[int, int] = {}
    for req in iter_requests(path):  # TraceError (file, line, field) for anything wrong
        row_of_id[req.id] = len(times)
        times.append(req.arrival_s)
        inputs.append(req.input_len)
        outputs.append(req.output_len)
        extra = dict(req.extra or {})
        if req.prefix_blocks is not None:
            extra["prefix_blocks"] = list(req.prefix_blocks)
        if req.after is not None:
            # the row it follows (a trace has no zero-token rows, so rows are the new trace's ids when taken in order)
            extra["after"] = row_of_id[req.after]
            extra["delay_s"] = req.delay_s
        extras.append(extra or None)
    return _finish(path, "tracebench", sha256_file(path), np.array(times, dtype=np.float64), np.array(inputs, dtype=np.int64),
                   np.array(outputs, dtype=np.int64), np.arange(2, len(times) + 2, dtype=np.int64),
                   extras if any(e is not None for e in extras) else None, read_header(path).block_size)

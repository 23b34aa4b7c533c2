"""`tracebench pack`: store a finished run folder compactly, losing nothing the run recorded (docs/run-format.md).

    run.json         -> run.json.xz         xz, the same bytes inside
    requests.jsonl   -> requests.parquet    zstd Parquet, one row per line, the run format's columns and types
    telemetry.jsonl  -> telemetry.parquet   likewise (a field absent from a line is a null)
    server_metrics.jsonl, gpu.jsonl -> .parquet   likewise
    server-<i>.log   -> server-<i>.log.xz   xz (--log-tail N: only its last N lines)
    metrics-<i>-start.txt, -end.txt -> .txt.xz   xz, whole
    router.log       -> router.log.xz       likewise (a run through --router sglang-router)
    requests.columns.parquet                removed (a copy of requests.jsonl, report/columns.py: requests.parquet
                                            holds the same records)

xz rather than gzip for the text files: run.json holds each server's /server_info, near-identical and ~33 kB apart,
beyond gzip's 32 kB window (a 4-server run.json: 192 kB, gzip 24 kB, xz 8 kB). Both are in Python's standard library.

Every reader of run folders (tracebench.report.load.run_file) reads either form. Packing is all or nothing: every run
given is validated as `tracebench report` reads it, each packed file is written under a temporary name, read back
and compared with the original record by record (the JSONL parsed again by orjson, not by the reader that wrote the
Parquet), and only when every run passed are the packed files renamed into place and the originals removed.

`shareable`: run.json, the logs and the /metrics texts also lose the machine's paths (tracebench/paths.py); an already packed run then
has only those files rewritten, in place, with the same checks.
"""

from __future__ import annotations

import lzma
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import orjson
import polars as pl

from tracebench.cleanup import StopSignals, remove_stale, temp_files
from tracebench.errors import ConfigError, RunFolderError
from tracebench.paths import shareable_json, shareable_text
from tracebench.report.columns import copy_temps, is_copy_temp
from tracebench.report.load import (
    BESIDE_FILES, BESIDE_SCHEMAS, METRICS_TEXT_PATTERN, PACKED_NAMES, PD_COLUMNS, ROW, is_packed, read_beside,
    COLUMNS_COPY, read_parquet_table, read_requests, read_run_json, read_telemetry, request_schema, run_file,
    telemetry_schema,
)

TEMP_TAG = "packing"  # a packed file is written as .<name>.packing-<pid> first
ZSTD_LEVEL = 19  # packing happens once per run and small files travel (git, the GPU call): the strongest level
LOG_PATTERNS = ("server-*.log", "router.log")  # the servers' logs, sglang-router's (--router sglang-router)


@dataclass
class PreparedRun:
    """A run whose packed files are written (under temporary names) and verified, not yet in place."""

    folder: Path
    moves: list[tuple[Path, Path, Path]] = field(default_factory=list)  # (temporary, final, original)
    derived: list[Path] = field(default_factory=list)  # removed with the originals: requests.jsonl's columnar copy
    bytes_before: int = 0  # of the originals
    bytes_after: int = 0   # of their packed forms

    def add(self, original: Path, in_place: bool = False) -> Path:
        """Register `original` for packing (`in_place`: an already packed file rewritten); returns the temporary path
        its packed form is written to."""
        final = original if in_place else original.with_name(PACKED_NAMES.get(original.name, original.name + ".xz"))
        temp = final.with_name(f".{final.name}.{TEMP_TAG}-{os.getpid()}")
        self.moves.append((temp, final, original))
        return temp

    def written(self, original: Path, temp: Path) -> None:
        self.bytes_before += original.stat().st_size
        self.bytes_after += temp.stat().st_size


def pack_runs(folders: list[Path], log_tail: int | None, shareable: bool = False, stop: StopSignals | None = None,
              stale: Callable[[Path, int], None] | None = None) -> list[PreparedRun]:
    """Pack every folder, or none: a run that cannot be packed (or whose packed form does not read back equal), or a
    stop signal (`stop`: they raise Interrupted until the renames start, then wait), stops the whole call before any
    original is removed, and removes every temporary file it wrote. Temporary files that an earlier pack killed
    (SIGKILL) left, and those of a columnar copy whose replay was killed while writing it, are removed first, each
    reported to `stale`; those of a pack (or a copy) still being written stop the call.
    `shareable`: see the module's docstring."""
    seen: dict[Path, Path] = {}
    for folder in folders:
        if folder.resolve() in seen:
            raise ConfigError(f"run '{folder}' is given twice (also as '{seen[folder.resolve()]}')")
        seen[folder.resolve()] = folder
    for folder in folders:
        try:
            # its own, and the columnar copy's of a replay killed while writing it (report/columns.py): pack is the
            # one command that rewrites a finished run folder
            removed, running = remove_stale(temp_files(folder, ".", TEMP_TAG) + copy_temps(folder))
        except OSError as err:
            raise ConfigError(f"run '{folder}': cannot remove {err.filename} ({err.strerror}): nothing was packed") \
                from None
        for path, pid in removed:
            if stale is not None:
                stale(path, pid)
        if running:
            path, pid = running[0]
            writer = ("a tracebench replay still writing this run's columnar copy" if is_copy_temp(path)
                      else "another tracebench pack of this run")
            raise ConfigError(f"run '{folder}': {path.name} belongs to pid {pid}, which is running: {writer}? (if pid "
                              f"{pid} is no tracebench, remove the file)")
    prepared: list[PreparedRun] = []
    try:
        for folder in folders:
            check_packable(folder, shareable)
        for folder in folders:
            prepared.append(PreparedRun(folder))
            if shareable and is_packed(folder):
                make_shareable(prepared[-1])
            else:
                prepare(prepared[-1], log_tail, shareable)
        if stop is not None:
            stop.defer()  # from here the renames: all of them, then the originals out, not interrupted halfway
    except BaseException as err:
        for run in prepared:
            discard(run)
        if isinstance(err, OSError):  # a read-only run folder, a full disk: the path and why, not a traceback
            raise ConfigError(f"{err.filename}: {err.strerror} (nothing was packed; every run is as it was)") from None
        raise
    for run in prepared:
        commit(run)
    return prepared


def check_packable(folder: Path, shareable: bool = False) -> None:
    if is_packed(folder):
        if shareable:
            read_run_json(folder)  # a packed run.json.xz that does not read stops here
            return
        raise RunFolderError(folder, None, None, "already packed (it has "
                             + ", ".join(sorted(p.name for p in _packed_files(folder))) + "; --shareable rewrites "
                             "only its paths)")
    meta = read_run_json(folder)
    if meta["status"] == "running":
        raise RunFolderError(folder / "run.json", None, "status",
                             "'running': the run is not finished (or was killed while running); only a finished run "
                             "is packed")


def prepare(run: PreparedRun, log_tail: int | None, shareable: bool = False) -> None:
    folder = run.folder
    meta_path = folder / "run.json"
    meta = read_run_json(folder)
    # the run folder exactly as `tracebench report` reads it: a broken record stops here, before anything is written
    requests = read_requests(run_file(folder, "requests.jsonl"), meta).drop(ROW)
    raw_meta = meta_path.read_bytes()
    if shareable:
        raw_meta = shareable_run_json(raw_meta, folder)
    _write_verified(run, meta_path, _xz(raw_meta), lambda data: lzma.decompress(data) == raw_meta)
    schema = request_schema()
    if not meta.get("pd"):  # a plain run's records have no prefill side (replay/records.py PdRecord)
        schema = {name: dtype for name, dtype in schema.items() if name not in PD_COLUMNS}
    _pack_table(run, folder / "requests.jsonl", requests, schema)
    if (folder / COLUMNS_COPY).exists():  # a copy of requests.jsonl (report/columns.py): goes with it
        run.derived.append(folder / COLUMNS_COPY)
        run.bytes_before += (folder / COLUMNS_COPY).stat().st_size
    telemetry_path = folder / "telemetry.jsonl"
    if telemetry_path.exists():  # a run whose servers never started polled nothing
        _pack_table(run, telemetry_path, read_telemetry(folder), telemetry_schema())
    for name in BESIDE_FILES:  # /metrics scrapes, GPU samples (when the run wrote them)
        frame = read_beside(folder, meta, name)
        if frame is not None:
            _pack_table(run, folder / name, frame, BESIDE_SCHEMAS[name]())
    for log in _logs(folder, ""):
        kept = _tail(log, log_tail)
        if shareable:
            kept = shareable_log(kept, folder, meta)
        _write_verified(run, log, _xz(kept), lambda data, kept=kept: lzma.decompress(data) == kept)
    for text_path in sorted(folder.glob(METRICS_TEXT_PATTERN)):  # whole: --log-tail is for logs
        text = text_path.read_bytes()
        if shareable:  # sglang's model_name label is the model's path
            text = shareable_log(text, folder, meta)
        _write_verified(run, text_path, _xz(text), lambda data, text=text: lzma.decompress(data) == text)


def make_shareable(run: PreparedRun) -> None:
    """An already packed run: its run.json.xz, logs and /metrics texts rewritten in place (the request and telemetry
    tables are left as recorded, as packing leaves them)."""
    folder = run.folder
    meta_path = run_file(folder, "run.json")
    raw_meta = shareable_run_json(lzma.decompress(meta_path.read_bytes()), folder)
    _write_verified(run, meta_path, _xz(raw_meta), lambda data: lzma.decompress(data) == raw_meta, in_place=True)
    meta = orjson.loads(raw_meta)
    for log in [*_logs(folder, ".xz"), *sorted(folder.glob(METRICS_TEXT_PATTERN + ".xz"))]:
        kept = shareable_log(lzma.decompress(log.read_bytes()), folder, meta)
        _write_verified(run, log, _xz(kept), lambda data, kept=kept: lzma.decompress(data) == kept, in_place=True)


def _path_roots(folder: Path, meta: dict[str, Any]) -> list[Path]:
    """The run folder as it is now and, when run.json names it absolutely, where it was written."""
    roots = [Path(os.path.abspath(folder))]
    out_dir = (meta.get("options") or {}).get("out_dir")
    if isinstance(out_dir, str) and os.path.isabs(out_dir) and meta.get("run_name"):
        roots.append(Path(out_dir) / meta["run_name"])
    return roots


def shareable_run_json(raw: bytes, folder: Path) -> bytes:
    """run.json with every machine path made portable (tracebench/paths.py), written as replay writes it."""
    meta = orjson.loads(raw)
    return orjson.dumps(shareable_json(meta, _path_roots(folder, meta)), option=orjson.OPT_INDENT_2) + b"\n"


def shareable_log(data: bytes, folder: Path, meta: dict[str, Any]) -> bytes:
    text = data.decode("utf-8", errors="surrogateescape")  # a log's odd bytes come back unchanged
    return shareable_text(text, _path_roots(folder, meta)).encode("utf-8", errors="surrogateescape")


def commit(run: PreparedRun) -> None:
    """Packed files into place (each rename atomic), then the originals out (a file rewritten in place replaced
    its original): requests.jsonl's columnar copy first, so that no copy outlives its JSONL."""
    for temp, final, _ in run.moves:
        os.replace(temp, final)
    for path in run.derived:
        path.unlink()
    for _, final, original in run.moves:
        if original != final:
            original.unlink()


def discard(run: PreparedRun) -> None:
    for temp, _, _ in run.moves:
        if temp.exists():  # (unlink of a missing file in a read-only folder fails with EROFS, not ENOENT)
            temp.unlink()


def _packed_files(folder: Path) -> list[Path]:
    return ([p for p in (folder / name for name in PACKED_NAMES.values()) if p.exists()] + _logs(folder, ".xz")
            + sorted(folder.glob(METRICS_TEXT_PATTERN + ".xz")))


def _logs(folder: Path, suffix: str) -> list[Path]:
    return sorted(p for pattern in LOG_PATTERNS for p in folder.glob(pattern + suffix))


def _write_verified(run: PreparedRun, original: Path, data: bytes, equal: Callable[[bytes], bool],
                    in_place: bool = False) -> None:
    temp = run.add(original, in_place)
    temp.write_bytes(data)
    if not equal(temp.read_bytes()):
        raise RunFolderError(original, None, None, "its packed form reads back different: nothing was packed")
    run.written(original, temp)


def _pack_table(run: PreparedRun, original: Path, frame: pl.DataFrame, schema: dict[str, Any]) -> None:
    temp = run.add(original)
    frame.select(list(schema)).write_parquet(temp, compression="zstd", compression_level=ZSTD_LEVEL, statistics=True)
    _verify_table(original, temp, schema)
    run.written(original, temp)


def _verify_table(original: Path, packed: Path, schema: dict[str, Any]) -> None:
    """Each row of `packed` equals the matching line of `original`, parsed independently (orjson): every field of
    the line present in the row with the same value, a field absent from the line null in the row, and no field of
    the line left out of the columns."""
    rows = read_parquet_table(packed, schema).iter_rows(named=True)
    with original.open("rb") as fh:
        lineno = 0
        for lineno, raw in enumerate(fh, start=1):
            try:
                obj = orjson.loads(raw)
            except orjson.JSONDecodeError as err:
                raise RunFolderError(original, lineno, None, f"not JSON ({err})") from None
            unknown = [name for name in obj if name not in schema]
            if unknown:
                raise RunFolderError(original, lineno, unknown[0],
                                     "not a field of the run format: packing would lose it (nothing was packed)")
            row = next(rows, None)
            expected = {name: obj.get(name) for name in schema}
            if row != expected:
                raise RunFolderError(original, lineno, None,
                                     f"packed row {lineno} reads back as {row!r}: nothing was packed")
    if next(rows, None) is not None:
        raise RunFolderError(packed, None, None, f"has more rows than {original.name} has lines ({lineno})")


def _xz(data: bytes) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_XZ, preset=9 | lzma.PRESET_EXTREME)


def _tail(log: Path, lines: int | None) -> bytes:
    if lines is None:
        return log.read_bytes()
    with log.open("rb") as fh:
        return b"".join(deque(fh, maxlen=lines))

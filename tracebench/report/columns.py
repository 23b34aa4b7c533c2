"""requests.jsonl's columnar copy, `requests.columns.parquet`, written at the clean end of a big replay
(docs/run-format.md, "Columnar copy").

Why: parsing a million-request requests.jsonl is most of `tracebench report`'s time (polars, ~2.5 CPU-s per 650 MB);
the same records in Parquet read in ~0.2 s. The replay itself stays free of polars (it appends JSON lines as requests
finish): the copy is made by the `tracebench replay` command after the run returned (tracebench/cli.py), from the
finished JSONL, and only for a JSONL of at least COPY_MIN_BYTES (a smaller one parses in under ~0.1 s: a second file
would save nothing worth the import of polars at every run's end).

The copy records what it was made from (Parquet metadata, report/load.py COPY_SOURCE_FIELDS): the JSONL's size,
mtime and sha256, and the number of records. The reader (report/load.py read_columns_copy) uses the copy only while it
is a copy of the JSONL as it is now, and checks every record by the same rules as the JSONL's. requests.jsonl stays
the record: the copy is written to a temporary name and renamed into place, so it is whole or absent.

`finish_run_copy` is what a replay's end runs: `tracebench replay` (cli.py) and each point of `tracebench sweep`.
A stop signal while the copy is written (SIGINT, SIGTERM: tracebench/cleanup.py StopSignals) removes the temporary
file and raises Interrupted; the run folder is whole without the copy. A process killed (SIGKILL) while writing
leaves `.requests.columns.parquet.writing-<pid>`: no reader opens it, and `tracebench pack`, the one command that
rewrites a finished run folder, removes it as it removes its own killed temporary files. The copy itself is written
only into the folder of the run that just ended (created fresh by that run), so no earlier copy's file is there.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from tracebench.cleanup import StopSignals, temp_files
from tracebench.errors import CopyNotWritten, RunFolderError
# the threshold lives with the options: replay and sweep check its variable before a run, without this module
from tracebench.options import COPY_MIN_BYTES, copy_min_bytes
from tracebench.report.copy_name import COLUMNS_COPY

COPY_TEMP_TAG = "writing"  # the copy is written as .requests.columns.parquet.writing-<pid> first
# what a copy not written leaves (CopyNotWritten's message ends with it)
WHOLE = (f": the run is whole without it; `tracebench report` parses its requests.jsonl (slower above "
         f"{COPY_MIN_BYTES >> 20} MiB)")
# zstd level 1: as small as level 3 on run records (~88 MB for 1M records) and the quickest to write; reads in ~0.2 s
COPY_ZSTD_LEVEL = 1


def wants_copy(folder: Path) -> bool:
    """Whether the finished run in `folder` gets a columnar copy: its requests.jsonl is big enough to gain from one."""
    jsonl = folder / "requests.jsonl"
    return jsonl.is_file() and jsonl.stat().st_size >= copy_min_bytes()


def copy_temps(folder: Path) -> list[tuple[Path, int]]:
    """The copy's temporary files in `folder`, with their writers' pids (tracebench/cleanup.py temp_files)."""
    return temp_files(folder, f".{COLUMNS_COPY}", COPY_TEMP_TAG)


def is_copy_temp(path: Path) -> bool:
    """Whether `path` is one of those (pack tells them from its own)."""
    return path.name.startswith(f".{COLUMNS_COPY}.{COPY_TEMP_TAG}-")


def finish_run_copy(folder: Path) -> CopyNotWritten | None:
    """At a replay's clean end: `folder`'s columnar copy, when its requests.jsonl is big enough (wants_copy). Returns
    None, or why the copy was not written (CopyNotWritten: a full disk, a read-only folder), for the caller to print as
    a warning: the run is whole without it. SIGINT or SIGTERM while it is written: Interrupted (exit 130, 143), no
    temporary file left, the run whole. polars is imported only when a copy is written."""
    if not wants_copy(folder):
        return None
    with StopSignals(f"stopped by {{signal}} while writing {folder / COLUMNS_COPY}: not written; the run is whole "
                     "without it") as stop:
        try:
            write_requests_copy(folder, stop)
        except CopyNotWritten as err:
            # a signal deferred for the rename, which then failed, is not lost
            stop.check(f"{folder / COLUMNS_COPY} was being put in place, which failed: not written; the run is whole "
                       "without it")
            return err
    return None


def write_requests_copy(folder: Path, stop: StopSignals | None = None) -> Path:
    """Write `folder`/requests.columns.parquet from `folder`/requests.jsonl (finished: nothing appends to it any
    more); returns its path. A JSONL polars cannot parse stops here, naming its line (RunFolderError); a JSONL that
    changes while it is read, too. A copy that cannot be written (a full disk): CopyNotWritten, no file left. The
    records' rules are not checked here: the report checks them on every read. `stop`: its signals raise until the
    copy is complete, then wait until it is in place (the rename)."""
    # polars is imported here, not with the module: a replay too small for a copy never loads it
    import polars as pl

    from tracebench.report.load import (
        COPY_METADATA_KEY, COPY_VERSION, _raise_located, file_sha256_and_lines, request_schema,
    )

    jsonl = folder / "requests.jsonl"
    final = folder / COLUMNS_COPY
    temp = folder / f".{COLUMNS_COPY}.{COPY_TEMP_TAG}-{os.getpid()}"
    before = jsonl.stat()
    # what the copy is made from goes in its footer, known before polars reads the file: the bytes' sha256 and the
    # number of lines (one line per record: replay writes no empty line)
    sha256, lines = file_sha256_and_lines(jsonl)
    source = {"version": COPY_VERSION, "source": "requests.jsonl", "size": before.st_size,
              "mtime_ns": before.st_mtime_ns, "sha256": sha256, "rows": lines}
    try:
        try:
            # streamed (a slice of the file at a time): ~0.9 GB resident for 1M records, not the 1.5 GB of a whole
            # frame; the same parser and schema as the report's read_jsonl_table
            pl.scan_ndjson(jsonl, schema=request_schema()).sink_parquet(
                temp, compression="zstd", compression_level=COPY_ZSTD_LEVEL, statistics=False,
                metadata={COPY_METADATA_KEY: orjson.dumps(source).decode()})
        except pl.exceptions.PolarsError as err:
            # polars' error for a broken line and for a full disk alike: a broken line is named, else it was the write
            _raise_located(jsonl, row=None)
            raise CopyNotWritten(f"{final}: not written ({err}){WHOLE}") from None
        rows = pl.scan_parquet(temp).select(pl.len()).collect().item()
        if rows != lines:  # polars skips an empty line, or reads a last line without its newline
            _raise_located(jsonl, row=None)
            raise RunFolderError(jsonl, None, None, f"{lines} lines but {rows} records: no columnar copy written")
        after = jsonl.stat()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise RunFolderError(jsonl, None, None, "changed while its columnar copy was made (is a replay still "
                                 "writing it?): no copy written")
        if stop is not None:
            stop.defer()  # the copy is complete: a signal now waits for the rename (else "not written" could be false)
        os.replace(temp, final)
    except OSError as err:
        temp.unlink(missing_ok=True)
        raise CopyNotWritten(f"{final}: not written ({err.strerror}){WHOLE}") from None
    except BaseException:
        # (a stop signal, a broken line, a failed write): no half-written copy is left
        temp.unlink(missing_ok=True)
        raise
    if stop is not None:
        stop.check(f"{final} was being put in place: it is written; the run is whole")
    return final

"""requests.jsonl's columnar copy (requests.columns.parquet, tracebench/report/columns.py): the report reads it
instead of parsing the JSONL, the same records and the same checks, and only while it is a copy of the JSONL as it is
now. The run: a committed example (reports/examples/sim2-routing/sjf, 720 records), unpacked to the form replay
writes (run.json, requests.jsonl, telemetry.jsonl)."""

from __future__ import annotations

import lzma
import os
import re
import select
import shutil
import signal
import subprocess
import threading
from pathlib import Path

import orjson
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from conftest import run_cli, run_cli_process
from tracebench.cli import _finish_run_folder
from tracebench.errors import ConfigError, RunFolderError
from tracebench.options import COPY_MIN_BYTES, COPY_MIN_BYTES_ENV
from tracebench.report.columns import wants_copy, write_requests_copy
from tracebench.report.load import (COLUMNS_COPY, COPY_METADATA_KEY, NDJSON_READ_SIZE_VARIABLE, load_run,
                                    read_requests, read_run_json)
from tracebench.report.pack import pack_runs

EXAMPLE = Path(__file__).resolve().parent.parent / "reports" / "examples" / "sim2-routing" / "sjf"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_bytes(lzma.decompress((EXAMPLE / "run.json.xz").read_bytes()))
    pl.read_parquet(EXAMPLE / "requests.parquet").write_ndjson(folder / "requests.jsonl")
    pl.read_parquet(EXAMPLE / "telemetry.parquet").write_ndjson(folder / "telemetry.jsonl")
    return folder


def _lines(folder: Path) -> list[bytes]:
    return (folder / "requests.jsonl").read_bytes().splitlines(keepends=True)


def test_the_copy_reads_back_as_the_jsonl_every_record_and_field(run: Path) -> None:
    from_jsonl = load_run(run)
    assert write_requests_copy(run) == run / COLUMNS_COPY
    assert sorted(p.name for p in run.iterdir()) == ["requests.columns.parquet", "requests.jsonl", "run.json",
                                                     "telemetry.jsonl"]  # no temporary file left
    from_copy = load_run(run)
    assert from_copy.requests.height == 720
    assert_frame_equal(from_copy.requests, from_jsonl.requests)
    assert from_copy.meta == from_jsonl.meta


def test_a_jsonl_read_in_many_pieces_is_the_same_frame_its_broken_record_named_by_its_line(
        run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the report has polars parse a JSONL in large pieces, each a chunk of the frame, and works on the chunks as they
    # are (report/load.py read_jsonl_in_large_pieces): pieces of 4 KiB here (a few records each), so 720 records in ~90
    # of chunks, must give the frame of one piece, its rows numbered across the pieces
    whole = load_run(run).requests.rechunk()
    monkeypatch.setenv(NDJSON_READ_SIZE_VARIABLE, "4096")
    pieces = load_run(run).requests
    assert pieces.n_chunks() > 50  # polars still reads the variable: else the report's large pieces are gone too
    assert_frame_equal(pieces, whole)
    lines = _lines(run)
    lines[700] = re.sub(rb'"t_arrival":[^,]*', b'"t_arrival":-1.0', lines[700], count=1)
    (run / "requests.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(RunFolderError) as err:
        read_requests(run / "requests.jsonl", read_run_json(run))
    assert str(err.value).startswith(f"{run}/requests.jsonl:701: field 't_arrival': must be >= 0")


def test_the_copy_is_what_the_report_reads(run: Path) -> None:
    # a copy whose values differ but whose footer still names this JSONL: the report shows the copy's value, so it
    # read the copy (and not the JSONL)
    copy = write_requests_copy(run)
    metadata = {COPY_METADATA_KEY: pl.read_parquet_metadata(copy)[COPY_METADATA_KEY]}
    frame = pl.read_parquet(copy)
    before = load_run(run).requests["t_arrival"][5]
    frame.with_columns(pl.when(pl.int_range(pl.len()) == 5).then(pl.col("t_arrival") / 2).otherwise(pl.col("t_arrival"))
                       .alias("t_arrival")).write_parquet(copy, metadata=metadata)
    assert load_run(run).requests["t_arrival"][5] == pytest.approx(before / 2) and before > 0
    # and its records are checked as the JSONL's, a broken one named by its JSONL line
    frame.with_columns(pl.when(pl.int_range(pl.len()) == 3).then(pl.lit(-1.0)).otherwise(pl.col("t_arrival"))
                       .alias("t_arrival")).write_parquet(copy, metadata=metadata)
    with pytest.raises(RunFolderError) as err:
        load_run(run)
    assert str(err.value).startswith(f"{run}/requests.jsonl:4: field 't_arrival': must be >= 0")


def _same_size_edit(folder: Path) -> None:
    """One digit of the first record changed: the JSONL keeps its size, its mtime moves."""
    data = bytearray((folder / "requests.jsonl").read_bytes())
    at = data.index(b'"t_arrival":') + len(b'"t_arrival":') + 3  # a digit after "0."
    data[at] = ord("7") if data[at] != ord("7") else ord("3")
    (folder / "requests.jsonl").write_bytes(bytes(data))


@pytest.mark.parametrize("change, why", [
    (lambda f: (f / "requests.jsonl").write_bytes(b"".join(_lines(f)[:-1])),
     "requests.jsonl has {size} bytes, the copy was made from {made}"),
    (_same_size_edit, "requests.jsonl has other bytes (sha256) than the copy was made from"),
])
def test_a_copy_of_another_jsonl_is_refused(run: Path, change, why: str) -> None:
    copy = write_requests_copy(run)
    made = (run / "requests.jsonl").stat().st_size
    change(run)
    with pytest.raises(RunFolderError) as err:
        load_run(run)
    assert str(err.value).startswith(f"{copy}: not a copy of requests.jsonl as it is now ("
                                     + why.format(size=(run / "requests.jsonl").stat().st_size, made=made))
    assert "delete requests.columns.parquet" in str(err.value)


def test_the_cli_names_a_stale_copy(run: Path) -> None:
    write_requests_copy(run)
    _same_size_edit(run)
    done = run_cli("report", str(run))
    assert done.returncode == 2
    assert done.stderr.startswith(f"tracebench: error: {run}/requests.columns.parquet: not a copy of requests.jsonl "
                                  "as it is now"), done.stderr


def test_a_jsonl_with_the_same_bytes_and_another_mtime_keeps_its_copy(run: Path) -> None:
    # a run folder copied elsewhere (its files' mtimes are new): the copy is checked by sha256, and read
    copy = write_requests_copy(run)
    stat = (run / "requests.jsonl").stat()
    os.utime(run / "requests.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    moved = run.with_name("moved")
    shutil.copytree(run, moved, copy_function=shutil.copy)  # mtimes not kept
    frame = pl.read_parquet(copy)
    assert_frame_equal(load_run(run).requests.drop("_row"), frame)
    assert_frame_equal(load_run(moved).requests.drop("_row"), frame)


def test_a_damaged_copy_is_refused(run: Path) -> None:
    copy = write_requests_copy(run)
    whole = copy.read_bytes()
    source = orjson.loads(pl.read_parquet_metadata(copy)[COPY_METADATA_KEY])
    assert source["rows"] == 720 and source["size"] == (run / "requests.jsonl").stat().st_size
    frame = pl.read_parquet(copy)
    cases = [
        (lambda: copy.write_bytes(whole[: len(whole) // 2]), "not a readable Parquet file"),
        (lambda: frame.write_parquet(copy), f"field '{COPY_METADATA_KEY}': missing from its Parquet metadata"),
        (lambda: frame.head(719).write_parquet(copy, metadata={COPY_METADATA_KEY: orjson.dumps(source).decode()}),
         "has 719 rows, but was made from 720 records"),
        (lambda: frame.write_parquet(copy, metadata={COPY_METADATA_KEY: orjson.dumps({**source, "rows": "720"})
                                                     .decode()}),
         f"field '{COPY_METADATA_KEY}.rows': must be int"),
    ]
    for damage, why in cases:
        damage()
        with pytest.raises(RunFolderError) as err:
            load_run(run)
        assert str(err.value).startswith(f"{copy}: ") and why in str(err.value), str(err.value)


def test_a_broken_record_is_named_by_its_jsonl_line(run: Path) -> None:
    lines = _lines(run)
    lines[6] = lines[6].replace(b'"status":"ok"', b'"status":"weird"')
    (run / "requests.jsonl").write_bytes(b"".join(lines))
    write_requests_copy(run)  # the copy holds what the JSONL holds; the rules are the report's, on every read
    with pytest.raises(RunFolderError) as err:
        load_run(run)
    assert str(err.value).startswith(f"{run}/requests.jsonl:7: field 'status': must be one of")


def test_a_jsonl_polars_cannot_parse_gets_no_copy(run: Path) -> None:
    lines = _lines(run)
    lines[11] = lines[11][:40] + b"\n"
    (run / "requests.jsonl").write_bytes(b"".join(lines))
    with pytest.raises(RunFolderError) as err:
        write_requests_copy(run)
    assert str(err.value).startswith(f"{run}/requests.jsonl:12: not JSON")
    assert sorted(p.name for p in run.iterdir()) == ["requests.jsonl", "run.json", "telemetry.jsonl"]


def test_pack_removes_the_copy_and_a_copy_beside_packed_records_is_refused(run: Path) -> None:
    write_requests_copy(run)
    expected = load_run(run).requests
    pack_runs([run], log_tail=None)
    assert sorted(p.name for p in run.iterdir()) == ["requests.parquet", "run.json.xz", "telemetry.parquet"]
    assert_frame_equal(load_run(run).requests, expected)
    pl.read_parquet(run / "requests.parquet").write_parquet(run / COLUMNS_COPY)
    with pytest.raises(RunFolderError) as err:
        load_run(run)
    assert str(err.value).startswith(f"{run}/{COLUMNS_COPY}: a copy of requests.jsonl, beside requests.parquet")


def test_the_replay_end_writes_a_copy_only_for_a_big_jsonl(run: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    with (sparse / "requests.jsonl").open("wb") as fh:
        fh.truncate(COPY_MIN_BYTES - 1)
    assert not wants_copy(sparse)
    with (sparse / "requests.jsonl").open("wb") as fh:
        fh.truncate(COPY_MIN_BYTES)
    assert wants_copy(sparse)
    # the tests' own threshold (TRACEBENCH_COPY_MIN_BYTES): a small run gets its copy too
    monkeypatch.setenv(COPY_MIN_BYTES_ENV, str(COPY_MIN_BYTES + 1))
    assert not wants_copy(sparse)
    monkeypatch.setenv(COPY_MIN_BYTES_ENV, "12 MiB")
    with pytest.raises(ConfigError, match=f"environment variable {COPY_MIN_BYTES_ENV}='12 MiB': expected a number"):
        wants_copy(sparse)
    monkeypatch.delenv(COPY_MIN_BYTES_ENV)

    _finish_run_folder(run)  # 720 records: no copy
    assert capsys.readouterr().out == f"{run}\n" and not (run / COLUMNS_COPY).exists()
    # the same records again and again, past the size that gets a copy (ids repeat: the report would refuse them,
    # the copy holds them as they are)
    data = (run / "requests.jsonl").read_bytes()
    (run / "requests.jsonl").write_bytes(data * (COPY_MIN_BYTES // len(data) + 1))
    (run / COLUMNS_COPY).mkdir()  # a copy that cannot be written (here: a folder is in its place)
    (run / COLUMNS_COPY / "x").touch()
    _finish_run_folder(run)
    out, err = capsys.readouterr()
    assert out == f"{run}\n"
    assert err.startswith(f"tracebench replay: warning: {run}/{COLUMNS_COPY}: not written (") and \
        "the run is whole without it" in err
    assert sorted(p.name for p in run.iterdir()) == [COLUMNS_COPY, "requests.jsonl", "run.json", "telemetry.jsonl"]
    shutil.rmtree(run / COLUMNS_COPY)
    _finish_run_folder(run)
    assert capsys.readouterr() == (f"{run}\n", "")
    assert pl.scan_parquet(run / COLUMNS_COPY).select(pl.len()).collect().item() == 720 * (COPY_MIN_BYTES // len(data) + 1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_the_copy_is_written_leaves_the_run_whole(run: Path, sig: int,
                                                                      capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay command's end (`_finish_run_folder`), here in this process, stopped by a real signal while polars
    writes the copy: the copy's temporary name is a named pipe of one page, so the write waits in it; a thread sends
    the signal once bytes of the copy are in the pipe, then reads the rest (the process test, with SIGTERM:
    tests/test_replay_robust.py)."""
    monkeypatch.setenv(COPY_MIN_BYTES_ENV, "0")
    temp = run / f".{COLUMNS_COPY}.writing-{os.getpid()}"
    os.mkfifo(temp)
    pipe = os.open(temp, os.O_RDWR | os.O_NONBLOCK)  # read and write ends: no open waits, no end-of-file
    import fcntl

    fcntl.fcntl(pipe, fcntl.F_SETPIPE_SZ, 4096)
    done = threading.Event()

    def stop_it() -> None:
        while not select.select([pipe], [], [], 0.05)[0]:  # the first bytes of the copy
            if done.is_set():  # the call returned without writing to the pipe: no signal (the test fails)
                return
        os.kill(os.getpid(), sig)
        while not done.is_set():
            if select.select([pipe], [], [], 0.05)[0]:
                os.read(pipe, 1 << 16)

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    thread = threading.Thread(target=stop_it)
    thread.start()
    try:
        with pytest.raises(SystemExit) as stop:
            _finish_run_folder(run)
    finally:
        done.set()
        thread.join()
        os.close(pipe)
    assert stop.value.code == 128 + sig
    assert capsys.readouterr() == (f"{run}\n", f"tracebench replay: stopped by {signal.Signals(sig).name} while "
                                   f"writing {run}/{COLUMNS_COPY}: not written; the run is whole without it\n")
    assert sorted(p.name for p in run.iterdir()) == ["requests.jsonl", "run.json", "telemetry.jsonl"]
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # put back


def test_a_killed_copys_temporary_file_is_never_read_and_pack_removes_it(run: Path) -> None:
    """SIGKILL while the copy was written leaves .requests.columns.parquet.writing-<pid>: no reader opens it, and
    pack (the one command that rewrites a finished run) removes it, saying so, as it removes its own killed files;
    one whose writer runs stops the pack."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = run / f".{COLUMNS_COPY}.writing-{dead.pid}"
    stale.write_bytes(b"PAR1 half a copy")
    expected = load_run(run).requests  # read from requests.jsonl
    assert expected.height == 720
    running = run / f".{COLUMNS_COPY}.writing-1"  # pid 1 always runs
    running.write_bytes(b"")
    done = run_cli("pack", str(run))
    assert done.returncode == 2 and done.stderr == (
        f"tracebench: removed {stale}, left by a replay (pid {dead.pid}, no longer running) killed while it wrote the "
        "run's columnar copy\n"
        f"tracebench: error: run '{run}': {running.name} belongs to pid 1, which is running: a tracebench replay still "
        "writing this run's columnar copy? (if pid 1 is no tracebench, remove the file)\n")
    assert not stale.exists() and (run / "requests.jsonl").exists()
    running.unlink()
    done = run_cli("pack", str(run))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in run.iterdir()) == ["requests.parquet", "run.json.xz", "telemetry.parquet"]
    assert_frame_equal(load_run(run).requests, expected)


@pytest.mark.parametrize("command", ["replay", "sweep"])
def test_a_bad_copy_threshold_stops_replay_and_sweep_before_their_run(tmp_path: Path, command: str) -> None:
    """TRACEBENCH_COPY_MIN_BYTES (for tests) is read when a run ends, for its columnar copy; a value that is not a
    number of bytes is refused before the run starts (exit 2), not after it: no run folder, no server started."""
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "5", "--num-requests", "3", "--seed", "0", "-o", str(trace)).returncode == 0
    extra = ["--rates", "5"] if command == "sweep" else []
    done = run_cli_process(command, str(trace), "--backend", "sim", *extra, "--out-dir", str(tmp_path / "out"),
                           "--quiet", env={COPY_MIN_BYTES_ENV: "12 MiB"}, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"tracebench: error: environment variable {COPY_MIN_BYTES_ENV}='12 MiB': expected a number of bytes >= 0")
    assert not (tmp_path / "out").exists()

"""`tracebench pack` on run folders written by a real replay against launched sim servers (real processes, real
HTTP): the packed folder holds every record of the original (checked here independently: json, lzma), reports exactly
as the original, and packing refuses what it must without touching the folder."""

from __future__ import annotations

import json
import lzma
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import free_port, run_cli, tracebench_cmd

# machine paths in the samples below are written f"{ROOT}home/...": literally they would be what
# tests/test_no_machine_paths.py refuses in a committed file
ROOT = "/"
METRICS_TEXTS = {f"metrics-{i}-{when}.txt" for i in (0, 1) for when in ("start", "end")}
PACKED = {"run.json.xz", "requests.parquet", "telemetry.parquet", "server_metrics.parquet", "server-0.log.xz",
          "server-1.log.xz", *(f"{name}.xz" for name in METRICS_TEXTS)}


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One finished run folder (replay --backend sim, two launched servers, so it has server logs). Never modified:
    each test packs a copy."""
    root = tmp_path_factory.mktemp("pack-runs")
    trace = root / "t.jsonl"
    done = run_cli("generate", "--rate", "10", "--num-requests", "120", "--seed", "3", "--input-len", "200",
                   "--output-len", "40", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    done = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "10", "--policy", "sjf",
                   "--max-running-requests", "4", "--out-dir", str(root / "reports"), "--run-name", "run", "--quiet",
                   "--port-base", str(free_port(2)))
    assert done.returncode == 0, done.stderr
    folder = root / "reports" / "run"
    assert {p.name for p in folder.iterdir()} == {"run.json", "requests.jsonl", "telemetry.jsonl",
                                                  "server_metrics.jsonl", "server-0.log", "server-1.log", *METRICS_TEXTS}
    return folder


@pytest.fixture
def copy(original: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    shutil.copytree(original, folder)
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_packed_folder_holds_every_record_and_reports_the_same(original: Path, copy: Path) -> None:
    done = run_cli("pack", str(copy))
    assert done.returncode == 0, done.stderr
    assert f"packed {copy}:" in done.stderr
    assert {p.name for p in copy.iterdir()} == PACKED  # originals gone, no temporary left
    assert lzma.decompress((copy / "run.json.xz").read_bytes()) == (original / "run.json").read_bytes()
    for i in (0, 1):
        assert lzma.decompress((copy / f"server-{i}.log.xz").read_bytes()) == (original / f"server-{i}.log").read_bytes()
    requests = pl.read_parquet(copy / "requests.parquet")
    records = _jsonl(original / "requests.jsonl")
    assert len(records) == 120
    assert requests.columns == list(records[0])  # the columns in the order replay writes them
    assert requests.to_dicts() == records  # same rows, same order (finishing order), same values
    telemetry = pl.read_parquet(copy / "telemetry.parquet")
    lines = _jsonl(original / "telemetry.jsonl")
    assert len(lines) > 2
    assert telemetry.to_dicts() == [{name: line.get(name) for name in telemetry.columns} for line in lines]
    assert telemetry.schema["healthy"] == pl.Boolean and telemetry.schema["cap"] == pl.Int64
    # every number the report prints, from the original and from the packed folder
    for fmt in ("csv", "md"):
        before = run_cli("report", str(original), "--format", fmt)
        after = run_cli("report", str(copy), "--format", fmt)
        assert before.returncode == 0 and after.returncode == 0, before.stderr + after.stderr
        assert after.stdout.replace(str(copy), str(original)) == before.stdout


def test_log_tail_keeps_only_the_end_of_each_server_log(copy: Path) -> None:
    # a sim server logs one line; a real sglang log is thousands: lengthen the logs as sglang would
    logs = {}
    for i in (0, 1):
        path = copy / f"server-{i}.log"
        logs[i] = path.read_bytes() + b"".join(b"[2026-11-22] Decode batch, #running-req: %d\n" % n for n in range(10))
        path.write_bytes(logs[i])
    done = run_cli("pack", str(copy), "--log-tail", "3")
    assert done.returncode == 0, done.stderr
    for i in (0, 1):
        lines = logs[i].splitlines(keepends=True)
        assert lzma.decompress((copy / f"server-{i}.log.xz").read_bytes()) == b"".join(lines[-3:])


def test_refuses_a_packed_or_unfinished_run_and_leaves_it_untouched(copy: Path) -> None:
    assert run_cli("pack", str(copy)).returncode == 0
    before = _snapshot(copy)
    done = run_cli("pack", str(copy))
    assert done.returncode == 2
    assert done.stderr.startswith(f"tracebench: error: {copy}: already packed (it has ")
    assert _snapshot(copy) == before


def test_refuses_a_run_given_twice(copy: Path) -> None:
    before = _snapshot(copy)
    done = run_cli("pack", str(copy), str(copy / ".." / "run"))
    assert done.returncode == 2 and "is given twice" in done.stderr
    assert _snapshot(copy) == before


def test_refuses_a_running_run(copy: Path) -> None:
    meta = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**meta, "status": "running"}))
    before = _snapshot(copy)
    done = run_cli("pack", str(copy))
    assert done.returncode == 2
    assert f"{copy}/run.json: field 'status': 'running': the run is not finished" in done.stderr
    assert _snapshot(copy) == before


def test_all_or_nothing_over_several_runs(copy: Path) -> None:
    broken = copy.with_name("broken")
    shutil.copytree(copy, broken)
    lines = (broken / "requests.jsonl").read_text().splitlines(keepends=True)
    lines[6] = lines[6].replace('"status":"ok"', '"status":"weird"')
    (broken / "requests.jsonl").write_text("".join(lines))
    before = {folder: _snapshot(folder) for folder in (copy, broken)}
    done = run_cli("pack", str(copy), str(broken))
    assert done.returncode == 2
    assert f"{broken}/requests.jsonl:7: field 'status': must be one of" in done.stderr
    assert {folder: _snapshot(folder) for folder in (copy, broken)} == before  # the good run is not packed either


def test_a_field_outside_the_run_format_is_not_dropped(copy: Path) -> None:
    lines = (copy / "requests.jsonl").read_text().splitlines(keepends=True)
    lines[2] = lines[2].replace('{"id"', '{"note":"x","id"', 1)
    (copy / "requests.jsonl").write_text("".join(lines))
    before = _snapshot(copy)
    done = run_cli("pack", str(copy))
    assert done.returncode == 2
    assert f"{copy}/requests.jsonl:3: field 'note': not a field of the run format" in done.stderr
    assert _snapshot(copy) == before


def test_reader_names_a_broken_packed_record_and_a_half_packed_folder(copy: Path) -> None:
    assert run_cli("pack", str(copy)).returncode == 0
    path = copy / "requests.parquet"
    frame = pl.read_parquet(path)
    frame.with_columns(pl.when(pl.int_range(pl.len()) == 9).then(pl.lit(-5.0)).otherwise(pl.col("t_arrival"))
                       .alias("t_arrival")).write_parquet(path)
    done = run_cli("report", str(copy))
    assert done.returncode == 2
    assert done.stderr.startswith(f"tracebench: error: {path}:10: field 't_arrival': must be >= 0, got -5.0")
    frame.drop("server").write_parquet(path)
    done = run_cli("report", str(copy))
    assert done.returncode == 2 and f"{path}: field 'server': missing column" in done.stderr
    frame.write_parquet(path)
    (copy / "requests.jsonl").write_text("")
    done = run_cli("report", str(copy))
    assert done.returncode == 2
    assert f"{copy}: has both requests.jsonl and requests.parquet (a `tracebench pack` was interrupted)" in done.stderr


def test_help_names_every_file_and_option() -> None:
    done = run_cli("pack", "--help")
    assert done.returncode == 0
    for word in ("run.json.xz", "requests.parquet", "telemetry.parquet", "server-<i>.log.xz", "--log-tail",
                 "--reports-dir", "All or nothing", "--shareable"):
        assert word in done.stdout


def test_the_router_log_of_a_run_through_sglang_router_is_packed_too(copy: Path) -> None:
    router_log = b"".join(b"router line %d\n" % n for n in range(10))
    (copy / "router.log").write_bytes(router_log)
    done = run_cli("pack", str(copy), "--log-tail", "4")
    assert done.returncode == 0, done.stderr
    assert not (copy / "router.log").exists()
    assert lzma.decompress((copy / "router.log.xz").read_bytes()) == b"".join(router_log.splitlines(keepends=True)[-4:])


def test_replay_records_no_absolute_path(original: Path) -> None:
    # the trace and --out-dir were given as absolute paths outside the working folder
    text = (original / "run.json").read_text()
    assert '": "/' not in text and '"/' not in text and str(original.parent) not in text
    meta = json.loads(text)
    assert meta["trace"]["path"] == meta["options"]["trace"] == "…/t.jsonl" and meta["options"]["out_dir"] == "…/reports"
    assert meta["policy"]["file"] == "tracebench/policies/sjf.py"  # a built-in: where it is in any install


def test_shareable_rewrites_machine_paths_and_reports_the_same(original: Path, copy: Path) -> None:
    # what an older tracebench, or a server's own answer, recorded: paths of the machine
    meta = json.loads((copy / "run.json").read_text())
    meta["options"]["out_dir"] = f"{ROOT}home/me/reports"  # where the run folder was written
    meta["policy"]["file"] = f"{ROOT}home/me/tb/tracebench/policies/sjf.py"
    meta["servers"][0]["server_info"]["model_path"] = f"{ROOT}tmp/A/llama-2-7b-hf"
    meta["trace"]["header"]["args"] = {"dataset": f"..{ROOT}data/a.csv", "note": f"in {ROOT}root/x for /v1/loads"}
    meta["events"] = [{"t": 1.0, "kind": "server_down", "server": 1, "detail": f"see {ROOT}home/me/reports/run/server-1.log"}]
    (copy / "run.json").write_text(json.dumps(meta, indent=2))
    (copy / "server-1.log").write_bytes(f"{ROOT}opt/sgl-overlay/x.py:56: Warn\n".encode() + b"\xff POST /generate\n")
    # sglang's /metrics labels name the model by its path
    (copy / "metrics-0-end.txt").write_text(f'sglang:num_requests_total{{model_name="{ROOT}tmp/A/llama-2-7b-hf"}} 3.0\n')
    done = run_cli("pack", str(copy), "--shareable")
    assert done.returncode == 0, done.stderr
    shared = json.loads(lzma.decompress((copy / "run.json.xz").read_bytes()))
    assert (shared["options"]["out_dir"], shared["policy"]["file"]) == ("…/reports", "…/sjf.py")
    assert shared["servers"][0]["server_info"]["model_path"] == "…/llama-2-7b-hf"
    assert shared["trace"]["header"]["args"] == {"dataset": "…/a.csv", "note": "in …/x for /v1/loads"}
    assert shared["events"][0]["detail"] == "see server-1.log"  # inside the run folder where it was written
    assert lzma.decompress((copy / "server-1.log.xz").read_bytes()) == "…/x.py:56: Warn\n".encode() + b"\xff POST /generate\n"
    assert lzma.decompress((copy / "metrics-0-end.txt.xz").read_bytes()).decode() == (
        'sglang:num_requests_total{model_name="…/llama-2-7b-hf"} 3.0\n')
    changed = ("options", "policy", "servers", "trace", "events")
    assert {k: v for k, v in shared.items() if k not in changed} == {k: v for k, v in meta.items() if k not in changed}
    before = run_cli("report", str(original), "--format", "csv")
    after = run_cli("report", str(copy), "--format", "csv")
    assert before.returncode == 0 and after.returncode == 0, before.stderr + after.stderr
    assert after.stdout.replace(str(copy), str(original)) == before.stdout


def test_shareable_on_a_packed_run_rewrites_only_its_run_json_and_logs(copy: Path) -> None:
    (copy / "server-0.log").write_bytes(f"loaded {ROOT}Users/me/llama\n".encode())
    assert run_cli("pack", str(copy)).returncode == 0  # packed as it is: the path kept
    tables = {name: (copy / name).read_bytes() for name in ("requests.parquet", "telemetry.parquet", "run.json.xz")}
    done = run_cli("pack", str(copy), "--shareable")
    assert done.returncode == 0 and f"made shareable {copy}:" in done.stderr, done.stderr
    assert {p.name for p in copy.iterdir()} == PACKED  # in place, no temporary left
    assert lzma.decompress((copy / "server-0.log.xz").read_bytes()) == "loaded …/llama\n".encode()
    assert {name: (copy / name).read_bytes() for name in tables} == tables  # run.json had no path: the same bytes


# ---- stop signals, killed packs, a read-only folder (issue 20 items 8, 13) ----------------------------------------

def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporary_files_of_a_killed_pack_are_removed_and_said(copy: Path) -> None:
    stale = copy / f".requests.parquet.packing-{_dead_pid()}"
    stale.write_bytes(b"half a parquet file")
    done = run_cli("pack", str(copy))
    assert done.returncode == 0, done.stderr
    assert f"removed {stale}, left by a pack (pid " in done.stderr and "no longer running" in done.stderr
    assert {p.name for p in copy.iterdir()} == PACKED


def test_a_pack_still_running_on_the_folder_stops_the_call(copy: Path) -> None:
    (copy / ".run.json.xz.packing-1").write_bytes(b"")  # pid 1 always runs
    before = _snapshot(copy)
    done = run_cli("pack", str(copy))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert ".run.json.xz.packing-1 belongs to pid 1, which is running: another tracebench pack" in done.stderr
    assert _snapshot(copy) == before


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_leaves_the_run_as_it_was_or_packed_and_no_temporary_file(copy: Path, sig: int) -> None:
    before = _snapshot(copy)
    proc = subprocess.Popen(tracebench_cmd("pack", str(copy)), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(copy.glob(".*.packing-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.001)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, err
    assert not list(copy.glob(".*")), "no temporary file left"
    if err.startswith(f"tracebench: error: pack stopped by {signal.Signals(sig).name}: nothing was packed"):
        assert _snapshot(copy) == before
    else:  # the signal came while the packed files were being put in place: that is finished first
        assert f"{signal.Signals(sig).name} came while the packed files were being put in place" in err
        assert {p.name for p in copy.iterdir()} == PACKED


def test_a_read_only_run_folder_is_one_line_and_left_as_it_was(copy: Path, read_only) -> None:
    before = _snapshot(copy)
    read_only(copy)
    done = run_cli("pack", str(copy))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"tracebench: error: {copy}/.run.json.xz.packing-")
    assert "(nothing was packed; every run is as it was)" in done.stderr
    assert _snapshot(copy) == before

"""`run_cli` runs the commands that start no server inside the pytest process (tests/conftest.py
run_cli_in_process): the same click entry point as `python -m tracebench`, without the process. Here both paths are
run on the same arguments and must answer the same: exit status, stdout, stderr. (`report` is compared on real runs in
tests/test_report_cli.py, test_report_answers_the_same_in_process.)"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import IN_PROCESS_COMMANDS, REPO, on_virtual_clock, run_cli, run_cli_in_process, run_cli_process

# A bug planted in `inspect` (both paths get the same one): two warnings, one a fresh interpreter hides
# (DeprecationWarning outside __main__) and one it prints, then an exception nothing catches.
PLANT = '''
import warnings
import tracebench.trace.inspect as target

def planted(*args, **kwargs):
    warnings.warn_explicit("planted deprecation", DeprecationWarning, "tracebench/planted.py", 1)
    warnings.warn_explicit("planted warning", UserWarning, "tracebench/planted.py", 2)
    raise RuntimeError("planted bug")
'''


def same(args: list[str], cwd: Path | None = None,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    inside, process = run_cli_in_process(*args, cwd=cwd, env=env), run_cli_process(*args, cwd=cwd, env=env)
    assert (inside.returncode, inside.stdout, inside.stderr) == (process.returncode, process.stdout, process.stderr)
    return inside


def test_success_bad_input_and_usage_errors_answer_as_the_process(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    done = same(["generate", "--num-requests", "20", "--seed", "3", "--workload", "shared-prompt", "--groups", "2",
                 "--prefix-len", "100", "-o", str(trace)])
    assert done.returncode == 0 and "only 64 of the 100 tokens" in done.stderr and str(trace) in done.stdout
    # relative paths and the default output folder follow cwd
    done = same(["generate", "--num-requests", "5", "--seed", "4"], cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / done.stdout.splitlines()[0]).is_file()
    assert same(["inspect", "t.jsonl", "--servers", "2"], cwd=tmp_path).returncode == 0
    assert same(["inspect", str(trace), "--json"]).returncode == 0
    assert same(["policies"]).returncode == 0
    narrow = same(["policies"], env={"COLUMNS": "80"})  # the environment given: here, the terminal's width
    assert narrow.returncode == 0 and max(map(len, narrow.stdout.splitlines())) <= 80
    assert os.environ["COLUMNS"] == "120"  # put back (tests/conftest.py)
    assert same(["pack", "--help"]).returncode == 0
    # bad input: one line, exit 2; a usage error: click's lines naming `python -m tracebench`, exit 2
    lines = trace.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace('"input_len"', '"inputlen"')
    (tmp_path / "bad.jsonl").write_text("".join(lines))
    done = same(["inspect", str(tmp_path / "bad.jsonl")])
    assert done.returncode == 2 and done.stderr.startswith(f"tracebench: error: {tmp_path / 'bad.jsonl'}:4:")
    done = same(["generate", "--num-requests", "-3", "-o", str(trace)])
    assert done.returncode == 2 and done.stderr.startswith("tracebench: error:")
    done = same(["inspect", "--no-such-option"])
    assert done.returncode == 2 and done.stderr.startswith("Usage: python -m tracebench inspect")


def test_a_bug_shows_its_traceback_and_exits_1_as_the_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--num-requests", "5", "-o", str(trace)).returncode == 0
    code = PLANT + "target.trace_stats = planted\nimport runpy\nrunpy.run_module('tracebench', run_name='__main__')\n"
    process = subprocess.run([sys.executable, "-c", code, "inspect", str(trace)], capture_output=True, text=True,
                             timeout=60)
    planted: dict[str, object] = {}
    exec(PLANT, planted)
    monkeypatch.setattr(planted["target"], "trace_stats", planted["planted"])
    inside = run_cli_in_process("inspect", str(trace))
    assert process.returncode == inside.returncode == 1 and process.stdout == inside.stdout == ""
    # the same warning line, the traceback from tracebench's entry on (the frames above it: runpy's or this test's)
    for err in (process.stderr, inside.stderr):
        lines = err.splitlines()
        assert lines[0] == "tracebench/planted.py:2: UserWarning: planted warning", err
        assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "RuntimeError: planted bug", err
        assert "planted deprecation" not in err
    tail = [err[err.index(f'File "{REPO / "tracebench" / "cli.py"}"'):] for err in (process.stderr, inside.stderr)]
    assert tail[0] == tail[1]


def test_nothing_of_the_call_stays_in_this_process(tmp_path: Path) -> None:
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    streams, cwd, filters = (sys.stdout, sys.stderr), os.getcwd(), list(warnings.filters)
    # generate installs SIGINT/SIGTERM handlers while it writes (tracebench/cleanup.py)
    assert run_cli("generate", "--num-requests", "5", "-o", "t.jsonl", cwd=tmp_path).returncode == 0
    assert run_cli("inspect", "missing.jsonl", cwd=tmp_path).returncode == 2
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert (sys.stdout, sys.stderr) == streams and os.getcwd() == cwd and warnings.filters == filters


def test_fresh_warning_filters_are_a_fresh_interpreters() -> None:
    from conftest import FRESH_WARNING_FILTERS

    code = ("import warnings; "
            "print([(a, c.__name__, getattr(m, 'pattern', m) or '') for a, _, c, m, _ in warnings.filters])")
    fresh = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert fresh.strip() == str([(a, c.__name__, m) for a, c, m in FRESH_WARNING_FILTERS])


def test_commands_that_start_servers_stay_processes() -> None:
    assert IN_PROCESS_COMMANDS.isdisjoint({"replay", "record", "sweep", "sim-server"})
    # replay and sweep come in only on the virtual clock, and not onto a Ray cluster
    assert on_virtual_clock(("replay", "t.jsonl", "--clock", "virtual", "--gpus", "2"))
    assert on_virtual_clock(("sweep", "t.jsonl", "--rates", "2", "--clock=virtual"))
    for args in (("replay", "t.jsonl", "--backend", "sim"), ("replay", "t.jsonl", "--clock", "real"),
                 ("sweep", "t.jsonl", "--clock", "virtual", "--ray", "auto"), ("record", "--clock", "virtual"),
                 ("replay", "virtual", "--clock", "real"), ("sim-server", "--clock", "virtual")):
        assert not on_virtual_clock(args), args


def _wall_time_masked(stderr: str) -> str:
    """The virtual run's end line says how long the host took: the one figure two runs never share."""
    return re.sub(r"\([0-9.]+ s of wall time, [0-9,]+x real time\)", "(WALL)", stderr)


def test_a_virtual_replay_answers_as_the_process_and_leaves_nothing_behind(tmp_path: Path) -> None:
    """run_cli runs `replay --clock virtual` in this process (conftest.on_virtual_clock): the same exit status, stdout,
    stderr (but for the host's wall time) and byte-identical records as the process; a refusal the same too; the
    signal handlers it installs and the gc.freeze() of its run do not stay."""
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--workload", "shared-prompt", "--groups", "3", "--prefix-len", "256",
                   "--num-requests", "60", "--rate", "20", "--seed", "2", "-o", str(trace)).returncode == 0
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    answers = {}
    for where, run in (("inside", run_cli_in_process), ("process", run_cli_process)):
        done = run("replay", str(trace), "--clock", "virtual", "--gpus", "2", "--policy", "cache_aware",
                   "--max-running-requests", "4", "--run-name", "r", "--out-dir", str(tmp_path / where))
        assert done.returncode == 0, done.stderr
        answers[where] = (done.stdout.replace(where, "WHERE"), _wall_time_masked(done.stderr).replace(where, "WHERE"),
                          (tmp_path / where / "r" / "requests.jsonl").read_bytes())
    assert "(WALL)" in answers["inside"][1], answers["inside"][1]
    assert answers["inside"] == answers["process"]
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers and gc.get_freeze_count() == 0
    refused = same(["replay", str(trace), "--clock", "virtual", "--speed", "4", "--out-dir", str(tmp_path / "no")])
    assert refused.returncode == 2 and "--clock virtual: --speed cannot be used" in refused.stderr, refused.stderr

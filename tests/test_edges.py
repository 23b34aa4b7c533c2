"""The edges of the commands outside the replay (issue 20 items 8, 10, 13): every number option in range, stop signals
and killed processes leave no temporary file behind, an output that cannot be written or an address that cannot be
bound is one line naming it. Record's own edges are in test_record.py, pack's in test_pack.py."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from conftest import free_port, run_cli, tracebench_cmd
from tracebench.cli import _COMMANDS, main
from tracebench.errors import ConfigError
from tracebench.options import BoundedInt, FiniteFloat
from tracebench.replay.run import ReplayConfig

# Arguments with which each command stops at once once its options are read (a file that is not there, a profile
# that does not exist): an option the parser lets through gives another error, never a command that runs.
_STOPS_AT_ONCE = {
    "generate": ["--num-requests", "3", "-o", "{tmp}/g.jsonl"],
    "inspect": ["{tmp}/none.jsonl"],
    "replay": ["{tmp}/none.jsonl", "--backend", "sim"],
    "sweep": ["{tmp}/none.jsonl", "--backend", "sim", "--rates", "1,2"],
    "sim-server": ["--port", "1", "--profile", "{tmp}/none"],
    "report": ["{tmp}/none"],
    "pack": ["{tmp}/none"],
    "record": ["--listen", "127.0.0.1:1", "--upstream", "http://127.0.0.1:1", "-o", "{tmp}/r.jsonl"],
    "policies": [],
}
# options that only apply together with another
_NEEDS = {("generate", "--burstiness"): ["--arrival", "gamma"], ("replay", "--batch-timeout"): ["--mode", "static"],
          ("replay", "--batch-size"): ["--mode", "static"]}


def _number_options() -> list[tuple[str, click.Option]]:
    ctx = click.Context(main)
    found = []
    for name in sorted(_COMMANDS):
        command = main.get_command(ctx, name)
        assert command is not None
        numbers = (click.types.FloatParamType, click.types.IntParamType, FiniteFloat, BoundedInt)
        found += [(name, p) for p in command.params if isinstance(p, click.Option) and isinstance(p.type, numbers)]
    return found


def _invoke(tmp_path: Path, command: str, flag: str, value: str) -> tuple[int, str]:
    args = [a.format(tmp=tmp_path) for a in _STOPS_AT_ONCE[command]] + _NEEDS.get((command, flag), [])
    result = CliRunner().invoke(main, [command, *args, flag, value])
    return result.exit_code, result.output


def test_every_number_option_is_checked_by_the_parser() -> None:
    """click's FLOAT takes nan and inf, its INT any size: no option of any command uses them."""
    options = _number_options()
    assert len(options) > 30
    plain = [f"{name} {max(p.opts, key=len)}" for name, p in options
             if not isinstance(p.type, (FiniteFloat, BoundedInt))]
    assert not plain, f"options read with click's own number types: {plain}"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_no_float_option_takes_a_value_that_is_not_a_finite_number(tmp_path: Path, value: str) -> None:
    floats = [(name, p) for name, p in _number_options()
              if isinstance(p.type, (click.types.FloatParamType, FiniteFloat))]
    assert {name for name, _ in floats} >= {"generate", "replay", "sim-server", "report"}
    for name, option in floats:
        flag = max(option.opts, key=len)
        code, out = _invoke(tmp_path, name, flag, value)
        assert code == 2 and out.count("\n") == 1 and f"{flag} must be a finite number, got {value}" in out, \
            f"{name} {flag} {value}: exit {code}: {out}"


@pytest.mark.parametrize("value", [str(10**26), "1e26", "-" + str(10**26)])
def test_no_integer_option_takes_a_value_outside_its_range(tmp_path: Path, value: str) -> None:
    ints = [(name, p) for name, p in _number_options() if isinstance(p.type, (click.types.IntParamType, BoundedInt))]
    for name, option in ints:
        flag = max(option.opts, key=len)
        code, out = _invoke(tmp_path, name, flag, value)
        assert code == 2 and out.count("\n") == 1 and out.startswith(f"tracebench: error: {flag} must be "), \
            f"{name} {flag} {value}: exit {code}: {out}"
    code, out = _invoke(tmp_path, "generate", "--seed", value)
    assert "--seed must be an integer from 0 to 2^63-1" in out


@pytest.mark.parametrize("field,value,expected", [
    ("speed", float("inf"), "--speed must be > 0 and finite, got inf"),
    ("timeout", float("inf"), "--timeout must be > 0 and finite"),
    ("poll_interval", float("nan"), "--poll-interval must be > 0 and finite"),
    ("speed", 1e-300, "--speed must be between 0.001 and 1e+06"),
    ("seed", 10**26, "--seed must be an integer from 0 to 2^63-1"),
    ("seed", -1, "--seed must be an integer from 0 to 2^63-1"),
])
def test_replay_config_refuses_what_the_cli_would(field: str, value: float, expected: str) -> None:
    """ReplayConfig.resolve, for the library's callers (bench scripts) that skip the CLI."""
    with pytest.raises(ConfigError, match=expected.replace("+", r"\+").replace("^", r"\^")):
        ReplayConfig(trace=Path("t.jsonl"), backend="sim", **{field: value}).resolve()


def test_sim_server_speed_out_of_range_is_refused(tmp_path: Path) -> None:
    for value in ("1e-300", "1e300"):
        code, out = _invoke(tmp_path, "sim-server", "--speed", value)
        assert code == 2 and "--speed must be between 0.001 and 1e+06" in out, out


@pytest.mark.parametrize("args,expected", [
    (["--rate", "1e-300", "--num-requests", "3"], "--rate 1e-300 req/s put the last arrival at"),
    (["--rate", "1e-5", "--num-requests", "100000"], "within 1,000,000,000 s"),
    (["--duration", "1e300"], "--duration must be a number of seconds > 0 and at most 1,000,000,000"),
    (["--workload", "multi-turn", "--think-time", "1e300"], "--think-time 1e300 s put the last arrival"),
    (["--arrival", "gamma", "--burstiness", "1e308"], "--burstiness must be a number from 0.001 to 1000"),
    (["--arrival", "gamma", "--burstiness", "1e-300"], "--burstiness must be a number from 0.001 to 1000"),
    (["--length-spread", "1e308"], "too wide for lognormal lengths (at most 100"),
    (["--max-context", str(10**17)], "--max-context must be at least 2"),
    (["--workload", "shared-prompt", "--groups", str(10**9)], "--groups must be an integer >= 1 and at most"),
])
def test_generate_refuses_a_trace_it_cannot_write_sensibly(tmp_path: Path, args: list[str], expected: str) -> None:
    """--rate 1e-300 used to write arrival times of 300 digits."""
    result = CliRunner().invoke(main, ["generate", *args, "-o", str(tmp_path / "t.jsonl")])
    code, out = result.exit_code, result.output
    assert code == 2 and out.count("\n") == 1 and expected in out, out
    assert not list(tmp_path.iterdir())


# ---- stop signals and killed writers: no temporary file left (item 8) -------------------------------------------

def _wait_for(pattern: str, folder: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not list(folder.glob(pattern)):
        assert proc.poll() is None, f"ended (exit {proc.returncode}) before a file {pattern} appeared"
        assert time.monotonic() < deadline, f"no file {pattern} within {timeout} s"
        time.sleep(0.002)


def test_generate_stopped_by_sigterm_removes_its_temporary_file(tmp_path: Path) -> None:
    """SIGTERM used to end generate at once, leaving .NAME.tmp-PID (2.4 GB at 50M requests)."""
    # a trace with prefix blocks: formatted line by line, so its writing takes a while (~1 s) to stop in the middle
    proc = subprocess.Popen(tracebench_cmd("generate", "--num-requests", "300000", "--workload", "shared-prompt",
                                           "--groups", "4", "--prefix-len", "1024", "--input-len", "64", "-o",
                                           str(tmp_path / "t.jsonl")), stderr=subprocess.PIPE, text=True)
    _wait_for(".t.jsonl.tmp-*", tmp_path, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err == "tracebench: error: generate stopped by SIGTERM: nothing was written (no temporary file left)\n"
    assert not list(tmp_path.iterdir())


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_generate_removes_a_killed_generates_temporary_file_and_says_so(tmp_path: Path) -> None:
    dead, alive = tmp_path / f".t.jsonl.tmp-{_dead_pid()}", tmp_path / f".t.jsonl.tmp-{1}"  # pid 1 always runs
    dead.write_bytes(b"half a trace")
    alive.write_bytes(b"being written")
    done = run_cli("generate", "--num-requests", "5", "-o", str(tmp_path / "t.jsonl"))
    assert done.returncode == 0, done.stderr
    assert f"removed {dead}, the temporary file of an earlier generate" in done.stderr
    assert f"left {alive} alone: its writer (pid 1) is running" in done.stderr
    assert not dead.exists() and alive.read_bytes() == b"being written"


# ---- outputs that cannot be written, addresses that cannot be bound (item 13) -------------------------------------

def test_generate_into_a_read_only_folder(tmp_path: Path, read_only) -> None:
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    done = run_cli("generate", "--num-requests", "5", "-o", str(folder / "t.jsonl"))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"tracebench: error: -o {folder / 't.jsonl'}: cannot write: ")
    assert not list(folder.iterdir())


def test_record_into_a_read_only_folder(tmp_path: Path, read_only, sim_server) -> None:
    sim = sim_server("--speed", "50")
    (tmp_path / "ro").mkdir()
    folder = read_only(tmp_path / "ro")
    done = run_cli("record", "--listen", f"127.0.0.1:{free_port()}", "--upstream", sim.url, "-o",
                   str(folder / "t.jsonl"), timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"tracebench: error: -o {folder / 't.jsonl'}: cannot write in {folder} (")
    assert not list(folder.iterdir())


def test_sim_server_on_a_taken_port_or_a_bad_host(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        done = run_cli("sim-server", "--port", str(port), timeout=30)
    assert done.returncode == 2 and done.stderr == \
        f"tracebench: error: --host 127.0.0.1 --port {port}: cannot listen there (Address already in use)\n"
    done = run_cli("sim-server", "--port", str(free_port()), "--host", "no-such-host.invalid", timeout=30)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("tracebench: error: --host 'no-such-host.invalid': not an address to listen on")


def test_a_taken_pd_bootstrap_port_is_one_line(tmp_path: Path) -> None:
    # issue 33 item 12: sim-server --disaggregation-mode prefill on a taken bootstrap port gave a traceback; replay
    # --pd --port-base did not check the bootstrap ports (prefill server i's is base + servers + i)
    base = free_port(3)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 2))
        taken.listen(1)
        done = run_cli("sim-server", "--port", str(base), "--disaggregation-mode", "prefill",
                       "--disaggregation-bootstrap-port", str(base + 2), timeout=30)
        assert done.returncode == 2 and done.stderr == (
            f"tracebench: error: --host 127.0.0.1 --disaggregation-bootstrap-port {base + 2}: cannot listen there "
            "(Address already in use)\n"), done.stderr
        trace = tmp_path / "t.jsonl"
        assert run_cli("generate", "--num-requests", "4", "-o", str(trace)).returncode == 0
        done = run_cli("replay", str(trace), "--backend", "sim", "--pd", "1:1", "--port-base", str(base),
                       "--run-name", "pd", "--out-dir", str(tmp_path), "--quiet", timeout=60)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"server 0's PD bootstrap port {base + 2} on 127.0.0.1 is taken" in done.stderr, done.stderr
    run = json.loads((tmp_path / "pd" / "run.json").read_text())
    assert run["status"] == "not_started" and "bootstrap port" in run["error"]


def test_report_refuses_an_objective_that_is_not_finite(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(tmp_path / "none"), "--slo", "ttft=1e400"])
    assert result.exit_code == 2 and "--slo: ttft must be a finite number of seconds, got inf" in result.output


def test_record_options_without_a_recording(tmp_path: Path) -> None:
    """--listen and --upstream are required to record; --recover takes neither."""
    result = CliRunner().invoke(main, ["record", "-o", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and result.output.startswith("tracebench: error: --listen is required (or --recover")
    result = CliRunner().invoke(main, ["record", "--recover", "--listen", "127.0.0.1:1", "-o", str(tmp_path / "t")])
    assert result.exit_code == 2 and "--listen does not apply" in result.output
    result = CliRunner().invoke(main, ["record", "--recover", "-o", str(tmp_path / "t.jsonl")])
    assert result.exit_code == 2 and f"there is no part file {tmp_path / '.t.jsonl.part'}" in result.output
    assert not list(tmp_path.iterdir())

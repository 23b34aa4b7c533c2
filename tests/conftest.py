"""Shared fixtures. Servers are real processes on 127.0.0.1 (`python -m tracebench sim-server`); nothing is mocked."""

from __future__ import annotations

import gc
import io
import locale
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_DATA = REPO / "tests" / "data"  # kept in the repo: every test runs on a fresh clone (tests/data/README.md)
SGLANG_CAPTURES = TEST_DATA / "sglang-0.5.17"  # what real sglang 0.5.17 answered
AZURE_CSV = TEST_DATA / "AzureLLMInferenceTrace_conv.csv.xz"

# The terminal width every tracebench process of the tests lays its output out for (tracebench/termwidth.py): that of
# a pipe or a file. Set explicitly because the process environment may carry another (readline, loaded by pytest,
# exports COLUMNS=80 and LINES=24 to children when stdout is not a terminal); tests of other widths set their own.
os.environ["COLUMNS"] = "120"


def free_port(count: int = 1) -> int:
    """A port P with P..P+count-1 free on 127.0.0.1 (a launched server i listens on base + i), drawn at random from
    20000-32000: below the kernel's ephemeral range (32768+), where a client connection of this machine (the
    replay's own, a health poll) could take the port between this probe and the server's bind."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        socks = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free port(s) in 20000-32000")


def tracebench_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracebench", *args]


# The commands run_cli runs inside the pytest process: those that start no server, own no event loop, and restore the
# signal handlers they install (tracebench/cleanup.py StopSignals). A new Python process costs each call 0.2-0.4 CPU-s
# of imports (numpy, polars), and the suite makes ~110 such calls on 2 cores. `replay`, `record`, `sweep` and
# `sim-server` stay processes (servers, an asyncio loop, signal handlers of their own), and so does every test whose
# point is the process itself (a signal sent to it, an import check, determinism across processes): those call
# run_cli_process or subprocess with tracebench_cmd. tests/test_cli_in_process.py checks both paths answer the same.
IN_PROCESS_COMMANDS = frozenset({"generate", "inspect", "report", "pack", "policies"})
# `replay` and `sweep` on the virtual clock start no server process and wait on no host time (the simulated cluster is
# inside the command, its loop's clock jumps: docs/virtual-clock.md), so run_cli runs them in this process too: ~70
# calls of the suite, each ~0.4 CPU-s of imports as a process. Their loop is asyncio.Runner's (closed on return), the
# signal handlers they install are put back, and the replay's gc.freeze() is undone (run_cli_in_process). Not with
# --ray (a cluster of processes). A sweep's --jobs workers are still processes of their own (sweep/parallel.py).
VIRTUAL_COMMANDS = frozenset({"replay", "sweep"})
PROG_NAME = "python -m tracebench"  # what click names the program in `python -m tracebench` (its usage lines)
# The warning filters of a fresh interpreter (no -W, no PYTHONWARNINGS), innermost first: what decides which warnings
# the real process prints on its stderr (tests/test_cli_in_process.py compares them with a fresh interpreter's).
FRESH_WARNING_FILTERS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, ""),
                         ("ignore", PendingDeprecationWarning, ""), ("ignore", ImportWarning, ""),
                         ("ignore", ResourceWarning, "")]


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`tracebench ARGS` (cwd: its working folder; env: variables set on top of this process's environment): its exit
    status, stdout and stderr as `subprocess.run(..., capture_output=True, text=True)` gives them (check returncode
    yourself). IN_PROCESS_COMMANDS and virtual-clock runs (on_virtual_clock) run in this process (run_cli_in_process;
    `timeout` applies to processes only), the others as a process (run_cli_process)."""
    # a virtual run given environment variables stays a process: the simulator reads sglang's own variables once, at
    # import, as sglang does (sim/pd.py SGLANG_DISAGGREGATION_*), and this process imported it long ago
    if args and (args[0] in IN_PROCESS_COMMANDS or (on_virtual_clock(args) and not env)):
        return run_cli_in_process(*args, cwd=cwd, env=env)
    return run_cli_process(*args, cwd=cwd, env=env, timeout=timeout)


def on_virtual_clock(args: tuple[str, ...] | list[str]) -> bool:
    """`replay ... --clock virtual` or `sweep ... --clock virtual` without --ray: run_cli runs it in this process."""
    if not args or args[0] not in VIRTUAL_COMMANDS or "--ray" in args or any(a.startswith("--ray=") for a in args):
        return False
    return "--clock=virtual" in args or any(a == "--clock" and b == "virtual" for a, b in zip(args, args[1:]))


def run_cli_process(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
                    timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `tracebench ARGS` as a real process (`python -m tracebench`); returns the completed process."""
    return subprocess.run(tracebench_cmd(*args), cwd=cwd, env=None if env is None else {**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


def set_environ(values: dict[str, str | None]) -> dict[str, str | None]:
    """Set these environment variables (None: unset) and return what they were, in the same form (to put back)."""
    before = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    return before


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, file: object = None,
                  line: str | None = None) -> None:
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def run_cli_in_process(*args: str, cwd: Path | None = None,
                       env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run `tracebench ARGS` in this process through the same click entry point `python -m tracebench` calls
    (tracebench.cli.main, standalone), and answer as the process would: SystemExit's code as returncode; an uncaught
    exception as its traceback on stderr and returncode 1 (what Python does); stdout and stderr apart, in the locale's
    encoding, stderr with backslashreplace, newlines as text=True reads them; the warnings a fresh interpreter prints,
    on stderr. What the call changes in this process is put back: the working folder, `env`'s variables,
    sys.stdout/stderr, the warning filters, SIGINT/SIGTERM handlers, matplotlib figures left open, user policy modules
    in sys.modules."""
    from tracebench.cli import main

    encoding = locale.getpreferredencoding(False)
    out, err = io.BytesIO(), io.BytesIO()
    saved_streams, saved_cwd = (sys.stdout, sys.stderr), os.getcwd()
    saved_handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    saved_modules, saved_figures = set(sys.modules), _open_figures()
    frozen = gc.get_freeze_count()  # a replay freezes what it holds for its run (replay/run.py): undone after
    returncode = 0
    saved_env = set_environ(dict(env or {}))
    try:
        with warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module in reversed(FRESH_WARNING_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            warnings.showwarning = _show_warning
            # kept in locals until the bytes are read: a text wrapper closes its buffer when it goes
            stdout = sys.stdout = io.TextIOWrapper(out, encoding=encoding, write_through=True)
            stderr = sys.stderr = io.TextIOWrapper(err, encoding=encoding, errors="backslashreplace",
                                                   write_through=True)
            if cwd is not None:
                os.chdir(cwd)
            try:
                main.main(args=list(args), prog_name=PROG_NAME, standalone_mode=True)
            except SystemExit as stop:
                if stop.code is None or isinstance(stop.code, int):
                    returncode = stop.code or 0
                else:  # what Python does with sys.exit("text")
                    print(stop.code, file=sys.stderr)
                    returncode = 1
            except Exception:  # a bug: Python prints the traceback and exits 1
                sys.stderr.write(traceback.format_exc())
                returncode = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        set_environ(saved_env)
        for sig, handler in saved_handlers.items():
            signal.signal(sig, handler)
        for name in set(sys.modules) - saved_modules:
            if name.startswith("tracebench_user_policy_"):  # a policy file imported by path: fresh in every process
                del sys.modules[name]
        _close_figures_since(saved_figures)
        if frozen == 0 and gc.get_freeze_count():
            gc.unfreeze()

    def text(data: bytes) -> str:  # subprocess's text=True: universal newlines
        return data.decode(encoding).replace("\r\n", "\n").replace("\r", "\n")

    done = subprocess.CompletedProcess(tracebench_cmd(*args), returncode, text(out.getvalue()), text(err.getvalue()))
    stdout.detach(), stderr.detach()
    return done


def _open_figures() -> set[int]:
    pyplot = sys.modules.get("matplotlib.pyplot")
    return set(pyplot.get_fignums()) if pyplot is not None else set()


def _close_figures_since(before: set[int]) -> None:
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        for number in set(pyplot.get_fignums()) - before:
            pyplot.close(number)


@dataclass
class SimServer:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sim-server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"sim-server at {url} not healthy after {timeout}s:\n{log.read_text()[-3000:]}")


def served(url: str) -> int:
    """How many requests the sim-server at `url` has finished (its /metrics `sglang:num_requests_total`, summed
    over the stream label)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return int(sum(float(line.split()[-1]) for line in text.splitlines()
                   if line.startswith("sglang:num_requests_total{")))


def wait_served(urls: list[str], count: int, timeout: float = 60.0) -> None:
    """Until the sim-servers at `urls` have finished `count` requests between them. Tests that act on a run mid-way
    (kill a server, Ctrl-C) wait for this instead of sleeping: what they then check (some requests ok) holds however
    slowly a busy machine runs the replay."""
    deadline = time.monotonic() + timeout
    while (done := sum(served(url) for url in urls)) < count:
        assert time.monotonic() < deadline, f"{done} of the {count} requests waited for finished in {timeout} s"
        time.sleep(0.02)


def start_sim_server(folder: Path, *args: str, wait: bool = True) -> SimServer:
    """A sim-server process on a free port, its log in `folder`; with `wait`, once /health is 200. The caller stops
    it (`SimServer.stop`); module-scoped fixtures use `sim_servers`, tests the `sim_server` factory."""
    port = free_port()
    log = folder / f"sim-{port}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            tracebench_cmd("sim-server", "--port", str(port), *args),
            stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    server = SimServer(url=f"http://127.0.0.1:{port}", port=port, proc=proc, log=log)
    if wait:
        wait_healthy(server.url, proc, log)
    return server


@contextmanager
def sim_servers(folder: Path) -> Iterator[Callable[..., SimServer]]:
    """A factory of sim-servers (start_sim_server's arguments, logs in `folder`); every one it started is stopped on
    leaving. Module-scoped fixtures use it: `with sim_servers(tmp_path_factory.mktemp(...)) as start: ...`."""
    started: list[SimServer] = []

    def start(*args: str, wait: bool = True) -> SimServer:
        server = start_sim_server(folder, *args, wait=wait)
        started.append(server)
        return server

    try:
        yield start
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def sim_server(tmp_path: Path) -> Iterator[Callable[..., SimServer]]:
    """Factory: `sim_server("--speed", "10", "--max-running-requests", "4")` starts a sim-server process and waits
    until /health is 200. Every server started is stopped at the end of the test."""
    with sim_servers(tmp_path) as start:
        yield start


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], Path]]:
    """`read_only(folder)` makes `folder` read-only for the processes a test starts: chmod 555, or, where that does
    not stop the test's user (root), a read-only bind mount over it (needs CAP_SYS_ADMIN: skipped without). Undone at
    the end of the test."""
    mounted: list[Path] = []
    changed: list[Path] = []

    def make(folder: Path) -> Path:
        folder.chmod(0o555)
        changed.append(folder)
        probe = folder / ".probe-writable"
        try:
            probe.touch()
        except OSError:
            return folder
        probe.unlink()
        if subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a read-only folder here (root, and no bind mount allowed)")
        mounted.append(folder)
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True).returncode != 0:
            pytest.skip("cannot make a read-only folder here (root, and no read-only remount allowed)")
        return folder

    yield make
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], check=True)
    for folder in changed:
        folder.chmod(0o755)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects them
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`make test` runs the tests marked serial from the files that say `mark.serial` (Makefile SERIAL_FILES): a test
    marked another way would run in neither part."""
    for item in items:
        if item.get_closest_marker("serial") is not None and "mark.serial" not in item.path.read_text():
            raise pytest.UsageError(f"{item.nodeid} is marked serial, but its file does not say `mark.serial`: "
                                    "the Makefile's SERIAL_FILES would not run it")


# ---- the environment of the processes the tests start ---------------------------------------------------------------
# The tests start ~450 Python processes (replays, sim-servers, recorders, the README's commands). Two costs each paid
# again and again, which the controller pytest process lifts for the session (its xdist workers and every process they
# start inherit the environment; it is put back at the end):
# - bytecode: where the environment sets PYTHONDONTWRITEBYTECODE (this project's machines do), each process compiled
#   tracebench's modules from source again, ~30 ms of a sim-server's start and ~50 ms of a replay's. They keep their
#   bytecode in a temporary folder instead (PYTHONPYCACHEPREFIX), removed at the end: nothing is written beside the
#   sources, and the code that runs is the same. A prefix the user set is theirs.
# - CA certificates: importing aiohttp (every sim-server, replay, recorder: ~380 processes) builds two TLS contexts, each
#   parsing the CA bundle SSL_CERT_FILE or OpenSSL's default names (~40 ms of a 150 ms import). The tests speak plain
#   HTTP to 127.0.0.1 only, so SSL_CERT_FILE is an empty file for them (os.devnull), whatever it was (this project's
#   machines name the system bundle): a test that made an HTTPS call would fail its certificate check, loudly.
SESSION_ENV = pytest.StashKey[dict[str, str | None]]()  # what the session changed: the values before
PYCACHE = pytest.StashKey[str]()  # the temporary bytecode folder (`make test` gives a lasting one: Makefile TEST_ENV)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # an xdist worker: its controller's environment already
    changes: dict[str, str | None] = {}
    if os.environ.get("PYTHONDONTWRITEBYTECODE") and not os.environ.get("PYTHONPYCACHEPREFIX"):
        config.stash[PYCACHE] = tempfile.mkdtemp(prefix="tracebench-tests-pycache-")
        changes.update(PYTHONDONTWRITEBYTECODE=None, PYTHONPYCACHEPREFIX=config.stash[PYCACHE])
    changes["SSL_CERT_FILE"] = os.devnull
    config.stash[SESSION_ENV] = set_environ(changes)


def pytest_unconfigure(config: pytest.Config) -> None:
    if SESSION_ENV in config.stash:   # not on an xdist worker
        set_environ(config.stash[SESSION_ENV])
    if PYCACHE in config.stash:
        shutil.rmtree(config.stash[PYCACHE])


# ---- pytest-xdist: which test files go first ------------------------------------------------------------------------
# `make test` runs three pytest processes, each taking whole test files (--dist loadfile): a file's module fixtures run
# once. xdist hands out files with the most tests first, which left the README's blocks (the longest file, one chain
# of runs) to start last and finish alone. Here the longest units go first (longest-processing-time-first: the
# processes end close together), and the README's blocks are split into their chains (tests/test_readme.py `chains`:
# the tour, the sweep, the routing example share no file), each a unit of its own, named by the first file its first
# block makes (a README line number went stale whenever text above it moved, and the chain then counted a second a
# test: the longest unit started last). Wall seconds of each unit in `make test`'s parallel part on the 2-core machine
# (its first test's start to its last test's end, module fixtures included; other work beside it, load ~4-5,
# 2026-11-28); a file not listed counts a second a test, so the quick files of many tests are listed too. Stale
# figures only change the order, never what runs; tests/test_readme.py checks every key names a unit that exists.
SLOWEST_FIRST = {
    # a three-node Ray cluster (~10 s to start), six servers as actors, a 12-point sweep twice, a node removed
    # (skipped without ray)
    "tests/test_ray.py": 45,
    "tests/test_record.py": 45,  # its six round trips, A at --speed 0.25 (~6 s each)
    "tests/test_readme.py::chain-traces/tour.jsonl": 41, "tests/test_replay_robust.py": 41, "tests/test_sweep.py": 30,
    "tests/test_replay_run.py": 29, "tests/test_virtual_clock.py": 26, "tests/test_report_cli.py": 20,
    "tests/test_pd.py": 18, "tests/test_newcomer3.py": 17, "tests/test_replay_truth.py": 15,
    "tests/test_newcomer.py": 15, "tests/test_senders.py": 12, "tests/test_overhead.py": 11,
    "tests/test_external_router.py": 11, "tests/test_pack.py": 9, "tests/test_readme.py::chain-traces/routing.jsonl": 9,
    "tests/test_sim_protocol.py": 7, "tests/test_sim_server.py": 7, "tests/test_replay_prefix.py": 7,
    "tests/test_policies_e2e.py": 7, "tests/test_telemetry.py": 6, "tests/test_readme.py::chain-traces/sweep.jsonl": 6,
    "tests/test_edges.py": 4, "tests/test_speedguard.py": 3, "tests/test_trace_datasets.py": 3,
    "tests/test_sim_prefix_cache.py": 3, "tests/test_sim_profiles.py": 3, "tests/test_report_units.py": 3,
    "tests/test_report_copy.py": 2, "tests/test_openai_api.py": 2, "tests/test_policies_unit.py": 2,
    "tests/test_cli_in_process.py": 2, "tests/test_no_machine_paths.py": 2, "tests/test_policies_prefix.py": 2,
    "tests/test_examples.py": 2, "tests/test_sim_model.py": 1, "tests/test_trace_workloads.py": 1,
    "tests/test_trace_prefix.py": 1, "tests/test_replay_units.py": 1, "tests/test_trace_bad_input.py": 1,
    "tests/test_trace_stats.py": 1, "tests/test_policies_registry.py": 1, "tests/test_readme.py": 1,
}
README_BLOCK_ID = "tests/test_readme.py::test_readme_block_runs_as_written[README.md:"


def readme_unit(line: int) -> str | None:
    """The xdist unit of the README block opened at `line`: its chain, named by the first file the chain's first block
    makes (`-o FILE`, `--run-name NAME`, ...); None for a block that does not run (it stays with the file)."""
    from test_readme import MADE, README_BLOCKS, README_CHAINS

    if line not in README_CHAINS:
        return None
    first = next(block for block in README_BLOCKS if block.line == README_CHAINS[line])
    made = MADE.findall(first.text)
    return f"tests/test_readme.py::chain-{made[0] if made else first.line}"


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from xdist.scheduler import LoadFileScheduling

    class SlowestFirst(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(README_BLOCK_ID):
                unit = readme_unit(int(nodeid[len(README_BLOCK_ID):].rstrip("]")))
                if unit is not None:
                    return unit
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node: object) -> None:
            if not self.ordered:  # the first hand-out: the whole queue is known
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: -SLOWEST_FIRST.get(unit[0], len(unit[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

        def _reschedule(self, node: object) -> None:
            # the next unit goes to a process when it starts the last test of its units, not while 2 are left (xdist's
            # rule): a process would otherwise take a second long unit while the other is about to be idle
            if not node.shutting_down and self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return SlowestFirst(config, log)

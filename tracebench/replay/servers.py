"""The servers a run talks to: launched (sglang or the simulator, one per GPU) or attached (already running).

Launched servers run in their own process group (start_new_session) with their output in `<run>/server-<i>.log`;
`stop()` sends SIGTERM to each group, then SIGKILL after a grace period. It is called from a `finally`, so no server
outlives the run: not on success, not on errors, not on Ctrl-C. On Linux the child also gets PR_SET_PDEATHSIG, so
it is told to stop even if tracebench itself is killed with SIGKILL.
"""

from __future__ import annotations

import asyncio
import ctypes
import ipaddress
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from tracebench.errors import ConfigError, ServerStartError
from tracebench.paths import portable_words

if TYPE_CHECKING:  # (a Ray actor imports this module on its node: it stays light, without aiohttp)
    from tracebench.replay.client import SglangClient

LOG_TAIL_LINES = 30
# flags tracebench sets itself on a launched server: the user must not pass them again through --server-arg
_OWNED_FLAGS = {
    "sglang": ("--model-path", "--model", "--port", "--host", "--max-running-requests", "--enable-metrics", "--skip-tokenizer-init"),
    "sim": ("--port", "--host", "--speed", "--max-running-requests"),
}
STOP_GRACE_S = {"sglang": 20.0, "sim": 5.0, "sglang-router": 5.0}  # sglang-router: --router sglang-router
EXIT_SETTLE_S = 2.0  # how long a probe that could not reach a launched process waits to see whether it exited


@dataclass
class ServerPlan:
    """One server of the run. For launched servers `command`, `env` (additions), `log` and `port` are set."""

    index: int
    url: str
    gpu: str | None = None
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)
    log: Path | None = None
    port: int | None = None
    role: str | None = None  # PD: "prefill" or "decode" (replay/pd.py); None: a plain server
    bootstrap_port: int | None = None  # a launched prefill server's --disaggregation-bootstrap-port

    @property
    def launched(self) -> bool:
        return self.command is not None

    @property
    def same_host(self) -> bool:
        """Whether the server shares this machine's wall clock (its meta_info stamps convert exactly)."""
        return self.launched or urlsplit(self.url).hostname in ("127.0.0.1", "localhost", "::1")


def split_server_args(values: tuple[str, ...] | list[str]) -> list[str]:
    """Each --server-arg value is split like a shell would: `--server-arg "--load-format dummy"` gives two words."""
    return [word for value in values for word in shlex.split(value)]


# Free ports for launched servers are drawn from here: below the kernel's ephemeral range (32768+ on Linux), where
# a client connection of this machine could take a port between our probe and the server's bind.
FREE_PORT_RANGE = (20000, 32000)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # like the servers: TIME_WAIT is usable
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now, drawn at random from FREE_PORT_RANGE (two replays started at
    the same moment do not draw the same ones, as they would counting up from a fixed base)."""
    rng = random.Random()  # seeded from the OS: independent of every other run
    ports: list[int] = []
    for _ in range(50 * count):
        port = rng.randrange(*FREE_PORT_RANGE)
        if port not in ports and _bindable(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise ServerStartError(f"no {count} free port(s) in {FREE_PORT_RANGE[0]}-{FREE_PORT_RANGE[1]} on 127.0.0.1: "
                           "give --port-base")


def plan_launched(
    backend: str,
    gpus: int,
    port_base: int | None,
    run_dir: Path,
    *,
    model: str | None,
    max_running_requests: int | None,
    server_args: list[str],
    speed: float | None,
    skip_tokenizer_init: bool = True,
    cache_report: bool = False,
) -> list[ServerPlan]:
    """N servers on ports port_base+i (port_base None: free ports, `free_ports`). sglang: one GPU each
    (CUDA_VISIBLE_DEVICES, honouring a list the user already set); sim: `tracebench sim-server` processes.
    `skip_tokenizer_init`: sglang gets --skip-tokenizer-init (ids in, ids out; the OpenAI APIs need the tokenizer, so
    --api completions/chat drop it). `cache_report`: sglang and the simulator get --enable-cache-report, so that
    OpenAI answers report the prompt tokens the prefix cache served (usage.prompt_tokens_details.cached_tokens)."""
    for word in server_args:
        flag = word.split("=", 1)[0]
        if flag in _OWNED_FLAGS[backend]:
            raise ConfigError(f"--server-arg {word}: tracebench sets {flag} itself (use its own option, or leave it out)")
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    devices = [d.strip() for d in visible.split(",") if d.strip()] if visible else [str(i) for i in range(gpus)]
    if backend == "sglang" and len(devices) < gpus:
        raise ConfigError(f"--gpus {gpus}: CUDA_VISIBLE_DEVICES={visible!r} names only {len(devices)} device(s)")
    ports = free_ports(gpus) if port_base is None else [port_base + i for i in range(gpus)]
    plans = []
    for i, port in enumerate(ports):
        if not 0 < port < 65536:
            raise ConfigError(f"--port-base {port_base}: port {port} is out of range")
        cap_args = ["--max-running-requests", str(max_running_requests)] if max_running_requests is not None else []
        cap_args += ["--enable-cache-report"] if cache_report else []
        env = {"PYTHONUNBUFFERED": "1"}
        if backend == "sglang":
            assert model is not None  # checked with the other options
            command = [
                sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
                "--port", str(port), "--enable-metrics", *(["--skip-tokenizer-init"] if skip_tokenizer_init else []),
                *cap_args, *server_args,
            ]
            env["CUDA_VISIBLE_DEVICES"] = devices[i]
            gpu: str | None = devices[i]
        else:
            speed_args = ["--speed", f"{speed:g}"] if speed is not None else []
            command = [
                sys.executable, "-m", "tracebench", "sim-server", "--host", "127.0.0.1", "--port", str(port),
                *speed_args, *cap_args, *server_args,
            ]
            gpu = None
        plans.append(ServerPlan(index=i, url=f"http://127.0.0.1:{port}", gpu=gpu, command=command, env=env,
                                log=run_dir / f"server-{i}.log", port=port))
    return plans


def _server_key(url: str) -> tuple[str, frozenset[str], int]:
    """What identifies the server behind an --attach URL: scheme, the addresses its host resolves to (every loopback
    address counts as one: 127.0.0.1, ::1 and localhost reach the same listener) and the port (the scheme's default
    when none is given). A host that does not resolve is bad input."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"--attach {url!r}: expected a server address like http://HOST:PORT")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as err:
        raise ConfigError(f"--attach {url!r}: {err}") from None
    try:
        infos = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise ConfigError(f"--attach {url!r}: cannot resolve {parts.hostname!r} ({err.strerror})") from None
    addresses = {info[4][0] for info in infos}
    return parts.scheme, frozenset("loopback" if ipaddress.ip_address(a.split("%")[0]).is_loopback else a
                                   for a in addresses), port


def plan_attached(urls: tuple[str, ...] | list[str]) -> list[ServerPlan]:
    """The --attach URLs as servers (a trailing slash dropped). The same server given twice (127.0.0.1 and
    localhost, with and without the slash or the default port) is refused: it would count as two."""
    plans: list[ServerPlan] = []
    keys: list[tuple[str, frozenset[str], int]] = []
    for i, url in enumerate(urls):
        key = _server_key(url)
        for earlier, (scheme, hosts, port) in zip(plans, keys):
            if scheme == key[0] and port == key[2] and hosts & key[1]:
                raise ConfigError(f"--attach {earlier.url!r} and {url!r} are the same server (port {port} on the "
                                  "same host): give each server once")
        keys.append(key)
        plans.append(ServerPlan(index=i, url=url.rstrip("/")))
    return plans


def _pdeathsig_preexec():
    """A preexec_fn asking Linux to send SIGTERM to the child when tracebench dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before fork: the child only calls it
    pr_set_pdeathsig = 1
    return lambda: prctl(pr_set_pdeathsig, signal.SIGTERM)


def _check_port_free(port: int, what: str = "port") -> None:
    if not _bindable(port):
        raise ServerStartError(
            f"{what} {port} on 127.0.0.1 is taken: stop what uses it, choose another --port-base, or leave "
            "--port-base out (free ports)"
        )


async def wait_exit(exit_reason: Callable[[], str | None], within: float = EXIT_SETTLE_S) -> str | None:
    """The exit reason of a launched process that could not be reached, once it is seen to exit (None if it is
    still running after `within` s). A killed process closes its sockets a moment before it can be reaped: in between,
    connections are refused while it still looks alive, and which of the two a probe sees first must not decide
    what the run names as the cause."""
    deadline = time.monotonic() + within
    while (why := exit_reason()) is None and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return why


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.is_file():
        return "(no log)"
    text = path.read_bytes()[-20000:].decode("utf-8", "replace").splitlines()
    return "\n".join(text[-lines:]) or "(empty log)"


class Fleet:
    """Starts, watches and stops the run's servers."""

    def __init__(self, backend: str, plans: list[ServerPlan]) -> None:
        self.backend = backend
        self.plans = plans
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(self) -> None:
        """Launch every launched server (attached ones are left alone). Ports are checked first, all of them."""
        launched = [p for p in self.plans if p.launched]
        for plan in launched:
            assert plan.port is not None
            _check_port_free(plan.port)
            if plan.bootstrap_port is not None:
                _check_port_free(plan.bootstrap_port, f"server {plan.index}'s PD bootstrap port")
        preexec = _pdeathsig_preexec()
        for plan in launched:
            assert plan.command is not None and plan.log is not None
            with plan.log.open("ab") as log:
                self.procs[plan.index] = subprocess.Popen(
                    plan.command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env={**os.environ, **plan.env}, start_new_session=True, preexec_fn=preexec,
                )

    def first(self, count: int) -> Fleet:
        """The first `count` servers as a Fleet of their own, sharing the processes (a run of a sweep that uses fewer
        servers than were launched). Only the owner of the processes may stop them: call stop() on this Fleet."""
        part = Fleet(self.backend, self.plans[:count])
        part.procs = {i: proc for i, proc in self.procs.items() if i < count}
        return part

    def exit_reason(self, index: int) -> str | None:
        """Why a launched server is gone (its process exited), or None (running, or not launched)."""
        proc = self.procs.get(index)
        if proc is None or proc.poll() is None:
            return None
        return f"server {index} process exited with code {proc.returncode}"

    # how long a probe that could not reach a launched server waits to see it exit (wait_exit)
    exit_settle_s = EXIT_SETTLE_S

    def start_exit(self, index: int) -> str | None:
        """How a launched server ended while starting ("exited with code N"), or None (running, or not launched)."""
        proc = self.procs.get(index)
        return None if proc is None or proc.poll() is None else f"exited with code {proc.returncode}"

    def wall_offset(self, index: int) -> float:
        """Seconds server `index`'s wall clock is ahead of this machine's, taken off its meta_info stamps: 0 for
        servers of this host (replay/ray_fleet.py measures those on other nodes)."""
        return 0.0

    def cluster(self, run_start: float | None) -> dict[str, Any] | None:
        """run.json `ray`: the cluster the servers ran on (replay/ray_fleet.py); None: this host's processes.
        `run_start`: the run clock's monotonic start (None before it started)."""
        return None

    def log_text(self, plan: ServerPlan) -> str:
        """The last lines of a launched server's log."""
        assert plan.log is not None
        return log_tail(plan.log)

    def _start_failure(self, plan: ServerPlan, what: str) -> ServerStartError:
        return ServerStartError(f"server {plan.index} ({plan.url}) {what}; last lines of {plan.log}:\n{self.log_text(plan)}")

    async def wait_healthy(self, client: SglangClient, timeout: float) -> None:
        """Until every server answers /health 200. A launched server that exits or stays unhealthy past `timeout`
        is a ServerStartError with the end of its log; an attached one must be healthy now."""
        deadline = time.monotonic() + timeout
        pending = {p.index: p for p in self.plans}
        while True:
            for plan in pending.values():
                if not plan.launched:
                    continue
                ended = self.start_exit(plan.index)
                if ended is not None:
                    raise self._start_failure(plan, f"{ended} while starting")
            probe_timeout = max(1.0, min(30.0, deadline - time.monotonic()))
            results = await asyncio.gather(*(client.health(p.url, probe_timeout) for p in pending.values()))
            for plan, why in zip(list(pending.values()), results):
                if why is None:
                    del pending[plan.index]
                elif not plan.launched:
                    raise ServerStartError(f"attached server {plan.index} ({plan.url}) is not healthy: {why}")
            if not pending:
                return
            if time.monotonic() >= deadline:
                plan = next(iter(pending.values()))
                raise self._start_failure(plan, f"not healthy after --startup-timeout {timeout:g} s")
            await asyncio.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM every launched server's process group, wait up to the grace period, then SIGKILL what is left.
        SIGINT is ignored meanwhile: a second Ctrl-C must not leave servers behind."""
        if not self.procs:
            return
        in_main_thread = threading.current_thread() is threading.main_thread()  # only there can handlers change
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
        try:
            for proc in self.procs.values():
                _signal_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S[self.backend]
            for proc in self.procs.values():
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass  # the group gets SIGKILL below
            # the leader may be gone while its children (sglang's scheduler, detokenizer) still run
            while any(_group_alive(p.pid) for p in self.procs.values()) and time.monotonic() < deadline:
                time.sleep(0.05)
            for proc in self.procs.values():
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            if in_main_thread:
                signal.signal(signal.SIGINT, previous)

    def describe(self, index: int) -> dict[str, Any]:
        plan = self.plans[index]
        proc = self.procs.get(index)
        return {
            "index": plan.index,
            "url": plan.url,
            "gpu": plan.gpu,
            # paths relative to the working folder, or only their name when elsewhere (tracebench/paths.py)
            "launch_command": portable_words(plan.command) if plan.command is not None else None,
            "launch_env": {k: v for k, v in plan.env.items() if k != "PYTHONUNBUFFERED"} or None,
            "pid": proc.pid if proc is not None else None,
            "same_host": plan.same_host,
            "log": plan.log.name if plan.log is not None else None,
            "role": plan.role,
        }


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the whole group is already gone: nothing to stop


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True

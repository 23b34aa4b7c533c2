"""`--router sglang-router`: sglang's own router between tracebench and the servers, as the reference a routing
policy is compared with (what production sglang runs; how it decides: .DUCUMENT/sglang-router.md).

tracebench launches `python -m sglang_router.launch_router` (sglang-router 0.3.2, the extra `tracebench[router]`)
once the servers are healthy, waits until it lists every server as a registered, healthy worker, and sends every
request to it. tracebench's own router then has one destination and no cap: a request is dispatched to sglang-router
when it is released (t_dispatch = sent to sglang-router). Which server served a request is not known per request
(records' `server` is null); per-server figures come from each server's own `/metrics` counters, read just before
the run and after it (run.json `external_router.server_counters`).

Settings tracebench always passes, for an honest benchmark: router and Prometheus exporter on 127.0.0.1 (free
ports), `--disable-retries` (a failed request is recorded, not retried elsewhere), `--disable-circuit-breaker` (its
breaker counts every non-2xx answer, even a 400 for a too-long prompt, and would move a server's share elsewhere;
tracebench's own router does not), `--log-level info` (the start-up line with the resolved settings). sglang-router
looks up a tokenizer per worker at start-up (by the served model name, on the Hugging Face hub when that is not a
local path); it never uses it for HTTP `/generate`. HF_ENDPOINT points that lookup at a local port that refuses
connections, so it never leaves the machine.

With PD servers (`--pd`, `--attach-prefill/--attach-decode`) it runs in its `--pd-disaggregation` mode: `--prefill URL
BOOTSTRAP_PORT` for each prefill server (the port read from the server's /server_info; without it sglang-router sends
`"bootstrap_port": null`) and `--decode URL` for each decode server; `--router-policy` is its `--policy`, used by both
pools unless `--router-arg "--prefill-policy P --decode-policy D"` says otherwise (.DUCUMENT/pd-disaggregation.md 7).
"""

from __future__ import annotations

import asyncio
import re
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tracebench.errors import ConfigError, ServerProtocolError, ServerStartError
from tracebench.paths import portable_words
from tracebench.policies.base import Assignment, Policy, QueuedRequest, ServerView
from tracebench.replay.client import SglangClient
from tracebench.replay.records import RecordWriter, RequestRecord
from tracebench.replay.servers import Fleet, ServerPlan, log_tail, split_server_args, wait_exit

ROUTERS = ("tracebench", "sglang-router")
PACKAGE = "sglang-router"
VERSION = "0.3.2"  # what .DUCUMENT/sglang-router.md was verified against; the extra pins it
POLICIES = ("cache_aware", "round_robin", "random", "power_of_two")
OWNED_FLAGS = (
    "--host", "--port", "--worker-urls", "--policy", "--prometheus-host", "--prometheus-port", "--log-level",
    "--disable-retries", "--retry-max-retries", "--disable-circuit-breaker", "--cb-failure-threshold",
    "--pd-disaggregation", "--prefill", "--decode",
)
READY_TIMEOUT_S = 30.0
PROBE_TIMEOUT_S = 30.0
# sglang's own counters (.DUCUMENT/endpoints.md "/metrics"), summed over their label sets; cached_tokens_total is
# absent on a server without a prefix cache (then null)
COUNTERS = (
    ("requests", "sglang:num_requests_total"),
    ("prompt_tokens", "sglang:prompt_tokens_total"),
    ("generation_tokens", "sglang:generation_tokens_total"),
    ("cached_tokens", "sglang:cached_tokens_total"),
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def check_options(router: str, router_policy: str | None, router_args: tuple[str, ...], given: set[str],
                  attach: bool) -> str | None:
    """Refuse what cannot act behind sglang-router (ConfigError); returns the router policy to use (None for
    tracebench's own router). `given`: the ReplayConfig fields the user set."""
    if router not in ROUTERS:
        raise ConfigError(f"--router must be one of {', '.join(ROUTERS)}, got {router!r}")
    if router == "tracebench":
        for flag, key in (("--router-policy", "router_policy"), ("--router-arg", "router_args")):
            if key in given:
                raise ConfigError(f"{flag} is for --router sglang-router (this run uses tracebench's router)")
        return None
    policy = router_policy or "cache_aware"
    if policy not in POLICIES:
        raise ConfigError(f"--router-policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    behind = "behind sglang-router tracebench does not choose the server"
    for flag, key, why in (
        ("--policy-opt", "policy_options", "an option of tracebench's policies; sglang-router's go in --router-arg"),
        ("--sjf-key", "sjf_key", "an option of tracebench's sjf policy"),
        ("--cap-schedule", "cap_schedule", f"tracebench's per-server caps, changed during the run: {behind}, and "
         "sglang cannot change a server's --max-running-requests after launch"),
        ("--control-port", "control_port", f"the endpoint that changes tracebench's per-server caps: {behind}"),
        ("--batch-size", "batch_size", f"static batching: {behind} of each batch"),
        ("--batch-timeout", "batch_timeout", f"static batching: {behind} of each batch"),
    ):
        if key in given:
            raise ConfigError(f"{flag} cannot be used with --router sglang-router: it is {why}")
    if attach and "max_running_requests" in given:
        raise ConfigError("--max-running-requests with --router sglang-router sets only the launched servers' own "
                          f"cap ({behind}); attached servers keep the one they were started with")
    args = split_server_args(router_args)
    for word in args:
        flag = word.split("=", 1)[0]
        if flag in OWNED_FLAGS:
            raise ConfigError(f"--router-arg {word}: tracebench sets {flag} itself (see `tracebench replay --help`)")
    return policy


def installed_version(package: str = PACKAGE) -> str:
    """The installed sglang-router's version; a ConfigError naming the extra when it is missing or not 0.3.2."""
    from importlib import metadata  # here: ~10 ms of imports (email, ...) that a run without sglang-router skips

    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        raise ConfigError(f"--router sglang-router needs the {package} package: pip install 'tracebench[router]' "
                          f"(installs {PACKAGE}=={VERSION})") from None
    if version != VERSION:
        raise ConfigError(f"{PACKAGE} {version} is installed; tracebench drives {VERSION} (what "
                          f".DUCUMENT/sglang-router.md verified): pip install 'tracebench[router]'")
    return version


class SglangRouterPolicy(Policy):
    """tracebench's side of --router sglang-router: every released request goes at once to its one destination,
    sglang-router, which chooses the server."""

    name = "sglang-router"
    description = ("sglang's own router (--router sglang-router --router-policy cache_aware|round_robin|random|"
                   "power_of_two): requests go to sglang-router as they arrive, it picks the server")

    def __init__(self, router_policy: str, rng: np.random.Generator) -> None:
        super().__init__(rng)
        self.name = f"sglang-router-{router_policy}"  # type: ignore[misc]  # names the run: which of its policies

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        (router,) = servers
        return [(req, router) for req in queue[: router.free_slots]]


class ViaRouterWriter(RecordWriter):
    """The records of a run through sglang-router: which server served a request is not known (`server` null)."""

    def write(self, record: RequestRecord) -> None:
        record.server = None
        super().write(record)


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:  # all bound at once: distinct ports
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def routed_outcomes(text: str) -> dict[tuple[str, str], int]:
    """sglang-router's own count of answers per (worker URL, outcome "success"|"failure") from its Prometheus text
    (`smg_worker_cb_outcomes_total`; counted with the circuit breaker disabled too: .DUCUMENT/sglang-router.md)."""
    out: dict[tuple[str, str], int] = {}
    for labels, value in re.findall(r"^smg_worker_cb_outcomes_total\{([^}]*)\} (\S+)$", text, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if "worker" not in pairs or "outcome" not in pairs:  # the format this was read from changed: say so
            raise ServerProtocolError(f"sglang-router's metrics: smg_worker_cb_outcomes_total{{{labels}}} lacks the "
                                      "worker or outcome label (.DUCUMENT/sglang-router.md)")
        out[(pairs["worker"], pairs["outcome"])] = int(float(value))
    return out


def parse_counters(text: str) -> dict[str, float | None]:
    """The COUNTERS from a Prometheus text body, each summed over its label sets (None when absent)."""
    out: dict[str, float | None] = {}
    for key, name in COUNTERS:
        values = re.findall(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", text, re.M)
        out[key] = sum(float(v) for v in values) if values else None
    return out


class SglangRouter:
    """One sglang-router process in front of the run's servers: launched, watched and stopped like a server."""

    def __init__(self, policy: str, router_args: tuple[str, ...], worker_urls: list[str], run_dir: Path,
                 roles: list[str] | None = None) -> None:
        """`roles`: with PD servers, "prefill" or "decode" for each of `worker_urls` (None: plain servers)."""
        self.version = installed_version()
        self.policy = policy
        self.user_args = split_server_args(router_args)
        self.worker_urls = worker_urls
        self.roles = roles
        self.run_dir = run_dir
        self.plan: ServerPlan | None = None
        self.fleet: Fleet | None = None
        self.prometheus_url: str | None = None
        self.hub_endpoint: str | None = None
        self._hub_sock: socket.socket | None = None
        self.startup_line: str | None = None
        self.workers: list[Any] | None = None  # its GET /workers, once every server is registered
        self._before: list[tuple[dict[str, float | None] | None, str | None]] | None = None
        self.server_counters: list[dict[str, Any]] | None = None

    @property
    def url(self) -> str:
        assert self.plan is not None
        return self.plan.url

    def exit_reason(self) -> str | None:
        proc = self.fleet.procs.get(0) if self.fleet is not None else None
        if proc is None or proc.poll() is None:
            return None
        return f"sglang-router exited with code {proc.returncode}"

    def worker_args(self, bootstrap_ports: dict[str, int] | None) -> list[str]:
        """How the servers are named on its command line: `--worker-urls ...`, or in PD mode `--pd-disaggregation`
        with `--prefill URL PORT` and `--decode URL` per server."""
        if self.roles is None:
            return ["--worker-urls", *self.worker_urls]
        if bootstrap_ports is None:
            raise ValueError("PD servers need their bootstrap ports")
        args = ["--pd-disaggregation"]
        for url, role in zip(self.worker_urls, self.roles):
            args += ["--prefill", url, str(bootstrap_ports[url])] if role == "prefill" else ["--decode", url]
        return args

    async def start(self, client: SglangClient, timeout: float = READY_TIMEOUT_S,
                    bootstrap_ports: dict[str, int] | None = None) -> None:
        """Launch it, wait until it lists every server as a healthy worker, read the servers' counters.
        `bootstrap_ports`: each prefill server's bootstrap port (PD servers)."""
        port, prom_port = _free_ports(2)
        # bound, never listening: a connection to it is refused at once (the tokenizer lookup stays local)
        self._hub_sock = socket.socket()
        self._hub_sock.bind(("127.0.0.1", 0))
        self.hub_endpoint = f"http://127.0.0.1:{self._hub_sock.getsockname()[1]}"
        self.prometheus_url = f"http://127.0.0.1:{prom_port}"
        command = [
            sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom_port), "--policy", self.policy,
            "--disable-retries", "--disable-circuit-breaker", "--log-level", "info", *self.user_args,
            *self.worker_args(bootstrap_ports),
        ]
        env = {"PYTHONUNBUFFERED": "1", "HF_ENDPOINT": self.hub_endpoint}
        self.plan = ServerPlan(index=0, url=f"http://127.0.0.1:{port}", command=command, env=env,
                               log=self.run_dir / "router.log", port=port)
        self.fleet = Fleet("sglang-router", [self.plan])
        self.fleet.start()
        await self._wait_ready(client, timeout)
        self._before = await self._read_counters(client)

    def _failure(self, what: str) -> ServerStartError:
        assert self.plan is not None and self.plan.log is not None
        return ServerStartError(f"sglang-router ({self.url}) {what}; last lines of {self.plan.log}:\n"
                                f"{_ANSI.sub('', log_tail(self.plan.log))}")

    async def _wait_ready(self, client: SglangClient, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        want = set(self.worker_urls)
        listed: Any = None
        assert self.fleet is not None
        proc = self.fleet.procs[0]
        while True:
            if proc.poll() is not None:
                raise self._failure(f"exited with code {proc.returncode} while starting")
            got = await client.get_json(f"{self.url}/workers", max(1.0, deadline - time.monotonic()))
            if got.error is None:
                listed = got.obj.get("workers") if isinstance(got.obj, dict) else None
                if isinstance(listed, list) and {w.get("url") for w in listed if w.get("is_healthy")} == want:
                    break
            if time.monotonic() >= deadline:
                raise self._failure(f"did not list every server as a healthy worker within {timeout:g} s "
                                    f"(it lists: {listed if got.error is None else got.error})")
            await asyncio.sleep(0.1)
        why = await client.health(self.url, PROBE_TIMEOUT_S)
        if why is not None:
            raise self._failure(f"lists every worker but its own /health fails: {why}")
        self.workers = listed
        assert self.plan is not None and self.plan.log is not None
        lines = _ANSI.sub("", self.plan.log.read_text("utf-8", "replace")).splitlines()
        self.startup_line = next((ln for ln in lines if "Starting router on" in ln), None)
        if self.startup_line is None:
            raise self._failure("is up but its log has no 'Starting router on' line (its resolved settings)")

    def health_check(self, client: SglangClient):
        """The router's probe of its one destination: the process is running and its /health answers 200."""

        async def check(index: int) -> str | None:
            why = self.exit_reason() or await client.health(self.url, PROBE_TIMEOUT_S)
            if why is not None:  # a dead router is named as the cause, however its death was first noticed
                why = await wait_exit(self.exit_reason) or why
            return why

        return check

    async def _read_counters(self, client: SglangClient) -> list[tuple[dict[str, float | None] | None, str | None]]:
        fetched = await asyncio.gather(*(client.get_text(f"{url}/metrics", PROBE_TIMEOUT_S) for url in self.worker_urls))
        return [(None, f.error) if f.error is not None else (parse_counters(f.obj), None) for f in fetched]

    async def finish(self, client: SglangClient) -> None:
        """Read the servers' counters again: per-server figures of the run = after - before."""
        if self._before is None:
            return
        after = await self._read_counters(client)
        assert self.prometheus_url is not None
        exported = await client.get_text(f"{self.prometheus_url}/metrics", PROBE_TIMEOUT_S)
        outcomes = routed_outcomes(exported.obj) if exported.error is None else None
        rows = []
        for index, (url, (old, old_err), (new, new_err)) in enumerate(zip(self.worker_urls, self._before, after)):
            row: dict[str, Any] = {"server": index, "url": url}
            error = old_err or new_err
            for key, name in COUNTERS:
                a, b = (old or {}).get(key), (new or {}).get(key)
                row[key] = None if a is None or b is None else int(b - a)
            if error is None and row["requests"] is None:
                error = "its /metrics has no sglang:num_requests_total (started without --enable-metrics?)"
            # the router's own view: answers it got from this server, 2xx or not
            for key, outcome in (("routed_ok", "success"), ("routed_failed", "failure")):
                row[key] = None if outcomes is None else outcomes.get((url, outcome), 0)
            row["error"] = error if outcomes is not None else error or f"sglang-router's metrics: {exported.error}"
            rows.append(row)
        self.server_counters = rows

    def stop(self) -> None:
        if self.fleet is not None:
            self.fleet.stop()
        if self._hub_sock is not None:
            self._hub_sock.close()
            self._hub_sock = None

    def describe(self) -> dict[str, Any]:
        """run.json `external_router` (docs/run-format.md)."""
        proc = self.fleet.procs.get(0) if self.fleet is not None else None
        return {
            "name": PACKAGE,
            "version": self.version,
            "policy": self.policy,
            "mode": "pd-disaggregation" if self.roles is not None else "regular",
            "args": self.user_args,
            "command": portable_words(self.plan.command) if self.plan is not None else None,  # tracebench/paths.py
            "env": {"HF_ENDPOINT": self.hub_endpoint} if self.hub_endpoint else None,
            "url": self.plan.url if self.plan is not None else None,
            "prometheus_url": self.prometheus_url,
            "pid": proc.pid if proc is not None else None,
            "log": "router.log" if self.plan is not None else None,
            "startup_line": self.startup_line,
            "workers": self.workers,
            "server_counters": self.server_counters,
        }

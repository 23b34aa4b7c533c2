"""One replay, start to end: check the options and the trace, start the servers, run engine + router + telemetry,
write the run folder (docs/run-format.md), stop the servers.

Order matters for the user's rules: everything that can be refused (options, trace, policy, model config, ports,
free disk space) is refused before any server starts; once servers start, a `finally` stops them whatever happens;
every request of the trace ends up exactly once in requests.jsonl, however the run ends (short of a full disk: then
run.json says how many records reached it, and a reserve kept since the start lets the final run.json be written).
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import gc
import json
import os
import re
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import orjson

from tracebench import __version__
from tracebench.cleanup import write_atomic
from tracebench.errors import ConfigError, OutputWriteError, RunInterrupted, ServerStartError
from tracebench.paths import portable_path, portable_policy, portable_words
from tracebench.policies.base import Policy
from tracebench.policies.registry import load_policy
from tracebench.precise_loop import run as run_loop
from tracebench.replay.beside import BesideTelemetry
from tracebench.replay.answer_check import ContextLimits
from tracebench.replay.caps import CapChange, bind_control_socket, launch_cap, parse_cap_schedule, run_cap_schedule
from tracebench.replay.client import APIS, KEEPALIVE_S, SglangClient
from tracebench.replay.clock import RunClock, VirtualRunClock, run_seconds
from tracebench.replay.flight import HttpSender
from tracebench.replay.engine import Engine, Rows
from tracebench.replay.loop import run_virtual
from tracebench.replay.pd import (
    PdPolicies, add_pd_launch_args, bootstrap_host, check_pd_config, check_role, check_unified, metrics_delta, parse_ratio,
    read_pd_metrics,
)
from tracebench.replay.pd_router import PdPools, PdRouter, pool_states
from tracebench.replay.external_router import (
    SglangRouter, SglangRouterPolicy, ViaRouterWriter, check_options, installed_version,
)
from tracebench.replay.records import STATUSES, RecordWriter
from tracebench.replay.router import Router, ServerState
from tracebench.replay.saturation import Saturation, SaturationWatch, watch_saturation
from tracebench.replay.kv_link import DEFAULT as KV_LINK_DEFAULT, kv_link_of
from tracebench.replay.servers import Fleet, ServerPlan, plan_attached, plan_launched, split_server_args, wait_exit
from tracebench.replay.stall import StallBounds, stall_bounds
from tracebench.replay.summary import modelled_hops
from tracebench.replay.telemetry import poll_loads, progress_line, show_progress
from tracebench.replay.tokens import InputIds, vocab_size_from_model
from tracebench.trace.format import TraceHeader, TraceTable, load_trace_table

if TYPE_CHECKING:
    from tracebench.replay.control import ControlServer

RUN_FORMAT = 1
ROUTER_SENDS_UNDER_S = 0.001  # --senders N > 1: see replay/senders.py, "the router sends what it can"
STARTUP_TIMEOUT_S = {"sglang": 600.0, "sim": 30.0}
PROBE_TIMEOUT_S = 30.0  # /server_info, /v1/loads at start; /model_info when a server may be down
# Free space: the run folder's file system must hold at least every record at its smallest (all fields null) and the
# telemetry lines, plus a reserve kept as a file from the start and freed at the end, so that the final run.json can
# always be written, even when the disk filled up during the run.
MIN_RECORD_BYTES = 450
MIN_TELEMETRY_LINE_BYTES = 150
RESERVE_BYTES = 256 << 10
RESERVE_NAME = ".reserve"


@dataclass(frozen=True)
class ReplayConfig:
    """Every option of `tracebench replay`. None means "not given" (resolve() fills what has a default)."""

    trace: Path
    policy: str = "random"
    policy_options: tuple[tuple[str, str], ...] = ()
    gpus: int | None = None
    backend: str | None = None  # sglang | sim; "attach" after resolve() when --attach was given
    clock: str = "real"  # real | virtual (the simulated cluster in this process, on a simulated clock: inprocess.py)
    attach: tuple[str, ...] = ()
    mode: str = "continuous"
    batch_size: int | None = None
    batch_timeout: float | None = None
    max_running_requests: int | None = None
    max_concurrency: int | None = None  # the client's gate: at most N requests in flight across the run (gate.py)
    cap_schedule: str | None = None
    control_port: int | None = None
    model: str | None = None
    vocab_size: int | None = None
    server_args: tuple[str, ...] = ()
    port_base: int | None = None
    speed: float | None = None
    sim_profile: str | None = None  # --backend sim: the simulators' --profile / --gpu (tracebench/sim/catalog.py)
    sim_gpu: str | None = None
    run_name: str | None = None
    out_dir: Path = Path("reports")
    timeout: float | None = None
    stall_timeout: float | None = None  # trace seconds; None: derived from the trace (replay/stall.py)
    stream: bool = True
    api: str = "generate"  # generate | completions | chat (client.APIS)
    seed: int = 0
    sjf_key: str | None = None
    poll_interval: float = 0.5
    keepalive: float = KEEPALIVE_S  # seconds a pooled connection may idle and be reused (client.py)
    metrics_interval: float = 1.0  # run seconds between /metrics scrapes (server_metrics.jsonl); 0: none
    startup_timeout: float | None = None
    flush_cache: bool = True
    quiet: bool = False
    router: str = "tracebench"  # or "sglang-router": sglang's own router picks the server (external_router.py)
    router_policy: str | None = None
    router_args: tuple[str, ...] = ()
    saturation_window: float | None = None  # trace seconds; stop the run when over-saturated (replay/saturation.py)
    # PD disaggregation (pd.py): launch P prefill + D decode servers, or attach them; one policy per pool
    pd: str | None = None  # "P:D"
    attach_prefill: tuple[str, ...] = ()
    attach_decode: tuple[str, ...] = ()
    prefill_policy: str | None = None  # default: --policy
    decode_policy: str | None = None
    prefill_policy_options: tuple[tuple[str, str], ...] = ()
    decode_policy_options: tuple[tuple[str, str], ...] = ()
    kv_link: str | None = None  # --backend sim --pd: a replay/kv_link.py preset or BANDWIDTH:LATENCY
    senders: int = 1  # processes that carry the requests (replay/senders.py); 1: the router's own (HttpSender)
    router_sends_under: float = ROUTER_SENDS_UNDER_S  # --senders N > 1: the router carries a request itself when on time
    pin_cpus: str | None = None  # --pin-cpus LIST: the router on the first CPU alone, the sender processes on the rest
    ray: str | None = None  # a Ray cluster's address: the launched servers run there as actors (replay/ray_fleet.py)

    @property
    def is_pd(self) -> bool:
        return self.pd is not None or bool(self.attach_prefill or self.attach_decode)

    @property
    def pd_sizes(self) -> tuple[int, int]:
        """(prefill servers, decode servers) of a PD run."""
        if self.attach_prefill or self.attach_decode:
            return len(self.attach_prefill), len(self.attach_decode)
        assert self.pd is not None
        return parse_ratio(self.pd)

    @property
    def num_servers(self) -> int:
        if self.is_pd:
            return sum(self.pd_sizes)
        return len(self.attach) if self.attach else (self.gpus or 1)

    @property
    def time_speed(self) -> float:
        """How many times the run is compressed: --speed K (simulated servers), 1.0 otherwise. Every time given in
        trace seconds (arrivals, --cap-schedule, --batch-timeout, --timeout) happens at t / K on the run clock."""
        return self.speed if self.speed is not None else 1.0

    def resolve(self) -> ReplayConfig:
        """Refuse contradictions and bad values (ConfigError); fill the defaults that depend on other options."""
        given = {f.name for f in dataclasses.fields(self) if getattr(self, f.name) not in (None, ())}
        self._check_values()
        check_senders(self.senders, self.clock, self.is_pd, self.router_sends_under,
                      self.router_sends_under != ROUTER_SENDS_UNDER_S)
        if self.pin_cpus is not None:
            if self.ray is not None:
                raise ConfigError("--pin-cpus places processes on this host's CPUs; with --ray the sender processes "
                                  "are actors on the cluster's nodes")
            pin_cpu_list(self.pin_cpus, self.senders)  # refused here, before anything starts, when it cannot hold
        if self.ray is not None:
            check_ray(self, given)
        cfg = self
        if self.clock == "virtual":
            self._check_virtual(given)
            cfg = dataclasses.replace(cfg, backend="sim")
        self._check_api_and_mode(given)
        router_policy = check_options(self.router, self.router_policy, self.router_args, given, bool(self.attach))
        if router_policy is not None:
            cfg = dataclasses.replace(cfg, router_policy=router_policy)
        if self.is_pd:
            cfg = check_pd_config(cfg, given)
        # --kv-link: only for simulated PD servers, a preset or BANDWIDTH:LATENCY (ConfigError); its default is named
        if (link := kv_link_of(cfg)) is not None and self.kv_link is None and link.name == KV_LINK_DEFAULT:
            cfg = dataclasses.replace(cfg, kv_link=KV_LINK_DEFAULT)
        cfg = self._resolve_policy_options(cfg)
        if ("sim_profile" in given or "sim_gpu" in given) and (self.attach or self.attach_prefill
                                                               or (cfg.backend or "sglang") != "sim"):
            raise ConfigError("--sim-profile and --sim-gpu choose the timing of servers launched with --backend sim")
        if self.attach_prefill or self.attach:
            return self._resolve_attached(cfg, given)
        return self._resolve_launched(cfg)

    def _check_values(self) -> None:
        """Each option's own range: counts >= 1, times > 0 and finite, --speed in its range, ports, --seed, --clock."""
        import math  # (here, not at the top: the option checks are this method's alone)

        from tracebench.options import INT64_MAX, SPEED_RANGE

        for name, value, low in (
            ("--gpus", self.gpus, 1), ("--batch-size", self.batch_size, 1),
            ("--max-running-requests", self.max_running_requests, 1), ("--vocab-size", self.vocab_size, 1),
            ("--max-concurrency", self.max_concurrency, 1),
        ):
            if value is not None and value < low:
                raise ConfigError(f"{name} must be >= {low}, got {value}")
        for name, value in (
            ("--batch-timeout", self.batch_timeout), ("--timeout", self.timeout), ("--speed", self.speed),
            ("--stall-timeout", self.stall_timeout),
            ("--poll-interval", self.poll_interval), ("--startup-timeout", self.startup_timeout),
            ("--keepalive", self.keepalive),
            ("--saturation-window", self.saturation_window),
        ):
            if value is not None and not (math.isfinite(value) and value > 0):  # inf: a run that never ends
                raise ConfigError(f"{name} must be > 0 and finite, got {value}")
        if self.speed is not None and not SPEED_RANGE[0] <= self.speed <= SPEED_RANGE[1]:
            raise ConfigError(f"--speed must be between {SPEED_RANGE[0]:g} and {SPEED_RANGE[1]:g}, got {self.speed:g}")
        if not 0 <= self.seed <= INT64_MAX:
            raise ConfigError(f"--seed must be an integer from 0 to 2^63-1, got {self.seed}")
        if not self.metrics_interval >= 0:
            raise ConfigError(f"--metrics-interval must be >= 0 (0: no scrape), got {self.metrics_interval}")
        for name, value in (("--port-base", self.port_base), ("--control-port", self.control_port)):
            if value is not None and not 0 < value < 65536:
                raise ConfigError(f"{name} must be a port in 1..65535, got {value}")
        if self.clock not in ("real", "virtual"):
            raise ConfigError(f"--clock must be real or virtual, got {self.clock!r}")

    def _check_virtual(self, given: set[str]) -> None:
        """--clock virtual: the options that need real time or HTTP are refused."""
        for name, key, why in (
            ("--attach", "attach", "attached servers run in real time"),
            ("--attach-prefill", "attach_prefill", "attached servers run in real time"),
            ("--attach-decode", "attach_decode", "attached servers run in real time"),
            ("--speed", "speed", "the virtual clock runs as fast as the host computes it"),
            ("--control-port", "control_port", "nothing outside the process can act on a virtual clock; "
             "change caps with --cap-schedule"),
        ):
            if key in given:
                raise ConfigError(f"--clock virtual: {name} cannot be used ({why})")
        if self.backend not in (None, "sim"):
            raise ConfigError(f"--clock virtual runs the simulated cluster: --backend {self.backend} needs --clock real")
        if self.router != "tracebench":
            raise ConfigError(f"--clock virtual: --router {self.router} cannot run on a virtual clock (its own process "
                              "keeps real time)")
        if self.api != "generate":
            raise ConfigError(f"--clock virtual: --api {self.api} is an HTTP route of the server; the virtual clock "
                              "speaks to the in-process servers directly (--api generate)")

    def _check_api_and_mode(self, given: set[str]) -> None:
        """--api one of APIS; --mode continuous or static, --batch-size and --batch-timeout only with static."""
        if self.api not in APIS:
            raise ConfigError(f"--api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.mode not in ("continuous", "static"):
            raise ConfigError(f"--mode must be continuous or static, got {self.mode!r}")
        if self.mode == "static" and self.batch_size is None:
            raise ConfigError("--mode static needs --batch-size B")
        if self.mode != "static":
            for name, key in (("--batch-size", "batch_size"), ("--batch-timeout", "batch_timeout")):
                if key in given:
                    raise ConfigError(f"{name} is for --mode static (this run is --mode {self.mode})")

    def _resolve_policy_options(self, cfg: ReplayConfig) -> ReplayConfig:
        """--policy-opt keys once each; --sjf-key (only with --policy sjf) becomes the policy option `key`."""
        keys = [k for k, _ in self.policy_options]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"--policy-opt: a key is given twice "
                              f"({', '.join(sorted({k for k in keys if keys.count(k) > 1}))})")
        if self.sjf_key is None:
            return cfg
        if self.policy != "sjf":
            raise ConfigError(f"--sjf-key is an option of --policy sjf (this run uses --policy {self.policy})")
        if "key" in keys:
            raise ConfigError("--sjf-key and --policy-opt key=... say the same thing: give one")
        return dataclasses.replace(cfg, policy_options=(*self.policy_options, ("key", self.sjf_key)))

    def _resolve_attached(self, cfg: ReplayConfig, given: set[str]) -> ReplayConfig:
        """--attach URL... or --attach-prefill/--attach-decode (PD lists checked by check_pd_config): running
        servers, so no option that launches one."""
        uses = "--attach-prefill/--attach-decode use" if self.attach_prefill else "--attach uses"
        if self.attach and not self.attach_prefill and len(set(self.attach)) != len(self.attach):
            raise ConfigError("--attach: the same URL twice (each server once)")
        for name, key in (("--backend", "backend"), ("--port-base", "port_base"), ("--speed", "speed"),
                          ("--server-arg", "server_args"), ("--startup-timeout", "startup_timeout")):
            if key in given:
                raise ConfigError(f"{name} is for servers tracebench launches; {uses} running servers")
        if self.attach_prefill:
            if self.model is not None and self.vocab_size is not None:
                raise ConfigError("--model and --vocab-size both give the vocabulary size: give one")
            return dataclasses.replace(cfg, backend="attach", gpus=cfg.num_servers)
        if self.gpus is not None and self.gpus != len(self.attach):
            raise ConfigError(f"--gpus {self.gpus} with {len(self.attach)} --attach URL(s): with --attach the servers "
                              "are the URLs")
        if self.model is not None and self.vocab_size is not None:
            raise ConfigError("--model and --vocab-size both give the vocabulary size: give one")
        return dataclasses.replace(cfg, backend="attach", gpus=len(self.attach))

    def _resolve_launched(self, cfg: ReplayConfig) -> ReplayConfig:
        """Servers tracebench launches: --backend sglang (its model from --model or TRACEBENCH_MODEL) or sim."""
        backend = cfg.backend or "sglang"
        if backend not in ("sglang", "sim"):
            raise ConfigError(f"--backend must be sglang or sim, got {backend!r}")
        model, server_args = self.model, self.server_args
        if backend == "sglang":
            # Set once per machine, so the plain `tracebench replay t.jsonl --gpus 4` works; run.json keeps the
            # resolved values. Explicit flags win.
            if model is None:
                model = os.environ.get("TRACEBENCH_MODEL") or None
            if not server_args and os.environ.get("TRACEBENCH_SERVER_ARGS"):
                server_args = (os.environ["TRACEBENCH_SERVER_ARGS"],)
            if model is None:
                raise ConfigError("--backend sglang needs --model PATH or TRACEBENCH_MODEL (the model folder: sglang "
                                  "loads it, its config.json gives the vocabulary)")
            if self.speed is not None:
                raise ConfigError("--speed is for --backend sim (a real GPU runs at its own speed)")
            if self.vocab_size is not None:
                raise ConfigError("--vocab-size is for --backend sim or --attach: with sglang it comes from --model's "
                                  "config.json")
        if backend == "sim" and self.model is not None:
            raise ConfigError("--model is for --backend sglang or --attach: the simulator has no model files (use "
                              "--vocab-size)")
        return dataclasses.replace(
            cfg,
            backend=backend,
            model=model,
            server_args=server_args,
            gpus=cfg.num_servers if self.is_pd else (self.gpus or 1),
            startup_timeout=self.startup_timeout or STARTUP_TIMEOUT_S[backend],
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        # paths as a shareable run folder keeps them (tracebench/paths.py): no one's home folder in run.json
        out["trace"], out["out_dir"] = portable_path(self.trace), portable_path(self.out_dir)
        out["model"] = portable_path(self.model) if self.model is not None else None
        out["server_args"] = portable_words(self.server_args)
        out["router_args"] = portable_words(self.router_args)
        out["policy"] = portable_policy(self.policy)
        out["prefill_policy"], out["decode_policy"] = portable_policy(self.prefill_policy), portable_policy(self.decode_policy)
        out["policy_options"] = dict(self.policy_options)
        out["prefill_policy_options"] = dict(self.prefill_policy_options)
        out["decode_policy_options"] = dict(self.decode_policy_options)
        return out


def check_senders(senders: int, clock: str, pd: bool, sends_under: float, sends_under_given: bool) -> None:
    """--senders N: 1..MAX_SENDERS; more than one only where requests go through the one HTTP sender (ConfigError)."""
    import math

    if senders != 1:  # (senders.py, with multiprocessing, is imported only by runs that use it)
        from tracebench.replay.senders import MAX_SENDERS

        if not 1 <= senders <= MAX_SENDERS:
            raise ConfigError(f"--senders must be from 1 to {MAX_SENDERS}, got {senders}")
    if not (math.isfinite(sends_under) and sends_under >= 0):
        raise ConfigError(f"--router-sends-under must be >= 0 and finite, got {sends_under}")
    if sends_under_given and senders == 1:
        raise ConfigError("--router-sends-under is for --senders N > 1 (with one sender the router sends everything)")
    if senders > 1 and clock == "virtual":
        raise ConfigError("--senders: the virtual clock runs every request in its own process (--clock virtual "
                          "needs --senders 1)")
    if senders > 1 and pd:
        raise ConfigError("--senders: a PD pair's flight (prefill and decode, one request) runs in the router's "
                          "process for now (PD runs need --senders 1)")


def pin_cpu_list(text: str, senders: int) -> tuple[int, ...]:
    """--pin-cpus LIST ("0-8", "0,2,4-6"): the CPUs in the order given, the router's first (ConfigError when the
    list is malformed, repeats a CPU, names one this process may not run on, or does not fit --senders)."""
    if not hasattr(os, "sched_setaffinity"):
        raise ConfigError("--pin-cpus needs Linux (os.sched_setaffinity)")
    cpus: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            raise ConfigError(f"--pin-cpus {text!r}: expected CPU numbers and ranges like 0-8 or 0,2,4-6")
        first, last = int(low), int(high) if sep else int(low)
        if last < first:
            raise ConfigError(f"--pin-cpus {text!r}: the range {part.strip()} runs backwards")
        cpus.extend(range(first, last + 1))
    if len(set(cpus)) != len(cpus):
        raise ConfigError(f"--pin-cpus {text!r}: a CPU is named twice")
    allowed = os.sched_getaffinity(0)
    outside = [c for c in cpus if c not in allowed]
    if outside:
        raise ConfigError(f"--pin-cpus {text!r}: CPU(s) {outside} are not among those this process may run on "
                          f"({len(allowed)} CPUs: {min(allowed)}-{max(allowed)})")
    if senders == 1 and len(cpus) != 1:
        raise ConfigError(f"--pin-cpus {text!r}: with --senders 1 the router is the only process: give one CPU")
    if senders > 1 and len(cpus) < 2:
        raise ConfigError(f"--pin-cpus {text!r}: with --senders {senders} give the router's CPU and at least one "
                          "for the sender processes")
    return tuple(cpus)


def check_ray(cfg: ReplayConfig, given: set[str]) -> None:
    """--ray ADDRESS: the servers tracebench launches (--backend sim or sglang), one Ray actor per GPU; what needs
    servers of this host or ports chosen here is refused (ConfigError). Nothing here imports ray."""
    if not cfg.ray:
        raise ConfigError("--ray needs a cluster address (host:port of its head, or auto)")
    for name, key, why in (
        ("--attach", "attach", "attached servers are already running: --ray launches them"),
        ("--attach-prefill", "attach_prefill", "attached servers are already running: --ray launches them"),
        ("--attach-decode", "attach_decode", "attached servers are already running: --ray launches them"),
        ("--pd", "pd", "PD pools on Ray are not built yet (launch them on one host, or attach them)"),
        ("--port-base", "port_base", "each server's port is chosen free on its own node"),
    ):
        if key in given:
            raise ConfigError(f"--ray: {name} cannot be used ({why})")
    if cfg.clock != "real":
        raise ConfigError("--ray: --clock virtual runs the servers inside this process (tracebench sweep --ray runs "
                          "virtual-clock points as Ray tasks)")
    if cfg.router != "tracebench":
        raise ConfigError(f"--ray: --router {cfg.router} needs the servers' addresses before they start; use "
                          "tracebench's router")


def trace_prefix(header: TraceHeader, table: TraceTable) -> dict[str, Any] | None:
    """What run.json keeps of the trace's prefix structure (the report's ceiling), None for a trace without blocks."""
    if header.block_size is None or table.blocks is None:
        return None
    from tracebench.trace.prefix import build_tree, reusable_per_request, working_set

    tree = build_tree(table.block_counts(), table.blocks, table.input_len, header.block_size)
    reusable, total = int(reusable_per_request(tree).sum()), int(tree.input_len.sum())
    shared, _ = working_set(tree)
    return {"block_size": header.block_size, "reusable_tokens": reusable, "prompt_tokens": total,
            "reusable_fraction": reusable / total, "shared_tokens": shared}


def one_line(err: BaseException) -> str:
    """An error as one short line, for the records (a ServerStartError carries a whole log tail)."""
    text = str(err).splitlines()[0] if str(err) else ""
    return f"{type(err).__name__}: {text[:300]}"


def default_run_name(cfg: ReplayConfig, policy: Policy) -> str:
    if cfg.is_pd:
        p, d = cfg.pd_sizes
        return f"{cfg.trace.stem}-pd{p}x{d}-{policy.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    # one server without a cap: every request goes straight to it, the policy decides nothing, so it is not named
    no_choice = cfg.num_servers == 1 and cfg.mode == "continuous" and cfg.max_running_requests is None and not cfg.cap_schedule
    routed = "" if no_choice else f"{policy.name}-"
    return f"{cfg.trace.stem}-{routed}{cfg.mode}-{cfg.num_servers}g-{time.strftime('%Y%m%d-%H%M%S')}"


# what a run folder whose run never started holds: its run.json (status not_started) and the logs of the servers and
# router it tried to start
_NEVER_STARTED_FILES = re.compile(r"^(run\.json|server-\d+\.log|router\.log|\.reserve)$")


def never_started(run_dir: Path) -> str | None:
    """Why the run of `run_dir` never started (its run.json's error), when the folder is a never-started run's: run.json
    says `not_started` (no request was sent, nothing was measured) and the folder holds nothing but run.json and the
    logs of the servers it tried to start. None for anything else: a run that started, a folder run.json does not
    describe, one holding other files."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
        names = [path.name for path in run_dir.iterdir()]
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("status") != "not_started":
        return None
    if not all(_NEVER_STARTED_FILES.match(name) for name in names):
        return None
    return str(meta.get("error") or "no error recorded").splitlines()[0]


def _replace_never_started(run_dir: Path) -> str | None:
    """Remove `run_dir` when it is a never-started run's folder (a retry with the same --run-name takes its name);
    returns its error, or None (then nothing was touched). It is renamed away first, so a replay claiming the name at
    the same moment never sees half of it."""
    why = never_started(run_dir)
    if why is None:
        return None
    aside = run_dir.with_name(f".{run_dir.name}.replaced-{os.getpid()}")
    try:
        run_dir.rename(aside)
    except OSError:
        return None  # gone or taken meanwhile: the caller refuses the name as before
    shutil.rmtree(aside)
    return why


def claim_run_dir(out_dir: Path, name: str, generated: bool, stderr: IO[str] | None = None) -> Path:
    """Create the run folder `out_dir/name` (exclusively: two replays never share one). A name the user gave that
    exists is refused, unless that folder is a never-started run's (`never_started`: run.json status not_started,
    only its logs beside it), which the retry replaces, saying so on `stderr`; a generated name (one-second
    resolution) that exists gets the next free suffix -2, -3, ... (still readable, and sorting after the plain
    name)."""
    for attempt in range(1, 1000):
        run_dir = out_dir / (name if attempt == 1 else f"{name}-{attempt}")
        try:
            run_dir.mkdir(parents=True)
            return run_dir
        except FileExistsError:
            if not generated:
                why = _replace_never_started(run_dir)
                if why is not None:
                    if stderr is not None:
                        stderr.write(f"tracebench replay: replacing {run_dir}: its run never started, no request was "
                                     f"sent ({why})\n")
                    return claim_run_dir(out_dir, name, generated, None)
                raise ConfigError(f"run folder {run_dir} already exists: choose another --run-name (runs are never "
                                  "overwritten; only a run that never started is replaced by a retry)") from None
        except OSError as err:
            raise ConfigError(f"cannot create the run folder {run_dir}: {err.strerror}") from None
    raise ConfigError(f"run folders {out_dir / name} and -2 ... -999 all exist: give --run-name")


def check_free_space(out_dir: Path, cfg: ReplayConfig, header: TraceHeader) -> None:
    """Refuse a run whose folder obviously cannot fit on its file system: less free space than every record at its
    smallest, the telemetry lines and the reserve (all lower bounds: a run that passes may still fill the disk, and
    then stops, saying so)."""
    where = out_dir
    while not where.exists() and where != where.parent:
        where = where.parent
    stat = os.statvfs(where)
    free = stat.f_bavail * stat.f_frsize
    n = header.num_requests
    polls = 0 if cfg.router_policy is not None else int(header.duration_s / cfg.time_speed / cfg.poll_interval)
    need = n * MIN_RECORD_BYTES + polls * cfg.num_servers * MIN_TELEMETRY_LINE_BYTES + RESERVE_BYTES
    if free < need:
        raise ConfigError(
            f"not enough free space for the run folder in {out_dir}: {free / 1e6:.2f} MB free, the run needs at least "
            f"{need / 1e6:.2f} MB ({n} requests x {MIN_RECORD_BYTES} bytes, {polls} telemetry polls, a reserve of "
            f"{RESERVE_BYTES >> 10} KiB for run.json): free space or choose another --out-dir")


def disk_full(err: BaseException) -> OutputWriteError | None:
    """An OSError of a full disk (ENOSPC, EDQUOT), from any writer of the run folder (the beside telemetry's too), as
    the run's OutputWriteError; None for anything else."""
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f"writing {err.filename}" if err.filename else "writing a file of the run folder"
        return OutputWriteError(f"disk full (no space left on the device): {where} failed", err.filename, err.errno)
    return None


def make_reserve(run_dir: Path) -> Path:
    """RESERVE_BYTES held as a file in the run folder until the end of the run (then removed), so the final run.json
    can be written even when the disk filled up during the run."""
    path = run_dir / RESERVE_NAME
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as err:
            if err.errno != errno.EOPNOTSUPP:
                raise
            os.write(fd, b"\0" * RESERVE_BYTES)  # a file system without fallocate: written out
    except OSError as err:
        os.close(fd)
        path.unlink()
        raise ConfigError(f"cannot keep the {RESERVE_BYTES >> 10} KiB reserve for run.json in {run_dir}: {err.strerror}") from None
    os.close(fd)
    return path


def plan_servers(cfg: ReplayConfig, run_dir: Path, vocab: int | None, cap_changes: list[CapChange]) -> list[ServerPlan]:
    """The servers of a resolved config: the --attach URLs, or the commands that launch them (each launched server
    gets the largest cap the run can use as its --max-running-requests: `launch_cap`)."""
    if cfg.backend == "attach":
        if not cfg.is_pd:
            return plan_attached(cfg.attach)
        # PD: the prefill servers first, then the decode servers (their indices in run.json servers)
        plans = plan_attached(cfg.attach_prefill + cfg.attach_decode)
        for plan in plans:
            plan.role = "prefill" if plan.index < len(cfg.attach_prefill) else "decode"
        return plans
    user_args = split_server_args(cfg.server_args)
    if cfg.backend == "sim" and any(word.split("=", 1)[0] in ("--profile", "--gpu") for word in user_args):
        raise ConfigError("--server-arg --profile/--gpu: give the simulators' profile with --sim-profile or --sim-gpu "
                          "(run.json records it)")
    sim_args = ["--vocab-size", str(vocab)] if cfg.backend == "sim" and vocab is not None else []
    sim_args += ["--profile", cfg.sim_profile] if cfg.sim_profile is not None else []
    sim_args += ["--gpu", cfg.sim_gpu] if cfg.sim_gpu is not None else []
    link = kv_link_of(cfg)
    sim_args += link.sim_args() if link is not None and cfg.kv_link is not None else []
    plans = plan_launched(
        cfg.backend, cfg.num_servers, cfg.port_base, run_dir, model=cfg.model,  # type: ignore[arg-type]
        max_running_requests=launch_cap(cfg.max_running_requests, cap_changes),
        server_args=[*user_args, *sim_args], speed=cfg.speed,
        skip_tokenizer_init=cfg.api == "generate",
        # the OpenAI routes report cache hits only so (.DUCUMENT/openai-api.md); /generate's meta_info always does
        cache_report=cfg.api != "generate",
    )
    if cfg.is_pd:
        add_pd_launch_args(plans, cfg.pd_sizes[0], cfg.port_base)
    return plans


@dataclass(frozen=True)
class SharedServers:
    """Servers launched once by a caller that runs several replays on them (`tracebench sweep`). A run given them
    uses them as its launched servers (run.json keeps their launch commands and says who launched them) but neither
    starts nor stops them; `fleet` may hold more servers than the run uses (it takes the first --gpus)."""

    fleet: Fleet
    launched_by: dict[str, Any]  # run.json `servers_launched_by`: who launched them, and where their logs are


def _vocab(cfg: ReplayConfig) -> int | None:
    """The vocabulary size known before any server answers (None: the attached simulators will say it)."""
    if cfg.backend == "sglang" or (cfg.backend == "attach" and cfg.model is not None):
        return vocab_size_from_model(cfg.model)  # type: ignore[arg-type]
    return cfg.vocab_size  # sim: checked against what the simulator reports; attach: None -> asked below


def launch_fleet(config: ReplayConfig, log_dir: Path) -> Fleet:
    """The Fleet a resolved launching config (--backend sim or sglang) would start, logs in `log_dir`, not started:
    for a caller that keeps the servers across several runs (SharedServers)."""
    cfg = config.resolve()
    if cfg.backend == "attach" or cfg.is_pd:
        raise ConfigError("launch_fleet: only a --backend sim/sglang config without PD launches servers to share")
    cap_changes = parse_cap_schedule(cfg.cap_schedule, cfg.num_servers, cfg.time_speed) if cfg.cap_schedule else []
    return Fleet(cfg.backend, plan_servers(cfg, log_dir, _vocab(cfg), cap_changes))  # type: ignore[arg-type]


def run_replay(config: ReplayConfig, stderr: IO[str], shared: SharedServers | None = None) -> Path:
    """Run one replay; returns the run folder. Raises RunInterrupted (Ctrl-C), RunFailed (no server left), or the
    error that stopped the run, after the run folder is complete and every launched server is stopped (`shared`
    servers excepted: their owner stops them)."""
    cfg = config.resolve()
    if shared is not None and (cfg.backend != shared.fleet.backend or cfg.is_pd
                               or cfg.num_servers > len(shared.fleet.plans)):
        raise ConfigError(f"the shared servers are {len(shared.fleet.plans)} {shared.fleet.backend} server(s); this run "
                          f"wants {cfg.num_servers} {cfg.backend}" + (" (PD)" if cfg.is_pd else ""))
    # the whole trace is checked before anything starts, read once (a pipe works) and hashed as it is read
    header, table, trace_sha = load_trace_table(cfg.trace)
    stall = stall_bounds(table.input_len, table.output_len, cfg.speed, cfg.stall_timeout)
    vocab = _vocab(cfg)
    if vocab is not None:
        InputIds(trace_sha, vocab)  # refuses a vocabulary too small now, not after start-up
    if cfg.router_policy is not None:
        installed_version()  # sglang-router missing (or not the pinned version): refused before anything starts
        policy: Policy = SglangRouterPolicy(cfg.router_policy, np.random.default_rng(cfg.seed))
    elif cfg.is_pd:
        policy = PdPolicies(cfg)
    else:
        policy = load_policy(cfg.policy, np.random.default_rng(cfg.seed), dict(cfg.policy_options))
    cap_changes = parse_cap_schedule(cfg.cap_schedule, cfg.num_servers, cfg.time_speed) if cfg.cap_schedule else []
    run_name = cfg.run_name or default_run_name(cfg, policy)
    if not run_name or "/" in run_name or run_name in (".", ".."):
        raise ConfigError(f"--run-name {run_name!r}: must be a plain folder name")
    if cfg.run_name is not None and (cfg.out_dir / run_name).exists() and never_started(cfg.out_dir / run_name) is None:
        raise ConfigError(f"run folder {cfg.out_dir / run_name} already exists: choose another --run-name (runs are never "
                          "overwritten; only a run that never started is replaced by a retry)")
    if cfg.ray is not None:
        if shared is not None:
            raise ConfigError("--ray: the run's servers are its own Ray actors (none to share)")
        from tracebench.cluster.connect import connect
        from tracebench.replay.ray_fleet import RayFleet

        connect(cfg.ray)  # ray missing, or no cluster there: refused before the run folder exists
        # the sim-server / sglang command lines; each actor gives them its node's interpreter, address and a free port
        fleet: Fleet = RayFleet(cfg.backend, plan_servers(dataclasses.replace(cfg, port_base=1), cfg.out_dir / run_name,  # type: ignore[arg-type]
                                                          vocab, cap_changes), cfg.ray, cfg.startup_timeout)  # type: ignore[arg-type]
    elif cfg.clock == "virtual":
        if shared is not None:
            raise ConfigError("--clock virtual: the run's servers are in its own process (none to share)")
        from tracebench.replay.inprocess import InProcessFleet

        # the sim-server command lines configure the in-process servers (their ports are never bound)
        fleet = InProcessFleet(plan_servers(dataclasses.replace(cfg, port_base=1), cfg.out_dir / run_name,
                                                   vocab, cap_changes))
    else:
        fleet = (Fleet(cfg.backend, plan_servers(cfg, cfg.out_dir / run_name, vocab, cap_changes))  # type: ignore[arg-type]
                 if shared is None else shared.fleet.first(cfg.num_servers))
    check_free_space(cfg.out_dir, cfg, header)
    control_sock = bind_control_socket(cfg.control_port)
    try:
        run_dir = claim_run_dir(cfg.out_dir, run_name, generated=cfg.run_name is None, stderr=stderr)
    except BaseException:
        control_sock.close()
        raise
    try:
        make_reserve(run_dir)
    except BaseException:
        control_sock.close()
        run_dir.rmdir()
        raise
    # a generated name may have got a suffix: the launched servers' logs go in the folder claimed (shared servers
    # keep theirs where their owner put them)
    for plan in fleet.plans if shared is None else []:
        if plan.log is not None:
            plan.log = run_dir / plan.log.name
    replay = Replay(cfg, run_dir, header, table, trace_sha, stall, vocab, policy, fleet, cap_changes, control_sock,
                    stderr, shared)
    replay.run()
    return run_dir


class Replay:
    """The state of one run, kept so that however it ends, the run folder can be completed."""

    def __init__(
        self, cfg: ReplayConfig, run_dir: Path, header: TraceHeader, table: TraceTable, trace_sha: str,
        stall: StallBounds, vocab: int | None, policy: Policy, fleet: Fleet, cap_changes: list[CapChange],
        control_sock: socket.socket, stderr: IO[str], shared: SharedServers | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.header = header
        self.table = table
        self.trace_sha = trace_sha
        self.stall = stall
        self.vocab = vocab
        self.policy = policy
        self.fleet = fleet
        self.shared = shared  # servers someone else launched and stops (tracebench sweep); None: this run's own
        plans = fleet.plans
        self.external = (None if cfg.router_policy is None else
                         SglangRouter(cfg.router_policy, cfg.router_args, [p.url for p in plans], run_dir,
                                      roles=[p.role for p in plans] if cfg.is_pd else None))  # type: ignore[misc]
        # PD: each prefill server's bootstrap address, and every server's PD counters before the run
        self.pd_bootstrap: dict[int, tuple[str, int]] = {}
        self.pd_metrics_before: list[Any] | None = None
        self.pd_metrics: list[dict[str, Any]] | None = None
        self.cap_changes = cap_changes
        self.control_sock = control_sock
        self.control_url = f"http://127.0.0.1:{control_sock.getsockname()[1]}"
        self.stderr = stderr
        self.writer: RecordWriter | None = None  # made when the run clock starts: a run that never started has none
        self.trace_prefix = trace_prefix(header, table)
        self.clock: RunClock | None = None
        self.router: Router | None = None
        self.server_info: list[Any] = [None] * len(plans)
        self.accelerators: list[str | None] = [None] * len(plans)
        self.enable_metrics: list[bool] = [True] * len(plans)
        self.limits: list[ContextLimits | None] = [None] * len(plans)  # sglang's context limits (/server_info)
        self.signal: str | None = None
        self.status = "running"
        self.failure: BaseException | None = None
        self.t_end: float | None = None
        self.beside = BesideTelemetry(run_dir, cfg.metrics_interval)  # /metrics scrapes, GPU samples
        self.saturation: Saturation | None = None  # the verdict that stopped the run (--saturation-window)
        self.host_start: float | None = None  # --clock virtual: the host's monotonic time at the loop's start
        self.hops: Any = None  # --clock virtual: the modelled HTTP hops (inprocess.Hops)
        self.senders: Any = None  # --senders N > 1: the sender processes (senders.ProcessSender)

    # ---- the run folder ----------------------------------------------------------------------------------------

    def _servers_json(self) -> list[dict[str, Any]]:
        """run.json `servers`: each server as the fleet describes it, with what it said of itself."""
        servers = []
        for i in range(len(self.fleet.plans)):
            info = self.server_info[i]
            described = self.fleet.describe(i)
            if self.shared is not None:
                described["log"] = None  # not in this run folder: servers_launched_by says where
            servers.append({
                **described,
                "server_info": info,
                "version": info.get("version") if isinstance(info, dict) else None,
                "accelerator": self.accelerators[i],
                # a tracebench simulator, launched or attached (its /server_info has tracebench_sim; sglang's not)
                "simulated": (self.cfg.backend == "sim" if info is None
                              else isinstance(info.get("tracebench_sim"), dict)),
                "enable_metrics": self.enable_metrics[i] if info is not None else None,
            })
        return servers

    def _saturation_json(self) -> dict[str, Any] | None:
        """run.json `saturation`: the window watched (--saturation-window) and what was detected; null: not watched."""
        if self.cfg.saturation_window is None:
            return None
        return {
            "window_s": self.cfg.saturation_window,
            "detected": None if self.saturation is None else self.saturation.to_json(self.cfg.speed),
            "detail": None if self.saturation is None else self.saturation.describe(self.cfg.speed),
        }

    def _write_run_json(self, run: dict[str, Any] | None = None) -> None:
        """run.json as the run stands now (before the run, at its start, at its end; docs/run-format.md). `run`:
        `_run_json()`'s, made before (at the start: made before the clock started, its clock fields filled after)."""
        path = self.run_dir / "run.json"
        if run is None:
            run = self._run_json()
        try:
            write_atomic(path, orjson.dumps(run, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT) or self.status != "running":
                raise  # the final write has the reserve freed for it: failing then is not a full disk
            raise OutputWriteError(f"disk full (no space left on the device): writing {path} failed", path, err.errno) from None

    def _clock_fields(self) -> dict[str, Any]:
        """run.json's fields that the run clock's start gives (null before the clock is made): when it started on the
        wall clock, and --ray's cluster with each node's clock offset from it."""
        clock = self.clock
        return {"wall_clock_start": clock.wall_start if clock is not None else None,
                "ray": self.fleet.cluster(clock.mono_start if clock is not None and not clock.virtual else None)}

    def _run_json(self) -> dict[str, Any]:
        router = self.router
        servers = self._servers_json()
        clock_fields = self._clock_fields()
        return {
            "tracebench_run": RUN_FORMAT,
            "run_name": self.run_dir.name,
            "tracebench_version": __version__,
            "host": socket.gethostname(),
            "wall_clock_start": clock_fields["wall_clock_start"],
            "trace": {
                "path": portable_path(self.cfg.trace), "sha256": self.trace_sha, "num_requests": self.header.num_requests,
                "duration_s": self.header.duration_s, "header": self.header.fields, "prefix": self.trace_prefix,
                # requests sent delay_s after the one they follow finished (after/delay_s), not at their arrival_s
                "closed_loop": int((~self.table.open_loop).sum()),
            },
            "options": self.cfg.to_json(),
            "speed": self.cfg.speed,
            "clock": self.cfg.clock,
            # --clock virtual: what stands for the HTTP the run does not do (docs/virtual-clock.md)
            "virtual_clock": None if self.hops is None else self.hops.to_json(),
            # --senders: the processes that carried the requests (replay/senders.py)
            "senders": {"count": 1} if self.senders is None else self.senders.describe(),
            "backend": self.cfg.backend,
            "mode": self.cfg.mode,
            "batch_size": self.cfg.batch_size,
            "batch_timeout": self.cfg.batch_timeout,
            "stream": self.cfg.stream,
            "flush_cache": self.cfg.flush_cache,
            "api": self.cfg.api,
            # the servers report how many prompt tokens their prefix cache served (null: not known yet)
            "cache_reported": (None if all(info is None for info in self.server_info)
                               else self.cache_unreported() is None),
            "policy": self.policy.describe(),
            "seed": self.cfg.seed,
            "vocab_size": self.vocab,
            "servers": servers,
            # --ray: the cluster the servers ran on, each server's node and clock offset (docs/ray.md)
            "ray": clock_fields["ray"],
            # who launched the servers when it was not this run (tracebench sweep launches them once for its points)
            "servers_launched_by": None if self.shared is None else self.shared.launched_by,
            "gpu_names": sorted({a for a in self.accelerators if a}) if self.cfg.backend != "sim" else [],
            # the simulators' timing profiles (launched or attached), as their /server_info names them
            "sim_profiles": sorted({i["tracebench_sim"]["profile"] for i in self.server_info
                                    if isinstance(i, dict) and isinstance(i.get("tracebench_sim"), dict)}),
            "control_url": self.control_url if self.external is None and self.cfg.clock == "real" else None,
            # behind sglang-router there is no router cap (--max-running-requests is then the servers' own)
            "external_router": self.external.describe() if self.external is not None else None,
            "pd": self._pd_json(),
            "caps": {
                "initial": [None if self.external else self.cfg.max_running_requests] * len(servers),
                "changes": router.cap_changes if router is not None else [],
            },
            # --max-concurrency: the client's gate before the router queue (null: none); its peak is the most
            # requests admitted at once (never above it)
            "max_concurrency": self.cfg.max_concurrency,
            "max_concurrency_peak": router.gate.peak if router is not None and router.gate is not None else None,
            "events": self._events(),
            **self.beside.describe(),
            "stall": self.stall.to_json(),
            "status": self.status,
            "saturation": self._saturation_json(),
            "error": None if self.failure is None else f"{type(self.failure).__name__}: {self.failure}",
            "t_end": self.t_end,
            "counts": self._counts(),
            # records that reached requests.jsonl: the counts' sum, unless writing failed (disk full)
            "records_written": self.writer.written if self.writer is not None else 0,
            "policy_time": self._policy_time(),
            "client_keepup": self.writer.keepup.describe() if self.writer is not None else None,
        }

    def _events(self) -> list[dict[str, Any]]:
        events = self.router.events if self.router is not None else []
        if self.external is None:
            return events
        # behind sglang-router the router's one destination is sglang-router itself, not servers[0]
        return [{**e, "server": None, "detail": f"sglang-router ({self.external.url}): {e['detail']}"} for e in events]

    def _counts(self) -> dict[str, int]:
        if self.router is not None:
            return dict(self.router.counts)
        return dict.fromkeys(STATUSES, 0)  # never started: nothing was sent

    def _policy_time(self) -> dict[str, Any] | None:
        """run.json `policy_time`: the time spent inside the policy (replay/policy_time.py), null before the run."""
        if self.router is None:
            return None
        return {**self.router.policy_time.summary(), "warning": self.router.policy_time.warning()}

    # ---- the run -----------------------------------------------------------------------------------------------

    def run(self) -> None:
        self._write_run_json()
        try:
            try:
                if self.shared is None:
                    self.fleet.start()
                if self.cfg.clock == "virtual":
                    self.host_start = time.monotonic()
                    run_virtual(self._main())  # the loop's clock jumps from event to event (replay/loop.py)
                else:
                    run_loop(self._main())  # asyncio.run, with timers that wake when due (precise_loop.py)
            except KeyboardInterrupt:  # Ctrl-C before the loop's own handler was in place (or after it)
                self.signal = self.signal or "SIGINT"
            except BaseException as err:
                self.failure = disk_full(err) or err
            finally:
                try:
                    if self.external is not None:
                        self.external.stop()  # before the servers it routes to
                finally:
                    if self.shared is None:
                        self.fleet.stop()
                    self.control_sock.close()
        finally:
            if self.writer is not None:
                self.writer.close()  # before the status is decided: its last write may find the disk full
            if self.router is None:
                # the servers never started (or Ctrl-C came first): no request was sent, so none gets a record
                self.status = "not_started"
                if self.failure is None and self.signal is not None:
                    self.failure = RunInterrupted(f"interrupted ({self.signal}) before the run started")
            elif self.signal is not None and self.failure is None:
                self.status = "interrupted"
            elif self.failure is not None or self.router.failure is not None:
                self.status = "failed"
                if isinstance(self.failure, OutputWriteError) and isinstance(self.router.failure, OutputWriteError):
                    self.failure = self.router.failure  # the disk filled up once: the first write that found it
                self.failure = self.failure or self.router.failure
            elif self.saturation is not None:
                self.status = "saturated"  # stopped early on purpose: every request has its record
            else:
                self.status = "completed"
            if isinstance(self.failure, OutputWriteError) and self.writer is not None:
                self.failure = OutputWriteError(f"{self.failure}; {self.writer.written} of {len(self.table)} records "
                                                "reached requests.jsonl", self.failure.path, self.failure.errno)
            (self.run_dir / RESERVE_NAME).unlink(missing_ok=True)  # what the final run.json may need
            self._write_run_json()
        self._say_end()
        if self.status == "interrupted" or isinstance(self.failure, RunInterrupted):
            where = (f"the run folder {self.run_dir} is complete (status interrupted)" if self.status == "interrupted"
                     else f"the run never started ({self.run_dir}/run.json: status not_started)")
            err = RunInterrupted(f"interrupted ({self.signal}); {where}")
            if self.signal == "SIGTERM":
                err.exit_code = 128 + signal.SIGTERM
            raise err
        if self.failure is not None:
            raise self.failure

    def _say_end(self) -> None:
        if self.status == "not_started":
            logs = " (server logs there)" if any(p.launched for p in self.fleet.plans) else ""
            self.stderr.write(f"{self.run_dir}: never started, no request was sent: {one_line(self.failure)}{logs}\n")  # type: ignore[arg-type]
            self.stderr.flush()
            return
        counts = self._counts()
        summary = ", ".join(f"{k} {counts[k]}" for k in STATUSES)
        took = f" in {self.t_end:.1f} s of run time" if self.t_end is not None else ""
        if took and self.host_start is not None:  # --clock virtual: run time is simulated; the host's is apart
            wall = time.monotonic() - self.host_start
            took = f" in {self.t_end:.1f} simulated s ({wall:.1f} s of wall time, {self.t_end / max(wall, 1e-9):,.0f}x real time)"
        if took and self.cfg.speed is not None and self.cfg.speed != 1:  # (speed 1: run time is simulated time)
            took += f" ({self._simulated_duration()})"
        self.stderr.write(f"{self.run_dir}: {self.status}{took} ({summary})\n")
        if counts["mismatch"] and self.router is not None:
            # what a mismatch is is said once per reason (the records say it per request: requests.jsonl mismatch)
            for reason, count in sorted(self.router.mismatch_reasons.items(), key=lambda kv: -kv[1]):
                self.stderr.write(f"  mismatch {count}: {reason}\n")
        warning = self.router.policy_time.warning() if self.router is not None else None
        if warning is not None:
            self.stderr.write(f"tracebench replay: warning: {warning}\n")
        if self.writer is not None and (behind := self.writer.keepup.behind()) is not None:
            self.stderr.write(f"tracebench replay: warning: {behind}\n")
        self.stderr.flush()

    def _simulated_duration(self) -> str:
        """At --speed K: the run's duration as `tracebench report` gives it (replay/summary.py), never the run
        time x K (that would count tracebench's own host time K times)."""
        assert self.router is not None
        k = f"--speed {self.cfg.speed:g}"
        host_wait = (self.cfg.mode == "continuous" and (self.external is not None or self.cfg.max_running_requests is None)
                     and not self.router.cap_changes)
        output_s_known = all(isinstance((info or {}).get("tracebench_sim"), dict)
                             and isinstance(info["tracebench_sim"].get("output_s"), (int, float))
                             for info in self.server_info)
        duration = self.router.span.duration(host_wait, output_s_known, self.cfg.is_pd)
        if duration is None:
            return f"{k}: no request completed, so no simulated duration"
        return (f"{k}: {duration:.1f} simulated s from the first arrival to the last completed finish, as tracebench "
                "report counts them")

    async def _main(self) -> None:
        loop = asyncio.get_running_loop()
        work = asyncio.ensure_future(self._work())

        def on_signal(name: str) -> None:
            if self.signal is None:  # the first one stops the run; later ones must not cut the clean-up short
                self.signal = name
                work.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)
        try:
            await work
        except asyncio.CancelledError:
            if self.signal is None:
                raise
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    async def _work(self) -> None:
        cfg = self.cfg
        speed = cfg.time_speed
        timeout = None if cfg.timeout is None else run_seconds(cfg.timeout, speed)
        reason = None
        if cfg.timeout is not None and cfg.speed is not None:
            reason = (f"no complete answer within --timeout {cfg.timeout:g} s (simulated seconds: {timeout:g} s of run "
                      f"time at --speed {cfg.speed:g})")
        api = APIS[cfg.api]()
        client = self._client(api, timeout, reason)
        if cfg.clock != "virtual":
            # the control endpoint's aiohttp server (~50 ms of imports), imported long before the run clock starts (a
            # virtual run has no control endpoint, and imports no aiohttp)
            from tracebench.replay.control import ControlServer
        engine: Engine | None = None
        side_tasks: list[asyncio.Task[Any]] = []
        control: ControlServer | None = None
        try:
            input_ids = await self._prepare_servers(client, api)
            states, health_check = await self._destinations(client, api)
            # The trace, modules and server facts live for the whole run: out of the collector's sight, a full
            # collection (a pause of the loop, so release lag) does not walk them again and again.
            gc.collect()
            gc.freeze()
            self.writer = (RecordWriter if self.external is None else ViaRouterWriter)(self.run_dir / "requests.jsonl")
            # the run's clock: everything is wired to it now, and it starts (clock.start, below) right before the
            # engine's first step, so that setting up (the control endpoint, run.json's making, the engine: 2-7 ms)
            # is not run time: a request due at the start was released that late, and every server's steps kept the
            # phase it gave them
            # (self.clock from now: a run interrupted or failed before the start still has its t_end, as its
            # router's records have their stamps)
            self.clock = clock = VirtualRunClock(asyncio.get_running_loop()) if cfg.clock == "virtual" else RunClock()
            router = self._make_router(clock, states, health_check, self._sender(client, input_ids, clock, timeout,
                                                                                 reason))
            if cfg.clock == "virtual":  # an in-process engine that raised stops the run (a bug: fail fast)
                for task in self.fleet.tasks:  # type: ignore[attr-defined]
                    task.add_done_callback(self._side_done)
            elif self.external is None:  # behind sglang-router there are no tracebench caps to change
                control = ControlServer(self.control_sock, len(states), router.set_cap, router.caps)
                await control.start()
            start_json = self._run_json()   # (~1 ms) before the start; its clock fields are filled in after it
            engine = Engine(self.table, clock, router)
            clock.start()
            start_json.update(self._clock_fields())
            self._write_run_json(start_json)
            self._announce_start(control)
            if self.senders is not None:
                self.senders.use_clock(clock.mono_start, clock.wall_start)
            side_tasks = self._start_side_tasks(engine, router, client)
            await router.ended.wait()
            if router.failure is not None:
                await router.close(engine.unreleased, f"run stopped: {one_line(router.failure)}")
            elif self.saturation is not None:
                await router.close(engine.unreleased, f"run stopped: {self.saturation.describe(cfg.speed)}")
        except asyncio.CancelledError:
            if self.router is not None and self.signal is not None:
                unreleased = engine.unreleased if engine is not None else Rows(self.table, np.arange(len(self.table)))
                await self.router.close(unreleased, f"interrupted ({self.signal})")
            raise
        finally:
            await self._wind_down(client, side_tasks, control)

    def _client(self, api: Any, timeout: float | None, reason: str | None) -> Any:
        """What speaks to the servers: HTTP (SglangClient), or (--clock virtual) the in-process servers directly."""
        if self.cfg.clock == "virtual":
            from tracebench.replay.inprocess import InProcessClient, InProcessFleet

            assert isinstance(self.fleet, InProcessFleet)
            return InProcessClient(self.fleet, self.cfg.stream)
        return SglangClient(timeout, self.cfg.stream, reason, api=api, keepalive=self.cfg.keepalive)

    async def _prepare_servers(self, client: Any, api: Any) -> InputIds:
        """Before the run clock starts: the servers healthy, their facts read (and warned about), caches flushed, the
        files beside the load started, the sender processes up, a PD run's counters read. Returns the prompts' ids."""
        cfg = self.cfg
        startup = cfg.startup_timeout if cfg.startup_timeout is not None else PROBE_TIMEOUT_S
        await self.fleet.wait_healthy(client, startup)
        await self._server_facts(client)
        api.cache_reported = api.server_meta or not self.cache_unreported()
        if not api.cache_reported:
            self.stderr.write(f"tracebench replay: warning: {self.cache_unreported()}\n")
        if (overload := self.load_warning()) is not None:
            self.stderr.write(f"tracebench replay: warning: {overload}\n")
        if cfg.flush_cache:
            await self._flush_caches(client)
        await self.beside.start(client, self._beside_servers())
        input_ids = InputIds(self.trace_sha, self.vocab, self.header.block_size)  # type: ignore[arg-type]
        cpus = pin_cpu_list(cfg.pin_cpus, cfg.senders) if cfg.pin_cpus is not None else None
        if cfg.senders > 1:  # started before the run clock: their start-up is not run time
            from tracebench.replay.senders import start_senders

            self.senders = await start_senders(cfg.senders, self.trace_sha, self.vocab, self.header.block_size,  # type: ignore[arg-type]
                                               api, client, cfg.keepalive, cfg.router_sends_under,
                                               cpus[1:] if cpus else None, self._sender_launcher())
        if cpus:  # after the sender processes started (they begin on this process's CPUs, then move to theirs)
            os.sched_setaffinity(0, {cpus[0]})
        if cfg.is_pd:
            self.pd_metrics_before = await read_pd_metrics(client, [p.url for p in self.fleet.plans],
                                                            PROBE_TIMEOUT_S)
        return input_ids

    async def _destinations(self, client: Any, api: Any) -> tuple[list[ServerState], Any]:
        """The router's destinations and how it checks their health: each server, or sglang-router alone (started
        here, and run.json written once it is)."""
        cfg = self.cfg
        if self.external is None:
            states = [
                # OpenAI answers carry no meta_info stamps (.DUCUMENT/openai-api.md): nothing to require then
                ServerState(p.index, p.url, cfg.max_running_requests,
                            require_stamps=self.enable_metrics[p.index] and api.server_meta,
                            launch_cap=self.server_info[p.index].get("max_running_requests"), api_path=api.path,
                            limits=self.limits[p.index], wall_offset=self.fleet.wall_offset(p.index))
                for p in self.fleet.plans
            ]
            if cfg.is_pd:
                pool_states(states)   # PdRouter checks the stamps of each side itself
            return states, self._health_check(client)
        # one destination, sglang-router, without a cap; it passes each server's meta_info on unchanged
        ports = {self.fleet.plans[i].url: port for i, (_, port) in self.pd_bootstrap.items()}
        await self.external.start(client, bootstrap_ports=ports if cfg.is_pd else None)
        self._write_run_json()
        # PD: the answer is a decode server's, which has no prefill_finished_time: its stamps are taken as they come
        # (pd_router.py checks them through tracebench's own router); answers are checked against the servers'
        # context limits when they all have the same ones
        limits = self.limits[0] if len(set(self.limits)) == 1 else None
        states = [ServerState(0, self.external.url, None, api_path=api.path, limits=limits,
                              require_stamps=all(self.enable_metrics) and api.server_meta and not cfg.is_pd)]
        return states, self.external.health_check(client)

    def _make_router(self, clock: RunClock, states: list[ServerState], health_check: Any, sender: Any) -> Router:
        """The run's router (self.router): PdRouter over the PD pools, or Router over the servers (or sglang-router)."""
        cfg = self.cfg
        assert self.writer is not None
        common: dict[str, Any] = dict(
            clock=clock, servers=states, sender=sender, writer=self.writer,
            total=len(self.table), health_check=health_check,
            batch_size=cfg.batch_size if cfg.mode == "static" else None,
            batch_timeout=None if cfg.batch_timeout is None else run_seconds(cfg.batch_timeout, cfg.time_speed),
            speed=cfg.time_speed, block_size=self.header.block_size, max_concurrency=cfg.max_concurrency,
            stall=self.stall, modelled_hops=modelled_hops(self.server_info),
        )
        if cfg.is_pd and self.external is None:
            assert isinstance(self.policy, PdPolicies)
            plans = self.fleet.plans
            pools = PdPools([p.index for p in plans if p.role == "prefill"],
                            [p.index for p in plans if p.role == "decode"], self.policy.prefill,
                            self.policy.decode, self.pd_bootstrap,
                            {p.index: self.enable_metrics[p.index] for p in plans})
            self.router = router = PdRouter(pools=pools, seed=cfg.seed, decode_answers=True, **common)
        else:  # sglang-router's PD mode passes the decode server's answer on
            self.router = router = Router(policy=self.policy, decode_answers=cfg.is_pd, **common)
        if self.senders is not None:
            self.senders.on_fault = router.fail  # a sender process that died stops the run (senders.py)
        return router

    def _announce_start(self, control: ControlServer | None) -> None:
        """The run's first lines on stderr: how many requests, to which servers, where the run folder is."""
        servers = f"{len(self.fleet.plans)} server(s)"
        if self.external is not None:
            servers += f" behind sglang-router {self.external.version} --policy {self.external.policy} ({self.external.url})"
        self.stderr.write(f"tracebench replay: {len(self.table)} requests, {servers}, run folder {self.run_dir}\n")
        if control is not None:
            self.stderr.write(f"control: POST {self.control_url}/cap {{\"server\": i|\"all\", \"max_running_requests\": n}}\n")
        self.stderr.flush()

    def _start_side_tasks(self, engine: Engine, router: Router, client: Any) -> list[asyncio.Task[Any]]:
        """The run's tasks: the engine releasing the trace, the router's watch, the load poller, the files beside the
        load, the cap schedule, the progress line, the saturation watch; any that raises stops the run."""
        cfg, clock = self.cfg, self.clock
        assert clock is not None
        side = [engine.run(), router.watch()]
        if self.external is None:  # the poller asks each destination for /v1/loads: sglang-router has none
            side.append(poll_loads(client, router, clock, cfg.poll_interval, self.run_dir / "telemetry.jsonl"))
            router.polled = True
        side.extend(self.beside.coroutines(clock, router.fail))
        if self.cap_changes:
            side.append(run_cap_schedule(self.cap_changes, clock, self._scheduled_set_cap(router)))
        if not cfg.quiet:
            side.append(show_progress(router, clock, self.stderr, cfg.speed, wall_paced=cfg.clock == "virtual"))
        if cfg.saturation_window is not None:
            watch = SaturationWatch(run_seconds(cfg.saturation_window, cfg.time_speed))
            side.append(watch_saturation(watch, clock, lambda: router.released, lambda: router.finished,
                                         self._saturated))
        tasks = []
        for coro in side:
            task = asyncio.ensure_future(coro)
            task.add_done_callback(self._side_done)
            tasks.append(task)
        return tasks

    async def _wind_down(self, client: Any, side_tasks: list[asyncio.Task[Any]],
                         control: ControlServer | None) -> None:
        """After the run, however it ended: the clock's last reading, the side tasks stopped, the servers' counters
        after the run read, the client closed, the final progress line."""
        cfg = self.cfg
        if self.clock is not None:
            self.t_end = self.clock.now()
            if self.senders is not None:
                self.senders.run_ended()  # the router's CPU over the run: until now (run.json senders.router_cpu_s)
        for task in side_tasks:
            task.cancel()
        if side_tasks:
            await asyncio.wait(side_tasks)
        if self.router is not None:
            await self.router.stop_probes()  # before the session closes (a probe through it would fail)
        if control is not None:
            await control.stop()
        if self.external is not None:
            await self.external.finish(client)  # the servers' counters after the run
        try:
            if self.pd_metrics_before is not None:
                await self._pd_metrics_after(client)
            await self.beside.finish()
        finally:
            if self.senders is not None:
                await self.senders.close()
            await client.close()
        if not cfg.quiet and self.router is not None and self.t_end:
            # the last state, whatever the period of the progress line (its rate: over the whole run)
            tty = self.stderr.isatty()
            line = progress_line(self.router, self.t_end, self.router.finished / self.t_end, cfg.speed)
            self.stderr.write(("\r" if tty else "") + line + "\n")

    def _sender_launcher(self) -> Any:
        """--ray: the sender processes of --senders N as actors on the cluster (replay/ray_senders.py); else None
        (spawned on this host)."""
        if self.cfg.ray is None:
            return None
        from tracebench.replay.ray_senders import RaySenders

        return RaySenders(self.fleet.ray)  # type: ignore[attr-defined]

    def _sender(self, client: Any, input_ids: InputIds, clock: RunClock, timeout: float | None,
                reason: str | None) -> Any:
        """How the requests reach the servers (flight.py): HTTP, or (--clock virtual) a direct call into the
        in-process servers, with the HTTP hops modelled from their profile (one: they are built from one command
        line but for --port)."""
        if self.senders is not None:
            return self.senders   # told the run clock's anchor when it starts (use_clock)
        if self.cfg.clock == "real":
            return HttpSender(client, input_ids)
        from tracebench.replay.inprocess import Hops, InProcessFleet, InProcessSender

        assert isinstance(self.fleet, InProcessFleet)
        self.hops = Hops.of_profile(self.fleet.servers[0].args.profile)
        return InProcessSender(self.fleet, input_ids.block_size, self.cfg.stream, self.hops, clock, timeout, reason)

    def _beside_servers(self) -> list[dict[str, Any]]:
        # what BesideTelemetry needs of each server (behind sglang-router too: it asks the servers themselves)
        return [{**self.fleet.describe(p.index), "enable_metrics": self.enable_metrics[p.index],
                 "simulated": isinstance(self.server_info[p.index].get("tracebench_sim"), dict)}
                for p in self.fleet.plans]

    async def _pd_metrics_after(self, client: SglangClient) -> None:
        """Every PD server's counters after the run, as deltas over it (run.json pd.server_metrics)."""
        plans = self.fleet.plans
        # a server tracebench's router found down is not asked (a hung one would hold the end of the run 30 s)
        down = ({s.index for s in self.router.servers if s.state == "down"}
                if self.external is None and self.router is not None else set())
        asked = [p for p in plans if p.index not in down]
        got = dict(zip([p.index for p in asked], await read_pd_metrics(client, [p.url for p in asked], PROBE_TIMEOUT_S)))
        after = [got.get(p.index, (None, "down during the run: not asked after it")) for p in plans]
        assert self.pd_metrics_before is not None
        self.pd_metrics = [
            {"server": p.index, "role": p.role, "delta": metrics_delta(old, new), "error": old_err or new_err}
            for p, (old, old_err), (new, new_err) in zip(plans, self.pd_metrics_before, after)
        ]

    def _pd_json(self) -> dict[str, Any] | None:
        """run.json `pd` (docs/run-format.md): the pools, their policies, the bootstrap addresses, the servers' PD
        counters over the run."""
        if not self.cfg.is_pd:
            return None
        plans = self.fleet.plans
        policies = None
        if isinstance(self.policy, PdPolicies):
            policies = {"prefill": self.policy.prefill.describe(), "decode": self.policy.decode.describe()}
        return {
            "ratio": "{}:{}".format(*self.cfg.pd_sizes),
            "pools": {role: [p.index for p in plans if p.role == role] for role in ("prefill", "decode")},
            "policies": policies,
            "bootstrap": [{"server": i, "host": host, "port": port} for i, (host, port) in sorted(self.pd_bootstrap.items())],
            "rooms": "uniform in [0, 2^63 - 1] (as sglang-router), drawn from the run's seed"
                     if self.external is None else "sglang-router's own (random)",
            "server_metrics": self.pd_metrics,
            "kv_link": None if (link := kv_link_of(self.cfg)) is None else link.to_json(),
        }

    async def _flush_caches(self, client: SglangClient) -> None:
        """Empty every server's prefix cache before the clock starts, so runs of one trace start from the same cache
        state (what a previous run or a warm-up left there would otherwise be hits of this one)."""
        plans = self.fleet.plans
        answers = await asyncio.gather(*(client.flush_cache(p.url, PROBE_TIMEOUT_S) for p in plans))
        for plan, why in zip(plans, answers):
            if why is not None:
                raise ServerStartError(f"server {plan.index} ({plan.url}): {why}; an attached server must be idle "
                                       "when the run starts, or give --no-flush-cache")

    def _scheduled_set_cap(self, router: Router):
        """router.set_cap for the cap schedule, counting the changes still to come (each asks the policy again:
        Router._nothing_can_ask_again)."""
        router.pending_wakeups = len(self.cap_changes)

        def set_cap(server: int | None, cap: int, source: str) -> None:
            router.pending_wakeups -= 1
            router.set_cap(server, cap, source)

        return set_cap

    def _saturated(self, verdict: Saturation) -> None:
        """The saturation watcher's verdict: the run ends now (what was never sent and what is in flight get their
        records in _work, from router.close)."""
        self.saturation = verdict
        assert self.router is not None
        self.router.ended.set()

    def _side_done(self, task: asyncio.Task[Any]) -> None:
        # the engine, poller, cap schedule and progress line run beside the requests: an error in one stops the run
        if not task.cancelled() and task.exception() is not None and self.router is not None:
            err = task.exception()
            self.router.fail(disk_full(err) or err)  # type: ignore[arg-type]

    def _health_check(self, client: SglangClient):
        fleet = self.fleet
        timeout = min(PROBE_TIMEOUT_S, self.stall.run_no_progress_s)  # a hung server answers nothing: not for long

        async def check(index: int) -> str | None:
            why = fleet.exit_reason(index) or await client.alive(fleet.plans[index].url, timeout)
            if why is not None and fleet.plans[index].launched:
                # a killed server resets its connections a moment before its process is seen to exit: its exit,
                # when it comes, is the cause to name
                why = await wait_exit(lambda: fleet.exit_reason(index), fleet.exit_settle_s) or why
            return why

        return check

    def load_warning(self) -> str | None:
        """The trace's offered load against these servers, past what they serve (tracebench/capacity.py): said before
        the run, since a run that falls behind measures its backlog. None when under, or the servers' costs are not
        known (neither simulators nor a GPU with a built-in profile), or a PD run."""
        from tracebench.capacity import costs_of_servers, load_warning

        costs = costs_of_servers(self.server_info, self.accelerators)
        count, duration = len(self.table), self.header.duration_s
        if costs is None or self.cfg.is_pd or count < 2 or not duration:
            return None
        return load_warning(costs, requests=count, rate=(count - 1) / duration, input_mean=float(self.table.input_len.mean()),
                            output_mean=float(self.table.output_len.mean()),
                            cached_fraction=float((self.trace_prefix or {}).get("reusable_fraction") or 0.0),
                            servers=len(self.fleet.plans), cap=self.cfg.max_running_requests)

    def cache_unreported(self) -> str | None:
        """Why this run cannot know its prefix-cache hits (records' cached_tokens null), or None when it can: with
        --api completions|chat the servers must run with --enable-cache-report (launched ones do), and /server_info
        says whether they do. run.json `cache_reported` keeps the answer; the report says it."""
        if self.cfg.api == "generate":
            return None
        without = [str(p.index) for p, info in zip(self.fleet.plans, self.server_info)
                   if not (isinstance(info, dict) and info.get("enable_cache_report") is True)]
        if not without:
            return None
        return (f"--api {self.cfg.api}: server(s) {', '.join(without)} run without --enable-cache-report, so their "
                f"OpenAI answers do not say how many prompt tokens the prefix cache served: this run cannot know its "
                f"cache hits (records' cached_tokens null; the report has no prefix-cache figures). Start them with "
                f"--enable-cache-report, or replay with --api generate")

    async def _server_facts(self, client: SglangClient) -> None:
        """/server_info and /v1/loads of every server (recorded in run.json), and the vocabulary size where the
        server is the one that knows it (the simulator)."""
        plans = self.fleet.plans
        infos = await asyncio.gather(*(client.get_json(f"{p.url}/server_info", PROBE_TIMEOUT_S) for p in plans))
        loads = await asyncio.gather(*(client.get_json(f"{p.url}/v1/loads", PROBE_TIMEOUT_S) for p in plans))
        for plan, info, load in zip(plans, infos, loads):
            for what, got in (("/server_info", info), ("/v1/loads", load)):
                if got.error is not None or not isinstance(got.obj, dict):
                    raise ServerStartError(f"server {plan.index} ({plan.url}): {what}: {got.error or 'not a JSON object'}")
            self.server_info[plan.index] = info.obj
            self.accelerators[plan.index] = load.obj.get("accelerator")
            metrics = info.obj.get("enable_metrics")
            if not isinstance(metrics, bool):
                raise ServerStartError(f"server {plan.index} ({plan.url}): /server_info has no boolean 'enable_metrics' ({metrics!r})")
            # with --enable-metrics every meta_info stamp must come (a missing one is an error); without it (an
            # attached server started so) sglang sends only e2e_latency, and the server_* fields stay null
            self.enable_metrics[plan.index] = metrics
            if plan.role is not None:   # PD: the server must be what it was given as; a prefill's bootstrap port
                port = check_role(plan.index, plan.url, info.obj, plan.role)
                if port is not None:
                    self.pd_bootstrap[plan.index] = (bootstrap_host(plan.url), port)
            else:
                check_unified(plan.index, plan.url, info.obj)
            self.limits[plan.index] = ContextLimits.from_server_info(f"server {plan.index} ({plan.url})", info.obj)
        # the simulator says its vocabulary size in /server_info (tracebench_sim.vocab_size); sglang does not
        reported = {i.obj["tracebench_sim"].get("vocab_size") for i in infos if isinstance(i.obj.get("tracebench_sim"), dict)}
        all_sims = all(isinstance(i.obj.get("tracebench_sim"), dict) for i in infos)
        if self.vocab is None:
            if not all_sims:
                raise ConfigError(
                    "the vocabulary size of the attached server(s) is unknown: give --vocab-size V or --model PATH "
                    "(its config.json); an input id outside the vocabulary kills a real sglang server"
                )
            if len(reported) != 1:
                raise ConfigError(f"the simulators report different vocabulary sizes: {sorted(map(str, reported))}")
            vocab = reported.pop()
            if not isinstance(vocab, int):
                raise ServerStartError(f"the simulator's /server_info has tracebench_sim.vocab_size {vocab!r}, not an integer")
            self.vocab = vocab
        elif reported - {self.vocab}:
            raise ConfigError(f"the vocabulary size is {self.vocab}, but a simulator reports {sorted(map(str, reported))}")

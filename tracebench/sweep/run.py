"""One sweep, start to end: check the options and the trace, launch the servers once, run every point as an ordinary
replay on them (or on the --attach URLs), summarise each point with the report's code, write the sweep folder.

A sweep folder (docs/sweep.md):
    <out-dir>/<name>/
        summary.json, summary.csv    one row per point (rewritten after each point: a stopped sweep keeps its rows)
        load-latency.html, .png      the load-latency figure (written at the end)
        traces/<point>.jsonl         each point's trace (rescaled, or all at 0), so a point replays on its own
        servers/server-<i>.log       the launched servers' logs (their launch commands are in every point's run.json)
        <point>/                     each point's run folder (`tracebench report` reads it like any run)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable
from typing import IO, Any

import numpy as np
import orjson

from tracebench import __version__
from tracebench.cleanup import write_atomic
from tracebench.errors import ConfigError, Interrupted, RunFailed, RunInterrupted
from tracebench.paths import portable_policy
from tracebench.policies.registry import load_policy
from tracebench.replay.client import SglangClient
from tracebench.replay.run import ReplayConfig, SharedServers, launch_fleet, run_replay
from tracebench.replay.saturation import PERSIST, SAMPLES_PER_WINDOW
from tracebench.replay.telemetry import parse_loads
from tracebench.replay.saturation import RULE as SATURATION_RULE
from tracebench.sweep.search import RULE as SEARCH_RULE
from tracebench.sweep.parallel import Part
from tracebench.sweep.search import RateSearch
from tracebench.replay.caps import parse_cap_schedule
from tracebench.sweep.faults import PointFault, point_faults
from tracebench.sweep.traces import rate_window, refuse_closed_loop, trace_rate, write_point_trace
from tracebench.trace.format import load_trace, sha256_file

SWEEP_FORMAT = 1
IDLE_TIMEOUT_S = 120.0  # how long the servers may take to finish aborting a stopped point's requests
WHAT = {"rate": "rate sweep", "concurrency": "concurrency sweep", "capacity": "capacity search"}
DEFAULT_SATURATION_WINDOW_S = 10.0
PARALLEL_FROM = 10_000  # requests in all points of a rate or concurrency sweep: from here, --jobs defaults to the cores


@dataclass(frozen=True)
class SweepConfig:
    """What `tracebench sweep` was asked. `base` holds the replay options every point shares; its gpus and policy
    are replaced per point by `gpus` / `policies` when those are given."""

    base: ReplayConfig
    rates: tuple[float, ...] = ()
    concurrency: tuple[int, ...] = ()
    find_max_rate: bool = False
    gpus: tuple[int, ...] = ()  # () -> the replay's own (--gpus, or the --attach URLs)
    policies: tuple[str, ...] = ()  # () -> base.policy
    slo_spec: str | None = None
    slo_percentile: float = 99.0
    warmup: float = 0.0
    bootstrap: int = 1000
    name: str | None = None
    start_rate: float | None = None
    rate_tolerance: float = 0.05
    max_points: int = 12
    point_duration: float | None = None  # trace seconds of arrivals per rate point (a prefix of the trace)
    pd: tuple[str, ...] = ()  # PD ratios "P:D", a dimension (each point launches its own PD servers)
    jobs: int | None = None  # --jobs: parts run at once in worker processes (sweep/parallel.py); None: the default
    ray: str | None = None  # a Ray cluster's address: the points run there as tasks, in parallel (sweep/ray_points.py)

    @property
    def kind(self) -> str:
        return "capacity" if self.find_max_rate else "concurrency" if self.concurrency else "rate"


@dataclass(frozen=True)
class Point:
    name: str
    kind: str  # "rate" or "concurrency"
    value: float  # req/s, or requests in flight
    gpus: int
    policy: str
    pd: str | None = None  # "P:D" for a PD point (gpus = P + D)


def _label(spec: str) -> str:
    """A policy spec as part of a folder name (policies/x.py:Cls -> policies_x.py_Cls)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", portable_policy(spec) or "").strip("_.") or "policy"


def _fmt_value(value: float) -> str:
    return f"{value:.4g}"


class Sweep:
    def __init__(self, cfg: SweepConfig, stderr: IO[str]) -> None:
        self.cfg = cfg
        self.stderr = stderr
        self._check_options()
        base = cfg.base
        self.header, self.requests = load_trace(base.trace)
        refuse_closed_loop(base.trace, self.requests)
        self.trace_sha = sha256_file(base.trace)
        self.source_rate = trace_rate(self.requests) if cfg.kind != "concurrency" else None
        for rate in cfg.rates:  # a point that cannot be written is refused before any server starts
            rate_window(self.requests, rate, cfg.point_duration)
        from tracebench.report.metrics import parse_slo  # the report's --slo syntax, the report's parser

        self.slo = parse_slo(cfg.slo_spec) if cfg.slo_spec is not None else None
        stamp = time.strftime("%Y%m%d-%H%M%S")
        self.name = cfg.name or f"sweep-{base.trace.stem}-{cfg.kind}-{stamp}"
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ConfigError(f"--name {self.name!r}: must be a plain folder name")
        self.dir = base.out_dir / self.name
        if self.dir.exists():
            raise ConfigError(f"sweep folder {self.dir} already exists: choose another --name (never overwritten)")
        resolved = base.resolve()
        self.part_sink: Callable[[dict[str, Any]], None] | None = None  # in a worker: where each row goes
        self.attach = resolved.attach
        # servers launched once for every point, except: PD points launch their own (the roles differ from one ratio
        # to the next), and --clock virtual points each run their own, in process
        self.launches = (resolved.backend in ("sim", "sglang") and not cfg.pd and resolved.clock == "real"
                         and cfg.ray is None)  # on Ray each point's task launches its own
        self.gpus = cfg.gpus or (resolved.num_servers,)
        self.policies = cfg.policies or (base.policy,)
        if self.attach and max(self.gpus) > len(self.attach):
            raise ConfigError(f"--gpus {max(self.gpus)}: only {len(self.attach)} --attach URL(s) (a point with N GPUs "
                              "uses the first N URLs)")
        for policy in self.policies:  # refused now, not at the first point that uses it
            if base.router == "tracebench":
                load_policy(policy, np.random.default_rng(0), dict(base.policy_options))
        for gpus, pd in self.setups:
            for policy in self.policies:
                checked = self._point_config(Point("check", "rate", 1.0, gpus, policy, pd), base.trace).resolve()
                if checked.cap_schedule:  # as the replay does before its folder: refused before the sweep's
                    parse_cap_schedule(checked.cap_schedule, checked.num_servers, checked.time_speed)
        if cfg.ray is not None:  # ray missing, or no cluster there: refused before the sweep folder exists
            from tracebench.cluster.connect import connect

            connect(cfg.ray)
        self.jobs = self._jobs(resolved.clock)
        self.rows: list[dict[str, Any]] = []
        self.named: set[str] = set()  # the point names given so far (on Ray, before any has a row)
        self.ray_points: dict[str, dict[str, str]] = {}  # point -> the node its task ran on (--ray)
        self.searches: list[dict[str, Any]] = []
        self.status = "running"
        self.error: str | None = None
        self.servers: list[dict[str, Any]] | None = None
        self.t0 = time.monotonic()

    def __getstate__(self) -> dict[str, Any]:
        """What a worker process gets (sweep/parallel.py): all but the terminal."""
        return {k: v for k, v in self.__dict__.items() if k != "stderr"}

    def parts(self) -> list[Part]:
        """The sweep's independent pieces, in the order a one-process sweep runs them (sweep/parallel.py)."""
        if self.cfg.kind == "capacity":
            return [Part("search", gpus, pd, policy) for gpus, pd in self.setups for policy in self.policies]
        values = self.cfg.rates if self.cfg.kind == "rate" else self.cfg.concurrency
        return [Part(self.cfg.kind, gpus, pd, policy, float(value))
                for gpus, pd in self.setups for policy in self.policies for value in values]

    def _jobs(self, clock: str) -> int:
        """--jobs: how many parts run at once. Only the virtual clock's points are independent of the host and of
        each other (a real-clock sweep shares its servers and measures in real time). Its default: one per usable
        core for a capacity search of several combinations or a sweep of at least PARALLEL_FROM requests in all;
        else 1 (a worker process costs ~1 s of imports, more than a small sweep's points take)."""
        asked = self.cfg.jobs
        if asked is not None and asked < 1:
            raise ConfigError(f"--jobs must be >= 1, got {asked}")
        if self.cfg.ray is not None:
            if asked is not None and asked > 1:
                raise ConfigError(f"--jobs {asked} with --ray: the cluster runs the points side by side (give one)")
            return 1
        if clock != "virtual":
            if asked is not None and asked > 1:
                raise ConfigError(f"--jobs {asked}: parts run side by side only on --clock virtual (a real-clock "
                                  "sweep's points share its servers and the host's time)")
            return 1
        if asked is not None:
            return asked
        parts = self.parts()
        if self.cfg.kind == "capacity":
            big = len(parts) > 1
        else:
            big = sum(self._point_requests(p) for p in parts) >= PARALLEL_FROM
        return len(os.sched_getaffinity(0)) if big else 1

    def _point_requests(self, part: Part) -> int:
        if part.kind == "rate" and self.cfg.point_duration is not None:
            return min(len(self.requests), round(part.value * self.cfg.point_duration) + 1)
        return len(self.requests)

    @property
    def setups(self) -> list[tuple[int, str | None]]:
        """(servers, PD ratio or None) of each setup the points run on: --pd's ratios, else --gpus's counts."""
        if self.cfg.pd:
            from tracebench.replay.pd import parse_ratio

            return [(sum(parse_ratio(ratio)), ratio) for ratio in self.cfg.pd]
        return [(gpus, None) for gpus in self.gpus]

    def _check_options(self) -> None:
        cfg = self.cfg
        asked = [name for name, given in (("--rates", bool(cfg.rates)), ("--concurrency", bool(cfg.concurrency)),
                                          ("--find-max-rate", cfg.find_max_rate)) if given]
        if len(asked) != 1:
            raise ConfigError("give one of --rates R,..., --concurrency N,... or --find-max-rate"
                              + (f" (got {' and '.join(asked)})" if asked else ""))
        for name, values in (("--rates", cfg.rates), ("--concurrency", cfg.concurrency), ("--gpus", cfg.gpus),
                             ("--policy", cfg.policies)):
            if len(set(values)) != len(values):
                raise ConfigError(f"{name}: a value is given twice")
        if any(not (r > 0 and math.isfinite(r)) for r in cfg.rates):
            raise ConfigError(f"--rates: every rate must be > 0, got {','.join(map(_fmt_value, cfg.rates))}")
        if any(n < 1 for n in cfg.concurrency) or any(g < 1 for g in cfg.gpus):
            raise ConfigError("--concurrency and --gpus values must be >= 1")
        if cfg.find_max_rate and cfg.slo_spec is None:
            raise ConfigError("--find-max-rate needs --slo (the objectives the rate must meet)")
        if not 0 < cfg.slo_percentile < 100:
            raise ConfigError(f"--slo-percentile must be in (0, 100), got {cfg.slo_percentile:g}")
        if not cfg.find_max_rate:
            for name, given in (("--start-rate", cfg.start_rate is not None),):
                if given:
                    raise ConfigError(f"{name} is for --find-max-rate")
        if cfg.start_rate is not None and not cfg.start_rate > 0:
            raise ConfigError(f"--start-rate must be > 0, got {cfg.start_rate:g}")
        if not cfg.rate_tolerance > 0:
            raise ConfigError(f"--rate-tolerance must be > 0, got {cfg.rate_tolerance:g}")
        if cfg.max_points < 2:
            raise ConfigError(f"--max-points must be >= 2, got {cfg.max_points}")
        if cfg.point_duration is not None and not cfg.point_duration > 0:
            raise ConfigError(f"--point-duration must be > 0, got {cfg.point_duration:g}")
        if cfg.point_duration is not None and cfg.concurrency:
            raise ConfigError("--point-duration is for rate points (a concurrency point releases every request at once)")
        if cfg.bootstrap < 0 or cfg.warmup < 0:
            raise ConfigError("--bootstrap and --warmup must be >= 0")
        if cfg.base.attach and cfg.base.gpus is not None:
            raise ConfigError("--gpus with --attach: the points use the first N URLs; give --gpus as the list")
        if cfg.base.attach_prefill or cfg.base.attach_decode:
            raise ConfigError("tracebench sweep does not run attached PD servers (--attach-prefill, --attach-decode): "
                              "sweep launched ones with --pd P:D[,P:D...], or one tracebench replay per rate")
        if len(set(cfg.pd)) != len(cfg.pd):
            raise ConfigError("--pd: a ratio is given twice")
        if cfg.pd and cfg.gpus:
            raise ConfigError("--gpus with --pd: each ratio P:D says how many servers its points launch")
        if cfg.base.run_name is not None:
            raise ConfigError("a sweep names its points itself (give --name for the sweep folder)")
        if cfg.concurrency and cfg.base.max_concurrency is not None:
            raise ConfigError("--concurrency sets each point's --max-concurrency: do not give both")
        if cfg.ray is not None:
            if not cfg.ray:
                raise ConfigError("--ray needs a cluster address (host:port of its head, or auto)")
            if cfg.find_max_rate:
                raise ConfigError("--ray runs independent points in parallel; a capacity search's next rate depends on "
                                  "the last point (run --find-max-rate without --ray)")
            if cfg.base.attach:
                raise ConfigError("--ray: each point's task launches its own servers on its node (not with --attach)")

    # ---- points ------------------------------------------------------------------------------------------------

    def _point_config(self, point: Point, trace: Path) -> ReplayConfig:
        base = self.cfg.base
        changes: dict[str, Any] = {"trace": trace, "run_name": point.name, "out_dir": self.dir, "policy": point.policy}
        if point.pd is not None:
            changes["pd"] = point.pd
        elif base.attach:
            changes["attach"] = tuple(base.attach[: point.gpus])
        else:
            changes["gpus"] = point.gpus
        if point.kind == "concurrency":
            changes["max_concurrency"] = int(point.value)
        return dataclasses.replace(base, **changes)

    def _point_name(self, kind: str, value: float, gpus: int, policy: str, pd: str | None = None) -> str:
        servers = f"pd{pd.replace(':', 'x')}-" if pd is not None else (f"g{gpus}-" if len(self.gpus) > 1 else "")
        prefix = servers + (f"{_label(policy)}-" if len(self.policies) > 1 else "")
        name = f"{prefix}{kind}-{_fmt_value(value)}"
        unique, n = name, 2
        while unique in self.named or (self.dir / unique).exists():
            unique, n = f"{name}-{n}", n + 1
        self.named.add(unique)
        return unique

    def run_point(self, kind: str, value: float, gpus: int, policy: str, shared: SharedServers | None,
                  pd: str | None = None) -> dict[str, Any]:
        from tracebench.report.columns import finish_run_copy
        from tracebench.report.headline import headline

        point, config = self._prepare_point(kind, value, gpus, policy, pd)
        if config.flush_cache:  # the flush needs idle servers: a point stopped early leaves them aborting its requests
            # (a PD point launches its own servers: nothing to wait for)
            urls = ([p.url for p in shared.fleet.plans[:gpus]] if shared is not None else list(config.attach))
            asyncio.run(_wait_idle(urls, IDLE_TIMEOUT_S))
        t0 = time.monotonic()
        try:
            run_dir = run_replay(config, self.stderr, shared)
            wall = time.monotonic() - t0
            # a big point's columnar copy, as `tracebench replay` writes one (before the headline, which reads it);
            # a stop signal while it is written: Interrupted, the point's run whole without it
            not_written = finish_run_copy(run_dir)
        except BaseException:
            # the run folder is complete (the replay's promise): keep its row when requests were sent, then stop
            # the sweep with the replay's error
            if (self.dir / point.name / "requests.jsonl").exists():
                self._add_row(point, self.dir / point.name, time.monotonic() - t0, headline)
            raise
        if not_written is not None:  # a warning: the point is whole without it
            self.stderr.write(f"tracebench sweep: warning: {not_written}\n")
            self.stderr.flush()
        row = self._add_row(point, run_dir, wall, headline)
        if row["faults"]:  # a server down, a stall, a failed request: not a capacity answer (sweep/faults.py)
            raise PointFault(point.name, row["faults"])
        return row

    def _prepare_point(self, kind: str, value: float, gpus: int, policy: str,
                       pd: str | None) -> tuple[Point, ReplayConfig]:
        """A point named, its trace written to traces/, said on stderr; its replay config."""
        point = Point(self._point_name(kind, value, gpus, policy, pd), kind, value, gpus, policy, pd)
        trace = self.dir / "traces" / f"{point.name}.jsonl"
        if kind == "rate":
            write_point_trace(trace, self.cfg.base.trace, self.header, self.requests, rate=value,
                              duration=self.cfg.point_duration)
        else:
            write_point_trace(trace, self.cfg.base.trace, self.header, self.requests, at_once=True)
        unit = "req/s" if kind == "rate" else "in flight"
        servers = f"PD {pd} ({gpus} servers)" if pd is not None else f"{gpus} server(s)"
        number = "" if self.part_sink is not None else f" {len(self.named)}"  # a worker's: it knows no number
        self.stderr.write(f"tracebench sweep: point{number}: {point.name} ({_fmt_value(value)} {unit}, "
                          f"{servers}, policy {policy})" + (" sent to Ray\n" if self.cfg.ray else "\n"))
        self.stderr.flush()
        return point, self._point_config(point, trace)

    def _run_on_ray(self, parts: list[Part]) -> None:
        """Every point as a Ray task at once (sweep/ray_points.py); their rows added in point order as they come back.
        The first point (in that order) that failed or had a fault then stops the sweep, as it would point by point,
        every row kept."""
        from tracebench.sweep.ray_points import RayPoints, point_resources, unpack
        from tracebench.report.columns import finish_run_copy
        from tracebench.report.headline import headline

        assert self.cfg.ray is not None
        tasks = RayPoints(self.cfg.ray)
        prepared = [self._prepare_point(p.kind, p.value, p.gpus, p.policy, p.pd) for p in parts]
        needs = [point_resources(config.resolve()) for _, config in prepared]
        tasks.check_room(needs)
        for (point, config), need in zip(prepared, needs):
            tasks.submit(point.name, config, config.trace.read_bytes(), self.name, need)
        results: dict[str, Any] = {}
        stop: BaseException | None = None
        added = 0
        try:
            for name, result in tasks.finished():
                results[name] = result
                while added < len(prepared) and prepared[added][0].name in results:
                    point, _ = prepared[added]
                    added += 1
                    got = results.pop(point.name)
                    self.ray_points[point.name] = got.node
                    self.stderr.write(got.stderr)
                    if got.archive is not None:
                        unpack(got, self.dir)
                    run_dir = self.dir / point.name
                    if got.error is None:
                        not_written = finish_run_copy(run_dir)
                        if not_written is not None:
                            self.stderr.write(f"tracebench sweep: warning: {not_written}\n")
                    if (run_dir / "requests.jsonl").exists():
                        row = self._add_row(point, run_dir, got.wall_s, headline)
                        if stop is None and got.error is None and row["faults"]:
                            stop = PointFault(point.name, row["faults"])
                    if stop is None and got.error is not None:
                        kind, text, code = got.error
                        stop = RunFailed(f"point {point.name} (on Ray node {got.node['ip']}): {kind}: {text}")
                        stop.exit_code = code
                    self.stderr.flush()
        except BaseException:
            tasks.cancel()
            raise
        if stop is not None:
            raise stop

    def _add_row(self, point: Point, run_dir: Path, wall: float, headline: Any) -> dict[str, Any]:
        h = headline(run_dir, warmup=self.cfg.warmup, slo=self.slo, slo_percentile=self.cfg.slo_percentile,
                     bootstrap=self.cfg.bootstrap, seed=0, from_dispatch=point.kind == "concurrency")
        run_json = orjson.loads((run_dir / "run.json").read_bytes())
        row = point_row(point, h, run_json.get("saturation"), wall)
        row["faults"] = point_faults(run_dir, run_json) or None
        if row["faults"]:
            row["verdict"] = "fault"  # never an SLO verdict
        row["trace"] = f"traces/{point.name}.jsonl"
        row["arrivals_s"] = run_json["trace"]["duration_s"]  # trace seconds from the first arrival to the last
        n = run_json["trace"]["num_requests"]
        # what the point's own trace offered ((n - 1) / span, inspect's mean rate): the rate itself for a whole
        # trace, near it for a --point-duration prefix
        row["offered_rps"] = (n - 1) / row["arrivals_s"] if point.kind == "rate" and n > 1 and row["arrivals_s"] > 0 else None
        self.rows.append(row)
        if self.part_sink is not None:
            self.part_sink(row)  # a worker's row: the parent writes the summary (sweep/parallel.py)
        else:
            self.write_summary()
        return row

    # ---- the whole sweep ---------------------------------------------------------------------------------------

    def run(self) -> Path:
        self.dir.mkdir(parents=True)
        (self.dir / "traces").mkdir()
        shared = None
        fleet = None
        try:
            try:
                if self.launches:
                    (self.dir / "servers").mkdir()
                    launch = dataclasses.replace(self.cfg.base, gpus=max(self.gpus), policy=self.policies[0])
                    fleet = launch_fleet(launch, self.dir / "servers")
                    fleet.start()
                    self.servers = [{**fleet.describe(i), "log": f"servers/{fleet.describe(i)['log']}"}
                                    for i in range(len(fleet.plans))]
                    asyncio.run(_wait_healthy(fleet, launch.resolve().startup_timeout))  # type: ignore[arg-type]
                    shared = SharedServers(fleet, {"tool": "tracebench sweep", "sweep": self.name,
                                                   "logs": "servers/server-<i>.log in the sweep folder"})
                self.stderr.write(f"tracebench sweep: {WHAT[self.cfg.kind]}, folder {self.dir}"
                                  + (f", {len(fleet.plans)} server(s) launched once" if fleet is not None else "") + "\n")
                parts = self.parts()
                if self.jobs > 1 and len(parts) > 1:
                    from tracebench.sweep.parallel import run_parts

                    self.stderr.write(f"tracebench sweep: {len(parts)} parts, {min(self.jobs, len(parts))} at a "
                                      "time (--jobs)\n")
                    run_parts(self, parts, self.jobs)
                elif self.cfg.ray is not None:
                    self._run_on_ray(parts)
                else:
                    for part in parts:
                        self.run_part(part, shared)
                self.write_summary()  # a search's last state (each point's row wrote the summary as it came)
                self.status = "completed"
            except (KeyboardInterrupt, RunInterrupted, Interrupted):  # Interrupted: in a point's columnar copy
                self.status = "interrupted"
                raise
            except BaseException as err:
                self.status = "failed"
                self.error = f"{type(err).__name__}: {err}"  # summary.json and the terminal say why
                raise
            finally:
                if fleet is not None:
                    fleet.stop()
        except KeyboardInterrupt:
            raise RunInterrupted(f"interrupted; the sweep folder {self.dir} keeps the points done") from None
        except Interrupted as err:
            raise Interrupted(err.signum, f"{err}; the sweep folder {self.dir} keeps the points done") from None
        finally:
            # the figure before the summary's last status: a summary that says `completed` has its figure (a sweep
            # killed between the two said completed without it)
            try:
                self._write_figure()
            except (KeyboardInterrupt, RunInterrupted, Interrupted):
                self.status = "interrupted"
                raise
            except BaseException:
                self.status = "failed"
                raise
            finally:
                self.write_summary()
        return self.dir

    def run_part(self, part: Part, shared: SharedServers | None) -> None:
        """One of the sweep's independent pieces (parts()): a capacity search, or a point."""
        if part.kind == "search":
            self.search_one(part.gpus, part.pd, part.policy, shared)
        else:
            self.run_point(part.kind, part.value, part.gpus, part.policy, shared, part.pd)

    def search_one(self, gpus: int, pd: str | None, policy: str, shared: SharedServers | None) -> dict[str, Any]:
        """One capacity search (one setup and policy), from the start rate x gpus / the smallest setup's: each
        combination is searched on its own, so combinations may run in parallel (sweep/parallel.py)."""
        base_start = self.cfg.start_rate or self.source_rate
        assert base_start is not None
        start = base_start * gpus / min(g for g, _ in self.setups)
        search = RateSearch(start, self.cfg.rate_tolerance, self.cfg.max_points)
        entry: dict[str, Any] = {"gpus": gpus, "pd": pd, "policy": portable_policy(policy), "start_rate": start}
        self.searches.append(entry)
        while (rate := search.next_rate()) is not None:
            try:
                row = self.run_point("rate", rate, gpus, policy, shared, pd)
            except RunFailed as err:  # a fault (PointFault) or a run that could not go on: no answer
                from tracebench.sweep.output import setup_name

                entry.update(search.result().to_json())
                entry["points"].append({"rate": rate, "verdict": "fault"})
                entry["stopped"] = f"stopped by a fault at {_fmt_value(rate)} req/s, not a capacity answer: {err}"
                self.stderr.write(f"tracebench sweep: {setup_name(gpus, pd)}, policy {policy}: {entry['stopped']}\n")
                raise
            verdict = row["verdict"]
            search.record(rate, "missed" if verdict == "saturated" else verdict)
            entry.update(search.result().to_json())
        entry.update(search.result().to_json())
        servers = f"PD {pd}" if pd is not None else f"{gpus} server(s)"
        from tracebench.sweep.output import capacity_line

        self.stderr.write(f"tracebench sweep: {servers}, policy {policy}: {capacity_line(entry)}\n")
        return entry

    # ---- outputs -----------------------------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        cfg = self.cfg
        dims: dict[str, Any] = {"gpus": [gpus for gpus, _ in self.setups],
                                "policies": [portable_policy(p) for p in self.policies]}
        if cfg.pd:
            dims["pd"] = list(cfg.pd)
        if cfg.kind == "rate":
            dims["rates"] = list(cfg.rates)
        elif cfg.kind == "concurrency":
            dims["concurrency"] = list(cfg.concurrency)
        rules = {"saturation": SATURATION_RULE if cfg.base.saturation_window is not None else None,
                 "intervals": "95% percentile-bootstrap intervals of each point's own percentile "
                              f"({cfg.bootstrap} resamples, seed 0; report/headline.py); pooled ITL has none"}
        if self.slo is not None:  # --slo's two figures, named (issue 33 A6)
            rules.update({
                "slo_verdict": f"each SLO key's p{cfg.slo_percentile:g} (its 95% bootstrap interval) against its limit: met "
                           "when every upper end is within its limit, missed when a lower end is above one, else "
                           "uncertain (report/headline.py); the capacity search's verdict",
                "slo_fraction": "the share of kept requests meeting every limit together (a request that did not "
                                "finish meets none): the report's 'fraction meeting all', which `tracebench report "
                                "--fail-on-slo` compares with --slo-percentile",
            })
        if cfg.kind == "capacity":
            rules["search"] = SEARCH_RULE
        options = cfg.base.to_json()
        for key in ("trace", "run_name", "out_dir"):
            options.pop(key, None)
        return {
            "tracebench_sweep": SWEEP_FORMAT,
            "tracebench_version": __version__,
            "name": self.name,
            "kind": cfg.kind,
            "status": self.status,
            "error": self.error,
            "wall_s": time.monotonic() - self.t0,
            "trace": {"path": str(cfg.base.trace), "sha256": self.trace_sha, "num_requests": len(self.requests),
                      "rate": self.source_rate},
            "replay_options": options,
            "dimensions": dims,
            "slo": None if self.slo is None else {"spec": cfg.slo_spec, "limits_s": self.slo,
                                                  "percentile": cfg.slo_percentile},
            "warmup_s": cfg.warmup,
            "point_duration_s": cfg.point_duration,
            "saturation_window_s": cfg.base.saturation_window,
            "speed": cfg.base.speed,
            "servers": None if self.servers is None else {"launched_by": "this sweep, once for every point",
                                                          "servers": self.servers},
            # --ray: the points ran as Ray tasks, each on the node named here (sweep/ray_points.py)
            "ray": None if cfg.ray is None else {"address": cfg.ray, "points": self.ray_points},
            "rules": rules,
            "points": self.rows,
            "capacity": self.searches if cfg.kind == "capacity" else None,
            "warnings": self.warnings(),
        }

    def warnings(self) -> list[str]:
        """What the numbers cannot say: points shorter than --point-duration because the trace ran out, points too
        short for the saturation rule to judge, ITL distorted by --speed."""
        out = []
        rates = [row for row in self.rows if row["rate"] is not None]
        if self.cfg.point_duration is not None:
            cut = [row["point"] for row in rates if row["arrivals_s"] < 0.95 * self.cfg.point_duration]
            if cut:
                out.append(f"{_some(cut)} had arrivals for less than --point-duration {self.cfg.point_duration:g} s: "
                           "the trace has too few requests for that rate (generate a longer one)")
        window = self.cfg.base.saturation_window
        # the rule judges from two windows on, and must hold a quarter window more (replay/saturation.py)
        needed = None if window is None else window * (2 + PERSIST / SAMPLES_PER_WINDOW)
        short = [row["point"] for row in rates if not row["saturated"] and needed is not None
                 and row["arrivals_s"] < needed]
        if short:
            out.append(f"{_some(short)} had arrivals for less than the {needed:g} s the over-saturation rule needs "
                       f"(--saturation-window {window:g}): it could not judge them (their latencies then depend on "
                       "the trace's length)")
        lagging = [row for row in self.rows if row.get("host_lag") and row["host_lag"]["over"]]
        if lagging:
            from tracebench.report.metrics.lag import LAG_BOUND

            worst = max(lagging, key=lambda row: max(row["host_lag"]["shares"][k] or float("inf")
                                                      for k in row["host_lag"]["over"]))
            key = max(worst["host_lag"]["over"], key=lambda k: worst["host_lag"]["shares"][k] or float("inf"))
            share = worst["host_lag"]["shares"][key]
            speed = f"--speed {self.cfg.base.speed:g}" if self.cfg.base.speed is not None else "speed 1"
            out.append(f"host lag: {_some([row['point'] for row in lagging])} had lag that could account for more than "
                       f"the replay's bound of {LAG_BOUND:.0%} of a latency figure (worst: {worst['point']}, "
                       f"{'inf' if share is None else f'{share:.0%}'} of {key}; points[].host_lag): their latencies "
                       f"may be the host's, not the servers'; rerun the sweep at a lower speed than {speed} (a "
                       "replay's --adapt-speed finds one this host holds) or on a quieter machine")
        if self.cfg.base.speed is not None and self.cfg.base.speed > 1 and self.rows:
            out.append(f"ITL at --speed {self.cfg.base.speed:g} is distorted (the stream's chunks come "
                       f"{self.cfg.base.speed:g} times closer and are read together): measure ITL at --speed 1")
        return out

    def write_summary(self) -> None:
        if not self.dir.exists():
            return
        from tracebench.sweep.output import summary_csv

        doc = self.summary()
        write_atomic(self.dir / "summary.json", orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
               + b"\n")
        write_atomic(self.dir / "summary.csv", summary_csv(doc).encode())

    def _write_figure(self) -> None:
        if not self.rows:
            return
        from tracebench.report.render.load_latency import render_sweep_html

        page, png = render_sweep_html(self.summary())
        write_atomic(self.dir / "load-latency.html", page.encode())
        write_atomic(self.dir / "load-latency.png", png)


def point_row(point: Point, h: Any, saturation: dict[str, Any] | None, wall: float) -> dict[str, Any]:
    """A summary row: the point, what happened, and its figures (latencies null when over-saturated)."""
    saturated = h.status == "saturated"

    def estimate(e: Any) -> dict[str, Any]:
        return {"value": _finite(e.value), "ci95": None if e.ci_low is None else [_finite(e.ci_low), _finite(e.ci_high)]}

    slo_check = {
        key: {"limit_s": check.limit, "percentile": check.percentile, **estimate(check.estimate),
              "verdict": check.verdict}
        for key, check in h.slo.items()
    }
    verdict = "saturated" if saturated else h.slo_verdict
    return {
        "point": point.name,
        "run": point.name,
        "rate": point.value if point.kind == "rate" else None,
        "concurrency": int(point.value) if point.kind == "concurrency" else None,
        "gpus": point.gpus,
        "pd": point.pd,
        "policy": portable_policy(point.policy),
        "status": h.status,
        "saturated": saturated,
        "saturation": None if saturation is None else saturation.get("detail"),
        "requests": h.requests,
        "counts": h.counts,
        "duration_s": h.duration,
        "throughput_rps": h.requests_per_s,
        "output_tokens_per_s": h.output_tokens_per_s,
        "goodput_rps": h.goodput,
        "slo_fraction": h.slo_fraction,
        "latency_s": None if saturated else {
            key: {stat: estimate(e) for stat, e in stats.items()} for key, stats in h.latency.items()
        },
        "slo_check": slo_check or None,
        "verdict": verdict,
        "host_lag": host_lag(h.lag),
        "wall_s": wall,
    }


def host_lag(stats: Any) -> dict[str, Any] | None:
    """A point's host lag as the replay's report judges it (report/metrics/lag.py): the share of TTFT and total
    latency p50/p99 the host's lag (the simulators' and tracebench's own time) could account for, the bound, and
    whether the point passed it (issue 33 A3: a sweep at --speed 10 had a point at 174% of TTFT p50, unsaid)."""
    from tracebench.report.metrics.lag import LAG_BOUND

    if stats is None:
        return None
    return {"shares": {k: _finite(v) for k, v in stats.shares.items()}, "bound": LAG_BOUND, "over": stats.over(),
            "sim_lag_p50_s": stats.sim_p50, "sim_lag_p99_s": stats.sim_p99, "own_p50_s": stats.own_p50,
            "own_p99_s": stats.own_p99}


def _some(points: list[str]) -> str:
    return f"{len(points)} point(s) ({', '.join(points[:3])}{', ...' if len(points) > 3 else ''})"


def _finite(value: float | None) -> float | None:
    """JSON has no infinity: a percentile that falls on failed requests is written null (docs/sweep.md)."""
    return None if value is None or not math.isfinite(value) else value


async def _wait_idle(urls: list[str], timeout: float) -> None:
    """Until every server reports nothing running or waiting (/v1/loads). A point stopped early (over-saturated)
    leaves the servers aborting what it cancelled; the next point's cache flush needs them idle (sglang refuses to
    flush while requests run or wait). A server still busy after `timeout` s (another client using it?) is a
    RunFailed naming it."""
    client = SglangClient(None, True)
    deadline = time.monotonic() + timeout
    try:
        while True:
            fetched = await asyncio.gather(*(client.get_json(f"{url}/v1/loads", 10.0) for url in urls))
            busy = []
            for url, got in zip(urls, fetched):
                if got.error is not None:
                    raise RunFailed(f"server {url}: /v1/loads: {got.error}")
                running, waiting, _, _ = parse_loads(f"{url}/v1/loads", got.obj)
                if running or waiting:
                    busy.append(f"{url} ({running} running, {waiting} waiting)")
            if not busy:
                return
            if time.monotonic() >= deadline:
                raise RunFailed(f"server(s) still busy {timeout:g} s after the previous point ended: "
                                f"{', '.join(busy)} (another client using them?)")
            await asyncio.sleep(0.2)
    finally:
        await client.close()


async def _wait_healthy(fleet: Any, timeout: float) -> None:
    client = SglangClient(None, True)
    try:
        await fleet.wait_healthy(client, timeout)
    finally:
        await client.close()


def run_sweep(cfg: SweepConfig, stdout: IO[str], stderr: IO[str]) -> Path:
    """Run the sweep; returns its folder. Every launched server is stopped whatever happens; the summary keeps the
    points that ran."""
    sweep = Sweep(cfg, stderr)
    from tracebench.sweep.output import terminal_summary

    try:
        folder = sweep.run()
    finally:
        if sweep.dir.exists():  # a sweep that failed shows what it did and why too (the error follows on stderr)
            stdout.write(terminal_summary(sweep.summary(), str(sweep.dir)))
            stdout.flush()
    return folder

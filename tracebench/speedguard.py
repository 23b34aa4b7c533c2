"""`replay --adapt-speed`: a simulated run at `--speed K` that the host could not hold is made again at a lower K.

At `--speed K` the host handles K times the events per second; a host that cannot keep up hands tokens out late and
releases requests late, and the report's "Host lag" bound (report/metrics/lag.py: K x the simulators' lag + (K - 1)
x the client's release lag, as a share of TTFT and total latency p50/p99) passes LAG_BOUND. With --adapt-speed the
replay judges each finished run by that same bound (the run loaded as the report loads it): a run that passed it is
deleted and made again, from the start and on fresh servers, at

    K' = min(K / 2, K * LAG_BOUND / largest share), rounded down to an integer >= 1 (lag grows about as K does),

until a run holds or K is 1. Each step is said on the terminal; the kept run's run.json gets `speed_guard` (the K asked
for, the K used, and every attempt's shares), and the report names it. A run that misses the bound even at K 1 is
kept and flagged (`held` false; the report warns as for any run): there is no lower K. What K then guarantees: the run's
lag could account for at most LAG_BOUND of its TTFT and total latency p50/p99 (on issue 24's workload that kept the
figures within ~2% of speed 1, docs/sim-server.md), nothing about a load that arrives after the run. Not in replay/:
it loads the run with report/ (polars), which the replay's hot path never imports. Nor does it import replay/: the
replay command hands it the function that makes a run (run_replay), so no import runs from replay/ up to here.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar

import orjson

from tracebench.cleanup import write_atomic
from tracebench.errors import ConfigError


class SpeedConfig(Protocol):
    """What adapt reads of a replay's configuration (tracebench/replay/run.py ReplayConfig, a frozen dataclass: adapt
    makes each next attempt's with dataclasses.replace, its speed and run_name changed)."""

    @property
    def backend(self) -> str | None: ...

    @property
    def attach(self) -> tuple[str, ...]: ...

    @property
    def speed(self) -> float | None: ...

    @property
    def is_pd(self) -> bool: ...


Config = TypeVar("Config", bound=SpeedConfig)


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One run of the adapt loop: its speed and the share of each latency figure its lag could account for."""

    speed: float
    shares: dict[str, float]
    bound: float

    @property
    def held(self) -> bool:
        return all(share <= self.bound for share in self.shares.values())

    @property
    def worst(self) -> tuple[str, float]:
        key = max(self.shares, key=lambda k: self.shares[k])
        return key, self.shares[key]

    def to_json(self) -> dict[str, Any]:
        return {"speed": self.speed, "held": self.held, "shares": self.shares}


def judge(run_dir: Path) -> Attempt:
    """The lag verdict of a finished simulated run, as the report computes it."""
    from tracebench.report.load import is_completed, load_run
    from tracebench.report.metrics.lag import LAG_BOUND, lag_stats

    run = load_run(run_dir)
    ok = run.requests.filter(is_completed())
    stats = lag_stats(ok, run.speed)
    if stats is None or stats.sim_p50 is None:
        raise ConfigError(f"{run_dir}: --adapt-speed needs the simulators' lag (sim_lag), and no completed request "
                          "has one (no request completed, or the servers are not tracebench simulators)")
    return Attempt(speed=run.speed if run.speed is not None else 1.0, shares=stats.shares, bound=LAG_BOUND)


def next_speed(attempt: Attempt) -> float:
    """The speed of the next attempt after `attempt` passed the bound (module docstring); >= 1."""
    k = attempt.speed
    _, worst = attempt.worst
    lower = min(k / 2, k * attempt.bound / worst) if worst > 0 else k / 2
    return float(max(1, math.floor(lower)))


def adapt(cfg: Config, run_replay: Callable[[Config, IO[str]], Path], stderr: IO[str]) -> Path:
    """Run `cfg` with `run_replay` (tracebench/replay/run.py's, handed in by the replay command: this module sits
    beside the replay, not above it) and, while the host cannot hold its speed, again at a lower one; returns the kept
    run folder."""
    if cfg.backend != "sim" or cfg.attach:
        raise ConfigError("--adapt-speed: only with --backend sim (launched simulators: their speed is set at launch)")
    if cfg.speed is None or cfg.speed <= 1:
        raise ConfigError("--adapt-speed: give --speed K > 1 (the speed to try first; at speed 1 there is nothing to "
                          "lower: drop --adapt-speed)")
    if cfg.is_pd:
        raise ConfigError("--adapt-speed: not with PD (a PD run at --speed K is converted x K whole, so its lag "
                          "bound does not apply)")
    requested = cfg.speed
    attempts: list[Attempt] = []
    while True:
        run_dir = run_replay(cfg, stderr)
        attempt = judge(run_dir)
        attempts.append(attempt)
        key, worst = attempt.worst
        if attempt.held or attempt.speed <= 1:
            break
        lower = next_speed(attempt)
        stderr.write(f"tracebench replay: --adapt-speed: the host could not hold --speed {attempt.speed:g} (its lag "
                     f"could account for {worst:.1%} of {key}, more than {attempt.bound:.0%}); run {run_dir} deleted, "
                     f"replaying again at --speed {lower:g}\n")
        stderr.flush()
        shutil.rmtree(run_dir)
        cfg = dataclasses.replace(cfg, speed=lower, run_name=run_dir.name)
    guard = {"requested": requested, "used": attempt.speed, "bound": attempt.bound, "held": attempt.held,
             "attempts": [a.to_json() for a in attempts]}
    record_guard(run_dir, guard)
    if attempt.held:
        lowered = "" if attempt.speed == requested else f" (lowered from {requested:g})"
        stderr.write(f"tracebench replay: --adapt-speed: --speed {attempt.speed:g}{lowered} held: the lag could "
                     f"account for at most {worst:.1%} of TTFT and total latency p50/p99 (bound {attempt.bound:.0%})\n")
    else:
        stderr.write(f"tracebench replay: warning: --adapt-speed: even --speed 1 did not hold on this host (its lag "
                     f"could account for {worst:.1%} of {key}, more than {attempt.bound:.0%}): run {run_dir} is kept "
                     "and flagged (run.json speed_guard.held false); its latencies may be distorted by the machine's "
                     "load\n")
    stderr.flush()
    return run_dir


def record_guard(run_dir: Path, guard: dict[str, Any]) -> None:
    """Add `speed_guard` to the kept run's run.json (written whole, then renamed, as the replay writes it)."""
    path = run_dir / "run.json"
    doc = orjson.loads(path.read_bytes())
    doc["speed_guard"] = guard
    write_atomic(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")

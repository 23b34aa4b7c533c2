"""What a run was configured as, in the words the report shows: its settings (`config_of`) and what differs between
runs (`diff_config`), its backend and speed, and the notes and warnings about sped-up runs."""

from __future__ import annotations

import json
from typing import Any

from tracebench.report.metrics.schema import ConfigDiff, RunSummary
from tracebench.report.speed import uncapped


# options already shown through run.json's own fields (or that name the run rather than configure it)
# and those that change nothing measured (where servers listen, how long they may take to start)
_CURATED_OPTIONS = {"backend", "mode", "batch_size", "policy", "policy_options", "gpus", "max_running_requests",
                    "max_concurrency",
                    "cap_schedule", "run_name", "out_dir", "quiet", "trace", "speed",
                    "port_base", "control_port", "startup_timeout"}


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def speed_text(speed: float | None) -> str:
    """How a run's speed is shown: `4x (simulated seconds)`, or `1x (real time)` for a run that was not sped up."""
    return "1x (real time)" if speed is None else f"{_show(speed)}x (simulated seconds)"


def time_note(runs: list[RunSummary]) -> str | None:
    """The line that says which runs' times are simulated seconds (None when no run was sped up)."""
    sped = [run for run in runs if run.speed is not None]
    if not sped:
        return None
    groups: dict[tuple[float | None, str | None], list[str]] = {}
    for run in sped:
        groups.setdefault((run.speed, run.speed_conversion), []).append(run.label)
    which = "; ".join(f"{', '.join(labels)} at --speed {_show(speed)}: {how}" for (speed, how), labels in groups.items())
    return (f"times of sped-up runs are in simulated seconds ({which}); throughputs are per simulated second")


# what a speed-up still distorts after the conversion (docs/report.md, "Runs at different speeds")
SPEED_SENSITIVE = ("release lag", "router wait", "TTFT", "TPOT", "ITL")


def speed_warning(runs: list[RunSummary]) -> str | None:
    """The warning for a comparison of runs made at different --speed (None when all ran at one speed)."""
    speeds = {run.speed if run.speed is not None else 1.0 for run in runs}
    if len(speeds) < 2:
        return None
    which = ", ".join(f"{run.label} {_show(run.speed if run.speed is not None else 1.0)}x" for run in runs)
    return (f"these runs were made at different speeds ({which}): the simulators' time converts exactly, but "
            "tracebench's own host time (release lag, HTTP hops, the router's dispatch) is real time, and at --speed "
            "K the host handles K times the events per second, so it can read longer; with a cap or static batching "
            f"the router wait is counted x K, its host part included. Differences of ~1-3 ms in "
            f"{', '.join(SPEED_SENSITIVE)} can come from the speed alone: compare those at one speed")


def simulated_accelerators(meta: dict[str, Any]) -> list[str]:
    """The accelerators a run's simulated servers pretend to be ([] when no server is a simulator). A server is
    simulated when it was launched with --backend sim, or its /server_info carries `tracebench_sim` (an attached
    `tracebench sim-server`; real sglang has no such field)."""
    names = []
    for server in meta["servers"]:
        sim = (server.get("server_info") or {}).get("tracebench_sim")
        if isinstance(sim, dict):
            names.append(str(sim.get("accelerator")))
        elif meta["backend"] == "sim":
            names.append("a GPU")
    return names


def sim_profiles(meta: dict[str, Any]) -> list[str]:
    """The timing profiles of a run's simulated servers, as their /server_info named them ([] for real servers)."""
    names = set()
    for server in meta["servers"]:
        sim = (server.get("server_info") or {}).get("tracebench_sim")
        if isinstance(sim, dict) and sim.get("profile") is not None:
            names.add(str(sim["profile"]))
    return sorted(names)


def attached_sim_speeds(meta: dict[str, Any]) -> list[float]:
    """The --speed of attached simulators running faster or slower than real time (their times are then not
    simulated seconds: an attached run is not compressed). Empty for launched simulators and real servers."""
    if meta["backend"] == "sim":
        return []
    speeds = []
    for server in meta["servers"]:
        sim = (server.get("server_info") or {}).get("tracebench_sim")
        if isinstance(sim, dict) and isinstance(sim.get("speed"), (int, float)) and sim["speed"] != 1:
            speeds.append(float(sim["speed"]))
    return speeds


def backend_text(meta: dict[str, Any]) -> str:
    """`sim`, `sglang`, `attach`, or `attach (simulated)` when an attached server is a tracebench simulator
    (`attach (simulated, --speed 50)` when it runs sped up)."""
    backend = meta["backend"]
    if backend != "sim" and simulated_accelerators(meta):
        speeds = sorted(set(attached_sim_speeds(meta)))
        return f"{backend} (simulated" + (f", --speed {'/'.join(_show(v) for v in speeds)})" if speeds else ")")
    return backend


def config_of(meta: dict[str, Any]) -> dict[str, str]:
    """The settings of a run that a comparison cares about, as text, in display order."""
    servers = meta["servers"]
    policy = meta["policy"]
    caps = meta["caps"]
    initial = caps["initial"]
    simulated = sorted(set(simulated_accelerators(meta)))
    cfg = {
        "backend": backend_text(meta),
        "speed": speed_text(meta["speed"]),
        "mode": meta["mode"],
        "batch size": _show(meta["batch_size"]),
        "policy": policy["name"] + (f" {_show(policy['options'])}" if policy["options"] else "")
        + (" (no effect: 1 server, no cap)" if len(servers) == 1 and uncapped(meta) else ""),
        "servers": str(len(servers)),
        "gpus": ",".join(_show(s["gpu"]) for s in servers),
        "gpu model": (", ".join(f"{name} (simulated)" for name in simulated) if simulated
                      else ", ".join(sorted(set(meta["gpu_names"]))) or "-"),
        "sim profile": ", ".join(sim_profiles(meta)) or "-",
        "caps": _show(initial[0]) if initial and all(c == initial[0] for c in initial) else _show(initial),
        # --max-concurrency: the client's gate (absent from runs recorded before it: they had none)
        "max concurrency": _show(meta.get("max_concurrency")),
        "cap changes": "; ".join(
            f"{change['t']:g}s " + (f"server{change['server']}" if change.get("server") is not None else "all")
            + f"={change['cap']}" for change in caps["changes"]
        ) or "none",
        "server version": ", ".join(sorted({_show(s["version"]) for s in servers})),
        "trace": meta["trace"]["path"],
    }
    for key in sorted(meta["options"]):
        if key not in _CURATED_OPTIONS:
            cfg[f"--{key.replace('_', '-')}"] = _show(meta["options"][key])
    return cfg


def diff_config(metas: list[dict[str, Any]]) -> ConfigDiff:
    configs = [config_of(meta) for meta in metas]
    keys: list[str] = []
    for cfg in configs:
        keys += [k for k in cfg if k not in keys]
    changed: list[tuple[str, list[str]]] = []
    same: list[tuple[str, str]] = []
    for key in keys:
        values = [cfg.get(key, "(not set)") for cfg in configs]
        if len(set(values)) > 1:
            changed.append((key, values))
        else:
            same.append((key, values[0]))
    return ConfigDiff(changed=changed, same=same)

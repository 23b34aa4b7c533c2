"""`sweep ... --ray ADDRESS`: the sweep's points as Ray tasks, run in parallel wherever the cluster has room, merged
into the summary a point-by-point sweep writes (sweep/run.py: rows in point order, each from the point's run folder).

A point's task gets its replay config and its trace (the bytes the sweep wrote to traces/), runs the ordinary replay
in a temporary folder on its node (`run_replay`: its own servers: in-process with --clock virtual, sim-server or
sglang processes on that node otherwise), and sends back the whole run folder as a tar archive, which the sweep
unpacks into its folder, where the row is made from it as for a local point. The resources a task asks for
(`point_resources`): 1 CPU on the virtual clock; the replay and each simulated server a CPU on the real clock; with
sglang, one GPU per server. Points do not share servers: each task launches and stops its own.

Points are independent, so every point runs, whatever happens to another; the sweep then stops as a point-by-point
one would at the first point (in point order) that failed or had a fault, every row that ran kept.
"""

from __future__ import annotations

import dataclasses
import io
import socket
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tracebench.cluster.connect import connect
from tracebench.errors import ConfigError, TracebenchError


@dataclasses.dataclass(frozen=True)
class PointResult:
    """What a point's task sent back: its run folder (a tar archive; None if the replay made none), how long the
    replay took there, what it wrote on stderr, the error that stopped it (type name, message, exit code), where it
    ran."""

    archive: bytes | None
    wall_s: float
    stderr: str
    error: tuple[str, str, int] | None
    node: dict[str, str]


def point_resources(config: Any) -> dict[str, float]:
    """What a point's task holds on its node (module docstring). `config`: the point's ReplayConfig, resolved."""
    if config.clock == "virtual":
        return {"num_cpus": 1}
    if config.backend == "sim":
        return {"num_cpus": config.num_servers + 1}
    return {"num_cpus": 1, "num_gpus": config.num_servers}


def run_point(config: Any, trace: bytes, sweep_name: str, point: str) -> PointResult:
    """A point's task, on its node: the replay of `config` on `trace` in a temporary folder laid out as the sweep's
    (<sweep>/traces/<point>.jsonl, <sweep>/<point>/), its run folder sent back whole."""
    import ray

    from tracebench.replay.run import run_replay

    with tempfile.TemporaryDirectory(prefix="tracebench-point-") as tmp:
        out = Path(tmp) / sweep_name
        (out / "traces").mkdir(parents=True)
        path = out / "traces" / f"{point}.jsonl"
        path.write_bytes(trace)
        stderr = io.StringIO()
        error = None
        t0 = time.monotonic()
        try:
            run_replay(dataclasses.replace(config, trace=path, out_dir=out), stderr)
        except TracebenchError as err:  # the run folder is complete (the replay's promise): sent back with the error
            error = (type(err).__name__, str(err), err.exit_code)
        wall = time.monotonic() - t0
        archive = None
        if (out / point).is_dir():
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
                tar.add(out / point, arcname=point)
            archive = buffer.getvalue()
    node = {"id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
            "hostname": socket.gethostname()}
    return PointResult(archive, wall, stderr.getvalue(), error, node)


class RayPoints:
    """The points of one sweep as Ray tasks on the cluster at `address`."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.ray = connect(address)
        self.calls: dict[Any, str] = {}  # task -> point name

    def check_room(self, needs: list[dict[str, float]]) -> None:
        """Refuse (ConfigError) a point no node of the cluster can ever hold: its task would wait for ever."""
        nodes = [n["Resources"] for n in self.ray.nodes() if n["Alive"]]
        for need in needs:
            if not any(all(node.get(_RESOURCE[k], 0) >= v for k, v in need.items()) for node in nodes):
                wants = ", ".join(f"{v:g} {_RESOURCE[k]}" for k, v in need.items())
                raise ConfigError(f"--ray {self.address}: a point needs {wants} on one node; no node of the cluster "
                                  "has that much")

    def submit(self, point: str, config: Any, trace: bytes, sweep_name: str, need: dict[str, float]) -> None:
        task = self.ray.remote(run_point).options(**need, max_retries=0)
        self.calls[task.remote(config, trace, sweep_name, point)] = point

    def finished(self) -> Iterator[tuple[str, PointResult]]:
        """(point, result) as the tasks end, in the order they end."""
        pending = list(self.calls)
        while pending:
            done, pending = self.ray.wait(pending, num_returns=1)
            yield self.calls[done[0]], self.ray.get(done[0])

    def cancel(self) -> None:
        """Stop every task still running (a Ctrl-C of the sweep)."""
        for call in self.calls:
            self.ray.cancel(call, force=True)


_RESOURCE = {"num_cpus": "CPU", "num_gpus": "GPU"}


def unpack(result: PointResult, into: Path) -> None:
    """A point's run folder, from its task's archive, into the sweep folder (tarfile's "data" filter: files and
    folders under `into` only)."""
    assert result.archive is not None
    with tarfile.open(fileobj=io.BytesIO(result.archive), mode="r:gz") as tar:
        tar.extractall(into, filter="data")

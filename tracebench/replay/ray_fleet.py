"""`replay --ray ADDRESS`: the run's servers as Ray actors, one per GPU, on whichever nodes of the cluster have them.

Each `ServerActor` holds one of the cluster's GPUs (num_gpus=1; Ray sets its CUDA_VISIBLE_DEVICES) and runs on its
node what `Fleet` runs here: the server's command line (`python -m sglang.launch_server ...` or `python -m tracebench
sim-server ...`, with that node's interpreter, its address for --host and a port free there), its output in a log
file on that node. It reports the server's URL (node IP + port); tracebench's router, in this process, speaks HTTP to
it as to any server. Placement: SPREAD over the nodes that have a free GPU.

Faults: every actor has a call in flight that returns when its server process exits (`wait_exit`); `exit_reason`
looks at it without blocking. A node removed (or its actor killed) fails that call with Ray's actor-died error, which
names the run's cause: the router probes a server it cannot reach and marks it down with it (event `server_down`,
its requests in flight recorded as errors), as for a launched server that died on this host; run.json `ray.lost`
says which server, on which node, and when this process saw it.

Clocks (docs/ray.md): sglang stamps meta_info with its node's `time.time()`. For each server on another node than
this process's, the offset of its wall clock is measured NTP-style through its actor (CLOCK_SAMPLES round trips, the
one with the shortest round trip kept: offset = remote - midpoint, uncertain by half that round trip) before the run
and again at its end; the offset is taken off its stamps when it is larger than its uncertainty (else they are
converted as they come). run.json servers[].clock keeps both measures.

The servers' logs come back to the run folder (server-<i>.log, the last LOG_FETCH_BYTES) when the run stops them.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from tracebench.cluster.connect import import_ray
from tracebench.cluster.remote import CLOCK_SAMPLES, actor_lost, clock_offset, first_line
from tracebench.errors import ServerStartError
from tracebench.replay.servers import (
    FREE_PORT_RANGE, LOG_TAIL_LINES, STOP_GRACE_S, Fleet, ServerPlan, _pdeathsig_preexec, _signal_group,
)

ACTOR_THREADS = 4  # wait_exit holds one thread of the actor for the server's life; the others answer the rest
LOG_FETCH_BYTES = 8 << 20  # the end of each server's log copied back to the run folder
RAY_CALL_TIMEOUT_S = 30.0  # a clock sample, a log tail: an actor that answers none of these within it is lost
CLOCK_RULE = ("offset = the server node's time.time() - the midpoint of this host's time.time() around a call to the "
              f"server's actor, the shortest of {CLOCK_SAMPLES} round trips kept, uncertain by half of it; taken off "
              "the server's meta_info stamps when larger than its uncertainty (applied_offset_s), measured again at "
              "the end of the run (after); servers on this process's node share its clock (offset 0)")


def _free_port(host: str) -> int:
    """A port free on `host` now, drawn at random from FREE_PORT_RANGE (as servers.free_ports does on 127.0.0.1)."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(*FREE_PORT_RANGE)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise ServerStartError(f"no free port in {FREE_PORT_RANGE[0]}-{FREE_PORT_RANGE[1]} on {host}")


def command_on_node(words: list[str], python: str, host: str, port: int) -> list[str]:
    """A launch plan's command line as it runs on a node: that node's interpreter, its address, a port of its own."""
    out = [python, *words[1:]]
    for flag, value in (("--host", host), ("--port", str(port))):
        out[out.index(flag) + 1] = value
    return out


class ServerActor:
    """One server on one node (wrapped by `ray.remote` in RayFleet.start: this module imports no ray)."""

    def __init__(self, index: int, words: list[str], env: dict[str, str]) -> None:
        self.index = index
        self.words = words
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path: str | None = None

    def start(self) -> dict[str, Any]:
        import ray

        host = ray.util.get_node_ip_address()
        port = _free_port(host)
        command = command_on_node(self.words, sys.executable, host, port)
        fd, self.log_path = tempfile.mkstemp(prefix=f"tracebench-server-{self.index}-", suffix=".log")
        with os.fdopen(fd, "ab") as log:
            self.proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **self.env}, start_new_session=True,
                                         preexec_fn=_pdeathsig_preexec())
        return {"node_ip": host, "node_id": ray.get_runtime_context().get_node_id(), "hostname": socket.gethostname(),
                "port": port, "pid": self.proc.pid, "command": command,
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()]}

    def wait_exit(self) -> int:
        assert self.proc is not None
        return self.proc.wait()

    def wall(self) -> float:
        return time.time()

    def log_tail(self, limit: int) -> tuple[bytes, int]:
        """The last `limit` bytes of the server's log, and its whole size."""
        assert self.log_path is not None
        with open(self.log_path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - limit))
            return log.read(), size

    def stop(self, grace: float) -> int | None:
        """SIGTERM the server's process group, SIGKILL what is left of it after `grace` s; its exit code."""
        if self.proc is None:
            return None
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass  # the group gets SIGKILL below
        _signal_group(self.proc.pid, signal.SIGKILL)  # its children too (sglang's scheduler, detokenizer)
        return self.proc.wait()

    def remove_log(self) -> None:
        if self.log_path is not None:
            os.unlink(self.log_path)


class RayFleet(Fleet):
    """The servers of a --ray run (module docstring). `plans`: the launch plans (their commands; ports and hosts are
    chosen on the nodes, the URLs known once `start` returns)."""

    exit_settle_s = 15.0  # a node's loss reaches this process through the cluster's health checks (seconds)

    def __init__(self, backend: str, plans: list[ServerPlan], address: str, startup_timeout: float) -> None:
        super().__init__(backend, plans)
        self.address = address
        self.startup_timeout = startup_timeout
        self.ray: Any = None
        self.actors: list[Any] = []
        self.watch: dict[int, Any] = {}  # index -> the actor's wait_exit call
        self.nodes: dict[int, dict[str, Any]] = {}
        self.clocks: dict[int, dict[str, Any]] = {}
        self.lost: dict[int, dict[str, Any]] = {}
        self.driver_node: str | None = None

    def start(self) -> None:
        ray = self.ray = import_ray()
        self.driver_node = ray.get_runtime_context().get_node_id()
        gpus = ray.cluster_resources().get("GPU", 0)
        if gpus < len(self.plans):
            raise ServerStartError(f"--ray {self.address}: the cluster has {gpus:g} GPU(s); --gpus {len(self.plans)} "
                                   "needs one per server")
        # num_cpus=0: placed by its GPU alone (an actor holding a CPU could leave GPUs of a node with few CPUs unused)
        actor = ray.remote(ServerActor).options(num_gpus=1, num_cpus=0, max_concurrency=ACTOR_THREADS,
                                                scheduling_strategy="SPREAD")
        # CUDA_VISIBLE_DEVICES is Ray's to set on the node (the GPU it gave the actor), not this host's
        self.actors = [actor.remote(p.index, p.command, {k: v for k, v in p.env.items() if k != "CUDA_VISIBLE_DEVICES"})
                       for p in self.plans]
        calls = [a.start.remote() for a in self.actors]
        done, _ = ray.wait(calls, num_returns=len(calls), timeout=self.startup_timeout)
        if len(done) < len(calls):
            free = ray.available_resources().get("GPU", 0)
            raise ServerStartError(f"--ray {self.address}: {len(done)} of {len(calls)} server actor(s) placed and "
                                   f"started within --startup-timeout {self.startup_timeout:g} s (the cluster has "
                                   f"{free:g} of {gpus:g} GPU(s) free now)")
        try:
            infos = ray.get(calls)
        except ray.exceptions.RayError as err:
            raise ServerStartError(f"--ray {self.address}: a server actor failed to start: {first_line(err)}") from None
        for plan, info, handle in zip(self.plans, infos, self.actors):
            plan.url, plan.port, plan.command = f"http://{info['node_ip']}:{info['port']}", info["port"], info["command"]
            plan.gpu = ",".join(info["gpu_ids"]) or None
            self.nodes[plan.index] = {"id": info["node_id"], "ip": info["node_ip"], "hostname": info["hostname"],
                                      "pid": info["pid"]}
            self.watch[plan.index] = handle.wait_exit.remote()
        for plan in self.plans:
            self.clocks[plan.index] = self._measure_clock(plan.index)

    def _same_node(self, index: int) -> bool:
        return self.nodes[index]["id"] == self.driver_node

    def _measure_clock(self, index: int) -> dict[str, Any]:
        """The offset of server `index`'s node clock from this host's (module docstring)."""
        ray, actor = self.ray, self.actors[index]
        same = self._same_node(index)
        round_trip, offset, applied = clock_offset(
            lambda: ray.get(actor.wall.remote(), timeout=RAY_CALL_TIMEOUT_S), time.time, same)
        return {"same_node": same, "offset_s": offset, "uncertainty_s": round_trip / 2, "round_trip_s": round_trip,
                "applied_offset_s": applied, "after": None}

    def wall_offset(self, index: int) -> float:
        return self.clocks[index]["applied_offset_s"]

    def start_exit(self, index: int) -> str | None:
        """How server `index` ended (its process exited, or its actor or node is gone), or None while it runs. Looks
        at the actor's wait_exit call without waiting for it."""
        call = self.watch.get(index)
        if call is None:
            return None
        if index in self.lost:
            return self.lost[index]["detail"]
        ready, _ = self.ray.wait([call], timeout=0)
        if not ready:
            return None
        node = self.nodes[index]
        where = f"on node {node['ip']} ({node['id'][:12]})"
        try:
            detail = f"exited with code {self.ray.get(call)} {where}"
        except self.ray.exceptions.RayActorError as err:  # the node removed, or the actor killed: a measurement
            detail = actor_lost(self.ray, err, where)
        self.lost[index] = {"server": index, "node_id": node["id"], "node_ip": node["ip"], "detail": detail,
                            "seen_wall_time": time.time(), "seen_monotonic": time.monotonic()}
        return detail

    def exit_reason(self, index: int) -> str | None:
        why = self.start_exit(index)
        return None if why is None else f"server {index} {why}"

    def log_text(self, plan: ServerPlan) -> str:
        if plan.index >= len(self.actors) or plan.index in self.lost:
            return "(its log is on its node, which is gone)"
        tail, _ = self.ray.get(self.actors[plan.index].log_tail.remote(20000), timeout=RAY_CALL_TIMEOUT_S)
        lines = tail.decode("utf-8", "replace").splitlines()
        return "\n".join(lines[-LOG_TAIL_LINES:]) or "(empty log)"

    def first(self, count: int) -> Fleet:
        raise ServerStartError("servers on Ray belong to their run (not shared)")

    def stop(self) -> None:
        """Each live server stopped by its actor (SIGTERM, then SIGKILL), its clock measured again and its log copied
        to the run folder; then every actor killed. A second Ctrl-C meanwhile is ignored (as Fleet.stop)."""
        if not self.actors:
            return
        in_main_thread = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
        ray = self.ray
        try:
            alive = [p for p in self.plans if p.index in self.nodes and self.start_exit(p.index) is None]
            for plan in alive:
                try:
                    self.clocks[plan.index]["after"] = self._measure_clock(plan.index)["offset_s"]
                except ray.exceptions.RayError as err:  # lost since: start_exit below says how
                    self.clocks[plan.index]["after"] = f"not measured: {first_line(err)}"
            grace = STOP_GRACE_S[self.backend]
            stops = {p.index: self.actors[p.index].stop.remote(grace) for p in self.plans if p.index in self.nodes}
            ray.wait(list(stops.values()), num_returns=len(stops), timeout=2 * grace + RAY_CALL_TIMEOUT_S)
            for plan in self.plans:
                if plan.index in stops and plan.log is not None:
                    self._fetch_log(plan)
        finally:
            for handle in self.actors:
                ray.kill(handle)
            if in_main_thread:
                signal.signal(signal.SIGINT, previous)

    def _fetch_log(self, plan: ServerPlan) -> None:
        """The end of the server's log, from its node to the run folder (nothing when its node is gone)."""
        assert plan.log is not None
        actor = self.actors[plan.index]
        try:
            tail, size = self.ray.get(actor.log_tail.remote(LOG_FETCH_BYTES), timeout=RAY_CALL_TIMEOUT_S)
            self.ray.get(actor.remove_log.remote(), timeout=RAY_CALL_TIMEOUT_S)
        except self.ray.exceptions.RayError as err:
            self.start_exit(plan.index)
            plan.log.write_text(f"(not copied from node {self.nodes[plan.index]['ip']}: {first_line(err)})\n")
            return
        head = b"" if size <= len(tail) else f"(the first {size - len(tail)} bytes left out)\n".encode()
        plan.log.write_bytes(head + tail)

    def describe(self, index: int) -> dict[str, Any]:
        out = super().describe(index)
        node = self.nodes.get(index)
        out.update({
            "pid": None if node is None else node["pid"],  # on its node
            "same_host": False if node is None else self._same_node(index),
            "node": None if node is None else {k: node[k] for k in ("id", "ip", "hostname")},
            "clock": self.clocks.get(index),
            "lost": self.lost[index]["detail"] if index in self.lost else None,  # ray.lost says when
        })
        return out

    def cluster(self, run_start: float | None) -> dict[str, Any]:
        nodes: dict[str, dict[str, Any]] = {}
        for index, node in sorted(self.nodes.items()):
            entry = nodes.setdefault(node["id"], {"id": node["id"], "ip": node["ip"], "hostname": node["hostname"],
                                                  "servers": []})
            entry["servers"].append(index)
        return {
            "address": self.address,
            "ray_version": None if self.ray is None else self.ray.__version__,
            "this_node": self.driver_node,
            "placement": "one actor per server, num_gpus=1 (num_cpus=0), SPREAD over the nodes",
            "nodes": list(nodes.values()),
            "clock_rule": CLOCK_RULE,
            "lost": [_public(self.lost[i], run_start) for i in sorted(self.lost)],
        }


def _public(lost: dict[str, Any], run_start: float | None) -> dict[str, Any]:
    """A lost server as run.json says it: `t`, the run time this process saw it go (null before the run clock)."""
    out = {k: v for k, v in lost.items() if k != "seen_monotonic"}
    out["t"] = None if run_start is None else lost["seen_monotonic"] - run_start
    return out

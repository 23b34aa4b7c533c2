"""`--ray ADDRESS` (tracebench/cluster/, docs/ray.md) on a real Ray cluster of three nodes on this machine
(`ray.cluster_utils.Cluster`: a head and two worker nodes, each with its own raylet, each declaring 2 GPUs that
stand for real ones: num_gpus on a CPU-only machine only counts). Real replay processes connect to it; their servers
are tracebench's simulators, started by Ray actors on the nodes; nothing is mocked. Skipped without ray (the
optional extra: pip install 'tracebench[ray]').

One cluster for the module (it takes ~10 s to start on 2 cores); the last test removes one of its nodes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import run_cli, tracebench_cmd
from test_replay_run import read_run, write_trace_file

NODES = 3
GPUS_PER_NODE = 2
# One CPU a node: what the three sender actors need (num_cpus=1, SPREAD), and a sweep's virtual points then run three
# at a time, one a node. Each CPU declared is a Ray worker process a job may start (~1 CPU-s of imports each): with 2
# a node the module took 78 s and the twelve-point sweep 22 s on the 2-core machine, with 1 60 s and 14 s (2026-11-29).
CPUS_PER_NODE = 1
OBJECT_STORE = 80 << 20  # the least Ray accepts: nothing big goes through it


@pytest.fixture(scope="module")
def cluster() -> Any:
    pytest.importorskip("ray", reason="ray is not installed (the optional extra: pip install 'tracebench[ray]')")
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": CPUS_PER_NODE, "num_gpus": GPUS_PER_NODE, "object_store_memory": OBJECT_STORE,
        "include_dashboard": False})
    for _ in range(NODES - 1):
        cluster.add_node(num_cpus=CPUS_PER_NODE, num_gpus=GPUS_PER_NODE, object_store_memory=OBJECT_STORE)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()




def test_without_ray_installed_ray_is_a_one_line_error_naming_the_extra(tmp_path: Path) -> None:
    # ray made unimportable in a real tracebench process (as where it is not installed); the other commands and the
    # replay without --ray never import it
    trace = write_trace_file(tmp_path / "t.jsonl", 4, rate=10, inputs=(16, 128), outputs=(4, 32))
    code = ("import sys, tracebench.cli, tracebench.replay.run, tracebench.replay.router, tracebench.sweep.run; "
            "assert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')], 'ray imported'; "
            "sys.modules['ray'] = None; sys.argv[0] = 'tracebench'; tracebench.cli.main()")
    for command in (("replay", str(trace), "--backend", "sim", "--ray", "auto"),
                    ("sweep", str(trace), "--rates", "1,2", "--clock", "virtual", "--ray", "auto")):
        result = subprocess.run([sys.executable, "-c", code, *command], cwd=tmp_path, capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == ["tracebench: error: --ray needs Ray, which is not installed: pip install "
                                              "'tracebench[ray]'"], result.stderr


def test_six_servers_on_three_nodes(tmp_path: Path, cluster: Any) -> None:
    n = 120
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=60, inputs=(16, 128), outputs=(4, 32))
    # its three sender processes as actors too, every request through them: their stamps must be on the run's clock
    result = run_cli("replay", str(trace), "--ray", cluster.address, "--backend", "sim", "--gpus", "6", "--speed", "4",
                     "--senders", "3", "--router-sends-under", "0",
                     "--policy", "round_robin", "--run-name", "r", "--out-dir", str(tmp_path), "--quiet", timeout=120)
    assert result.returncode == 0, result.stderr
    run, records = read_run(tmp_path / "r")
    assert sorted(r["id"] for r in records) == list(range(n))
    assert Counter(r["status"] for r in records) == {"ok": n}
    servers = run["servers"]
    assert len(servers) == 6
    nodes = {s["node"]["id"] for s in servers}
    assert nodes == {node.node_id for node in [cluster.head_node, *cluster.worker_nodes]}  # every node has servers
    assert Counter(s["node"]["id"] for s in servers) == dict.fromkeys(nodes, GPUS_PER_NODE)
    assert sorted(s["gpu"] for s in servers) == ["0", "0", "0", "1", "1", "1"]  # Ray's GPU ids, one per server
    assert run["ray"]["address"] == cluster.address and len(run["ray"]["nodes"]) == NODES and run["ray"]["lost"] == []
    for s in servers:  # each server reached at its node's address, its clock measured, its log back in the folder
        assert s["url"] == f"http://{s['node']['ip']}:{s['launch_command'][s['launch_command'].index('--port') + 1]}"
        assert s["same_host"] == (s["node"]["id"] == run["ray"]["this_node"])
        clock = s["clock"]
        assert clock["uncertainty_s"] > 0 and abs(clock["offset_s"]) < 0.05 and isinstance(clock["after"], float)
        assert (tmp_path / "r" / s["log"]).read_text().startswith(f"sim-server listening on {s['url']} ")
    assert Counter(r["server"] for r in records) == dict.fromkeys(range(6), n // 6)  # round robin over all six
    # the servers' stamps, converted to the run clock, fall between dispatch and finish (the sender actors took
    # t_dispatch and t_finish on their own clocks, aligned to the run's)
    for r in records:
        assert r["t_dispatch"] - 0.01 <= r["server_received"] <= r["t_finish"] + 0.01, r
        assert r["t_assigned"] <= r["t_built"] <= r["t_written"] <= r["t_first_token"] <= r["t_finish"], r
    senders = run["senders"]
    assert senders["count"] == 3 and sum(senders["carried_by_process"]) == n and senders["fault"] is None
    assert senders["placement"].startswith("Ray actors") and len(senders["actors"]) == 3
    assert len({a["node"]["id"] for a in senders["actors"]}) >= 2  # spread over the nodes
    for actor in senders["actors"]:  # each sender's clock measured before and after the run
        clock = actor["clock"]
        assert clock["uncertainty_s"] > 0 and isinstance(clock["after"], float)
        # one machine: the nodes share CLOCK_MONOTONIC, so the offset measured is within its uncertainty, not applied
        assert abs(clock["offset_s"]) < 0.05 and clock["applied_offset_s"] == 0.0


def test_a_sweep_of_twelve_points_on_ray_equals_the_point_by_point_one(tmp_path: Path, cluster: Any) -> None:
    # on the virtual clock a point's figures depend on nothing but its trace and options: the rows must be the same
    trace = write_trace_file(tmp_path / "t.jsonl", 40, rate=20, inputs=(16, 128), outputs=(4, 32))
    common = ("sweep", str(trace), "--rates", "5,10,20,40", "--policy", "round_robin,least_outstanding,random",
              "--clock", "virtual", "--gpus", "2", "--max-running-requests", "4", "--bootstrap", "20",
              "--saturation-window", "0", "--out-dir", str(tmp_path))
    local = run_cli(*common, "--name", "local", timeout=120)
    assert local.returncode == 0, local.stderr
    remote = run_cli(*common, "--name", "remote", "--ray", cluster.address, timeout=120)
    assert remote.returncode == 0, remote.stderr
    one, parallel = (json.loads((tmp_path / name / "summary.json").read_text()) for name in ("local", "remote"))
    assert len(one["points"]) == len(parallel["points"]) == 12
    assert [p["status"] for p in parallel["points"]] == ["completed"] * 12

    def figures(row: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in row.items() if k != "wall_s"}  # the one figure of the host, not of the run

    assert [figures(p) for p in parallel["points"]] == [figures(p) for p in one["points"]]
    assert parallel["warnings"] == one["warnings"] and parallel["dimensions"] == one["dimensions"]
    assert one["ray"] is None and parallel["ray"]["address"] == cluster.address
    nodes = parallel["ray"]["points"]
    assert sorted(nodes) == sorted(p["point"] for p in one["points"])
    assert len({node["id"] for node in nodes.values()}) >= 2  # the points ran on several nodes
    for p in parallel["points"]:  # each point's run folder came back whole
        assert (tmp_path / "remote" / p["point"] / "run.json").is_file()
        assert len((tmp_path / "remote" / p["point"] / "requests.jsonl").read_text().splitlines()) == 40


def test_a_node_removed_mid_run_is_a_fault_the_run_reports(tmp_path: Path, cluster: Any) -> None:
    # the last test of the module: it takes one of the cluster's nodes away
    n = 200
    trace = write_trace_file(tmp_path / "t.jsonl", n, rate=40, inputs=(16, 128), outputs=(16, 64))
    proc = subprocess.Popen(tracebench_cmd("replay", str(trace), "--ray", cluster.address, "--backend", "sim",
                                           "--gpus", "3", "--policy", "round_robin", "--run-name", "k",
                                           "--out-dir", str(tmp_path), "--quiet"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # the run clock has started (run.json says when)
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run did not start"
            path = tmp_path / "k" / "run.json"
            if path.is_file() and (start := json.loads(path.read_text())["wall_clock_start"]) is not None:
                break
            time.sleep(0.05)
        time.sleep(max(0.0, start + 1.0 - time.time()))  # a second into the 5 s trace
        run = json.loads((tmp_path / "k" / "run.json").read_text())
        used = {s["node"]["id"] for s in run["servers"]}
        victim = min((node for node in cluster.worker_nodes if node.node_id in used), key=lambda node: node.node_id)
        on_victim = sorted(s["index"] for s in run["servers"] if s["node"]["id"] == victim.node_id)
        t_removed = time.time()
        cluster.remove_node(victim, allow_graceful=False)
        _, stderr = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    run, records = read_run(tmp_path / "k")
    assert sorted(r["id"] for r in records) == list(range(n))
    assert run["status"] == "completed"  # the other servers served the rest
    downs = [e for e in run["events"] if e["kind"] == "server_down"]
    assert sorted(e["server"] for e in downs) == on_victim, downs
    for event in downs:  # the cause named: its actor died with the node
        assert f"lost on node {victim.node_ip_address} ({victim.node_id[:12]}): its Ray actor " in event["detail"], event
    lost = run["ray"]["lost"]
    assert sorted(e["server"] for e in lost) == on_victim and all(e["node_id"] == victim.node_id for e in lost)
    assert all(abs(e["seen_wall_time"] - t_removed) < 20 for e in lost)
    assert all(down["t"] - 3 < e["t"] <= down["t"] for e, down in zip(lost, sorted(downs, key=lambda d: d["server"])))
    for i in on_victim:  # its log stayed on the node that went
        assert (tmp_path / "k" / f"server-{i}.log").read_text().startswith(f"(not copied from node {victim.node_ip_address}: ")
    assert all(run["servers"][i]["lost"] is not None for i in on_victim)
    failed = [r for r in records if r["status"] != "ok"]
    assert failed and all(r["server"] in on_victim and r["status"] == "error" for r in failed), failed
    t_down = max(e["t"] for e in downs)
    assert not [r for r in records if r["server"] in on_victim and r["t_dispatch"] is not None and r["t_dispatch"] > t_down]
    assert sum(r["status"] == "ok" and r["t_dispatch"] > t_down for r in records) > 20  # the run went on

"""Replay the real shared-prefix runs of reports/examples/h200-prefix/ on simulated servers and compare, run by run:
prefix-cache hit rate (token-weighted), TTFT p50, total p50, and, for the sequential run, cached_tokens request by
request. Writes the sim runs next to nothing in git (a scratch folder) and prints a Markdown table.

    .venv/bin/python bench/prefix_sim_vs_real.py [--real reports/examples/h200-prefix] [--out DIR]

(--out: a folder that does not exist yet; default a new temporary folder.)

The simulated servers get the real ones' KV capacity (`max_total_num_tokens` from the real runs' /server_info) and
run at --speed 1 (TTFT is faithful only near real time on this 2-core machine). The routing runs' real servers shared
one GPU (two sglang processes on one H200): their latencies are a shared GPU's, so only their hit rates are compared
(the simulator gives each server a GPU of its own).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_replay import start_sim  # bench/ is the script's folder, so on sys.path
from tracebench.report.load import load_run

TB = [sys.executable, "-m", "tracebench"]
POLICIES = ("random", "round_robin", "prefix_hash", "cache_aware")


def start_sim_kv(out: Path, name: str, kv_tokens: int) -> tuple[subprocess.Popen[bytes], str]:
    return start_sim(out / f"{name}.log", "--max-total-tokens", str(kv_tokens))


def replay(trace: Path, urls: list[str], name: str, out: Path, policy: str = "random") -> Path:
    attach = [a for url in urls for a in ("--attach", url)]
    subprocess.run([*TB, "replay", str(trace), *attach, "--policy", policy, "--run-name", name, "--out-dir", str(out),
                    "--quiet"], check=True)
    return out / name


def figures(run_dir: Path) -> dict[str, float]:
    report = json.loads(subprocess.run([*TB, "report", str(run_dir), "--format", "json"], check=True,
                                       capture_output=True, text=True).stdout)
    run = report["runs"][0]
    return {"hit": run["cache"]["hit_rate"], "ttft_p50": run["latency"]["ttft"]["p50"],
            "total_p50": run["latency"]["total"]["p50"], "rps": run["throughput"]["requests_per_s"]}


def kv_tokens(real_run: Path) -> list[int]:
    return [s["server_info"]["max_total_num_tokens"] for s in load_run(real_run).meta["servers"]]


def pct(sim: float, real: float) -> str:
    return f"{(sim - real) / real * 100:+.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=Path, default=Path("reports/examples/h200-prefix"))
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.out is None:
        args.out = Path(tempfile.mkdtemp(prefix="prefix-sim-"))
    else:
        args.out.mkdir(parents=True, exist_ok=False)
    procs: list[subprocess.Popen[bytes]] = []
    lines = ["| run | hit rate real | sim | Δ (points) | TTFT p50 real | sim | Δ | total p50 real | sim | Δ |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    try:
        node_kv = kv_tokens(args.real / "node")
        proc, url = start_sim_kv(args.out, "sim-node", node_kv[0])
        procs.append(proc)
        seq = replay(args.real / "seq.jsonl", [url], "seq", args.out)
        real_seq = {r["id"]: r["cached_tokens"] for r in load_run(args.real / "seq").requests.iter_rows(named=True)}
        sim_seq = {r["id"]: r["cached_tokens"] for r in load_run(seq).requests.iter_rows(named=True)}
        differ = [i for i in real_seq if real_seq[i] != sim_seq[i]]
        seq_line = (f"seq: {len(real_seq)} requests one at a time; cached_tokens sim == real for "
                    f"{len(real_seq) - len(differ)} of them (differ: {differ or 'none'}); "
                    f"total real {sum(real_seq.values())}, sim {sum(sim_seq.values())}")
        node = replay(args.real / "shared.jsonl", [url], "node", args.out)
        os.killpg(proc.pid, signal.SIGTERM)
        pairs = [("node (one H200)", args.real / "node", node, True)]
        kv = kv_tokens(args.real / "routing-random")
        sims = [start_sim_kv(args.out, f"sim-routing-{i}", tokens) for i, tokens in enumerate(kv)]
        procs += [p for p, _ in sims]
        for policy in POLICIES:
            sim_run = replay(args.real / "shared.jsonl", [u for _, u in sims], f"routing-{policy}", args.out, policy)
            pairs.append((f"{policy} (2 servers, KV {'/'.join(map(str, kv))})", args.real / f"routing-{policy}",
                          sim_run, False))
        for label, real_dir, sim_dir, with_latency in pairs:
            real, sim = figures(real_dir), figures(sim_dir)
            row = f"| {label} | {real['hit']:.3f} | {sim['hit']:.3f} | {(sim['hit'] - real['hit']) * 100:+.1f} |"
            if with_latency:
                row += (f" {real['ttft_p50'] * 1e3:.1f} ms | {sim['ttft_p50'] * 1e3:.1f} ms | {pct(sim['ttft_p50'], real['ttft_p50'])} |"
                        f" {real['total_p50'] * 1e3:.0f} ms | {sim['total_p50'] * 1e3:.0f} ms | {pct(sim['total_p50'], real['total_p50'])} |")
            else:
                row += " (shared GPU) | | | | | |"
            lines.append(row)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=10)
    print(seq_line)
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()

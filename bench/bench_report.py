"""Speed of `tracebench report` on two synthetic runs of 1,000,000 requests each (docs/run-format.md, written here
with numpy + polars). Prints the figures; the target is < 3 s for `tracebench report A B` (table and JSON) on a quiet
2-core machine (issue 23; it was 5 s before), < 6 s from requests.jsonl alone (issue 35). The records carry a real
run's 44 fields (~1.2 KB a line, `--records full`, the default since issue 35); `--records core` writes the 22 the
report's figures read, as the bench did before (it then read 5.1 / 2.0 s where full records took 12.8 / 4.5 s). Beside the wall clock it prints the CPU time (user + system), which other
work on the machine does not inflate as much: the report reads both runs at once, one thread each, so on a quiet
machine the wall clock is about half the CPU time.

Each run is made as a replay leaves it: requests.jsonl, then, as `tracebench replay` does at a clean end
(tracebench/cli.py `_finish_run_folder`, the same functions), its columnar copy requests.columns.parquet. The time
that copy costs the replay's end is printed per 1M requests. The report is also timed on the JSONL alone (the same
files hard-linked into folders without the copy: a run recorded before the copy existed, or a run too small for one).

    .venv/bin/python bench/bench_report.py [--requests 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from tracebench.itl import bucket_of
from tracebench.options import COPY_MIN_BYTES
from tracebench.report.columns import wants_copy
from tracebench.report.load import COLUMNS_COPY


def write_synthetic_run(folder: Path, num_requests: int, seed: int, *, policy: str, servers: int = 4,
                        speedup: float = 1.0, trace_sha256: str = "0" * 64, full: bool = True) -> None:
    """A run folder of `num_requests` ok requests at ~1000 req/s on `servers` servers, following docs/run-format.md.
    `speedup` < 1 makes server latencies longer (a slower configuration)."""
    rng = np.random.default_rng(seed)
    arrival_rng = np.random.default_rng(12345)  # same trace for every run: same arrivals and lengths
    t_arrival = np.cumsum(arrival_rng.exponential(1 / 1000, num_requests))
    input_len = arrival_rng.integers(16, 2048, num_requests)
    output_len = arrival_rng.integers(2, 512, num_requests)
    t_released = t_arrival + rng.exponential(0.0004, num_requests)
    t_dispatch = t_released + rng.exponential(0.02, num_requests)
    t_first_token = t_dispatch + rng.exponential(0.05 / speedup, num_requests)
    t_finish = t_first_token + output_len * rng.uniform(0.008, 0.012, num_requests) / speedup
    server = rng.integers(0, servers, num_requests)
    # inter-token gaps as the replay stores them (tracebench/itl.py): 12 buckets around each request's step time
    width = 12
    step_bucket = np.array([bucket_of(step) for step in np.quantile((t_finish - t_first_token) / output_len,
                                                                    np.linspace(0, 1, 101))])
    first = step_bucket[rng.integers(0, 101, num_requests)] - width // 2
    itl_buckets = first[:, None] + np.arange(width)[None, :]
    gaps = output_len - 1
    itl_counts = np.repeat((gaps // width)[:, None], width, axis=1)
    itl_counts[:, width // 2] += gaps - itl_counts.sum(axis=1)
    itl_hist = [",".join(f"{b}:{n}" for b, n in zip(bs, ns)) for bs, ns in zip(itl_buckets.tolist(), itl_counts.tolist())]
    wall_start = 1_800_000_000.0
    frame = pl.DataFrame({
        "id": np.arange(num_requests), "input_len": input_len, "output_len": output_len,
        "t_arrival": t_arrival, "t_released": t_released, "t_dispatch": t_dispatch,
        "t_first_token": t_first_token, "t_finish": t_finish, "server": server,
        "batch": pl.Series([None] * num_requests, dtype=pl.Int64), "status": ["ok"] * num_requests,
        "error": pl.Series([None] * num_requests, dtype=pl.String), "completion_tokens": output_len,
        "prompt_tokens": input_len, "server_e2e_latency": t_finish - t_dispatch - 0.001,
        "server_queue_time": np.full(num_requests, 0.0005), "server_received": t_dispatch + 0.0005,
        "server_forward_entry": t_dispatch + 0.001, "server_prefill_finished": t_first_token - 0.001,
        "server_finished": t_finish - 0.0005, "itl_max": (t_finish - t_first_token) / output_len * 1.3,
        "itl_hist": itl_hist,
    })
    if full:  # the other fields of a real run's record (a PD run through tracebench's router: 44 fields, ~1.2 KB)
        frame = frame.with_columns(**full_fields(rng, frame, servers))
    folder.mkdir(parents=True)
    frame.write_ndjson(folder / "requests.jsonl")
    meta = {
        "tracebench_run": 1, "run_name": folder.name, "tracebench_version": "0.1.0", "host": "bench",
        "wall_clock_start": wall_start,
        "trace": {"path": "traces/bench.jsonl", "sha256": trace_sha256, "num_requests": num_requests,
                  "duration_s": float(t_arrival[-1]), "header": {}},
        "options": {"speed": None, "stream": True}, "speed": None, "backend": "sim", "mode": "continuous", "batch_size": None,
        "policy": {"name": policy, "class": f"bench.{policy}", "options": {}}, "seed": 0,
        "servers": [{"index": i, "url": f"http://127.0.0.1:{30000 + i}", "gpu": None, "launch_command": None,
                     "same_host": True, "server_info": {}, "version": "sim", "log": None} for i in range(servers)],
        "gpu_names": [], "caps": {"initial": [64] * servers, "changes": []}, "events": [],
        "status": "completed", "t_end": float(t_finish.max()),
        "counts": {"ok": num_requests, "error": 0, "timeout": 0, "cancelled": 0},
    }
    (folder / "run.json").write_text(json.dumps(meta, indent=2))


def full_fields(rng: np.random.Generator, frame: pl.DataFrame, servers: int) -> dict[str, Any]:
    """The 22 record fields the core set leaves out, with values of a real run's shape (docs/run-format.md): the
    client's stamps between release and answer, the cache, and a PD run's prefill side; 44 fields in all, as
    reports/examples/h200x2-pd/pd-shared's records."""
    n = frame.height
    t_released, t_dispatch = frame["t_released"].to_numpy(), frame["t_dispatch"].to_numpy()
    t_first, t_finish = frame["t_first_token"].to_numpy(), frame["t_finish"].to_numpy()
    input_len = frame["input_len"].to_numpy()
    to_first = t_first - t_dispatch  # every stamp in order (the loader checks the run-format invariants)
    at = lambda share: t_dispatch + share * to_first  # noqa: E731
    return {
        "cached_tokens": (input_len * rng.uniform(0, 0.9, n)).astype(np.int64),
        "mismatch": pl.Series([None] * n, dtype=pl.String),
        "t_admitted": t_released, "policy_s": rng.uniform(1e-5, 3e-4, n),
        "sim_lag": pl.Series([None] * n, dtype=pl.Float64),
        "t_assigned": t_released + 0.5 * (t_dispatch - t_released), "t_built": t_dispatch, "t_written": at(0.02),
        "t_headers": at(0.05), "t_last_chunk": t_finish - 0.0002, "t_parsed": t_finish + 0.0001,
        "server_dispatched": at(0.04), "server_first_sent": at(0.95),
        "prefill_server": rng.integers(0, servers, n), "bootstrap_room": rng.integers(0, 2**62, n),
        "t_prefill_answer": at(0.8), "prefill_received": at(0.03), "prefill_forward_entry": at(0.1),
        "prefill_done": at(0.6), "prefill_finished": at(0.7), "prefill_queue_time": 0.07 * to_first,
        "prefill_e2e_latency": 0.67 * to_first,
    }


def _time(cmd: list[str]) -> tuple[float, float]:
    """Wall-clock seconds of the command, and the CPU seconds (user + system) it used: the CPU figure does not
    grow when other work shares the machine, the wall-clock one does."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr}")
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def copy_as_replay_does(folder: Path) -> tuple[float, float]:
    """The replay's end: tracebench/cli.py `_finish_run_folder`, the very function `tracebench replay` runs after a
    clean end, in a process of its own (its import of polars counted). Returns its wall and CPU seconds."""
    if not wants_copy(folder):
        sys.exit(f"{folder}/requests.jsonl is under {COPY_MIN_BYTES >> 20} MiB: a replay writes no copy of it "
                 "(use more --requests)")
    return _time([sys.executable, "-c", "import sys; from pathlib import Path; from tracebench.cli import "
                  "_finish_run_folder; _finish_run_folder(Path(sys.argv[1]))", str(folder)])


def jsonl_only(folder: Path) -> Path:
    """`folder` without its columnar copy: requests.jsonl hard-linked (same bytes and mtime) beside run.json."""
    plain = folder.with_name(folder.name + "-jsonl-only")
    if not plain.exists():
        plain.mkdir()
        os.link(folder / "requests.jsonl", plain / "requests.jsonl")
        shutil.copy2(folder / "run.json", plain / "run.json")
    return plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, default=None, help="build the runs here and keep them")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--records", choices=("full", "core"), default="full",
                        help="full: a real run's 44 record fields (~1.2 KB a line, issue 35); core: the 22 the "
                             "report's figures read (the bench before issue 35)")
    args = parser.parse_args()

    root = args.keep if args.keep is not None else Path(tempfile.mkdtemp(prefix="bench-report-"))
    run_a, run_b = root / "bench-a", root / "bench-b"
    sha = hashlib.sha256(b"bench trace").hexdigest()
    start = time.perf_counter()
    built = 0
    copies = []
    for folder, seed, policy, speedup in ((run_a, 1, "round_robin", 1.0), (run_b, 2, "sjf", 0.97)):
        if not (folder / "run.json").exists():
            write_synthetic_run(folder, args.requests, seed, policy=policy, speedup=speedup, trace_sha256=sha,
                                full=args.records == "full")
            built += 1
        if not (folder / COLUMNS_COPY).exists():
            copies.append(copy_as_replay_does(folder))
    size = sum((f / "requests.jsonl").stat().st_size for f in (run_a, run_b)) / 1e6
    copy_size = sum((f / COLUMNS_COPY).stat().st_size for f in (run_a, run_b)) / 1e6
    how = f"built in {time.perf_counter() - start:.1f} s" if built else "reused"
    print(f"2 runs x {args.requests:,} requests ({size:,.0f} MB of requests.jsonl, {copy_size:,.0f} MB of "
          f"{COLUMNS_COPY}), {how}, under {root}")
    if copies:
        wall, cpu = statistics.mean(w for w, _ in copies), statistics.mean(c for _, c in copies)
        per_million = 1e6 / args.requests
        print(f"columnar copy at the replay's end (tracebench/cli.py _finish_run_folder, its own process), per run of "
              f"{args.requests:,} requests: {wall:.2f} s wall, {cpu:.2f} s CPU; per 1M requests {wall * per_million:.2f}"
              f" s wall, {cpu * per_million:.2f} s CPU (scaled, the start-up included; mean of {len(copies)}; load "
              f"average {os.getloadavg()[0]:.1f})")
    plain_a, plain_b = jsonl_only(run_a), jsonl_only(run_b)

    report = [sys.executable, "-m", "tracebench", "report"]
    tracebench = report + [str(run_a), str(run_b)]
    html = root / "report.html"
    cases = [
        ("table", tracebench),
        ("json", tracebench + ["--format", "json"]),
        ("table, --slo and --warmup", tracebench + ["--slo", "ttft=0.2,total=6", "--warmup", "10"]),
        ("html + png", tracebench + ["--format", "html", "-o", str(html)]),
        ("table, requests.jsonl only", report + [str(plain_a), str(plain_b)]),
    ]
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start; whole command "
          f"(process start to exit), {args.repeat} runs each: median wall clock (all), median CPU time")
    for name, cmd in cases:
        runs = [_time(cmd) for _ in range(args.repeat)]
        wall = statistics.median(t for t, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        # what a replay leaves, packed or not (issue 35: < 3 s from the copy, < 6 s from JSONL); html draws plots
        target = 3.0 if name in ("table", "json", "table, --slo and --warmup") else 6.0 if "jsonl" in name else None
        verdict = "" if target is None else f"  target < {target:g} s: {'met' if wall < target else 'MISSED'}"
        print(f"  tracebench report A B  {name:<28} {wall:6.2f} s  ({', '.join(f'{t:.2f}' for t, _ in runs)})  "
              f"CPU {cpu:.2f} s{verdict}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (other work on the machine slows the wall clock)")
    from_copy = subprocess.run(tracebench, capture_output=True, text=True, check=True).stdout
    from_jsonl = subprocess.run(report + [str(plain_a), str(plain_b)], capture_output=True, text=True, check=True).stdout
    same = from_jsonl.replace(str(plain_a), str(run_a)).replace(str(plain_b), str(run_b)) == from_copy
    print(f"the table from the columnar copies is the table from the JSONL: {'yes' if same else 'NO'}")
    if not same:
        sys.exit("the report differs between the columnar copy and the JSONL: a bug")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak resident memory of one report process: {peak:,.0f} MB")
    if args.keep is None:
        shutil.rmtree(root)


if __name__ == "__main__":
    main()

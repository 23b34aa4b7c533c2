"""Issue 6, steps 1-2: tracebench's node-level runs next to sglang's own bench_serving on the same server and
workload, and tracebench's client-side stamps against sglang's own.

    python bench/gpu/compare_node.py RUN_DIR [RUN_DIR ...] --bench-serving FILE   (bench_serving's --output-file)

Definitions are aligned to bench_serving's (.DUCUMENT/bench_serving.md): a request's E2E is send -> last byte
(tracebench: t_finish - t_dispatch), TTFT is send -> first token (t_first_token - t_dispatch), TPOT is
(E2E - TTFT) / (output tokens - 1) per request, throughput is completed / (first send -> last completion).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tracebench.report import load  # noqa: E402  (reads a run folder as written or packed)


def load_run(folder: Path) -> dict[str, np.ndarray]:
    requests = load.load_run(folder).requests
    ok = requests.filter(pl.col("status") == "ok")
    if ok.height != requests.height:
        raise SystemExit(f"{folder}: {requests.height - ok.height} requests not ok")
    return {k: ok[k].cast(pl.Float64).to_numpy() for k in (
        "t_arrival", "t_dispatch", "t_first_token", "t_finish", "completion_tokens", "server_e2e_latency",
        "server_received", "server_finished")}


def tracebench_summary(run: dict[str, np.ndarray]) -> dict[str, float]:
    e2e = run["t_finish"] - run["t_dispatch"]
    ttft = run["t_first_token"] - run["t_dispatch"]
    tpot = (e2e - ttft) / (run["completion_tokens"] - 1)
    duration = run["t_finish"].max() - run["t_dispatch"].min()
    return {
        "request_throughput": len(e2e) / duration,
        "output_throughput": run["completion_tokens"].sum() / duration,
        "e2e_p50_ms": 1e3 * np.median(e2e), "e2e_p99_ms": 1e3 * np.percentile(e2e, 99),
        "ttft_p50_ms": 1e3 * np.median(ttft), "ttft_p99_ms": 1e3 * np.percentile(ttft, 99),
        "tpot_p50_ms": 1e3 * np.median(tpot),
    }


def bench_serving_summary(path: Path) -> dict[str, float]:
    res = json.loads(path.read_text().splitlines()[-1])
    return {
        "request_throughput": res["request_throughput"], "output_throughput": res["output_throughput"],
        "e2e_p50_ms": res["median_e2e_latency_ms"], "e2e_p99_ms": res["p99_e2e_latency_ms"],
        "ttft_p50_ms": res["median_ttft_ms"], "ttft_p99_ms": res["p99_ttft_ms"], "tpot_p50_ms": res["median_tpot_ms"],
    }


def stamp_check(run: dict[str, np.ndarray]) -> str:
    client = run["t_finish"] - run["t_dispatch"]
    diff_ms = 1e3 * (client - run["server_e2e_latency"])
    before_ms = 1e3 * (run["server_received"] - run["t_dispatch"])  # dispatch -> sglang received it
    after_ms = 1e3 * (run["t_finish"] - run["server_finished"])  # sglang finished -> client saw the end
    q = lambda a: " / ".join(f"{np.percentile(a, p):.2f}" for p in (0, 50, 90, 99, 100))  # noqa: E731
    return "\n".join([
        "| per request (ms) | min / p50 / p90 / p99 / max |", "| --- | --- |",
        f"| client server-latency - sglang e2e_latency | {q(diff_ms)} |",
        f"| t_dispatch -> sglang request_received | {q(before_ms)} |",
        f"| sglang request_finished -> t_finish | {q(after_ms)} |",
    ])


def main(run_dirs: list[Path], bench_serving: Path | None) -> None:
    columns: dict[str, dict[str, float]] = {}
    runs = {folder.name: load_run(folder) for folder in run_dirs}
    for name, run in runs.items():
        columns[f"tracebench {name}"] = tracebench_summary(run)
    if bench_serving is not None:
        columns["sglang bench_serving"] = bench_serving_summary(bench_serving)
    metrics = list(next(iter(columns.values())))
    print("| metric | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for m in metrics:
        print(f"| {m} | " + " | ".join(f"{c[m]:.2f}" for c in columns.values()) + " |")
    if bench_serving is not None:
        bs = columns["sglang bench_serving"]
        for name in runs:
            tb = columns[f"tracebench {name}"]
            print(f"\ntracebench {name} vs bench_serving: " + ", ".join(
                f"{m} {100 * (tb[m] - bs[m]) / bs[m]:+.1f}%" for m in ("request_throughput", "e2e_p50_ms", "ttft_p50_ms", "tpot_p50_ms")))
    for name, run in runs.items():
        print(f"\nStamps, {name}:\n{stamp_check(run)}")


if __name__ == "__main__":
    args = sys.argv[1:]
    bench_file = None
    if "--bench-serving" in args:
        i = args.index("--bench-serving")
        bench_file = Path(args[i + 1])
        del args[i:i + 2]
    main([Path(a) for a in args], bench_file)

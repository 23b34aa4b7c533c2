"""Does the virtual clock give the real-time simulator's answers? The same trace and options replayed twice on the
simulated cluster, `--clock real` (sim-server processes over HTTP, in real time) and `--clock virtual` (in process,
simulated time), compared with the report's own figures.

    .venv/bin/python bench/virtual_vs_realtime.py --out DIR CASE [CASE ...]
    CASE = NAME=TRACE:REPLAY-ARGS      e.g.  tour=traces/demo.jsonl:--gpus 2 --policy round_robin

or, for runs already made, `--pair REALTIME_RUN VIRTUAL_RUN` (repeatable). Per case: throughput, TTFT / TPOT / total
latency p50 and p99 (simulated seconds, completed requests), the prompt tokens served from the prefix cache (% of
prompt tokens), and whether every request went to the same server under both clocks. Held (issue #32): p50s and
throughput within 1%, p99s within 3%, the cache share within 0.2 points; a figure outside is flagged `OFF`. The
real-time run is made on whatever host this is: a busy host moves it (its own lag), not the virtual one.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.report.load import COMPLETED_STATUSES, Run, load_run  # noqa: E402
from tracebench.report.metrics import latency_expr  # noqa: E402

# (label, key, quantile or None for throughput, tolerance as a fraction)
ROWS = (
    ("throughput req/s", "requests_per_s", None, 0.01),
    ("TTFT p50", "ttft", 0.50, 0.01), ("TTFT p99", "ttft", 0.99, 0.03),
    ("TPOT p50", "tpot", 0.50, 0.01), ("TPOT p99", "tpot", 0.99, 0.03),
    ("total p50", "total", 0.50, 0.01), ("total p99", "total", 0.99, 0.03),
)
CACHE_POINTS = 0.2


def figures(run: Run) -> dict[str, float]:
    ok = run.requests.filter(pl.col("status").is_in(COMPLETED_STATUSES))
    if ok.height == 0:
        raise SystemExit(f"{run.path}: no completed request")
    out: dict[str, float] = {}
    duration = float(ok["t_finish"].max()) - float(run.requests["t_arrival"].min())
    for label, key, q, _ in ROWS:
        if q is None:
            out[label] = ok.height / duration
        else:
            values = ok.select(latency_expr(key).alias("v"))["v"].drop_nulls().to_numpy()
            out[label] = float(np.quantile(values, q)) * 1000 if values.size else float("nan")
    prompt = float(ok["prompt_tokens"].sum())
    out["cache %"] = 100.0 * float(ok["cached_tokens"].fill_null(0).sum()) / prompt if prompt else 0.0
    return out


def compare(name: str, real_dir: Path, virtual_dir: Path) -> tuple[list[str], bool]:
    real, virtual = load_run(real_dir), load_run(virtual_dir)
    a, b = figures(real), figures(virtual)
    lines = [f"### {name}", "", "| figure | real-time sim | virtual clock | diff | held |", "| --- | ---: | ---: | ---: | --- |"]
    held = True
    for label, _, _, tol in ROWS:
        diff = (b[label] - a[label]) / a[label] if a[label] else 0.0
        ok = abs(diff) <= tol
        held &= ok
        lines.append(f"| {label} | {a[label]:.3f} | {b[label]:.3f} | {diff:+.2%} | {'ok' if ok else 'OFF'} (±{tol:.0%}) |")
    points = b["cache %"] - a["cache %"]
    ok = abs(points) <= CACHE_POINTS
    held &= ok
    lines.append(f"| prompt tokens from cache % | {a['cache %']:.2f} | {b['cache %']:.2f} | {points:+.2f} pt | "
                 f"{'ok' if ok else 'OFF'} (±{CACHE_POINTS} pt) |")
    ra = real.requests.select("id", "server").sort("id")
    rb = virtual.requests.select("id", "server").sort("id")
    same = int((ra["server"] == rb["server"]).sum())
    lines.append(f"| requests on the same server | | | {same} of {ra.height} | |")
    return lines + [""], held


def replay(trace: str, args: list[str], clock: str, out: Path, name: str) -> Path:
    cmd = [sys.executable, "-m", "tracebench", "replay", trace, "--clock", clock, "--run-name", name,
           "--out-dir", str(out), "--quiet", *args]
    if clock == "real":
        cmd += ["--backend", "sim"]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return out / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="NAME=TRACE:REPLAY-ARGS")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("REALTIME_RUN", "VIRTUAL_RUN"))
    parser.add_argument("--out", type=Path, default=Path("reports/virtual-vs-realtime"))
    opts = parser.parse_args()
    report: list[str] = []
    all_held = True
    for case in opts.cases:
        name, _, rest = case.partition("=")
        trace, _, args = rest.partition(":")
        words = shlex.split(args)
        real = replay(trace, words, "real", opts.out, f"{name}-real")
        virtual = replay(trace, words, "virtual", opts.out, f"{name}-virtual")
        lines, held = compare(name, real, virtual)
        report += lines
        all_held &= held
    for real_dir, virtual_dir in opts.pair:
        lines, held = compare(Path(real_dir).name, Path(real_dir), Path(virtual_dir))
        report += lines
        all_held &= held
    print("\n".join(report))
    print(f"every held figure within its bound: {'yes' if all_held else 'NO'}")


if __name__ == "__main__":
    main()

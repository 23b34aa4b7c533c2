"""Does the virtual clock give the real-time simulator's answers? The same trace and options replayed twice on the
simulated cluster, `--clock real` (sim-server processes over HTTP, in real time) and `--clock virtual` (in process,
simulated time), compared with the report's own figures.

    .venv/bin/python bench/virtual_vs_realtime.py --out DIR CASE [CASE ...]
    CASE = NAME=TRACE:REPLAY-ARGS      e.g.  tour=traces/demo.jsonl:--gpus 2 --policy round_robin
    CASE = NAME                        a ready case on a committed trace (READY_CASES), e.g.  pd-h200-shared
    .venv/bin/python bench/virtual_vs_realtime.py --out DIR --issue-cases [--runs-only] [--repeat-real]
    .venv/bin/python bench/virtual_vs_realtime.py --out DIR --compare-dir     (runs made before with --runs-only)

or, for runs already made, `--pair REALTIME_RUN VIRTUAL_RUN` (repeatable). Per case: throughput, TTFT / TPOT / total
latency p50 and p99 (simulated seconds, completed requests), the prompt tokens served from the prefix cache (% of
prompt tokens), and whether every request went to the same server under both clocks. Held (issue #32): p50s and
throughput within 1%, p99s within 3%, the cache share within 0.2 points; a figure outside is flagged `OFF`. The
real-time run is made on whatever host this is: a busy host moves it (its own lag), not the virtual one. PD runs
(`--pd P:D`) add, unheld, the KV transfer (prefill done -> KV at the decode server) and the prefill answer (dispatch
-> the prefill server's answer in) p50/p99, and how many requests had the same prefill server. A TRACE ending in .xz
is decompressed into --out first.

`--issue-cases`: the cases issue #32 item 1 names, traces generated here (ISSUE_CASES). `--repeat-real`: each case's
real-time run twice, at the same time (NAME-real and NAME-real2): how far the real-time simulator is from itself
is the floor under any comparison with it. `--runs-only`: make the runs, compare nothing (no polars needed: the GPU
machine's idle CPUs are a quiet host); `--compare-dir`: compare the runs found in --out.
"""

from __future__ import annotations

import argparse
import lzma
import shlex
import subprocess
import sys
from pathlib import Path

import json
import threading
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


if TYPE_CHECKING:
    from tracebench.report.load import Run

# issue #32 item 1's cases: (generate args, replay args); a trace is generated once per distinct generate args
TOUR = ("--rate", "20", "--num-requests", "120")
ISSUE_CASES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "tour": (TOUR, ("--gpus", "2", "--max-running-requests", "16", "--policy", "round_robin")),
    "tour-cap-schedule": (TOUR, ("--gpus", "2", "--max-running-requests", "8", "--policy", "sjf",
                                 "--cap-schedule", "0s:8,3s:2")),
    "azure4": (("--dataset", "tests/data/AzureLLMInferenceTrace_conv.csv.xz", "--rate", "30", "--num-requests",
                "1350"), ("--gpus", "4", "--max-running-requests", "24", "--policy", "random")),
    "mooncake": (("--dataset", "tests/data/mooncake_synthetic_trace_last1000.jsonl.xz", "--keep-timestamps",
                  "--num-requests", "400"), ("--gpus", "2", "--policy", "cache_aware")),
    "routing-cache_aware": (("--workload", "shared-prompt", "--groups", "128", "--prefix-len", "2048",
                             "--input-len", "256", "--output-len", "32", "--rate", "56", "--num-requests", "320"),
                            ("--gpus", "4", "--policy", "cache_aware")),
    "node": (("--rate", "8", "--num-requests", "300"), ("--gpus", "1",)),
    "node-static": (("--rate", "8", "--num-requests", "300"), ("--gpus", "1", "--mode", "static",
                                                               "--batch-size", "8")),
    "pd-1-1": (TOUR, ("--pd", "1:1")),
}
# ready cases on committed traces (CASE = NAME): trace, replay options
READY_CASES = {
    # PD 1:1 on the real H200 pair's shared-prefix trace (81 requests over 40 s, ~0.9 GiB of KV a request: the tcp
    # link is busy most of the run; reports/examples/h200x2-pd), round_robin in each pool, the H200 profile
    "pd-h200-shared": ("reports/examples/h200x2-pd/shared.jsonl.xz",
                       "--pd 1:1 --policy round_robin --sim-profile llama-2-7b-h200-triton"),
    # the same over an RDMA link: transfers short, no queue at the link (TTFT: the prefill, ~45 ms of bytes + 70 ms)
    "pd-h200-shared-rdma": ("reports/examples/h200x2-pd/shared.jsonl.xz",
                            "--pd 1:1 --policy round_robin --sim-profile llama-2-7b-h200-triton --kv-link rdma-200g"),
    # the same pair on the Mooncake slice (33 requests, long prompts)
    "pd-h200-mooncake": ("reports/examples/h200x2-pd/mooncake.jsonl.xz",
                         "--pd 1:1 --policy round_robin --sim-profile llama-2-7b-h200-triton"),
}
PD_ROWS = (("KV transfer", "kv_transfer"), ("prefill answer", "prefill_answer"))

# (label, key, quantile or None for throughput, tolerance as a fraction)
ROWS = (
    ("throughput req/s", "requests_per_s", None, 0.01),
    ("TTFT p50", "ttft", 0.50, 0.01), ("TTFT p99", "ttft", 0.99, 0.03),
    ("TPOT p50", "tpot", 0.50, 0.01), ("TPOT p99", "tpot", 0.99, 0.03),
    ("total p50", "total", 0.50, 0.01), ("total p99", "total", 0.99, 0.03),
)
CACHE_POINTS = 0.2


def figures(run: Run) -> dict[str, float]:
    import numpy as np
    import polars as pl

    from tracebench.report.load import COMPLETED_STATUSES
    from tracebench.report.metrics import latency_expr
    from tracebench.report.pd import is_pd, stage_exprs

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
    if is_pd(run.meta):
        exprs = {"kv_transfer": stage_exprs()["kv_transfer"],
                 "prefill_answer": pl.col("t_prefill_answer") - pl.col("t_dispatch")}
        for label, key in PD_ROWS:
            values = ok.select(exprs[key].alias("v"))["v"].drop_nulls().to_numpy()
            for name, q in (("p50", 0.5), ("p99", 0.99)):
                out[f"{label} {name}"] = float(np.quantile(values, q)) * 1000 if values.size else float("nan")
    return out


def compare(name: str, real_dir: Path, virtual_dir: Path, second: str = "virtual clock") -> tuple[list[str], bool]:
    from tracebench.report.load import load_run

    real, virtual = load_run(real_dir), load_run(virtual_dir)
    a, b = figures(real), figures(virtual)
    lines = [f"### {name}", "", f"| figure | real-time sim | {second} | diff | held |", "| --- | ---: | ---: | ---: | --- |"]
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
    for label in (f"{row} {name}" for row, _ in PD_ROWS for name in ("p50", "p99")):
        if label in a and label in b:
            diff = (b[label] - a[label]) / a[label] if a[label] else 0.0
            lines.append(f"| PD: {label} | {a[label]:.3f} | {b[label]:.3f} | {diff:+.2%} | (not held) |")
    ra = real.requests.select("id", "server").sort("id")
    rb = virtual.requests.select("id", "server").sort("id")
    same = int((ra["server"] == rb["server"]).sum())
    lines.append(f"| requests on the same server | | | {same} of {ra.height} | |")
    if real.meta.get("pd") and virtual.meta.get("pd"):   # (the loader gives every run the column, null when not PD)
        pa = real.requests.select("id", "prefill_server").sort("id")
        pb = virtual.requests.select("id", "prefill_server").sort("id")
        same = int((pa["prefill_server"] == pb["prefill_server"]).sum())
        lines.append(f"| requests on the same prefill server | | | {same} of {pa.height} | |")
    return lines + [""], held


def replay(trace: str, args: list[str], clock: str, out: Path, name: str, check: bool = True) -> Path | None:
    """Replay `trace` into out/name; None when `check` is False and tracebench refused the options (exit 2)."""
    cmd = [sys.executable, "-m", "tracebench", "replay", trace, "--clock", clock, "--run-name", name,
           "--out-dir", str(out), "--quiet", *args]
    if clock == "real":
        cmd += ["--backend", "sim"]
    print("$ " + " ".join(cmd[1:]), file=sys.stderr)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if done.returncode == 2 and not check:
        print(f"{name}: refused: {done.stderr.strip().splitlines()[-1]}", file=sys.stderr)
        return None
    if done.returncode != 0:
        raise SystemExit(f"{name}: exit {done.returncode}\n{done.stderr}")
    return out / name


def run_issue_cases(out: Path, repeat_real: bool, only: list[str] | None) -> list[tuple[str, Path, Path, Path | None]]:
    """Make every ISSUE_CASES case's runs; (name, real-time run, virtual run, second real-time run or None).
    A case the virtual clock refuses is left out, with its reason printed."""
    out.mkdir(parents=True, exist_ok=True)
    traces: dict[tuple[str, ...], str] = {}
    made = []
    for name, (gen, args) in ISSUE_CASES.items():
        if only and name not in only:
            continue
        if gen not in traces:
            trace = out / f"trace-{len(traces)}.jsonl"
            subprocess.run([sys.executable, "-m", "tracebench", "generate", *gen, "--seed", "0", "-o", str(trace)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            traces[gen] = str(trace)
        trace = traces[gen]
        # the virtual run first: a case it refuses costs no real-time run
        virtual = replay(trace, list(args), "virtual", out, f"{name}-virtual", check=False)
        if virtual is None:
            continue
        runs: dict[str, Path | None] = {}

        def real_run(tag: str) -> None:
            runs[tag] = replay(trace, list(args), "real", out, f"{name}-{tag}")

        threads = [threading.Thread(target=real_run, args=(tag,)) for tag in (["real", "real2"] if repeat_real
                                                                           else ["real"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if "real" not in runs or (repeat_real and "real2" not in runs):
            raise SystemExit(f"{name}: a real-time run failed")
        made.append((name, runs["real"], virtual, runs.get("real2")))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="NAME=TRACE:REPLAY-ARGS")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("REALTIME_RUN", "VIRTUAL_RUN"))
    parser.add_argument("--out", type=Path, default=Path("reports/virtual-vs-realtime"))
    parser.add_argument("--issue-cases", action="store_true", help="the cases of issue #32 item 1 (ISSUE_CASES)")
    parser.add_argument("--runs-only", action="store_true", help="make the runs, compare nothing")
    parser.add_argument("--compare-dir", action="store_true", help="compare the ISSUE_CASES runs found in --out")
    parser.add_argument("--repeat-real", action="store_true", help="each real-time run twice, side by side")
    parser.add_argument("--only", nargs="*", choices=sorted(ISSUE_CASES), help="these of ISSUE_CASES")
    opts = parser.parse_args()
    report: list[str] = []
    all_held = True
    if opts.issue_cases:
        made = run_issue_cases(opts.out, opts.repeat_real, opts.only)
        if opts.runs_only:
            print("made: " + ", ".join(name for name, *_ in made))
            return
        opts.compare_dir = True
    if opts.compare_dir:
        for name in ISSUE_CASES:
            if opts.only and name not in opts.only:
                continue
            real = opts.out / f"{name}-real"
            if not real.is_dir():
                print(f"{name}: no runs in {opts.out}", file=sys.stderr)
                continue
            pairs = [(name, real, opts.out / f"{name}-virtual")]
            if (opts.out / f"{name}-real2").is_dir():
                pairs.append((f"{name}, real-time vs real-time (the floor)", real, opts.out / f"{name}-real2"))
            for label, a, b in pairs:
                lines, held = compare(label, a, b, "real-time sim, again" if "floor" in label else "virtual clock")
                report += lines
                if "floor" not in label:
                    all_held &= held
    for case in opts.cases:
        name, _, rest = case.partition("=")
        if not rest:
            if name not in READY_CASES:
                raise SystemExit(f"{case}: not NAME=TRACE:ARGS, nor a ready case ({', '.join(READY_CASES)})")
            trace, args = READY_CASES[name]
            trace = str(REPO / trace)
        else:
            trace, _, args = rest.partition(":")
        if trace.endswith(".xz"):
            plain = opts.out / Path(trace).stem
            opts.out.mkdir(parents=True, exist_ok=True)
            plain.write_bytes(lzma.decompress(Path(trace).read_bytes()))
            trace = str(plain)
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

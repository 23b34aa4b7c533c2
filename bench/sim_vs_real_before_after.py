"""One table: every real run next to two simulator replays of it (before and after a model change), sim − real in %.

    .venv/bin/python bench/sim_vs_real_before_after.py LIST BEFORE_DIR AFTER_DIR [--check]

LIST: lines (bench/sim_vs_real_runs.txt: every committed real run with its trace) `REAL_RUN TRACE` (the pairs given to `bench/sim_vs_real.py --replay`); BEFORE_DIR / AFTER_DIR: folders
holding, per real run, `<group>/<run name>/` as `bench/sim_vs_real.py --replay ... --out DIR/<group>` made them, group
= the real run's path under reports/examples with '/' as '_', and a file `done` in `<group>/` once its replay
finished (a run without one shows n/a). Figures are bench/sim_vs_real.py's (the report's loader
and definitions). `--check` (issue 36's goal): after, TPOT p50 within 3% and TPOT p99 within 8%, and throughput, total
p50/p99, TTFT p50/p99 no further from real than before (+0.5 points of slack for replay noise); lists what misses.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_vs_real import figures  # noqa: E402
from tracebench.report.load import load_run  # noqa: E402

COLUMNS = ((("requests_per_s", ""), "req/s"), (("total", "p50"), "total p50"), (("total", "p99"), "total p99"),
           (("ttft", "p50"), "TTFT p50"), (("ttft", "p99"), "TTFT p99"), (("tpot", "p50"), "TPOT p50"),
           (("tpot", "p99"), "TPOT p99"))
GOALS = {("tpot", "p50"): 0.03, ("tpot", "p99"): 0.08}
SLACK = 0.005


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("list", type=Path)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--check", action="store_true")
    opts = parser.parse_args()
    print("| run | " + " | ".join(label for _, label in COLUMNS) + " |")
    print("| --- |" + " ---: |" * len(COLUMNS))
    misses = []
    for line in opts.list.read_text().splitlines():
        if not line.strip():
            continue
        real_dir = Path(line.split()[0])
        group = "_".join(real_dir.parts[2:])
        real = load_run(REPO / real_dir)
        name = real.meta["run_name"]
        sims = []
        for root in (opts.before, opts.after):
            path = root / group / name
            finished = (root / group / "done").is_file()   # the replay loop's mark: the run folder is complete
            sims.append(figures(load_run(path)) if finished else None)
        fr = figures(real)
        cells = []
        for key, label in COLUMNS:
            diffs = [None if fs is None else fs[key] / fr[key] - 1 for fs in sims]
            cells.append(" → ".join("n/a" if d is None else f"{d:+.1%}" for d in diffs))
            before, after = diffs
            if after is None:
                continue
            if key in GOALS and abs(after) > GOALS[key]:
                misses.append(f"{group} {label}: {after:+.1%} (goal ±{GOALS[key]:.0%})")
            elif key not in GOALS and before is not None and abs(after) > abs(before) + SLACK:
                misses.append(f"{group} {label}: {before:+.1%} → {after:+.1%} (worse)")
        print(f"| {group} | " + " | ".join(cells) + " |")
    if opts.check:
        print()
        print("misses:" if misses else "no misses")
        for miss in misses:
            print(f"- {miss}")


if __name__ == "__main__":
    main()

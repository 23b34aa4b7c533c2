"""One table: every real run next to two simulator replays of it (before and after a model change), sim − real in %.

    .venv/bin/python bench/sim_vs_real_before_after.py LIST BEFORE_DIR AFTER_DIR [--check]
    .venv/bin/python bench/sim_vs_real_before_after.py LIST --make DIR [--only WORD] [--sim-profile NAME|PATH]

LIST: lines (bench/sim_vs_real_runs.txt: every committed real run with its trace) `REAL_RUN TRACE` (the pairs given to `bench/sim_vs_real.py --replay`); BEFORE_DIR / AFTER_DIR: folders
holding, per real run, `<group>/<run name>/` as `bench/sim_vs_real.py --replay ... --out DIR/<group>` made them, group
= the real run's path under reports/examples with '/' as '_', and a file `done` in `<group>/` once its replay
finished (a run without one shows n/a). Figures are bench/sim_vs_real.py's (the report's loader
and definitions). `--check` (issue 36's goal): after, TPOT p50 within 3% and TPOT p99 within 8%, and throughput, total
p50/p99, TTFT p50/p99 no further from real than before (+0.5 points of slack for replay noise); lists what misses.

`--make DIR` makes those folders: every run of LIST (or those whose path holds `--only`) replayed into DIR by
`bench/sim_vs_real.py --replay`, on the virtual clock where the run allows it (deterministic: the same simulator gives
the same figures on any host) and on the real clock, speed 1, for PD runs and runs through sglang-router (the virtual
clock does not carry them: docs/virtual-clock.md); a group's `done` is written once its replay finished.
"""

from __future__ import annotations

import argparse
import subprocess
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


def entries(path: Path) -> list[tuple[Path, Path]]:
    """LIST's lines: (real run folder, its trace)."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise SystemExit(f"{path}:{number}: want 'REAL_RUN TRACE', got {line!r}")
        out.append((Path(parts[0]), Path(parts[1])))
    return out


def make(pairs: list[tuple[Path, Path]], out: Path, only: str | None, sim_profile: str | None) -> None:
    """Replay every real run of `pairs` into `out/<group>/`, virtual clock where the run allows it."""
    for real_dir, trace in pairs:
        if only is not None and only not in str(real_dir):
            continue
        group = "_".join(real_dir.parts[2:])
        meta = load_run(REPO / real_dir).meta
        clock = "real" if meta.get("pd") or meta.get("external_router") else "virtual"
        args = [sys.executable, str(REPO / "bench" / "sim_vs_real.py"), "--replay", str(real_dir), str(trace),
                "--out", str(out / group), "--clock", clock, "--summary"]
        if sim_profile is not None:
            args += ["--sim-profile", sim_profile]
        print(f"{group} ({clock} clock)", file=sys.stderr, flush=True)
        subprocess.run(args, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        (out / group / "done").write_text(clock + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("list", type=Path)
    parser.add_argument("before", type=Path, nargs="?")
    parser.add_argument("after", type=Path, nargs="?")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--make", type=Path, default=None, metavar="DIR",
                        help="replay every run of LIST into DIR (the layout BEFORE_DIR/AFTER_DIR take)")
    parser.add_argument("--only", default=None, help="--make: only the runs whose path holds this")
    parser.add_argument("--sim-profile", default=None, help="--make: this profile for every replay")
    opts = parser.parse_args()
    if opts.make is not None:
        if opts.before is not None:
            parser.error("--make takes LIST only")
        make(entries(opts.list), opts.make.resolve(), opts.only, opts.sim_profile)
        return
    if opts.before is None or opts.after is None:
        parser.error("give LIST BEFORE_DIR AFTER_DIR (or LIST --make DIR)")
    print("| run | " + " | ".join(label for _, label in COLUMNS) + " |")
    print("| --- |" + " ---: |" * len(COLUMNS))
    misses = []
    for real_dir, _ in entries(opts.list):
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

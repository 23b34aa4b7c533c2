"""How much a figure of the simulator's replay of a real run moves by chance, and a before/after comparison that
allows for it: each run replayed with its arrivals jittered by a millisecond (seeds), before and after a model change.

The simulator on the virtual clock is deterministic, and sjf has no random choice, so a replay's `--seed` changes
nothing for most runs; what differs between two real runs of one trace is when each request reaches its server (the
client's release lag and the HTTP path: ±1-2 ms on the committed runs). Near saturation (the capped routing runs,
the shared-prompt node run) a figure's sim − real moves by tens of points under that jitter: one replay of each
model, as `bench/sim_vs_real_before_after.py` compares them, is one draw.

    .venv/bin/python bench/sim_noise.py LIST --out DIR --after PROFILE [--before PROFILE] [--only WORD ...]
        [--seeds 8] [--jitter-ms 1] [--check]
    .venv/bin/python bench/sim_noise.py bench/sim_vs_real_runs.txt --out reports/noise --only routing \\
        --after bench/profiles/llama-2-7b-h200-triton-attention.json --check

LIST: bench/sim_vs_real_runs.txt's lines (`REAL_RUN TRACE`); runs that go on the virtual clock only (not PD, not
through sglang-router), those whose path holds any `--only` word. `--before`/`--after`: a profile file for the runs of
its accelerator, or `builtin` (each run's GPU's built-in profile; `--before`'s default). Per run and profile, `--seeds`
replays (`bench/sim_vs_real.py --replay --clock virtual`) with every arrival moved by uniform(±jitter) (seeds 1…N).
Prints one row per run: per figure, the median of sim − real over the seeds and their range, before → after, and the
real run's bootstrap 95% interval of the percentile (its own sampling noise). `--check`: after's median TPOT p50
within 3% and p99 within 8%; every other figure's median no further from real than before's median by more than the
half-width of before's range over the seeds (at least 0.5 points); lists what misses.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_vs_real import QUANTILES, figures, sampling_interval, sim_replay  # noqa: E402
from sim_vs_real_before_after import (COLUMNS, GOALS, SLACK, entries, group_of, print_header,  # noqa: E402
                                      print_misses)
from tracebench.report.load import load_run  # noqa: E402


def jittered_figures(real_dir: Path, trace: Path, out: Path, profile: str, seeds: int,
                     jitter_s: float) -> list[dict]:
    """The figures of `seeds` replays of `real_dir` with jittered arrivals (seed 1…N), each into out/seed<k>."""
    chosen = None if profile == "builtin" else profile
    runs = []
    for seed in range(1, seeds + 1):
        folder = out / f"seed{seed}"
        name = load_run(real_dir).meta["run_name"]
        done = folder / "done"
        if not done.is_file():   # a replay that finished is kept: the same seed gives the same run
            if (folder / name).exists():   # one that was stopped midway (no `done`) is made again
                shutil.rmtree(folder / name)
            sim_replay(real_dir, trace, folder, 1.0, chosen, [], "virtual", jitter=(jitter_s, seed))
            done.write_text("virtual\n")
        runs.append(figures(load_run(folder / name)))
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("list", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--before", default="builtin")
    parser.add_argument("--after", required=True)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jitter-ms", type=float, default=1.0)
    parser.add_argument("--check", action="store_true")
    opts = parser.parse_args()
    if opts.seeds < 1:
        parser.error("--seeds must be >= 1")
    print(f"sim − real, median over {opts.seeds} replays with arrivals jittered by ±{opts.jitter_ms:g} ms "
          "(min…max), before → after; [the real run's 95% interval]")
    print()
    print_header()
    misses = []
    for real_dir, trace in entries(opts.list):
        if opts.only and not any(word in str(real_dir) for word in opts.only):
            continue
        real = load_run(REPO / real_dir)
        if real.meta.get("pd") or real.meta.get("external_router"):
            continue
        group = group_of(real_dir)
        fr = figures(real)
        before, after = (jittered_figures(real_dir, trace, opts.out / side / group, profile, opts.seeds,
                                          opts.jitter_ms / 1e3)
                         for side, profile in (("before", opts.before), ("after", opts.after)))
        cells = []
        for key, label in COLUMNS:
            b, a = ([fs[key] / fr[key] - 1 for fs in runs] for runs in (before, after))
            mb, ma = statistics.median(b), statistics.median(a)
            cell = f"{mb:+.1%} ({min(b):+.1%}…{max(b):+.1%}) → {ma:+.1%} ({min(a):+.1%}…{max(a):+.1%})"
            if key[1] in QUANTILES:
                low, high = sampling_interval(real, *key)
                cell += f" [{low:+.0%}…{high:+.0%}]"
            cells.append(cell)
            if key in GOALS:
                if abs(ma) > GOALS[key]:
                    misses.append(f"{group} {label}: median {ma:+.1%} (goal ±{GOALS[key]:.0%})")
            elif abs(ma) > abs(mb) + max((max(b) - min(b)) / 2, SLACK):
                misses.append(f"{group} {label}: median {mb:+.1%} → {ma:+.1%} (before's seeds {min(b):+.1%}…"
                              f"{max(b):+.1%})")
        print(f"| {group} | " + " | ".join(cells) + " |", flush=True)
    if opts.check:
        print_misses(misses)


if __name__ == "__main__":
    main()

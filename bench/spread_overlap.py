"""Is the virtual clock's distance to a real run inside the real-time simulator's own spread? (issue #32 item 2, for
runs whose figures are draws: the capped routing runs near saturation, where a millisecond sends a request elsewhere.)

    .venv/bin/python bench/spread_overlap.py LIST --out DIR --realtime DIR [--realtime DIR ...] [--seeds 8]
        [--jitter-ms 1] [--only WORD ...]
    .venv/bin/python bench/spread_overlap.py x4.txt --out reports/noise --realtime replays-1 --realtime replays-2

LIST: bench/sim_vs_real_runs.txt's lines (`REAL_RUN TRACE`), those whose path holds any `--only` word. Per real run:
- the virtual clock's figures over `--seeds` replays with every arrival moved by uniform(±jitter) (bench/sim_noise.py's
  replays, kept in --out and reused), and the unjittered replay's (seed 0 is the trace as it is);
- the real-time simulator's figures from each `--realtime` folder: a run folder there named like the real run
  (run.json `run_name`), made beforehand (`bench/sim_vs_real.py --replay ... --clock real --dry-run` prints the
  commands; real-time runs are host-bound, so make them on a quiet machine).
Prints one row per figure (throughput, total latency and TTFT p50/p99; sim − real, % of real): the unjittered virtual
replay, the virtual range over the seeds, the real-time replays, and whether the two ranges overlap; then how many
figures overlap and how many are within 1 point of the nearest real-time replay (or closer to real).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_noise import jittered_figures  # noqa: E402
from sim_vs_real import figures, sim_replay  # noqa: E402
from sim_vs_real_before_after import entries, group_of  # noqa: E402
from tracebench.report.load import load_run  # noqa: E402

# the figures issue #32 item 2 holds (bench/sim_vs_real.py's starred rows)
HELD = ((("requests_per_s", ""), "throughput"), (("total", "p50"), "total p50"), (("total", "p99"), "total p99"),
        (("ttft", "p50"), "TTFT p50"), (("ttft", "p99"), "TTFT p99"))


def error(sim: dict, real: dict, key: tuple[str, str]) -> float:
    """sim − real in % of real."""
    return 100.0 * (sim[key] - real[key]) / real[key]


def rows(real_dir: Path, trace: Path, out: Path, realtime: list[Path], seeds: int, jitter_s: float
         ) -> list[tuple[str, float, list[float], list[float]]]:
    """(figure, the unjittered virtual error, the jittered ones, the real-time replays' ones) of one real run."""
    real = figures(load_run(real_dir))
    name = load_run(real_dir).meta["run_name"]
    group = out / group_of(real_dir)
    plain = group / "seed0"
    if not (plain / "done").is_file():
        sim_replay(real_dir, trace, plain, 1.0, None, [], "virtual")
        (plain / "done").write_text("virtual\n")
    virtual = figures(load_run(plain / name))
    jittered = jittered_figures(real_dir, trace, group, "builtin", seeds, jitter_s)
    replays = []
    for folder in realtime:
        if not (folder / name).is_dir():
            raise SystemExit(f"--realtime {folder}: no run folder {name} (the real-time replay of {real_dir})")
        replays.append(figures(load_run(folder / name)))
    return [(label, error(virtual, real, key), [error(j, real, key) for j in jittered],
             [error(r, real, key) for r in replays]) for key, label in HELD]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("list", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="where the virtual replays go (reused)")
    parser.add_argument("--realtime", type=Path, action="append", required=True,
                        help="a folder of real-time replays (repeatable)")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jitter-ms", type=float, default=1.0)
    parser.add_argument("--only", action="append", default=[])
    opts = parser.parse_args()
    if opts.seeds < 1:
        parser.error("--seeds must be >= 1")
    print("| run | figure | virtual clock | virtual, ±%g ms jitter, %d seeds (range) | real-time simulator | overlap |"
          % (opts.jitter_ms, opts.seeds))
    print("| --- | --- | ---: | ---: | ---: | --- |")
    overlap = near = total = 0
    for real_dir, trace in entries(opts.list):
        if opts.only and not any(word in str(real_dir) for word in opts.only):
            continue
        for label, plain, jittered, replays in rows(real_dir, trace, opts.out, opts.realtime, opts.seeds,
                                                    opts.jitter_ms / 1e3):
            lo, hi = min(jittered + [plain]), max(jittered + [plain])
            shared = not (hi < min(replays) or lo > max(replays))
            # within 1 point of the nearest real-time replay, or closer to real than it
            close = min(abs(plain - r) for r in replays) <= 1.0 or abs(plain) <= min(abs(r) for r in replays)
            total += 1
            overlap += shared
            near += close
            print(f"| {real_dir.name} | {label} | {plain:+.1f}% | {lo:+.1f}…{hi:+.1f}% | "
                  + ", ".join(f"{r:+.1f}" for r in replays) + f"% | {'yes' if shared else 'NO'} |", flush=True)
    print()
    print(f"{overlap} of {total} figures: the virtual range overlaps the real-time simulator's; {near} of {total}: the "
          "unjittered virtual replay within 1 point of the nearest real-time replay, or closer to real")


if __name__ == "__main__":
    main()

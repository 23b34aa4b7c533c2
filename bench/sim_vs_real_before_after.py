"""One table: every real run next to two simulator replays of it (before and after a model change), sim − real in %.

    .venv/bin/python bench/sim_vs_real_before_after.py LIST BEFORE_DIR AFTER_DIR [--check]
    .venv/bin/python bench/sim_vs_real_before_after.py LIST --make DIR [--only WORD] [--sim-profile PATH]
        [--decode-scale K]
    .venv/bin/python bench/sim_vs_real_before_after.py LIST BEFORE_DIR AFTER_DIR --check [--band DIR ...]

LIST: lines (bench/sim_vs_real_runs.txt: every committed real run with its trace) `REAL_RUN TRACE` (the pairs given to `bench/sim_vs_real.py --replay`); BEFORE_DIR / AFTER_DIR: folders
holding, per real run, `<group>/<run name>/` as `bench/sim_vs_real.py --replay ... --out DIR/<group>` made them, group
= the real run's path under reports/examples with '/' as '_', and a file `done` in `<group>/` once its replay
finished (a run without one shows n/a). Figures are bench/sim_vs_real.py's (the report's loader
and definitions). `--check` (issue 36's goal): after, TPOT p50 within 3% and TPOT p99 within 8%, and throughput, total
p50/p99, TTFT p50/p99 no further from real than before (+0.5 points of slack for replay noise); lists what misses.

`--make DIR` makes those folders: every run of LIST (or those whose path holds `--only`) replayed into DIR by
`bench/sim_vs_real.py --replay`, on the virtual clock where the run allows it (deterministic: the same simulator gives
the same figures on any host; PD runs too since 2026-11-29) and on the real clock, speed 1, for runs through
sglang-router (the virtual clock does not carry them: docs/virtual-clock.md); a group's `done` is written once its
replay finished.
`--sim-profile PATH` replays the runs of that profile's accelerator with it (the others with their GPU's built-in
profile); `--decode-scale K` multiplies every decode cost of the profile each run uses by K (a copy in DIR/profiles/).

`--band DIR ...` (folders made like BEFORE_DIR, e.g. `--make DIR --decode-scale 0.99` and `1.01`: the before
simulator with its decode step 1% cheaper and dearer) widens "no further from real than before" to the worst of
before and the band: a figure that a 1% change of the decode step moves by tens of points (the capped routing runs
near saturation: the router queue amplifies service time) is judged against what that 1% does to it.
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_vs_real import accelerators, figures  # noqa: E402
from tracebench.report.load import load_run  # noqa: E402
from tracebench.sim.catalog import profile_for_gpu  # noqa: E402
from tracebench.sim.fit import profile_document, profile_text  # noqa: E402
from tracebench.profiles import Profile, load_profile  # noqa: E402

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


def group_of(real_dir: Path) -> str:
    """A real run's group: its path under reports/examples with '/' as '_' (the folder its replays go in)."""
    return "_".join(real_dir.parts[2:])


def print_header() -> None:
    """The table's header: a run, then COLUMNS."""
    print("| run | " + " | ".join(label for _, label in COLUMNS) + " |")
    print("| --- |" + " ---: |" * len(COLUMNS))


def print_misses(misses: list[str]) -> None:
    """--check's verdict under the table: every miss, or that there is none."""
    print()
    print("misses:" if misses else "no misses")
    for miss in misses:
        print(f"- {miss}")


def scaled_profile(profile: Profile, scale: float, folder: Path) -> Path:
    """A copy of `profile` with every decode cost times `scale`, written into `folder`."""
    attention = profile.decode_attention
    if attention is not None:
        attention = dataclasses.replace(attention, token_s=attention.token_s * scale,
                                        few_programs_token_s=attention.few_programs_token_s * scale)
    scaled = dataclasses.replace(profile, decode_base_s=profile.decode_base_s * scale,
                                 decode_per_req_s=profile.decode_per_req_s * scale,
                                 decode_per_kv_token_s=profile.decode_per_kv_token_s * scale,
                                 decode_attention=attention, source=f"{profile.source}; decode costs x {scale:g}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{profile.name}-decode-x{scale:g}.json"
    path.write_text(profile_text(profile_document(scaled)))
    return path


def make(pairs: list[tuple[Path, Path]], out: Path, only: str | None, sim_profile: Path | None,
         decode_scale: float) -> None:
    """Replay every real run of `pairs` into `out/<group>/`, virtual clock where the run allows it."""
    chosen = None if sim_profile is None else load_profile(str(sim_profile))
    for real_dir, trace in pairs:
        if only is not None and only not in str(real_dir):
            continue
        group = group_of(real_dir)
        real = load_run(REPO / real_dir)
        meta = real.meta
        clock = "real" if meta.get("external_router") else "virtual"
        args = [sys.executable, str(REPO / "bench" / "sim_vs_real.py"), "--replay", str(real_dir), str(trace),
                "--out", str(out / group), "--clock", clock, "--summary"]
        (accelerator,) = accelerators(real)   # one kind of GPU per run
        profile_path = sim_profile if chosen is not None and chosen.accelerator == accelerator else None
        if decode_scale != 1.0:
            profile = load_profile(str(profile_path)) if profile_path is not None else profile_for_gpu(accelerator)
            profile_path = scaled_profile(profile, decode_scale, out / "profiles")
        if profile_path is not None:
            args += ["--sim-profile", str(profile_path)]
        print(f"{group} ({clock} clock)", file=sys.stderr, flush=True)
        subprocess.run(args, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
        (out / group / "done").write_text(clock + "\n")


def replayed(root: Path, group: str, name: str) -> dict | None:
    """The figures of the replay of run `name` in `root/group`, None when that replay did not finish."""
    finished = (root / group / "done").is_file()   # the replay loop's mark: the run folder is complete
    return figures(load_run(root / group / name)) if finished else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("list", type=Path)
    parser.add_argument("before", type=Path, nargs="?")
    parser.add_argument("after", type=Path, nargs="?")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--make", type=Path, default=None, metavar="DIR",
                        help="replay every run of LIST into DIR (the layout BEFORE_DIR/AFTER_DIR take)")
    parser.add_argument("--only", default=None, help="--make: only the runs whose path holds this")
    parser.add_argument("--sim-profile", type=Path, default=None,
                        help="--make: this profile file for the runs of its accelerator")
    parser.add_argument("--decode-scale", type=float, default=1.0,
                        help="--make: every decode cost of the profiles used times this (a band around a simulator)")
    parser.add_argument("--band", type=Path, nargs="+", default=[], metavar="DIR",
                        help="--check: replays of the before simulator with perturbed costs; a figure is worse only "
                             "past the worst of before and these")
    opts = parser.parse_args()
    if opts.make is not None:
        if opts.before is not None:
            parser.error("--make takes LIST only")
        make(entries(opts.list), opts.make.resolve(), opts.only, opts.sim_profile, opts.decode_scale)
        return
    if opts.before is None or opts.after is None:
        parser.error("give LIST BEFORE_DIR AFTER_DIR (or LIST --make DIR)")
    print_header()
    misses = []
    for real_dir, _ in entries(opts.list):
        group = group_of(real_dir)
        real = load_run(REPO / real_dir)
        name = real.meta["run_name"]
        fr = figures(real)
        before, after, *band = (replayed(root, group, name) for root in (opts.before, opts.after, *opts.band))
        cells = []
        for key, label in COLUMNS:
            b, a = (None if fs is None else fs[key] / fr[key] - 1 for fs in (before, after))
            spread = [fs[key] / fr[key] - 1 for fs in band if fs is not None]
            cell = " → ".join("n/a" if d is None else f"{d:+.1%}" for d in (b, a))
            if spread:
                cell += f" ({min(spread):+.1%}…{max(spread):+.1%})"
            cells.append(cell)
            if a is None:
                continue
            if key in GOALS and abs(a) > GOALS[key]:
                misses.append(f"{group} {label}: {a:+.1%} (goal ±{GOALS[key]:.0%})")
            elif key not in GOALS and b is not None and abs(a) > max(abs(x) for x in [b, *spread]) + SLACK:
                where = "before" if not spread else f"before and its band {min(spread):+.1%}…{max(spread):+.1%}"
                misses.append(f"{group} {label}: {b:+.1%} → {a:+.1%} (worse than {where})")
        print(f"| {group} | " + " | ".join(cells) + " |")
    if opts.check:
        print_misses(misses)


if __name__ == "__main__":
    main()

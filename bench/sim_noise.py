"""How much a figure of the simulator's replay of a real run moves by chance: the same replay with its arrivals
jittered by a millisecond (seeds), against the real run's own sampling noise. The simulator on the virtual clock is
deterministic, and sjf has no random choice, so its `--seed` changes nothing; what differs between two real runs of
one trace is when each request reaches its server (the client's release lag and the HTTP path: ±1-2 ms on the
committed runs). A figure whose sim − real moves by tens of points under that jitter is not something a 1% change of
a cost model can be judged by.

    .venv/bin/python bench/sim_noise.py REAL_RUN TRACE --out DIR [--seeds 8] [--jitter-ms 1] [--sim-profile PATH]...
    .venv/bin/python bench/sim_noise.py reports/examples/h200x4-routing/sjf reports/examples/sim4-routing/azure4.jsonl.xz \\
        --out /tmp/noise --sim-profile bench/profiles/llama-2-7b-h200-triton-attention.json

Per profile given (`--sim-profile`, repeatable; `builtin` is the real run's GPU's built-in profile, the default):
the replay as `bench/sim_vs_real.py --replay --clock virtual` makes it (jitter 0), then `--seeds` replays with every
arrival moved by uniform(±jitter) (seed 1…N). Prints, per figure: real, sim − real unjittered, and over the seeds
min / median / max of sim − real; and the real run's bootstrap 95% interval of that percentile (its own sampling
noise, bench/sim_vs_real.py's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sim_vs_real import QUANTILES, figures, sampling_interval, sim_replay  # noqa: E402
from sim_vs_real_before_after import COLUMNS  # noqa: E402
from tracebench.report.load import load_run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("real", type=Path)
    parser.add_argument("trace", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--jitter-ms", type=float, default=1.0)
    parser.add_argument("--sim-profile", action="append", default=[],
                        help="a profile file, or `builtin` (the real run's GPU's built-in profile; the default)")
    opts = parser.parse_args()
    if opts.seeds < 1:
        parser.error("--seeds must be >= 1")
    real = load_run(opts.real)
    fr = figures(real)
    print(f"### {opts.real}: sim − real, arrivals jittered by ±{opts.jitter_ms:g} ms ({opts.seeds} seeds)")
    print()
    print("| profile | figure | real | no jitter | jittered min / median / max | real's 95% interval |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for profile in opts.sim_profile or ["builtin"]:
        chosen = None if profile == "builtin" else profile
        label = "built-in" if chosen is None else Path(profile).stem
        runs = []
        for seed in range(opts.seeds + 1):
            jitter = None if seed == 0 else (opts.jitter_ms / 1e3, seed)
            folder = opts.out / label / f"seed{seed}"
            runs.append(figures(load_run(sim_replay(opts.real, opts.trace, folder, 1.0, chosen, [], "virtual",
                                                    jitter))))
        for key, name in COLUMNS:
            diffs = [fs[key] / fr[key] - 1 for fs in runs]
            spread = diffs[1:]
            interval = "-"
            if key[1] in QUANTILES:
                low, high = sampling_interval(real, *key)
                interval = f"{low:+.1%} … {high:+.1%}"
            print(f"| {label} | {name} | {fr[key] * (1 if key[0] == 'requests_per_s' else 1e3):,.1f} | "
                  f"{diffs[0]:+.1%} | {min(spread):+.1%} / {statistics.median(spread):+.1%} / {max(spread):+.1%} | "
                  f"{interval} |")


if __name__ == "__main__":
    main()

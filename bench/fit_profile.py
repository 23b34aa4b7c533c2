"""Regenerate the built-in sim-server profiles from the committed sglang 0.5.17 measurements and print each one's error
per calibration point.

- llama-2-7b-h200-triton: the H200 captures of tests/data/sglang-0.5.17 (calibration.json, prefix-cache-h200.json,
  api_capture.json), the decode grid decode-grid-h200.json.xz (the decode step; issue 36) and the real routing runs
  reports/examples/h200x2-routing/*/ (two H200s, Azure lengths: the idle intake and the plan lag).
- llama-2-7b-h100-triton: tests/data/sglang-0.5.17/calibration-h100.json.xz (bench/gpu/calibrate.py on one H100) and
  the real fit run reports/examples/h100-sim-vs-real/fit/fit-azure-round_robin (two H100s, Azure lengths, cap 24).

    .venv/bin/python bench/fit_profile.py             # writes both into tracebench/sim/profiles/
    .venv/bin/python bench/fit_profile.py h100        # only one (h200 or h100)
    .venv/bin/python bench/fit_profile.py --no-write  # only print

The fit itself is `tracebench/sim/fit.py` (its docstring says how each parameter is estimated); a test
(tests/test_sim_model.py) checks the committed files are these fits.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.sim.fit import main  # noqa: E402

DATA = REPO / "tests" / "data" / "sglang-0.5.17"
EXAMPLES = REPO / "reports" / "examples"
PROFILES = {
    "h200": ("llama-2-7b-h200-triton", ["--sglang-dir", str(DATA), "--decode-grid", str(DATA / "decode-grid-h200.json.xz")],
             EXAMPLES / "h200x2-routing"),
    "h100": ("llama-2-7b-h100-triton", ["--calibration", str(DATA / "calibration-h100.json.xz")],
             EXAMPLES / "h100-sim-vs-real" / "fit"),
}

if __name__ == "__main__":
    args = sys.argv[1:]
    write = "--no-write" not in args
    chosen = [a for a in args if a != "--no-write"] or list(PROFILES)
    for key in chosen:
        if key not in PROFILES:
            raise SystemExit(f"unknown profile {key!r}: give h200 and/or h100")
        name, source, runs = PROFILES[key]
        out = ["--write", str(REPO / "tracebench" / "sim" / "profiles" / f"{name}.json")] if write else []
        print(f"== {name}")
        main([*source, "--routing-runs", str(runs), "--name", name, *out])

"""Regenerate the built-in sim-server profiles from the committed sglang 0.5.17 measurements and print each one's error
per calibration point.

- llama-2-7b-h200-triton: the H200 captures of tests/data/sglang-0.5.17 (calibration.json, prefix-cache-h200.json,
  api_capture.json) and the real routing runs reports/examples/h200x2-routing/*/ (two H200s, Azure lengths).
- llama-2-7b-h100-triton: tests/data/sglang-0.5.17/calibration-h100.json.xz (bench/gpu/calibrate.py on one H100) and
  the real fit run reports/examples/h100-sim-vs-real/fit/fit-azure-round_robin (two H100s, Azure lengths, cap 24).
- llama-2-7b-h200-triton-attention (issue 36's candidate, not the built-in profile: docs/sim-server.md "The decode
  step at long context"): the H200 inputs above with the decode step fitted to the decode grids
  tests/data/sglang-0.5.17/decode-grid-h200.json.xz and decode-more-h200.json.xz; written to
  bench/profiles/ (`--sim-profile bench/profiles/llama-2-7b-h200-triton-attention.json` replays with it).

    .venv/bin/python bench/fit_profile.py             # writes all three
    .venv/bin/python bench/fit_profile.py h100        # only one (h200, h100 or h200-attention)
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
GRIDS = [DATA / "decode-grid-h200.json.xz", DATA / "decode-more-h200.json.xz", DATA / "prefill-prefix-h200.json.xz"]
BUILTIN = REPO / "tracebench" / "sim" / "profiles"
# key: (profile name, calibration arguments, routing runs, decode grids, where it is written)
PROFILES = {
    "h200": ("llama-2-7b-h200-triton", ["--sglang-dir", str(DATA)], EXAMPLES / "h200x2-routing", [],
             BUILTIN / "llama-2-7b-h200-triton.json"),
    "h100": ("llama-2-7b-h100-triton", ["--calibration", str(DATA / "calibration-h100.json.xz")],
             EXAMPLES / "h100-sim-vs-real" / "fit", [], BUILTIN / "llama-2-7b-h100-triton.json"),
    "h200-attention": ("llama-2-7b-h200-triton-attention", ["--sglang-dir", str(DATA)], EXAMPLES / "h200x2-routing",
                       GRIDS, REPO / "bench" / "profiles" / "llama-2-7b-h200-triton-attention.json"),
}

if __name__ == "__main__":
    args = sys.argv[1:]
    write = "--no-write" not in args
    chosen = [a for a in args if a != "--no-write"] or list(PROFILES)
    for key in chosen:
        if key not in PROFILES:
            raise SystemExit(f"unknown profile {key!r}: give any of {', '.join(PROFILES)}")
        name, source, runs, grids, path = PROFILES[key]
        out = ["--write", str(path)] if write else []
        print(f"== {name}")
        main([*source, "--routing-runs", str(runs), *(a for g in grids for a in ("--decode-grid", str(g))),
              "--name", name, *out])

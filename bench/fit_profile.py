"""Regenerate the default sim-server profile from the sglang 0.5.17 measurements and print its error per point.

Reads tests/data/sglang-0.5.17 (calibration.json, api_capture.json: the shared captures, kept in the repo) and the committed real routing runs
reports/examples/h200x2-routing/*/ (two H200s, Azure conversation lengths: the decode cost per KV token).

    .venv/bin/python bench/fit_profile.py            # writes tracebench/sim/profiles/llama-2-7b-h200-triton.json
    .venv/bin/python bench/fit_profile.py --no-write # only print

The fit itself is `tracebench/sim/fit.py` (its docstring says how each parameter is estimated).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.sim.fit import main  # noqa: E402

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-write"]
    write = [] if "--no-write" in sys.argv[1:] else ["--write", str(REPO / "tracebench/sim/profiles/llama-2-7b-h200-triton.json")]
    main(["--sglang-dir", str(REPO / "tests" / "data" / "sglang-0.5.17"),
          "--routing-runs", str(REPO / "reports" / "examples" / "h200x2-routing"), *write, *args])

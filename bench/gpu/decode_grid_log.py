"""sglang's own decode step for each point of a decode grid (bench/gpu/decode_grid.py), from its server log.

    python3 bench/gpu/decode_grid_log.py decode-grid-0.json server.log.gz [--write FILE.json]

With `--decode-log-interval 10` sglang logs every 10 decode steps `Decode batch, #running-req: B, #token: K, ...,
gen throughput (token/s): G`: G is the tokens generated over the interval / its time, so B / G is the interval's mean
step. A log line belongs to a point when its second stamp lies within the point's wall clock, B is the point's batch
and K (KV tokens in use) lies in [sum of inputs, sum of inputs + 65 B]; the point's sglang step is the median of its
lines' B / G without the largest (the first interval of a point also holds its prefill). Prints each point's client
step (the full-batch window) next to sglang's, and their agreement; `--write` adds `sglang_log_step_s` and
`sglang_log_intervals` to every point of a compact grid file whose points have the same labels (the committed one is its xz:
`xz -dk`, then --write, then `xz -9e`).
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import re
import statistics
from pathlib import Path

LINE = re.compile(r"\[(\S+ \S+)\] Decode batch, #running-req: (\d+), #token: (\d+),.*gen throughput \(token/s\): "
                  r"([\d.]+)")


class LogError(RuntimeError):
    """A grid point with too few of sglang's decode log lines to measure it."""


def log_lines(path: Path) -> list[tuple[float, int, int, float]]:
    text = (gzip.open(path, "rt") if path.suffix == ".gz" else path.open()).read()
    out = []
    for line in text.splitlines():
        m = LINE.search(line)
        if m:
            t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=datetime.timezone.utc)
            out.append((t.timestamp(), int(m.group(2)), int(m.group(3)), float(m.group(4))))
    return out


def sglang_steps(grid: dict, lines: list[tuple[float, int, int, float]]) -> dict[str, tuple[float, int]]:
    steps = {}
    for p in grid["points"]:
        first = sum(p["lens"])
        own = [b / g for t, b, k, g in lines if p["wall_start"] - 1 <= t <= p["wall_end"] + 1 and b == p["batch"]
               and g > 0 and first <= k <= first + 65 * b]
        if len(own) < 3:
            raise LogError(f"point {p['label']}: {len(own)} decode log lines (sglang started without "
                           "--decode-log-interval 10?)")
        steps[p["label"]] = (statistics.median(sorted(own)[:-1]), len(own) - 1)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grid", type=Path)
    parser.add_argument("log", type=Path)
    parser.add_argument("--write", type=Path, default=None)
    opts = parser.parse_args()
    grid = json.loads(opts.grid.read_text())
    steps = sglang_steps(grid, log_lines(opts.log))
    errors = []
    for p in grid["points"]:
        s, n = steps[p["label"]]
        errors.append(s / p["step_s"] - 1)
        print(f"{p['label']:>22}: client {p['step_s'] * 1e3:7.3f} ms, sglang {s * 1e3:7.3f} ms ({n} intervals) "
              f"{errors[-1]:+.1%}")
    rms = (sum(e * e for e in errors) / len(errors)) ** 0.5
    print(f"{len(errors)} points: sglang's step - client's: rms {rms:.1%}, {min(errors):+.1%} … {max(errors):+.1%}")
    if opts.write is not None:
        text = opts.write.read_text()
        doc = json.loads(text)
        for p in doc["points"]:
            s, n = steps[p["label"]]
            p["sglang_log_step_s"], p["sglang_log_intervals"] = round(s, 7), n
        out = json.dumps(doc, separators=(",", ":")).replace(',{"label"', ',\n{"label"')
        opts.write.write_text(out + "\n")
        print(f"wrote {opts.write}")


if __name__ == "__main__":
    main()

"""sglang's own decode step for each point of a decode grid (bench/gpu/decode_grid.py), from its server log.

    python3 bench/gpu/decode_grid_log.py decode-grid-0.json server.log.gz [--write FILE.json]
    python3 bench/gpu/decode_grid_log.py decode-more-shared.json server.log.gz --compact OUT.json [--source TEXT]

With `--decode-log-interval 10` sglang logs every 10 decode steps `Decode batch, #running-req: B, #token: K, ...,
gen throughput (token/s): G`: G is the tokens generated over the interval / its time, so B / G is the interval's mean
step. A log line belongs to a point when its second stamp lies within the point's wall clock, B is the point's batch
and K (KV tokens in use) lies in [sum of inputs, sum of inputs + 65 B]; the point's sglang step is the median of its
lines' B / G without the largest (the first interval of a point also holds its prefill). Prints each point's client
step (the full-batch window) next to sglang's, and their agreement; `--write` adds `sglang_log_step_s` and
`sglang_log_intervals` to every point of a compact grid file whose points have the same labels (the committed one is its xz:
`xz -dk`, then --write, then `xz -9e`). A point of bench/gpu/decode_more.py's `shared` family holds its groups' prefix
once in sglang's KV (#token counts each cached prefix once). `--compact OUT` writes the file's points in the committed
layout (no per-chunk stamps) with sglang's step added, and `--source` as its source line; a point with fewer than 3 log
lines is kept with `sglang_log_step_s` null (said on stdout).
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


def distinct_input_tokens(p: dict) -> int:
    """The KV tokens the point's inputs take in sglang's pool: a shared point's groups' prefixes once each."""
    if "groups" not in p:
        return sum(p["lens"])
    return len(set(p["groups"])) * p["prefix"] + sum(n - p["prefix"] for n in p["lens"])


def sglang_steps(grid: dict, lines: list[tuple[float, int, int, float]],
                 strict: bool = True) -> dict[str, tuple[float, int] | None]:
    steps: dict[str, tuple[float, int] | None] = {}
    for p in grid["points"]:
        first = distinct_input_tokens(p)
        own = [b / g for t, b, k, g in lines if p["wall_start"] - 1 <= t <= p["wall_end"] + 1 and b == p["batch"]
               and g > 0 and first <= k <= first + 65 * b]
        if len(own) < 3:
            if strict:
                raise LogError(f"point {p['label']}: {len(own)} decode log lines (sglang started without "
                               "--decode-log-interval 10?)")
            steps[p["label"]] = None
            continue
        steps[p["label"]] = (statistics.median(sorted(own)[:-1]), len(own) - 1)
    return steps


COMPACT_KEYS = ("label", "family", "batch", "lens", "groups", "prefix", "cached", "mid_tokens", "step_s",
                "step_s_spread", "window_steps", "requests_measured")


def compact(doc: dict, steps: dict[str, tuple[float, int] | None], source: str) -> str:
    """The file's points without their per-chunk stamps, sglang's step added; one point per line."""
    points = []
    for p in doc["points"]:
        q = {k: (round(p[k], 7) if isinstance(p[k], float) else p[k]) for k in COMPACT_KEYS if k in p}
        step = steps[p["label"]]
        q["sglang_log_step_s"], q["sglang_log_intervals"] = (None, 0) if step is None else (round(step[0], 7), step[1])
        points.append(q)
    head = {"source": source, "server_info": doc["server_info"], "accelerator": doc["accelerator"],
            "output_tokens": doc["output_tokens"], "family": doc.get("family"), "failed": doc.get("failed", []),
            "skipped": doc.get("skipped", []), "points": points}
    return json.dumps(head, separators=(",", ":")).replace(',{"label"', ',\n{"label"') + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grid", type=Path)
    parser.add_argument("log", type=Path)
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--compact", type=Path, default=None, metavar="OUT")
    parser.add_argument("--source", default="", help="--compact: the file's source line")
    opts = parser.parse_args()
    grid = json.loads(opts.grid.read_text())
    steps = sglang_steps(grid, log_lines(opts.log), strict=opts.compact is None)
    errors = []
    for p in grid["points"]:
        step = steps[p["label"]]
        if step is None:
            print(f"{p['label']:>22}: client {p['step_s'] * 1e3:7.3f} ms, sglang: fewer than 3 log lines")
            continue
        s, n = step
        errors.append(s / p["step_s"] - 1)
        print(f"{p['label']:>22}: client {p['step_s'] * 1e3:7.3f} ms, sglang {s * 1e3:7.3f} ms ({n} intervals) "
              f"{errors[-1]:+.1%}")
    rms = (sum(e * e for e in errors) / len(errors)) ** 0.5
    print(f"{len(errors)} points: sglang's step - client's: rms {rms:.1%}, {min(errors):+.1%} … {max(errors):+.1%}")
    if opts.compact is not None:
        opts.compact.write_text(compact(grid, steps, opts.source))
        print(f"wrote {opts.compact}")
    if opts.write is not None:
        text = opts.write.read_text()
        doc = json.loads(text)
        for p in doc["points"]:
            s, n = steps[p["label"]]  # type: ignore[misc]  # strict: every point has one
            p["sglang_log_step_s"], p["sglang_log_intervals"] = round(s, 7), n
        out = json.dumps(doc, separators=(",", ":")).replace(',{"label"', ',\n{"label"')
        opts.write.write_text(out + "\n")
        print(f"wrote {opts.write}")


if __name__ == "__main__":
    main()

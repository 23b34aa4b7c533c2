"""Where a request's time goes, tracebench against a minimal client on the same servers and load (bench/gpu/overhead.sh;
docs/overhead.md). Prints one Markdown document: per source (a tracebench run folder, or a raw_client.py JSONL), the
breakdown's stages (tracebench/report/breakdown.py) and the spans every source has, p50 and p99 in ms; then, given a
py-spy profile (`--format raw`: collapsed stacks), where the replay process spent its samples.

    python3 bench/gpu/overhead_compare.py --run plain=RES/overhead-plain --run pyspy=RES/overhead-pyspy \\
        --raw raw-aiohttp=RES/raw-aiohttp.jsonl [--profile RES/pyspy.txt] > RES/summary.md
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import polars as pl

from tracebench.report.breakdown import ALL_STAGES, GATE, stage_expr
from tracebench.report.load import REQUEST_COLUMNS, load_run

# spans every source has (a raw client has no router, policy or body step: its bodies are made before the start)
SPANS = (
    ("release lag", "t_arrival", "t_released"),
    ("release -> request written", "t_released", "t_written"),
    ("dispatch -> request written", "t_dispatch", "t_written"),
    ("request written -> sglang received", "t_written", "server_received"),
    ("dispatch -> sglang received", "t_dispatch", "server_received"),
    ("request written -> response headers", "t_written", "t_headers"),
    ("sglang first chunk sent -> first token in", "server_first_sent", "t_first_token"),
    ("sglang finished -> last chunk in", "server_finished", "t_last_chunk"),
    ("last chunk -> answer parsed", "t_last_chunk", "t_parsed"),
)


def read_raw(path: Path) -> pl.DataFrame:
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    columns = {name: [row.get(name) for row in rows] for name in REQUEST_COLUMNS if name not in ("error", "mismatch", "itl_hist")}
    columns["status"] = [row.get("status") for row in rows]
    return pl.DataFrame(columns, schema_overrides={name: pl.Float64 for name in columns
                                                   if name.startswith(("t_", "server_")) and name != "server"})


def completed(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.filter(pl.col("status").is_in(["ok", "mismatch"]))


def stats(values: pl.Series) -> tuple[int, float | None, float | None]:
    v = values.drop_nulls().to_numpy().astype(float)
    if v.size == 0:
        return 0, None, None
    p50, p99 = np.percentile(v, [50, 99])
    return int(v.size), float(p50) * 1e3, float(p99) * 1e3


def cell(n: int, p50: float | None, p99: float | None) -> str:
    return "-" if not n else f"{p50:.3f} / {p99:.3f}"


def table(sources: dict[str, pl.DataFrame]) -> list[str]:
    names = list(sources)
    lines = ["| stage | whose | from -> to | " + " | ".join(f"{n} p50 / p99 (ms)" for n in names) + " |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in names) + " |"]
    for stage in ALL_STAGES:
        if stage.whose == GATE:
            continue  # the replays here have no --max-concurrency
        cells = [cell(*stats(frame.select(stage_expr(stage)).to_series())) if {stage.start, stage.end} <= set(frame.columns)
                 else "-" for frame in sources.values()]
        if all(c == "-" for c in cells):
            continue
        lines.append(f"| {stage.label} | {stage.whose} | {stage.start} -> {stage.end} | " + " | ".join(cells) + " |")
    lines += ["", "| span (every source has it) | from -> to | " + " | ".join(f"{n} p50 / p99 (ms)" for n in names) + " |",
              "| --- | --- | " + " | ".join("---:" for _ in names) + " |"]
    for label, start, end in SPANS:
        cells = [cell(*stats(frame.select(pl.col(end) - pl.col(start)).to_series())) for frame in sources.values()]
        lines.append(f"| {label} | {start} -> {end} | " + " | ".join(cells) + " |")
    extra = ((pl.col("t_finish") - pl.col("t_dispatch")) - pl.col("server_e2e_latency"))
    cells = [cell(*stats(frame.select(extra).to_series())) for frame in sources.values()]
    lines.append("| client e2e - sglang e2e_latency | (t_finish - t_dispatch) - e2e_latency | " + " | ".join(cells) + " |")
    return lines


# ---- py-spy's collapsed stacks ----------------------------------------------------------------------------------

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::(?P<line>\d+))?\)$")
# where a frame's file puts it (first match wins); the idle wait is the selector's
GROUPS = (
    ("idle (waiting in select/epoll)", ("selectors.py", "replay/loop.py")),
    ("tracebench client (replay/client.py)", ("replay/client.py", "replay/http_session.py")),
    ("tracebench router (replay/router.py)", ("replay/router.py",)),
    ("tracebench engine (replay/engine.py)", ("replay/engine.py",)),
    ("tracebench records (replay/records.py)", ("replay/records.py",)),
    ("tracebench telemetry (/v1/loads, /metrics)", ("replay/telemetry.py", "replay/server_metrics.py", "replay/beside.py")),
    ("tracebench input ids (replay/tokens.py)", ("replay/tokens.py",)),
    ("policy (tracebench/policies/)", ("tracebench/policies/",)),
    ("aiohttp", ("aiohttp/",)),
    ("yarl / multidict", ("yarl/", "multidict/")),
    ("asyncio", ("asyncio/",)),
    ("gc / other", ("",)),
)


def _group(frames: list[str]) -> str:
    """The group of a stack: its innermost frame that belongs to a named group (the leaf for the idle wait)."""
    files = []
    for frame in frames:
        m = _FRAME.match(frame)
        files.append(m["file"] if m else frame)
    if files and any(p in files[-1] for p in GROUPS[0][1]) and "select" in frames[-1]:
        return GROUPS[0][0]
    for f in reversed(files):
        for name, patterns in GROUPS[1:-1]:
            if any(p in f for p in patterns):
                return name
    return GROUPS[-1][0]


def profile(path: Path, top: int = 25) -> list[str]:
    """The samples taken while the event loop ran (a stack through asyncio's _run_once): the replay itself; the
    others (imports, set-up before the loop, the end) are counted apart."""
    outside = 0
    total = 0
    groups: Counter[str] = Counter()
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if f]
        if frames and frames[0].startswith(("process ", "thread ")):  # py-spy's --threads/--pid prefixes
            frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not any(f.startswith("BaseEventLoop._run_once ") for f in frames):
            outside += n
            continue
        total += n
        groups[_group(frames)] += n
        if frames:
            self_time[frames[-1]] += n
            for frame in set(frames):
                inclusive[frame] += n
    if total == 0:
        return [f"(no samples in {path})"]
    idle = groups[GROUPS[0][0]]
    out = [f"{total} samples in the event loop ({outside} more outside it: imports, set-up, the end), "
           f"{idle / total:.1%} idle (the loop waiting for the next event or timer), {1 - idle / total:.1%} busy", "", "| where (innermost frame of ours or a library's) | share of samples |",
           "| --- | ---: |"]
    out += [f"| {name} | {n / total:.1%} |" for name, n in groups.most_common()]
    out += ["", f"Top {top} frames by own samples (idle wait excluded):", "", "| frame | own | inclusive |",
            "| --- | ---: | ---: |"]
    busy = [(f, n) for f, n in self_time.most_common() if "select" not in f.split(" (")[0] and "poll" not in f.split(" (")[0]]
    for frame, n in busy[:top]:
        out.append(f"| `{frame}` | {n / total:.1%} | {inclusive[frame] / total:.1%} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", action="append", default=[], help="LABEL=RUN_FOLDER (tracebench replay's)")
    parser.add_argument("--raw", action="append", default=[], help="LABEL=FILE.jsonl (raw_client.py's)")
    parser.add_argument("--profile", type=Path, help="py-spy record --format raw output")
    args = parser.parse_args()
    sources: dict[str, pl.DataFrame] = {}
    counts = []
    for spec in args.run:
        label, _, folder = spec.partition("=")
        run = load_run(Path(folder))
        sources[label] = completed(run.requests)
        counts.append(f"{label}: {sources[label].height} of {run.requests.height} requests completed ({folder})")
    for spec in args.raw:
        label, _, file = spec.partition("=")
        frame = read_raw(Path(file))
        sources[label] = completed(frame)
        counts.append(f"{label}: {sources[label].height} of {frame.height} requests completed ({file})")
    if not sources:
        sys.exit("give at least one --run or --raw")
    lines = ["# Where a request's time goes: tracebench against a minimal client", ""]
    lines += [f"- {c}" for c in counts] + [""] + table(sources)
    if args.profile is not None:
        lines += ["", f"## py-spy: where the replay process spent its samples ({args.profile.name})", ""]
        lines += profile(args.profile) if args.profile.is_file() else [f"(no profile: {args.profile} is missing)"]
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Split a trace into the parts round robin would send to N servers: request i (in trace order) goes to part i mod N.

    .venv/bin/python bench/split_trace.py TRACE --parts N --out-dir DIR     (TRACE: .jsonl, or .jsonl.xz)

Why (issue 19, part 3): with `--policy round_robin` and no cap, tracebench's router sends request i to server i mod N
at its arrival, whatever the servers do, so each server of an N-GPU routing run sees exactly part i mod N at the same
moments. Replaying part k alone on one server (attached, its cache flushed first) is the same experiment for that
server; the N parts can then run one after another on one GPU when only one is lent. The parts keep every request
line byte for byte (ids, arrival_s: the absolute schedule of the run clock, so the parts' records share one timeline
and can be pooled), and each header the original's fields with num_requests and duration_s of the part, plus `split`:
the source trace's sha256 and the rule. A closed-loop trace (requests `after` another) cannot be split: refused.
Writes DIR/<stem>.part<k>of<N>.jsonl and prints each path.
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import sys
import tempfile
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.trace.format import HEADER_KEY, read_header, write_trace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--parts", type=int, required=True, help="N: the servers round robin would use")
    parser.add_argument("--out-dir", type=Path, required=True)
    opts = parser.parse_args()
    if opts.parts < 2:
        parser.error("--parts must be at least 2")
    data = opts.trace.read_bytes()
    if opts.trace.suffix == ".xz":   # as the examples keep their traces
        data = lzma.decompress(data)
    first = data.split(b"\n", 1)[0] + b"\n"
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as head:   # the trace reader validates line 1
        head.write(first)
        head.flush()
        header = read_header(head.name)
    lines = data.splitlines()[1:]
    parts: list[list[bytes]] = [[] for _ in range(opts.parts)]
    last_arrival = [0.0] * opts.parts
    for index, line in enumerate(lines):
        request = orjson.loads(line)
        if "after" in request:
            raise SystemExit(f"{opts.trace}:{index + 2}: after: a closed-loop trace cannot be split "
                             "(a request waits on another, which may be in another part)")
        part = index % opts.parts
        parts[part].append(line + b"\n")
        last_arrival[part] = float(request["arrival_s"])
    fields = {key: value for key, value in header.fields.items() if key != HEADER_KEY}
    stem = opts.trace.name.removesuffix(".xz").removesuffix(".jsonl")
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    for part, part_lines in enumerate(parts):
        out = opts.out_dir / f"{stem}.part{part}of{opts.parts}.jsonl"
        part_fields = {**fields, "num_requests": len(part_lines), "duration_s": last_arrival[part],
                       "split": {"source_sha256": hashlib.sha256(data).hexdigest(), "part": part,
                                 "parts": opts.parts, "rule": "request i (trace order) -> part i mod parts"}}
        print(write_trace(out, part_fields, part_lines))


if __name__ == "__main__":
    main()

"""Split a trace into the parts round robin would send to N servers: request i (in trace order) goes to part i mod N.

    .venv/bin/python bench/split_trace.py TRACE --parts N --out-dir DIR     (TRACE: .jsonl, or .jsonl.xz)

Why (issue 19, part 3): with `--policy round_robin` and no cap, tracebench's router sends request i to server i mod N
at its arrival, whatever the servers do, so each server of an N-GPU routing run sees exactly part i mod N at the same
moments. Replaying part k alone on one server (attached, its cache flushed first) is the same experiment for that
server; the N parts can then run one after another on one GPU when only one is lent. The parts keep every request
line byte for byte (ids, arrival_s: the absolute schedule of the run clock, so the parts' records share one timeline
and can be pooled), and each header the original's fields with num_requests and duration_s of the part, plus `split`:
the source trace's sha256 and the rule. A closed-loop trace (requests `after` another) cannot be split: refused.
Writes DIR/<stem>.part<k>of<N>.jsonl and prints each path (a TRACE.jsonl.xz is first decompressed to DIR/TRACE.jsonl).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tracebench.trace.format import HEADER_KEY, load_trace, write_trace  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--parts", type=int, required=True, help="N: the servers round robin would use")
    parser.add_argument("--out-dir", type=Path, required=True)
    opts = parser.parse_args()
    if opts.parts < 2:
        parser.error("--parts must be at least 2")
    trace = opts.trace
    if trace.suffix == ".xz":   # as the examples keep their traces: the plain trace goes beside the parts
        opts.out_dir.mkdir(parents=True, exist_ok=True)
        trace = opts.out_dir / trace.stem
        trace.write_bytes(lzma.decompress(opts.trace.read_bytes()))
    header, requests = load_trace(trace)   # every line validated; a broken one is named here
    for lineno, request in enumerate(requests, start=2):
        if request.after is not None:
            raise SystemExit(f"{opts.trace}:{lineno}: after: a closed-loop trace cannot be split "
                             "(a request waits on another, which may be in another part)")
    data = trace.read_bytes()
    lines = data.splitlines(keepends=True)[1:]   # one line per request: the reader refuses an empty line
    fields = {key: value for key, value in header.fields.items() if key != HEADER_KEY}
    source_sha256 = hashlib.sha256(data).hexdigest()
    stem = trace.name.removesuffix(".jsonl")
    for part in range(opts.parts):
        part_requests = requests[part::opts.parts]
        part_fields = {**fields, "num_requests": len(part_requests),
                       "duration_s": part_requests[-1].arrival_s if part_requests else 0.0,
                       "split": {"source_sha256": source_sha256, "part": part, "parts": opts.parts,
                                 "rule": "request i (trace order) -> part i mod parts"}}
        print(write_trace(opts.out_dir / f"{stem}.part{part}of{opts.parts}.jsonl", part_fields,
                          lines[part::opts.parts]))

if __name__ == "__main__":
    main()

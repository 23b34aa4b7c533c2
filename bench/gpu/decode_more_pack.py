"""Pack bench/gpu/decode_more.py's results into the committed file (tests/data/sglang-0.5.17/decode-more-h200.json.xz).

    python3 bench/gpu/decode_more_pack.py OUT.json.xz --source TEXT decode-more-small.json:server.log.gz \
        decode-more-shared.json:server2.log.gz ... [decode-more-prefill.json]

Each decode family file is given with the server log that holds its points (`FILE:LOG`; a family measured in a later
device call on the same server is in that call's log): its points lose their per-chunk stamps and gain sglang's own
step (bench/gpu/decode_grid_log.py; a point with fewer than 3 log lines keeps `sglang_log_step_s` null, and its
failed and skipped points are listed). The prefill family (calibrate.py's `prefill` layout) is kept as it is, the
prefix family's points (the same layout with each request's stamps) join it, rounded. Bytes
NUL in a log (a log truncated while its server kept writing) are dropped.
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_grid_log import COMPACT_KEYS, log_lines, sglang_steps  # noqa: E402


def clean_log(path: Path) -> Path:
    """The log without NUL bytes, as a temporary gzip file."""
    data = (gzip.open(path, "rb") if path.suffix == ".gz" else path.open("rb")).read().replace(b"\0", b"")
    out = Path(tempfile.mkdtemp()) / "server.log.gz"
    out.write_bytes(gzip.compress(data))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("inputs", nargs="+", help="FAMILY.json:LOG for a decode family, or the prefill family's file")
    parser.add_argument("--source", required=True)
    opts = parser.parse_args()
    doc: dict = {"source": opts.source, "families": {}}
    for item in opts.inputs:
        path_text, _, log_text = item.partition(":")
        data = json.loads(Path(path_text).read_text())
        family = data["family"]
        for key in ("server_info", "accelerator", "output_tokens"):
            if doc.setdefault(key, data[key]) != data[key]:
                raise SystemExit(f"{path_text}: field '{key}' differs from the other files'")
        if family == "prefill":
            doc["prefill"] = data["points"]
            continue
        if family == "prefix":   # the third pass's prefill steps (decode_more.py prefix_family), in the same list
            doc.setdefault("prefill", []).extend(
                {k: (round(v, 6) if isinstance(v, float) and k in ("forward_entry", "prefill_finished", "received")
                     else round(v, 7) if isinstance(v, float) else v) for k, v in q.items()} for q in data["points"])
            continue
        if not log_text:
            raise SystemExit(f"{item}: a decode family needs its server log (FILE:LOG)")
        steps = sglang_steps(data, log_lines(clean_log(Path(log_text))), strict=False)
        points = []
        for p in data["points"]:
            q = {k: (round(p[k], 7) if isinstance(p[k], float) else p[k]) for k in COMPACT_KEYS if k in p}
            step = steps[p["label"]]
            if step is None:
                print(f"{family} {p['label']}: fewer than 3 sglang log lines (client step {p['step_s'] * 1e3:.3f} ms, "
                      f"{p['window_steps']} window steps)")
            q["sglang_log_step_s"], q["sglang_log_intervals"] = (None, 0) if step is None else (round(step[0], 7),
                                                                                                step[1])
            points.append(q)
        doc["families"][family] = {"points": points, "failed": data.get("failed", []),
                                   "skipped": data.get("skipped", [])}
    text = json.dumps(doc, separators=(",", ":")).replace(',{"label"', ',\n{"label"') + "\n"
    opts.out.write_bytes(lzma.compress(text.encode(), preset=9 | lzma.PRESET_EXTREME))
    print(f"wrote {opts.out}: " + ", ".join(f"{f} {len(v['points'])}" for f, v in doc["families"].items())
          + f", prefill {len(doc.get('prefill', []))}")


if __name__ == "__main__":
    main()

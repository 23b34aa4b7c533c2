"""`tracebench inspect` on a trace whose statistics are worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import orjson
import pytest

from conftest import run_cli

ARRIVALS = [0.0, 0.5, 1.0, 1.2, 3.0]
INPUTS = [10, 40, 20, 50, 30]
OUTPUTS = [1, 2, 3, 4, 100]


def _write(path: Path) -> None:
    lines = [orjson.dumps({"tracebench_trace": 1, "num_requests": 5, "duration_s": 3.0})]
    lines += [orjson.dumps({"id": i, "arrival_s": a, "input_len": n, "output_len": m})
              for i, (a, n, m) in enumerate(zip(ARRIVALS, INPUTS, OUTPUTS))]
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_inspect_json_gives_the_hand_computed_statistics(tmp_path: Path) -> None:
    trace = tmp_path / "hand.jsonl"
    _write(trace)
    proc = run_cli("inspect", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr
    stats = orjson.loads(proc.stdout)
    gaps = [0.5, 0.5, 0.2, 1.8]
    mean_gap = sum(gaps) / 4
    cv = math.sqrt(sum((g - mean_gap) ** 2 for g in gaps) / 4) / mean_gap
    assert stats["requests"] == 5
    assert math.isclose(stats["duration_s"], 3.0)
    assert math.isclose(stats["mean_rate"], 4 / 3.0)
    assert math.isclose(stats["gap_cv"], cv)
    assert stats["peak_rate_1s"] == 3  # 0.5, 1.0 and 1.2 lie within [0.5, 1.5)
    # percentiles by linear interpolation, as the report's (issue 23 item 10): h = (n - 1) q between order statistics
    assert stats["input_len"] == {"mean": 30.0, "p50": 30.0, "p90": 46.0, "p99": pytest.approx(49.6), "max": 50}
    assert stats["output_len"] == {"mean": 22.0, "p50": 3.0, "p90": pytest.approx(61.6), "p99": pytest.approx(96.16),
                                   "max": 100}
    assert math.isclose(stats["offered_input_tokens_per_s"], 4 / 3.0 * 30)
    assert math.isclose(stats["offered_tokens_per_s"], 4 / 3.0 * 52)


def test_inspect_table_names_every_statistic(tmp_path: Path) -> None:
    trace = tmp_path / "hand.jsonl"
    _write(trace)
    proc = run_cli("inspect", str(trace))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for row in ("requests          5", "duration          3.000 s", "mean rate         1.333 req/s",
                "peak rate (1 s)   3 req/s", "offered tokens/s  69.3 (input 40.0, output 29.3)"):
        assert row in text
    assert text.splitlines()[8].split() == ["input_len", "30.0", "30.0", "46.0", "49.6", "50"]
    assert text.splitlines()[9].split() == ["output_len", "22.0", "3.0", "61.6", "96.2", "100"]

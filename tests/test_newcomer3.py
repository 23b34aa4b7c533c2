"""Issue 35, "a third newcomer's hour": a figure for a slide, the busiest hour of one's own traffic (tested in
test_trace_datasets.py), PD links that match the hardware, five runs at a glance. Run folders are written here
(test_newcomer.write_run), not replayed: the report is what is under test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import run_cli
from test_newcomer import write_run

POLICIES = ("round_robin", "sjf", "cache_aware", "prefix_hash", "random")


@pytest.fixture(scope="module")
def five_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """reports/<policy> for five policies, one trace; the runs' latencies differ by their seeds."""
    root = tmp_path_factory.mktemp("newcomer3-runs")
    trace = root / "t.jsonl"
    done = run_cli("generate", "--rate", "20", "--num-requests", "300", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    for seed, policy in enumerate(POLICIES):
        write_run(root / "reports" / policy, trace, seed, policy, requests=300)
    return root


def _report(root: Path, columns: int, *args: str) -> str:
    done = run_cli("report", *POLICIES, *args, cwd=root, env={"COLUMNS": str(columns)})
    assert done.returncode == 0, done.stderr
    return done.stdout


def _table(text: str, title: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(title)
    return lines[start + 1: lines.index("", start)]


def test_five_runs_read_at_a_glance_at_120_columns(five_runs: Path) -> None:
    text = _report(five_runs, 120)
    assert max(map(len, text.splitlines())) <= 120
    assert "(1/" not in text and "(2/" not in text  # no table split into parts
    latency = _table(text, "Latency (ms)")
    header = latency[0].split()
    assert header[:2] == ["metric", "stat"] and [h for h in header[2:] if h != "(baseline)"] == list(POLICIES)
    assert not any("Δ" in line for line in latency)  # changes are in the runs' cells, against the baseline only
    # every percentile row has a row of each run's own 95% interval under it, holding the run's value
    rows = [line.split() for line in latency[1:]]
    checked = 0
    for above, row in zip(rows, rows[1:]):
        if row[:2] != ["95%", "CI"]:
            continue
        stat_at = next(i for i, w in enumerate(above) if w in ("p50", "p90", "p99"))
        values = [w for w in above[stat_at + 1:] if not re.fullmatch(r"[+-][\d.,]+%\*?", w)]
        intervals = row[2:]
        assert len(values) == len(intervals) == 5, (above, row)
        for value, interval in zip(values, intervals):
            low, high = (float(x.replace(",", "")) for x in interval.split("–"))
            assert low <= float(value.replace(",", "")) <= high, (value, interval)
        checked += 1
    assert checked >= 9  # total, router wait, TTFT ... at p50/p90/p99
    # the baseline's cells carry no change; the others' do, in % of the baseline
    p99 = next(line for line in latency if line.split()[:2] == ["total", "p99"] or line.split()[:1] == ["p99"])
    assert len(re.findall(r"[+-][\d.,]+%", p99)) == 4


def test_the_wide_layout_stays_for_two_runs_and_on_request(five_runs: Path) -> None:
    two = run_cli("report", "round_robin", "sjf", cwd=five_runs, env={"COLUMNS": "120"})
    assert two.returncode == 0 and "95% CI of Δ" in two.stdout and "95% CI\n" not in two.stdout
    wide = _report(five_runs, 120, "--layout", "wide")
    assert "Latency (ms) (1/" in wide
    bad = run_cli("report", "round_robin", "--layout", "tall", cwd=five_runs)
    assert bad.returncode == 2 and "--layout" in bad.stderr


def test_one_warning_for_all_the_runs_it_concerns() -> None:
    from tracebench.report.render import merged_warnings

    assert merged_warnings(["run 'a': too hot", "other", "run 'b': too hot", "run 'c': cold"]) == [
        "runs 'a', 'b': too hot", "other", "run 'c': cold"]

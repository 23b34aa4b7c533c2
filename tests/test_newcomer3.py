"""Issue 35, "a third newcomer's hour": a figure for a slide, the busiest hour of one's own traffic (tested in
test_trace_datasets.py), PD links that match the hardware, five runs at a glance. Run folders are written here
(test_newcomer.write_run), not replayed: the report is what is under test."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import run_cli, run_cli_in_process
from test_newcomer import write_run

POLICIES = ("round_robin", "sjf", "cache_aware", "prefix_hash", "random")
RELEASE_S = {"sjf": 0.3, "cache_aware": 0.2, "prefix_hash": 0.4}  # the others: 0.5 ms


@pytest.fixture(scope="module")
def five_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """reports/<policy> for five policies, one trace; the runs' latencies differ by their seeds; every stamp of the
    breakdown recorded (its table has the stages' stamps beside their names: it must fit too)."""
    root = tmp_path_factory.mktemp("newcomer3-runs")
    trace = root / "t.jsonl"
    done = run_cli("generate", "--rate", "20", "--num-requests", "300", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    for seed, policy in enumerate(POLICIES):
        # three runs whose requests wait 0.2-0.4 s before release: changes of +40,000% and more, cells as wide as a
        # PD run's against plain ones (the breakdown's stamps in a column of their own split its table then)
        write_run(root / "reports" / policy, trace, seed, policy, requests=300, stamps=True,
                  release_s=RELEASE_S.get(policy, 0.0005))
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
    assert "Where the time went (ms)\n" in text and "server_dispatched" in text  # the breakdown among them, whole
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


# ---- item 1: a figure for a slide ---------------------------------------------------------------------------------

def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_a_slide_png_with_chosen_panels_title_labels_and_axes(five_runs: Path) -> None:
    out = five_runs / "slide.png"
    done = run_cli("report", "round_robin", "sjf", "-o", str(out), "--plots", "ttft,tpot", "--x-scale", "log",
                   "--y-scale", "tail", "--title", "Two policies, one slide", "--label", "round_robin=RR",
                   "--label", "sjf=shortest first", cwd=five_runs)
    assert done.returncode == 0, done.stderr
    assert _png_size(out) == (2000, 1125)  # 13.33 x 7.5 in at 150 dpi: a 16:9 slide
    svg = five_runs / "slide.svg"
    done = run_cli("report", "round_robin", "sjf", "-o", str(svg), "--plots", "tpot,ttft", "--y-scale", "tail",
                   "--title", "Two policies, one slide", "--label", "round_robin=RR", "--label", "sjf=shortest first",
                   cwd=five_runs)
    assert done.returncode == 0, done.stderr
    text = svg.read_text()
    for words in ("Two policies, one slide", "RR (baseline)", "shortest first", "Time per output token",
                  "Time to first token", "p99", "p50"):
        assert words in text, words
    assert "Total latency" not in text and "Router wait" not in text  # only the panels asked for
    assert text.index("Time per output token") < text.index("Time to first token")  # in the order asked
    # the labels name the runs in the tables too
    table = run_cli("report", "round_robin", "sjf", "--label", "sjf=shortest first", cwd=five_runs).stdout
    assert "shortest first" in table


@pytest.mark.parametrize("args, message", [
    (["--plots", "ttft,latency"], "--plots: unknown panel 'latency'"),
    (["--plots", "ttft,ttft"], "a panel is named twice"),
    (["--label", "nosuchrun=x"], "--label nosuchrun=...: no such RUN"),
    (["--label", "sjf"], "expected RUN=TEXT"),
    (["--label", "sjf=round_robin"], "two runs would both be called 'round_robin'"),
    (["--format", "png"], "--format png writes the latency figure to a file"),
])
def test_bad_figure_options_are_one_line_errors(five_runs: Path, args: list[str], message: str) -> None:
    extra = [] if "--format" in args else ["-o", "x.png"]
    done = run_cli("report", "round_robin", "sjf", *args, *extra, cwd=five_runs)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (five_runs / "x.png").exists()
    done = run_cli("report", "round_robin", "sjf", "--x-scale", "log", cwd=five_runs)
    assert done.returncode == 2 and "drawn only by --format png, svg or html" in done.stderr


def test_telemetry_figure_drops_empty_panels_and_names_pd_roles(tmp_path: Path) -> None:
    """A simulated PD run (1 prefill, 1 decode server): /metrics scrapes but no GPU samples. On the virtual clock:
    what is checked is the report's figure and the link it names (the in-process servers' metrics are scraped the
    same way, on the run's clock)."""
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "8", "--num-requests", "24", "-o", str(trace)).returncode == 0
    done = run_cli("replay", str(trace), "--clock", "virtual", "--pd", "1:1", "--run-name", "pd", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    page = tmp_path / "r.html"
    done = run_cli("report", "pd", "-o", str(page), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    telemetry = next(svg for svg in page.read_text().split("<svg") if "Server telemetry" in svg)
    assert "no run has GPU samples" in telemetry
    assert "no GPU samples" not in telemetry.replace("no run has GPU samples", "")  # no empty GPU panel
    assert "server 0 (prefill): sglang requests" in telemetry and "server 1 (decode): sglang requests" in telemetry

    # item 3: the simulated link is named: run.json pd.kv_link, and the report (the default: the measured tcp link)
    meta = json.loads((tmp_path / "reports" / "pd" / "run.json").read_text())
    assert meta["pd"]["kv_link"]["name"] == "tcp" and meta["options"]["kv_link"] == "tcp"
    table = run_cli("report", "pd", cwd=tmp_path, env={"COLUMNS": "200"}).stdout
    assert "KV link tcp: 1.54 GiB/s + 70 ms a transfer (measured" in table


# ---- item 3: PD links that match the hardware ---------------------------------------------------------------------

def test_kv_link_is_a_visible_option_with_cited_presets() -> None:
    from tracebench.replay.kv_link import PRESETS

    done = run_cli("replay", "--help", env={"COLUMNS": "200"})
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "--kv-link PRESET|BW:LAT" in text and "[default: tcp, measured]" in text
    for name, link in PRESETS.items():
        assert f"{name} ({link.bandwidth_gib_s:g} GiB/s + {link.latency_s * 1000:g} ms)" in text
        assert link.source  # where the figure comes from, recorded with the run
    # the arithmetic of the cited figures: GB/s per NIC -> GiB/s
    assert PRESETS["rdma-400g"].bandwidth_gib_s == round(190 / 8 * 1e9 / 2**30, 2)
    assert PRESETS["rdma-200g"].bandwidth_gib_s == round(87 / 4 * 1e9 / 2**30, 2)
    sweep = run_cli("sweep", "--help", env={"COLUMNS": "200"})
    assert "--kv-link" in sweep.stdout


def test_a_chosen_link_reaches_the_simulators_and_the_report(tmp_path: Path) -> None:
    """(on the virtual clock: the simulators are built from the same command lines; HTTP is not the point here)"""
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "8", "--num-requests", "16", "-o", str(trace)).returncode == 0
    done = run_cli("replay", str(trace), "--clock", "virtual", "--pd", "1:1", "--kv-link", "25:0.005",
                   "--run-name", "pd25", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "reports" / "pd25" / "run.json").read_text())
    assert meta["pd"]["kv_link"] == {"name": "custom", "bandwidth_gib_s": 25.0, "latency_s": 0.005,
                                     "source": "given: --kv-link 25:0.005"}
    for server in meta["servers"]:  # what each simulated server says it was given
        sim = server["server_info"]["tracebench_sim"]
        assert (sim["kv_transfer_bandwidth_gib_s"], sim["kv_transfer_latency_s"]) == (25.0, 0.005)
    table = run_cli("report", "pd25", cwd=tmp_path, env={"COLUMNS": "200"}).stdout
    assert "KV link custom: 25 GiB/s + 5 ms a transfer" in table


@pytest.mark.parametrize("args, message", [
    (["--backend", "sim", "--gpus", "2", "--kv-link", "tcp"], "--kv-link sets the link of simulated PD servers"),
    (["--pd", "1:1", "--kv-link", "tcp", "--model", "m"], "--kv-link sets the link of simulated PD servers"),
    (["--backend", "sim", "--pd", "1:1", "--kv-link", "fast"], "--kv-link fast: expected a preset"),
    (["--backend", "sim", "--pd", "1:1", "--kv-link", "25:-1"], "--kv-link 25:-1: expected a preset"),
    (["--backend", "sim", "--pd", "1:1", "--kv-link", "nvlink", "--server-arg", "--kv-transfer-bandwidth 3"],
     "--kv-link and --server-arg --kv-transfer-bandwidth both set the KV link"),
])
def test_bad_kv_links_are_refused_before_the_run(tmp_path: Path, args: list[str], message: str) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "8", "--num-requests", "4", "-o", str(trace)).returncode == 0
    # refused before anything starts (no server, no event loop): answered in this process as the process answers it
    done = run_cli_in_process("replay", str(trace), *args, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "reports").exists()


def test_sweep_compares_pd_ratios(tmp_path: Path) -> None:
    """--pd 1:1,1:2 as a dimension: one point per ratio and rate, each on its own PD servers with the chosen link
    (on the virtual clock, in process: the sweep's PD dimension is the point, not HTTP)."""
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "4", "--num-requests", "8", "-o", str(trace)).returncode == 0
    done = run_cli("sweep", str(trace), "--rates", "4", "--clock", "virtual", "--pd", "1:1,1:2",
                   "--kv-link", "rdma-400g", "--name", "pds", "--bootstrap", "50", "--saturation-window", "0",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "reports" / "pds" / "summary.json").read_text())
    assert summary["dimensions"]["pd"] == ["1:1", "1:2"]
    assert [(p["point"], p["pd"], p["gpus"]) for p in summary["points"]] == [("pd1x1-rate-4", "1:1", 2),
                                                                           ("pd1x2-rate-4", "1:2", 3)]
    for point in summary["points"]:
        meta = json.loads((tmp_path / "reports" / "pds" / point["point"] / "run.json").read_text())
        assert meta["pd"]["ratio"] == point["pd"] and meta["pd"]["kv_link"]["name"] == "rdma-400g"
    assert "PD 1:1 (2 servers), policy random:" in done.stderr + done.stdout
    assert "PD 1:2 (3 servers), policy random:" in done.stderr + done.stdout

"""`tracebench generate`: determinism (across processes: the second of two equal calls is a process of its own),
output naming, summary, clamp reporting, help texts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO, run_cli, run_cli_process
from tracebench.trace.format import iter_requests, read_header


def _generate(tmp_path: Path, name: str, *args: str, process: bool = False) -> Path:
    """With `process`, a `python -m tracebench` process of its own (run_cli runs generate in this one): another hash
    seed, nothing of an earlier call in memory."""
    out = tmp_path / name
    proc = (run_cli_process if process else run_cli)("generate", *args, "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


def test_same_arguments_give_byte_identical_files_and_seeds_differ(tmp_path: Path) -> None:
    cases = [
        ("--rate", "20", "--num-requests", "3000", "--arrival", "gamma", "--burstiness", "3", "--length-dist", "zipf"),
        ("--duration", "60", "--length-dist", "normal", "--length-spread", "0.8", "--arrival", "constant"),
    ]
    for i, args in enumerate(cases):
        first = _generate(tmp_path, f"a{i}.jsonl", *args, "--seed", "7")
        second = _generate(tmp_path, f"b{i}.jsonl", *args, "--seed", "7", process=True)
        other = _generate(tmp_path, f"c{i}.jsonl", *args, "--seed", "8")
        assert first.read_bytes() == second.read_bytes()
        body = first.read_bytes().split(b"\n", 1)[1]
        assert body != other.read_bytes().split(b"\n", 1)[1]  # the requests differ, not only the header's seed
        assert read_header(first).fields["args"]["seed"] == 7


def test_default_output_path_summary_and_clamp_on_stderr(tmp_path: Path) -> None:
    proc = run_cli("generate", "--rate", "16", "--num-requests", "400", "--input-len", "900", "--output-len", "300",
                   "--length-dist", "lognormal", "--length-spread", "1.5", "--max-context", "1500", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    path_line, summary = proc.stdout.strip().splitlines()
    assert path_line == "traces/poisson-r16-n400-in900-out300-lognormal1.5-ctx1500-s0.jsonl"
    trace = tmp_path / path_line
    header = read_header(trace).fields
    assert summary.startswith("400 requests over ") and f"{header['clamped_requests']} clamped" in summary
    # a spread this wide at this context clamps some: counted in the header and said on stderr
    assert header["clamped_requests"] > 0
    assert (f"{header['clamped_requests']} of 400 requests clamped to input_len + output_len <= 1498: sglang generates "
            "the whole answer only up to its context length - 2 (--max-context 1500)") in proc.stderr
    requests = list(iter_requests(trace))
    assert len(requests) == 400 == header["num_requests"]
    assert all(r.input_len + r.output_len <= 1498 and r.input_len >= 1 and r.output_len >= 1 for r in requests)
    assert header["duration_s"] == requests[-1].arrival_s and requests[0].arrival_s == 0.0
    assert [r.id for r in requests] == list(range(400))
    assert "the default" not in proc.stderr  # --max-context was given
    # nothing clamped: nothing said about clamping
    quiet = run_cli("generate", "--rate", "16", "--num-requests", "50", "--input-len", "100", "--output-len", "20",
                    "-o", str(tmp_path / "small.jsonl"))
    assert quiet.returncode == 0 and "clamp" not in quiet.stderr + quiet.stdout, quiet.stderr + quiet.stdout
    # every argument, as used, is in the header
    assert header["args"] == {
        "rate": 16.0, "num_requests": 400, "duration": None, "seed": 0, "arrival": "poisson", "burstiness": None,
        "input_len": 900, "output_len": 300, "length_dist": "lognormal", "length_spread": 1.5, "max_context": 1500,
        "dataset": None, "dataset_format": None, "keep_timestamps": False, "time_scale": None, "in_order": False,
            "window_start": None, "window_end": None, "busiest": None,
        "workload": None, "block_size": None, "groups": None, "prefix_len": None, "group_dist": None,
        "group_zipf": None, "sessions": None, "turns": None, "think_time": None, "think_dist": None,
        "closed_loop": False,
    }


def test_help_texts_explain_every_option(tmp_path: Path) -> None:
    text = run_cli("generate", "--help").stdout
    for option in ("--rate", "--num-requests", "--duration", "--seed", "--arrival", "--burstiness", "--input-len",
                   "--output-len", "--length-dist", "--length-spread", "--max-context", "--dataset",
                   "--dataset-format", "--keep-timestamps", "--time-scale", "--in-order", "--output", "--workload",
                   "--block-size", "--groups", "--prefix-len", "--group-dist", "--group-zipf", "--sessions", "--turns",
                   "--think-time", "--think-dist", "--closed-loop"):
        assert option in text
    for meaning in ("shared-prompt  --groups G system prompts", "multi-turn     --sessions S of --turns T turns",
                    "Only the whole blocks of a group's prompt"):
        assert meaning in text
    for meaning in ("uniform    spread = std/mean", "normal     spread = std/mean", "lognormal  spread = std/mean",
                    "zipf       spread = longest length / mean", "fixed      every length is the mean"):
        assert meaning in text
    inspect_help = run_cli("inspect", "--help").stdout
    for word in ("gap CV", "peak rate", "p50/p90/p99", "offered tokens/s", "--json", "--lru-tokens",
                 "reusable (ceiling)", "input_len - 1", "LRU N tokens"):
        assert word in inspect_help


def test_commands_module_is_light_and_its_choices_match_the_library() -> None:
    code = ("import sys, tracebench.trace.commands as c; assert 'numpy' not in sys.modules, 'numpy imported';"
            "print(c._ARRIVALS, c._LENGTH_DISTS, c._DATASET_FORMATS, c._WORKLOADS, c._GROUP_DISTS, c._THINK_DISTS)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    from tracebench.trace.arrivals import ARRIVAL_KINDS
    from tracebench.trace.datasets import DATASET_FORMATS
    from tracebench.trace.lengths import LENGTH_DISTS
    from tracebench.trace.workloads import GROUP_DISTS, THINK_DISTS, WORKLOADS

    assert proc.stdout.strip() == f"{ARRIVAL_KINDS} {LENGTH_DISTS} {DATASET_FORMATS} {WORKLOADS} {GROUP_DISTS} " \
                                  f"{THINK_DISTS}"

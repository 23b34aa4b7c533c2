"""Issue 23, "a second newcomer's hour": what got in a new user's way, each item with a test where it can fail.

Run folders for the report tests are written here (docs/run-format.md), not replayed: the report is the process under
test, and a synthetic run of a few hundred requests makes it in milliseconds with exactly the groups a test needs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, tracebench_cmd

# ---- synthetic run folders ----------------------------------------------------------------------------------------


def write_run(folder: Path, trace: Path, seed: int, policy: str, *, requests: int = 240, servers: int = 2,
              hit_share: float = 0.5, cached: bool = True, speed: float | None = None) -> None:
    """A completed run of `trace` (its header read for the sha256 and the count; the requests' lengths are drawn
    here): every request ok; `hit_share` of them with cached_tokens = half their prompt (null without `cached`)."""
    from tracebench.trace.format import load_trace

    header, reqs = load_trace(trace)
    assert len(reqs) == requests
    rng = np.random.default_rng(seed)
    import hashlib

    sha = hashlib.sha256(trace.read_bytes()).hexdigest()
    lines = []
    for req in reqs:
        t_arrival = req.arrival_s
        t_released = t_arrival + 0.0005
        t_dispatch = t_released + float(rng.exponential(0.02))
        hit = rng.random() < hit_share
        uncached = req.input_len // 2 if hit else req.input_len
        t_first = t_dispatch + 0.01 + uncached * 2e-5 + float(rng.exponential(0.01))
        t_finish = t_first + req.output_len * 0.008
        lines.append({
            "id": req.id, "input_len": req.input_len, "output_len": req.output_len, "t_arrival": t_arrival,
            "t_released": t_released, "t_dispatch": t_dispatch, "t_first_token": t_first, "t_finish": t_finish,
            "server": int(rng.integers(0, servers)), "batch": None, "status": "ok", "error": None,
            "completion_tokens": req.output_len, "prompt_tokens": req.input_len,
            "cached_tokens": (req.input_len - uncached) if cached else None,
            "server_e2e_latency": t_finish - t_dispatch - 0.001, "server_queue_time": 0.0005,
            "server_received": t_dispatch + 0.0005, "server_forward_entry": t_dispatch + 0.001,
            "server_prefill_finished": t_first - 0.001, "server_finished": t_finish - 0.0005,
        })
    folder.mkdir(parents=True)
    (folder / "requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    t_end = max(line["t_finish"] for line in lines)
    meta = {
        "tracebench_run": 1, "run_name": folder.name, "tracebench_version": "0.1.0", "host": "test",
        "wall_clock_start": 1_800_000_000.0,
        "trace": {"path": str(trace.name), "sha256": sha, "num_requests": requests, "duration_s": header.duration_s,
                  "header": {}, "prefix": {"reusable_fraction": 0.6}},
        "options": {"speed": speed, "stream": True}, "speed": speed, "backend": "sim", "mode": "continuous",
        "batch_size": None, "policy": {"name": policy, "class": f"test.{policy}", "options": {}}, "seed": 0,
        "servers": [{"index": i, "url": f"http://127.0.0.1:{30000 + i}", "gpu": None, "launch_command": None,
                     "same_host": True, "server_info": {}, "version": "sim", "log": None} for i in range(servers)],
        "gpu_names": [], "caps": {"initial": [8] * servers, "changes": []}, "events": [],
        "status": "completed", "t_end": t_end, "counts": {"ok": requests},
    }
    (folder / "run.json").write_text(json.dumps(meta, indent=2))


@pytest.fixture(scope="module")
def four_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """reports/{prefix-round_robin,prefix-sjf,prefix-cache_aware,prefix-prefix_hash} of one shared-prompt trace."""
    root = tmp_path_factory.mktemp("newcomer-runs")
    trace = root / "prefix.jsonl"
    done = run_cli("generate", "--workload", "shared-prompt", "--groups", "8", "--prefix-len", "512", "--rate", "20",
                   "--num-requests", "240", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    for seed, policy in enumerate(("round_robin", "sjf", "cache_aware", "prefix_hash")):
        write_run(root / "reports" / f"prefix-{policy}-continuous-2g-20261124-120000", trace, seed, policy,
                  hit_share=0.3 + 0.2 * seed)
    return root


def _report(root: Path, names: list[str], columns: int, *args: str) -> str:
    env = {**os.environ, "COLUMNS": str(columns)}
    done = subprocess.run(tracebench_cmd("report", *names, *args), cwd=root, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _names(root: Path, count: int) -> list[str]:
    return sorted(p.name for p in (root / "reports").iterdir())[:count]


# ---- item 1: the terminal report and `tracebench policies` fit the terminal ---------------------------------------

@pytest.mark.parametrize("count", [2, 4])
def test_terminal_report_fits_80_and_120_columns_and_loses_nothing(four_runs: Path, count: int) -> None:
    names = _names(four_runs, count)
    wide = _report(four_runs, names, 400)
    assert max(map(len, wide.splitlines())) > 120  # the layout this test is about: too wide for 120 as it was
    part = re.compile(r"\(\d/\d\)")
    for columns in (80, 120):
        text = _report(four_runs, names, columns)
        assert max(map(len, text.splitlines())) <= columns, columns
        # split or wrapped, never cut: every word of the unconstrained layout is still there, nothing else is
        words = {w for w in text.split() if not part.fullmatch(w)}
        assert words == set(wide.split()), (columns, set(wide.split()) ^ words)
    assert "Latency (ms) (1/" in _report(four_runs, names, 80)


def test_tracebench_policies_fits_the_terminal() -> None:
    for columns in (80, 120):
        done = subprocess.run(tracebench_cmd("policies"), env={**os.environ, "COLUMNS": str(columns)},
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert max(map(len, done.stdout.splitlines())) <= columns
        assert "--policy-opt w_speed=..." in done.stdout and "--router sglang-router" in done.stdout

"""Real sglang on a GPU: the same invariants the sim tests check, on the real server.

Skipped unless a GPU (nvidia-smi) and sglang are present. On the device (README, "Tests on a GPU"):
    source .carry/sglang-device/setup-on-device.sh && python3 -m pytest -m gpu tests/gpu
Model and sglang arguments come from TRACEBENCH_GPU_MODEL (default .carry/models/llama-2-7b-hf) and
TRACEBENCH_GPU_SERVER_ARGS (default: dummy weights, triton attention, pytorch sampling — our device's sglang).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="no GPU (nvidia-smi not found)"),
    pytest.mark.skipif(importlib.util.find_spec("sglang") is None, reason="sglang is not installed"),
]

MODEL = os.environ.get("TRACEBENCH_GPU_MODEL", str(REPO / ".carry" / "models" / "llama-2-7b-hf"))
SERVER_ARGS = os.environ.get("TRACEBENCH_GPU_SERVER_ARGS",
                             "--load-format dummy --attention-backend triton --sampling-backend pytorch")
CAP = 4


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "requests.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One replay that launches real sglang (--backend sglang --gpus 1) under a router cap of CAP."""
    work = tmp_path_factory.mktemp("gpu")
    trace = work / "t.jsonl"
    gen = run_cli("generate", "--rate", "16", "--num-requests", "60", "--input-len", "256", "--output-len", "32",
                  "--length-dist", "uniform", "--seed", "3", "-o", str(trace))
    assert gen.returncode == 0, gen.stderr
    rep = run_cli("replay", str(trace), "--backend", "sglang", "--gpus", "1", "--model", MODEL,
                  "--server-arg", SERVER_ARGS, "--max-running-requests", str(CAP), "--port-base", "30500",
                  "--out-dir", str(work), "--run-name", "gpu", "--quiet", timeout=900)
    assert rep.returncode == 0, rep.stderr[-3000:]
    return work / "gpu"


def test_every_request_once_and_ok(gpu_run: Path) -> None:
    recs = _records(gpu_run)
    assert sorted(r["id"] for r in recs) == list(range(60))
    assert {r["status"] for r in recs} == {"ok"}
    assert all(r["completion_tokens"] == r["output_len"] for r in recs)  # ignore_eos honoured
    assert all(r["prompt_tokens"] == r["input_len"] for r in recs)


def test_timestamps_in_order_and_sglang_stamps_inside(gpu_run: Path) -> None:
    for r in _records(gpu_run):
        assert r["t_arrival"] <= r["t_released"] <= r["t_dispatch"] <= r["t_first_token"] <= r["t_finish"], r
        # sglang's own stamps, converted to the run clock, lie between our dispatch and finish (same host)
        assert r["t_dispatch"] <= r["server_received"] <= r["server_finished"] <= r["t_finish"], r
        assert 0 < r["server_e2e_latency"] <= r["t_finish"] - r["t_dispatch"], r


def test_cap_never_exceeded(gpu_run: Path) -> None:
    events = sorted([(r["t_dispatch"], 1) for r in _records(gpu_run)] + [(r["t_finish"], -1) for r in _records(gpu_run)],
                    key=lambda e: (e[0], e[1]))
    in_flight = peak = 0
    for _, step in events:
        in_flight += step
        peak = max(peak, in_flight)
    assert peak <= CAP


def test_run_json_names_the_real_server(gpu_run: Path) -> None:
    run = json.loads((gpu_run / "run.json").read_text())
    assert run["status"] == "completed"
    server = run["servers"][0]
    assert server["version"].startswith("0.5")
    assert "--enable-metrics" in server["launch_command"] and "--skip-tokenizer-init" in server["launch_command"]
    assert run["gpu_names"], "GPU names recorded"

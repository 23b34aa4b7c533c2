"""Which profile a simulator runs (by name or by GPU), and how late it runs (issues 19 part 3, 24): the choice in
sim-server, replay and run.json; the lag in the answers, the records and the report; the capped dispatch of a sped-up
run converted by the event it waited for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import run_cli
from tracebench.errors import ConfigError
from tracebench.replay.run import ReplayConfig
from tracebench.report.metrics.lag import LAG_BOUND, lag_stats, lag_warning
from tracebench.report.speed import BREAKDOWN_STAMPS, to_simulated_times
from tracebench.sim.catalog import profile_for_gpu, resolve_profile
from test_sim_server import gen, get, post


def test_profile_by_name_or_gpu() -> None:
    assert resolve_profile(None, None).name == "llama-2-7b-h200-triton"
    assert resolve_profile("llama-2-7b-h100-triton", None).accelerator == "NVIDIA H100 80GB HBM3"
    for gpu in ("H100", "h100 80gb", "NVIDIA H100 80GB HBM3"):
        assert profile_for_gpu(gpu).name == "llama-2-7b-h100-triton"
    assert resolve_profile(None, "NVIDIA H200").name == "llama-2-7b-h200-triton"
    with pytest.raises(ConfigError, match=r"--gpu 'A100': no built-in profile .*NVIDIA H100 80GB HBM3 \(llama-2-7b-h100"):
        profile_for_gpu("A100")
    with pytest.raises(ConfigError, match="2 built-in profiles"):
        profile_for_gpu("nvidia")
    with pytest.raises(ConfigError, match="give one"):
        resolve_profile("llama-2-7b-h100-triton", "H100")


def test_sim_profile_is_for_launched_simulators(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--sim-profile and --sim-gpu choose the timing of servers launched"):
        ReplayConfig(trace=tmp_path / "t.jsonl", sim_gpu="H100", model="m").resolve()
    with pytest.raises(ConfigError, match="--sim-profile and --sim-gpu"):
        ReplayConfig(trace=tmp_path / "t.jsonl", sim_profile="x", attach=("http://127.0.0.1:1",)).resolve()


def test_sim_server_gpu_h100_answers_as_one_and_says_how_late_it_ran(sim_server) -> None:
    srv = sim_server("--gpu", "H100", "--speed", "20")
    info = get(srv.url, "/server_info")
    assert info["tracebench_sim"]["profile"] == "llama-2-7b-h100-triton"
    assert info["max_total_num_tokens"] == 107675
    assert get(srv.url, "/v1/loads")["accelerator"] == "NVIDIA H100 80GB HBM3"
    meta = post(srv.url, gen(300, 20))["meta_info"]
    assert list(meta)[-1] == "tracebench_sim_lag" and 0.0 <= meta["tracebench_sim_lag"] < 5.0
    metrics = urlread(srv.url + "/metrics")
    assert "tracebench:sim_lag_seconds_count" in metrics and "tracebench:sim_lag_max_seconds" in metrics
    bad = run_cli("sim-server", "--port", "1", "--gpu", "A100")
    assert bad.returncode == 2 and "no built-in profile" in bad.stderr


def urlread(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode()


def test_replay_sim_gpu_records_the_profile_and_the_lag(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "40", "--num-requests", "12", "--seed", "0", "--input-len", "256",
                   "--output-len", "16", "-o", str(trace)).returncode == 0
    done = run_cli("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "10", "--sim-gpu", "H100",
                   "--run-name", "h", "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "h" / "run.json").read_text())
    assert meta["sim_profiles"] == ["llama-2-7b-h100-triton"] and meta["options"]["sim_gpu"] == "H100"
    lags = [json.loads(line)["sim_lag"] for line in (tmp_path / "h" / "requests.jsonl").read_text().splitlines()]
    assert len(lags) == 12 and all(isinstance(x, float) and x >= 0 for x in lags)
    done = run_cli("report", str(tmp_path / "h"), "--format", "json", "--bootstrap", "0")
    assert done.returncode == 0, done.stderr
    assert "llama-2-7b-h100-triton" in done.stdout and '"lag"' in done.stdout
    refused = run_cli("replay", str(trace), "--backend", "sim", "--server-arg", "--profile x", "--run-name", "r",
                      "--out-dir", str(tmp_path), "--quiet")
    assert refused.returncode == 2 and "--sim-profile or --sim-gpu" in refused.stderr


def test_lag_bound_and_warning() -> None:
    n = 200
    ok = pl.DataFrame({
        "t_arrival": np.arange(n) * 0.1, "t_released": np.arange(n) * 0.1 + 0.001,
        "t_dispatch": np.arange(n) * 0.1 + 0.002, "t_first_token": np.arange(n) * 0.1 + 0.052,
        "t_finish": np.arange(n) * 0.1 + 1.002, "sim_lag": np.full(n, 0.002),
    })
    quiet = lag_stats(ok, None)   # speed 1: the simulators' own 2 ms against a 52 ms TTFT
    assert quiet is not None and quiet.could_p50 == pytest.approx(0.002)
    assert quiet.shares["ttft p50"] == pytest.approx(0.002 / 0.052, rel=0.01) and lag_warning("q", None, quiet) is None
    fast = lag_stats(ok, 4.0)     # speed 4: 4 x 2 ms + 3 x 1 ms = 11 ms of simulated time
    assert fast is not None and fast.could_p50 == pytest.approx(0.011)
    assert fast.shares["ttft p50"] > LAG_BOUND and fast.shares["total p50"] < LAG_BOUND
    warning = lag_warning("f", 4.0, fast)
    assert warning is not None and "21% of TTFT p50" in warning and "rerun at a lower --speed" in warning
    assert lag_stats(ok.with_columns(pl.lit(None, pl.Float64).alias("sim_lag")), 4.0) is None   # real sglang


def test_lag_counts_tracebenchs_own_time_before_the_wire() -> None:
    """Issue 33 A4: on a loaded 2-core machine a simulated point read TTFT p50 +32% over a quiet host while the lag
    check said 2.8% and did not warn: the difference was tracebench's own time before the wire (9.3 ms p50, 0.65 ms
    quiet). The check counts it, for simulated and real runs alike."""
    n = 200
    t = np.arange(n) * 0.1

    def run(own_s: float, sim_lag: float | None) -> pl.DataFrame:
        return pl.DataFrame({
            "t_arrival": t, "t_released": t + 0.0001, "t_admitted": t + 0.0001, "slot_wait_s": np.zeros(n),
            "batch_wait_s": np.zeros(n), "t_assigned": t + own_s / 2, "t_built": t + own_s * 0.75,
            "t_written": t + own_s, "t_dispatch": t + own_s * 0.75,
            "server_first_sent": t + own_s + 0.020, "t_first_token": t + own_s + 0.0202,
            "t_finish": t + own_s + 0.5, "sim_lag": np.full(n, sim_lag, dtype=float) if sim_lag is not None
            else np.full(n, None, dtype=object),
        }, schema_overrides={"sim_lag": pl.Float64})

    quiet, loaded = lag_stats(run(0.00065, 0.0002), None), lag_stats(run(0.0093, 0.0002), None)
    assert quiet is not None and loaded is not None
    assert quiet.own_p50 == pytest.approx(0.00085, rel=0.01) and loaded.own_p50 == pytest.approx(0.0095, rel=0.01)
    assert quiet.shares["ttft p50"] < LAG_BOUND < loaded.shares["ttft p50"]
    warning = lag_warning("loaded", None, loaded)
    assert warning is not None and "tracebench's own time before the wire" in warning and "9.50/9.50 ms" in warning
    real = lag_stats(run(0.0093, None), None)  # real sglang: no sim_lag, its own time still checked
    assert real is not None and real.sim_p50 is None and real.could_p50 == pytest.approx(0.0095, rel=0.01)
    said = lag_warning("real", None, real)
    assert said is not None and said.startswith("run 'real': the client's host ran late"), said


def _two_requests(**columns: list) -> pl.DataFrame:
    """Two records of a sped-up run as the loader gives them: `columns`, and the breakdown stamps and the two waits
    null, as in a run recorded before them (the loader adds them so)."""
    return pl.DataFrame({
        **columns, "itl_max": [None, None],
        **{name: [None, None] for name in (*BREAKDOWN_STAMPS, "slot_wait_s", "batch_wait_s")},
    }, schema_overrides={"itl_max": pl.Float64,
                         **{name: pl.Float64 for name in (*BREAKDOWN_STAMPS, "slot_wait_s", "batch_wait_s")}})


# request 0 dispatched at once; request 1 (released at 1.0 s) waits for request 0's slot, freed when request 0 finished
# (run clock 1.5005), and is dispatched 0.5 ms later: a server capped at 1
CAPPED_PAIR = {
    "t_arrival": [0.0, 1.0], "t_released": [0.0005, 1.0005], "t_admitted": [0.0005, 1.0005],
    "t_dispatch": [0.001, 1.501], "t_first_token": [0.0112, 1.5112], "t_finish": [1.5005, 2.0005], "server": [0, 0],
    "server_e2e_latency": [1.4988, 0.4983], "server_queue_time": [0.0, 0.0],
    "server_received": [0.0012, 1.5017], "server_forward_entry": [0.0013, 1.5018],
    "server_prefill_finished": [0.01, 1.51], "server_finished": [1.5, 2.0]}


def test_capped_dispatch_counts_the_routers_host_time_once() -> None:
    # speed 4, one server capped at 1: request 0 is dispatched at once; request 1 (released at 1.0 s) waits for request
    # 0's slot, freed when request 0 finished (run clock 1.5005), and is dispatched 0.5 ms later
    k = 4.0
    requests = _two_requests(**CAPPED_PAIR)
    meta = {"mode": "continuous", "caps": {"initial": [1], "changes": []},
            "servers": [{"server_info": {"tracebench_sim": {"output_s": 0.002}}}]}
    out, how = to_simulated_times(requests, meta, k)
    t = out["t_dispatch"].to_list()
    assert t[0] == pytest.approx(0.0 * k + 0.0005 + 0.0005)   # release + host, not K x 0.001
    finish0 = out["t_finish"][0]
    assert finish0 == pytest.approx(t[0] + 0.0002 + (1.5 - 0.0012) * k + 0.0005)
    assert t[1] == pytest.approx(finish0 + 0.0005)               # the freed slot + the router's 0.5 ms
    assert "freed slot" in how


def test_the_simulators_modelled_intake_is_simulated_time_at_speed_k() -> None:
    # speed 4, a simulator that takes a request in request_hop_s = 2 ms after the client sent it: 0.5 ms of the run
    # clock, which is simulated time (x 4); what the host took beyond it (0.3 ms on the second request) stays as it was
    k = 4.0
    requests = _two_requests(
        t_arrival=[0.0, 1.0], t_released=[0.0, 1.0], t_admitted=[0.0, 1.0], t_dispatch=[0.0, 1.0],
        t_first_token=[0.0110, 1.0113], t_finish=[0.5, 1.5], server=[0, 0], server_received=[0.0005, 1.0008],
        server_forward_entry=[0.0006, 1.0009], server_prefill_finished=[0.01, 1.0103], server_finished=[0.49, 1.49],
        server_e2e_latency=[0.4895, 0.4892], server_queue_time=[0.0, 0.0])
    sim = {"output_s": 0.002, "request_hop_s": 0.002}
    meta = {"mode": "continuous", "caps": {"initial": [None], "changes": []},
            "servers": [{"server_info": {"tracebench_sim": sim}}]}
    out, _ = to_simulated_times(requests, meta, k)
    hops = (out["server_received"] - out["t_dispatch"]).to_list()
    assert hops == pytest.approx([0.002, 0.002 + 0.0003])
    # a simulator from before the modelled intake (no request_hop_s): the whole hop was host time
    old = {"servers": [{"server_info": {"tracebench_sim": {"output_s": 0.002}}}]}
    out, _ = to_simulated_times(requests, {**meta, **old}, k)
    assert (out["server_received"] - out["t_dispatch"]).to_list() == pytest.approx([0.0005, 0.0008])
    # a hop below 0 (an attached simulator whose host clock is behind the client's) holds no modelled intake: it stays
    # as measured, with request_hop_s or without (K x it put the receipt 4 times further before the dispatch)
    behind = requests.with_columns(pl.Series("server_received", [-0.0003, 0.9997]))
    for runs_meta in (meta, {**meta, **old}):
        out, _ = to_simulated_times(behind, runs_meta, k)
        assert (out["server_received"] - out["t_dispatch"]).to_list() == pytest.approx([-0.0003, -0.0003])


def test_the_simulators_modelled_answer_end_is_simulated_time_at_speed_k() -> None:
    # speed 4, a simulator that sends an answer's end answer_end_s = 0.48 ms after its model finished the request:
    # 0.12 ms of the run clock, simulated time (x 4); the rest of server_finished -> t_finish (the wire, the client's
    # read: 0.2 and 0.5 ms here) stays as measured, and a hop shorter than the modelled part is all simulated
    k = 4.0
    columns = dict(
        t_arrival=[0.0, 1.0], t_released=[0.0, 1.0], t_admitted=[0.0, 1.0], t_dispatch=[0.0, 1.0],
        t_first_token=[0.0110, 1.0113], server=[0, 0], server_received=[0.0005, 1.0005],
        server_forward_entry=[0.0006, 1.0009], server_prefill_finished=[0.01, 1.0103], server_finished=[0.49, 1.49],
        server_e2e_latency=[0.4895, 0.4895], server_queue_time=[0.0, 0.0])
    requests = _two_requests(**columns, t_finish=[0.49032, 1.49062])
    sim = {"output_s": 0.002, "request_hop_s": 0.002, "answer_end_s": 0.00048}
    meta = {"mode": "continuous", "caps": {"initial": [None], "changes": []},
            "servers": [{"server_info": {"tracebench_sim": sim}}]}
    out, _ = to_simulated_times(requests, meta, k)
    assert (out["t_finish"] - out["server_finished"]).to_list() == pytest.approx(
        [0.00012 * k + 0.0002, 0.00012 * k + 0.0005])
    short = _two_requests(**columns, t_finish=[0.49005, 1.49])
    out, _ = to_simulated_times(short, meta, k)
    assert (out["t_finish"] - out["server_finished"]).to_list() == pytest.approx([0.00005 * k, 0.0])
    # a simulator from before the modelled answer's end (no answer_end_s): all host time
    old = {"servers": [{"server_info": {"tracebench_sim": {"output_s": 0.002, "request_hop_s": 0.002}}}]}
    out, _ = to_simulated_times(requests, {**meta, **old}, k)
    assert (out["t_finish"] - out["server_finished"]).to_list() == pytest.approx([0.00032, 0.00062])


def test_a_capped_dispatch_waits_for_the_converted_finish_with_the_modelled_intake() -> None:
    # as test_capped_dispatch_counts_the_routers_host_time_once, but the simulator models its intake (request_hop_s
    # 2 ms, 0.5 ms of the run clock at speed 4): request 0's 0.2 ms hop is simulated time, 0.8 ms converted; request
    # 1 waited for request 0's slot, so it is dispatched after request 0's converted finish (0.6 ms before it when the
    # freed slot's finish kept the hop as measured)
    k = 4.0
    requests = _two_requests(**CAPPED_PAIR)
    meta = {"mode": "continuous", "caps": {"initial": [1], "changes": []},
            "servers": [{"server_info": {"tracebench_sim": {"output_s": 0.002, "request_hop_s": 0.002}}}]}
    out, _ = to_simulated_times(requests, meta, k)
    t = out["t_dispatch"].to_list()
    finish0 = out["t_finish"][0]
    assert finish0 == pytest.approx(t[0] + 0.0002 * k + (1.5 - 0.0012) * k + 0.0005)
    assert t[1] == pytest.approx(finish0 + 0.0005)   # the freed slot + the router's 0.5 ms


def test_the_replays_simulated_duration_is_the_reports_with_the_modelled_intake() -> None:
    # the replay's summary line ("N simulated s ..., as tracebench report counts them", replay/summary.py) mirrors
    # report/speed.py: with a simulator that models its intake (request_hop_s 2 ms: 0.5 ms of the run clock at
    # speed 4) the report counts that part x K, and so must the summary (it kept the hop as measured: 1.5 ms short).
    # An uncapped run (with a cap the summary takes K x t_dispatch, the report the freed slot's finish: not the same)
    from tracebench.replay.records import RequestRecord
    from tracebench.replay.summary import ModelledHops, SimulatedSpan

    k = 4.0
    row = {"t_arrival": 0.0, "t_released": 0.0001, "t_admitted": 0.0001, "t_dispatch": 0.0003,
           "t_first_token": 0.0112, "t_finish": 0.5005, "server": 0, "server_received": 0.0007,
           "server_forward_entry": 0.0008, "server_prefill_finished": 0.01, "server_finished": 0.5,
           "server_e2e_latency": 0.4993, "server_queue_time": 0.0}
    requests = pl.DataFrame({**{key: [value] for key, value in row.items()}, "itl_max": [None],
                             **{name: [None] for name in (*BREAKDOWN_STAMPS, "slot_wait_s", "batch_wait_s")}},
                            schema_overrides={"itl_max": pl.Float64, **{name: pl.Float64 for name in (
                                *BREAKDOWN_STAMPS, "slot_wait_s", "batch_wait_s")}})
    sim = {"output_s": 0.002, "request_hop_s": 0.002, "answer_end_s": 0.0012}   # (0.3 ms of the 0.5 ms end: simulated)
    meta = {"mode": "continuous", "caps": {"initial": [None], "changes": []},
            "servers": [{"server_info": {"tracebench_sim": sim}}]}
    out, _ = to_simulated_times(requests, meta, k)
    reported = out["t_finish"][0] - out["t_arrival"][0]
    span = SimulatedSpan(k, [ModelledHops(0.002, 0.0012)])
    fields = {key: row[key] for key in ("t_arrival", "t_released", "t_dispatch", "t_first_token", "t_finish", "server",
                                        "server_received", "server_forward_entry", "server_prefill_finished",
                                        "server_finished")}
    span.add(RequestRecord(0, 64, 8, **fields))
    assert span.duration(host_wait=True, output_s_known=True, pd=False) == pytest.approx(reported, abs=1e-9)
    # a PD run: the report multiplies every time by K (report/speed.py), so does the summary (it took the per-part
    # rebuild: 1.5 ms + 3 x the host time short)
    out, _ = to_simulated_times(requests.with_columns(**{name: pl.lit(None, pl.Float64) for name in (
        "t_prefill_answer", "prefill_received", "prefill_forward_entry", "prefill_done", "prefill_finished",
        "prefill_queue_time", "prefill_e2e_latency")}), {**meta, "pd": {"pools": {}}}, k)
    assert span.duration(host_wait=True, output_s_known=True, pd=True) == pytest.approx(
        out["t_finish"][0] - out["t_arrival"][0], abs=1e-9)

"""What runs beside the load (issue 22): the servers' /metrics scraped into server_metrics.jsonl, GPU samples from
nvidia-smi into gpu.jsonl, the timeline export, the CI gate. Servers are real sim-server processes; nvidia-smi is a
real stand-in process (a shell script that prints nvidia-smi's CSV), named by TRACEBENCH_NVIDIA_SMI."""

from __future__ import annotations

import asyncio
import json
import lzma
import os
import stat
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import REPO, free_port, run_cli, tracebench_cmd
from tracebench.errors import ConfigError, ServerProtocolError
from tracebench.replay.client import SglangClient
from tracebench.replay.clock import RunClock
from tracebench.replay.gpu import ENV_COMMAND, GpuSampler, find_command
from tracebench.replay.run import ReplayConfig
from tracebench.replay.server_metrics import FIELDS, MetricsScraper, parse_metrics
from tracebench.report.load import BESIDE_FILES, SERVER_METRIC_FIELDS, load_runs, read_beside
from tracebench.report.metrics import build_report
from tracebench.report.render import plots
from tracebench.report.render.perfetto import assign_lanes, request_slices
from tracebench.trace.format import format_request_line, write_trace

METRICS_CAPTURE = REPO / ".DUCUMENT" / "captures" / "h200-2026-11-22" / "metricsA.txt"

# two GPUs as `nvidia-smi --query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total,
# power.draw,name --format=csv,noheader,nounits` prints them; GPU 1 does not report its power
FAKE_SMI = """#!/bin/sh
case "$*" in
  *"--query-gpu=index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw,name"*"--format=csv,noheader,nounits"*"-lms 1000"*) ;;
  *) echo "unexpected arguments: $*" >&2; exit 3 ;;
esac
while :; do
  echo "0, GPU-aaaa, 37, 12, 1024, 81559, 123.45, NVIDIA H100 80GB HBM3"
  echo "1, GPU-bbbb, 0, 0, 4, 81559, [N/A], NVIDIA H100 80GB HBM3"
  sleep 0.1
done
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def small_trace(path: Path, n: int = 40, rate: float = 40.0) -> Path:
    rng = np.random.default_rng(1)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    lines = [format_request_line(i, float(arrivals[i]), int(rng.integers(16, 200)), int(rng.integers(4, 40)))
             for i in range(n)]
    return write_trace(path, {"num_requests": n, "duration_s": float(arrivals[-1])}, lines)


def fail(err: BaseException) -> None:
    raise AssertionError(f"a telemetry file could not be written: {err}")


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# ---- /metrics ----------------------------------------------------------------------------------------------------

def test_parse_metrics_real_capture() -> None:
    """sglang 0.5.17's whole /metrics body (metricsA.txt): each kept family folded over its label sets."""
    got = parse_metrics("A", METRICS_CAPTURE.read_text())
    assert tuple(got) == FIELDS == SERVER_METRIC_FIELDS  # the report reads the columns the replay writes
    assert got["num_requests_total"] == 39.0  # is_streaming false 38 + true 1
    assert got["prompt_tokens_total"] == 6162.0 and got["generation_tokens_total"] == 6540.0
    assert got["cached_tokens_total"] == 1842.0 and got["num_aborted_requests_total"] == 1.0
    assert got["time_to_first_token_seconds_count"] == 41.0  # two label sets, their lines apart
    assert got["inter_token_latency_seconds_count"] == 5682.0
    assert got["num_running_reqs"] == 0.0 and got["token_usage"] == 0.0


def test_parse_metrics_folding_absent_and_broken() -> None:
    text = "\n".join([
        "# HELP sglang:num_running_reqs x", "# TYPE sglang:num_running_reqs gauge",
        'sglang:num_running_reqs{tp_rank="0",dp_rank="0"} 3.0',
        'sglang:num_running_reqs{tp_rank="0",dp_rank="1"} 5.0',
        'sglang:token_usage{dp_rank="0"} 0.25', 'sglang:token_usage{dp_rank="1"} 0.75',
        'sglang:token_usage_extra{dp_rank="0"} 99', "sglang:gen_throughput 12.5 1700000000000",
        'sglang:cache_hit_rate{model_name="a b} c"} 0.5',
    ])
    got = parse_metrics("u", text)
    assert got["num_running_reqs"] == 8.0  # counts summed over ranks
    assert got["token_usage"] == 0.5  # ratios averaged, a longer name that starts alike not mixed in
    assert got["gen_throughput"] == 12.5  # no labels, a timestamp after the value
    assert got["cache_hit_rate"] == 0.5  # a label value holding a space and a brace
    assert got["num_requests_total"] is None  # absent: not yet created by sglang, not 0
    with pytest.raises(ServerProtocolError, match=r"u: /metrics line .*sglang:num_queue_reqs.*no number"):
        parse_metrics("u", 'sglang:num_queue_reqs{a="1"} lots')


def test_scraper_records_failures_as_rows(tmp_path: Path) -> None:
    """A server that cannot be reached: rows with `error`, no start/end text, the run not stopped."""
    async def scrape_nothing() -> MetricsScraper:
        client = SglangClient(None, True)
        scraper = MetricsScraper(client, {0: f"http://127.0.0.1:{free_port()}"}, RunClock(), 0.05, tmp_path, fail)
        task = asyncio.ensure_future(scraper.run())
        await asyncio.sleep(0.22)
        task.cancel()
        await asyncio.wait([task])
        await scraper.finish()
        await client.close()
        return scraper

    scraper = asyncio.run(scrape_nothing())
    rows = jsonl(tmp_path / "server_metrics.jsonl")
    assert len(rows) >= 4 and all(r["error"] and r["server"] == 0 for r in rows)
    ts = [r["t"] for r in rows[:-1]]
    assert ts == sorted(ts) and ts[1] >= 0.05  # absolute ticks, not back to back
    described = scraper.describe()["servers"][0]
    assert described["start"] is None and described["end"] is None and described["end_error"]
    assert not list(tmp_path.glob("metrics-*.txt"))


def test_a_bad_metrics_body_is_a_failed_scrape_not_the_runs_failure(tmp_path: Path) -> None:
    """Issue 33 item 14: a malformed sample line ended the benchmark at t=0, and random bytes counted as a good scrape
    with every value null. A server answering those (then a good body): error rows, counted, the scraper goes on."""
    from aiohttp import web

    bodies = ['sglang:num_queue_reqs{a="1"} lots\n', "\x8b\x1f random bytes \x00\x07\n",
              "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\n"]
    served = []

    async def metrics(request: web.Request) -> web.Response:
        served.append(1)
        return web.Response(text=bodies[min(len(served), len(bodies)) - 1])

    async def scrape() -> MetricsScraper:
        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        client = SglangClient(None, True)
        failures: list[BaseException] = []
        scraper = MetricsScraper(client, {0: f"http://127.0.0.1:{port}"}, RunClock(), 0.05, tmp_path, failures.append)
        task = asyncio.ensure_future(scraper.run())
        await asyncio.sleep(0.22)
        assert not task.done()  # still scraping
        task.cancel()
        await asyncio.wait([task])
        await scraper.finish()
        await client.close()
        await runner.cleanup()
        assert not failures
        return scraper

    scraper = asyncio.run(scrape())
    rows = jsonl(tmp_path / "server_metrics.jsonl")
    assert "no number after the labels" in rows[0]["error"] and "num_queue_reqs" in rows[0]["error"]
    assert "not one sglang: family" in rows[1]["error"] and rows[1].get("num_running_reqs") is None
    assert all("error" not in r and r["num_running_reqs"] == 3 for r in rows[2:]) and len(rows) >= 4
    assert scraper.describe()["failed"] == 2
    assert scraper.describe()["servers"][0]["start"] == "metrics-0-start.txt"  # the first good body


def test_in_process_samples_are_what_the_page_parses_to() -> None:
    """The virtual clock's scrape reads a server's numbers without its page (prom.metrics_samples), and its poll the
    /v1/loads figures without the body (InProcessServer.load_now): at every moment of a served load they are what
    parsing the page and the body gives (a PD pair's: the golden runs' server_metrics.jsonl and telemetry.jsonl)."""
    from tracebench.replay.loop import run_virtual
    from tracebench.replay.telemetry import parse_loads, snapshot_stamps
    from tracebench.replay.server_metrics import KEPT_NAMES, fold_samples
    from tracebench.sim.inprocess import InProcessServer, sim_args_from_command

    async def serve(flags: list[str]) -> list[tuple[dict[str, float | None], dict[str, float | None]]]:
        server = InProcessServer(sim_args_from_command(["--port", "1", *flags]))
        task = server.start(run_start=asyncio.get_running_loop().time())
        pends = []
        seen = []
        for k in range(12):
            loop_now = asyncio.get_running_loop().time()
            pends.append(server.submit(300 + 50 * k, 20 + k, None, loop_now, stream=k % 2 == 0))
            await asyncio.sleep(0.05)
            for pend in [p for p in pends if p.finished]:  # answered as the in-process sender answers
                server.final_answer(pend, pend.stream, loop_now)
                pends.remove(pend)
            samples = server.metrics_samples(KEPT_NAMES)
            assert samples is not None
            seen.append((parse_metrics("u", server.metrics_text()), fold_samples(samples)))
            body = server.loads()  # and /v1/loads, as the poller reads it (telemetry.LoadsAtOnce)
            assert server.load_now() == (parse_loads("u", body), snapshot_stamps("u", body))
            loads_seen.add(server.load_now()[0])
        task.cancel()
        return seen

    loads_seen: set[tuple[int, int, float, float]] = set()
    seen = run_virtual(serve([]))
    assert len(loads_seen) > 3  # the load moved
    assert seen[-1][0]["num_requests_total"] and seen[-1][0]["e2e_request_latency_seconds_count"]
    assert len({str(page) for page, _ in seen}) > 3  # the figures moved
    for page, samples in seen:
        assert samples == page
    disabled = InProcessServer(sim_args_from_command(["--port", "1", "--no-enable-metrics"]))
    assert disabled.metrics_samples(KEPT_NAMES) is None


def test_metrics_interval_option() -> None:
    with pytest.raises(ConfigError, match="--metrics-interval must be >= 0"):
        ReplayConfig(trace=Path("t.jsonl"), backend="sim", metrics_interval=-1).resolve()
    assert ReplayConfig(trace=Path("t.jsonl"), backend="sim", metrics_interval=0).resolve().metrics_interval == 0


def test_replay_scrapes_servers_and_samples_gpus(tmp_path: Path, sim_server) -> None:
    """A replay on two attached simulators, one without --enable-metrics, with a stand-in nvidia-smi: every scrape
    of the other one is a row, its counters end at its ok records; its whole text kept at start and end; the GPU
    samples in gpu.jsonl; run.json says what was and was not scraped."""
    smi = executable(tmp_path / "fake-smi", FAKE_SMI)
    trace = tmp_path / "t.jsonl"  # shared prompts: the prefix cache hits, so its counters move
    made = run_cli("generate", "--workload", "shared-prompt", "--groups", "4", "--prefix-len", "256", "--num-requests",
                   "40", "--rate", "40", "--input-len", "64", "--output-len", "16", "-o", str(trace))
    assert made.returncode == 0, made.stderr
    servers = [sim_server("--speed", "2"), sim_server("--speed", "2", "--no-enable-metrics")]
    attach = [a for s in servers for a in ("--attach", s.url)]
    result = subprocess.run(
        tracebench_cmd("replay", str(trace), *attach, "--policy", "round_robin", "--metrics-interval", "0.2",
                       "--run-name", "r", "--out-dir", str(tmp_path), "--quiet"),
        capture_output=True, text=True, timeout=60, env={**os.environ, ENV_COMMAND: str(smi)},
    )
    assert result.returncode == 0, result.stderr
    run_dir = tmp_path / "r"
    run = json.loads((run_dir / "run.json").read_text())
    records = jsonl(run_dir / "requests.jsonl")
    rows = jsonl(run_dir / "server_metrics.jsonl")

    meta = run["server_metrics"]
    assert meta["interval_s"] == 0.2 and meta["file"] == "server_metrics.jsonl" and meta["rows"] == len(rows)
    assert [s["server"] for s in meta["servers"]] == [0]
    assert "without --enable-metrics" in meta["not_scraped"]["1"]
    assert {r["server"] for r in rows} == {0} and not any("error" in r for r in rows)
    assert len(rows) >= run["t_end"] / 0.2  # every tick, plus the last one after the run
    counts = [r["num_requests_total"] for r in rows]
    assert counts == sorted(counts)  # a counter never goes back
    ok0 = sum(r["status"] == "ok" and r["server"] == 0 for r in records)
    assert ok0 > 0 and counts[-1] == ok0
    assert rows[-1]["prompt_tokens_total"] == sum(r["input_len"] for r in records if r["server"] == 0)
    cached0 = sum(r["cached_tokens"] for r in records if r["server"] == 0)
    assert cached0 > 0 and rows[-1]["cached_tokens_total"] == cached0
    assert max(r["num_running_reqs"] for r in rows) >= 1  # the load was seen while it ran
    start, end = meta["servers"][0]["start"], meta["servers"][0]["end"]
    assert (start, end) == ("metrics-0-start.txt", "metrics-0-end.txt")
    assert parse_metrics("s", (run_dir / start).read_text())["num_requests_total"] == 0
    assert parse_metrics("e", (run_dir / end).read_text())["num_requests_total"] == ok0
    end_text = (run_dir / end).read_text()
    assert "sglang:e2e_request_latency_seconds_bucket" in end_text  # the whole text, buckets too

    gpu = run["gpu_telemetry"]
    samples = jsonl(run_dir / "gpu.jsonl")
    assert gpu["error"] is None and gpu["file"] == "gpu.jsonl" and gpu["rows"] == len(samples)
    assert gpu["command"][0] == "…/fake-smi"  # no path of the machine in run.json
    assert [g["uuid"] for g in gpu["gpus"]] == ["GPU-aaaa", "GPU-bbbb"]
    assert all(g["server"] is None for g in gpu["gpus"])  # attached: which GPU a server uses is not known
    assert {s["gpu"] for s in samples} == {0, 1} and len(samples) >= 4
    zero = next(s for s in samples if s["gpu"] == 0)
    assert zero["util_pct"] == 37 and zero["mem_used_mib"] == 1024 and zero["power_w"] == 123.45
    assert all(s["power_w"] is None for s in samples if s["gpu"] == 1)  # [N/A]
    assert all(0 <= s["t"] <= run["t_end"] + 0.5 for s in samples)

    # the report: per-server plot series from both files, and the figure on the page and as its own PNG
    report = build_report(load_runs([str(run_dir)], tmp_path), 0, with_series=True, bootstrap=0)
    assert report.series is not None
    scraped, unscraped = report.series[0].servers
    assert unscraped.metrics is None and not unscraped.gpus  # not scraped; attached: GPUs not known
    m = scraped.metrics
    assert m is not None and m.t.size == len(rows) and np.nanmax(m.running) >= 1
    assert m.hit_rate.size > 0 and np.all((0 <= m.hit_rate) & (m.hit_rate <= 1)) and np.nanmax(m.hit_rate) > 0
    assert [g.index for g in report.series[0].host_gpus] == [0, 1]
    assert np.all(report.series[0].host_gpus[0].util_pct == 37) and np.all(np.isnan(report.series[0].host_gpus[1].power_w))
    assert plots.has_server_telemetry(report)  # the HTML page draws server_telemetry then, and writes its PNG
    figure = plots.server_telemetry(report)
    lines = sum(len(ax.get_lines()) for ax in figure.axes)
    plots.close(figure)
    assert lines >= 5 + 2 * 3  # server 0: running, queued, KV, hit rate, gen throughput; 2 GPUs: util, memory, power

    # packed: the tables as Parquet, the texts as xz, read back the same
    before = {name: read_beside(run_dir, run, name) for name in BESIDE_FILES}
    packed = run_cli("pack", str(run_dir))
    assert packed.returncode == 0, packed.stderr
    for name in ("server_metrics.parquet", "gpu.parquet", "metrics-0-start.txt.xz", "metrics-0-end.txt.xz"):
        assert (run_dir / name).is_file(), name
    assert not list(run_dir.glob("*.jsonl")) and not list(run_dir.glob("metrics-*.txt"))
    assert lzma.decompress((run_dir / "metrics-0-end.txt.xz").read_bytes()).decode() == end_text
    for name, frame in before.items():
        assert frame is not None and frame.height > 0 and read_beside(run_dir, run, name).equals(frame), name


def run_sampler(tmp_path: Path, script: str, server_of: dict[str, int], seconds: float) -> GpuSampler:
    smi = executable(tmp_path / "smi", script)

    async def sample() -> GpuSampler:
        sampler = GpuSampler([str(smi)], tmp_path / "gpu.jsonl", server_of)
        await sampler.start()
        task = asyncio.ensure_future(sampler.read(RunClock(), fail))
        done, _ = await asyncio.wait([task], timeout=seconds)
        if not done:
            await sampler.stop()
            task.cancel()
            await asyncio.wait([task])
        return sampler

    return asyncio.run(sample())


def test_gpu_sampler_maps_launched_servers(tmp_path: Path) -> None:
    """Launched servers' CUDA_VISIBLE_DEVICES entries (an index or a UUID) name their GPUs; the process is
    stopped at the end (no error then)."""
    sampler = run_sampler(tmp_path, FAKE_SMI, {"0": 0, "GPU-bbbb": 1}, 0.35)
    assert sampler.error is None and sampler.proc is not None and sampler.proc.returncode is not None
    assert [(g["index"], g["server"], g["name"]) for g in sampler.describe()["gpus"]] == [
        (0, 0, "NVIDIA H100 80GB HBM3"), (1, 1, "NVIDIA H100 80GB HBM3")]
    rows = jsonl(tmp_path / "gpu.jsonl")
    assert rows and all(r["server"] == r["gpu"] for r in rows)


def test_gpu_sampler_failures_are_said(tmp_path: Path) -> None:
    """nvidia-smi that fails (it prints its complaint on stdout and exits), or a path that is not there: the
    sampler ends with `error` saying what happened, and no row."""
    failing = "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
    sampler = run_sampler(tmp_path, failing, {}, 5.0)
    assert sampler.error is not None and "NVIDIA-SMI has failed" in sampler.error
    assert not (tmp_path / "gpu.jsonl").read_text()
    quitting = "#!/bin/sh\necho 'driver gone' >&2\nexit 4\n"
    sampler = run_sampler(tmp_path, quitting, {}, 5.0)
    assert sampler.error == "nvidia-smi exited by itself (code 4) during the run: driver gone"

    async def missing() -> GpuSampler:
        sampler = GpuSampler([str(tmp_path / "absent")], tmp_path / "gpu2.jsonl", {})
        await sampler.start()
        await sampler.read(RunClock(), fail)
        await sampler.stop()
        return sampler

    assert "did not start" in (asyncio.run(missing()).error or "")


def test_find_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no GPU is sampled, run.json gets why (the test runs the function itself: its input is the process
    environment, which it reads)."""
    monkeypatch.delenv(ENV_COMMAND, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_command(True, False) == (None, "no nvidia-smi on PATH")
    assert find_command(True, True) == (None, "the servers are simulated (they use no GPU)")
    assert find_command(False, False) == (None, "no server runs on this host")
    smi = executable(tmp_path / "nvidia-smi", FAKE_SMI)
    assert find_command(True, False) == ([str(smi)], None)
    monkeypatch.setenv(ENV_COMMAND, "/x/smi")
    assert find_command(True, True) == (["/x/smi"], None)


# ---- the timeline ----------------------------------------------------------------------------------------------

def check_trace_event_format(doc: dict[str, Any]) -> dict[tuple[int, int], list[dict[str, Any]]]:
    """The Trace Event Format's rules for what the file holds (JSON object form): each event's phase and fields, µs
    integers, and per track (pid, tid) complete events that nest: each slice either inside the open one or after it.
    Returns the complete events per track."""
    assert isinstance(doc["traceEvents"], list) and doc["displayTimeUnit"] in ("ms", "ns")
    tracks: dict[tuple[int, int], list[dict[str, Any]]] = {}
    named = set()
    for e in doc["traceEvents"]:
        assert e["ph"] in ("X", "M", "i", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "process_sort_index", "thread_name", "thread_sort_index"), e
            if e["name"] == "process_name":
                named.add(e["pid"])
            continue
        assert isinstance(e["ts"], int) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], int) and e["dur"] >= 0, e
            tracks.setdefault((e["pid"], e["tid"]), []).append(e)
        elif e["ph"] == "i":
            assert e["s"] in ("g", "p", "t"), e
        else:
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values()), e
    assert {pid for pid, _ in tracks} <= named  # every process with slices has a name
    for events in tracks.values():
        stack: list[int] = []  # ends of the open slices
        for e in sorted(events, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1], f"{e} overlaps its enclosing slice without nesting"
            stack.append(end)
    return tracks


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two launched simulators at --speed 5, a cap change at 0.5 s, /metrics every 0.2 s."""
    tmp_path = tmp_path_factory.mktemp("capped")
    trace = small_trace(tmp_path / "t.jsonl", n=60, rate=60.0)
    done = subprocess.run(
        tracebench_cmd("replay", str(trace), "--backend", "sim", "--gpus", "2", "--speed", "5", "--policy",
                       "round_robin", "--max-running-requests", "4", "--cap-schedule", "0.5s:server1=2",
                       "--port-base", str(free_port(2)), "--metrics-interval", "0.2", "--run-name", "r",
                       "--out-dir", str(tmp_path), "--quiet"), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return tmp_path


def test_perfetto_timeline(capped_run: Path) -> None:
    """`report RUN --format perfetto` on a run with a cap change: valid Trace Event Format, every ok request a slice
    on its server's process with its parts inside it, in µs; the cap change a marker; the telemetry as counters."""
    tmp_path = capped_run
    out = tmp_path / "r.json.trace"
    done = run_cli("report", str(tmp_path / "r"), "-o", str(out))
    assert done.returncode == 0, done.stderr
    assert "ui.perfetto.dev" in done.stderr
    doc = json.loads(out.read_text())
    tracks = check_trace_event_format(doc)
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    records = jsonl(tmp_path / "r" / "requests.jsonl")
    run = json.loads((tmp_path / "r" / "run.json").read_text())
    requests = {e["args"]["id"]: e for events in tracks.values() for e in events if e["cat"] == "request"}
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 60 and {r["id"] for r in ok} <= set(requests)
    for r in ok:
        e = requests[r["id"]]
        assert names[e["pid"]].startswith(f"r · server {r['server']} ")  # on its server's process
        # simulated seconds (the run was at --speed 5): the report's timeline, in µs
        assert e["args"]["t_arrival"] == pytest.approx(r["t_arrival"] * 5) and e["ts"] == round(e["args"]["t_arrival"] * 1e6)
        assert e["dur"] == pytest.approx((e["args"]["t_finish"] - e["args"]["t_arrival"]) * 1e6, abs=1)
        parts = [p["name"] for p in tracks[(e["pid"], e["tid"])] if e["ts"] <= p["ts"] and
                 p["ts"] + p["dur"] <= e["ts"] + e["dur"] and p["cat"] == "part"]
        assert "decode" in parts and "prefill" in parts, (r, parts)
    markers = [e for e in doc["traceEvents"] if e["ph"] == "i"]
    assert [(m["name"], names[m["pid"]].split(" (")[0]) for m in markers] == [("cap 2 (schedule)", "r · server 1")]
    assert markers[0]["ts"] == round(run["caps"]["changes"][0]["t"] * 5 * 1e6)
    counters = {(names[e["pid"]].split(" (")[0], e["name"]) for e in doc["traceEvents"] if e["ph"] == "C"}
    for server in ("r · server 0", "r · server 1"):
        assert {(server, "in flight"), (server, "sglang requests"), (server, "sglang token usage")} <= counters


def test_request_slices_and_lanes() -> None:
    """A request's parts stay inside it and in order when sglang's stamps (time.time()) disagree with tracebench's
    clock by a little; concurrent requests of a server take different lanes, a lane is reused once free."""
    rec = {"id": 3, "status": "ok", "t_arrival": 1.0, "t_released": 1.0001, "t_dispatch": 1.002,
           "server_received": 1.0015,  # 0.5 ms before the dispatch: clock skew
           "server_forward_entry": 1.01, "server_prefill_finished": 1.05, "server_finished": 1.2011,
           "t_first_token": 1.06, "t_finish": 1.2}  # sglang's finish 0.1 ms after ours
    slices = request_slices(rec)
    assert slices[0] == ("req 3", 1_000_000, 1_200_000)
    assert slices[1:] == [("router wait", 1_000_000, 1_002_000), ("server queue", 1_002_000, 1_010_000),
                          ("prefill", 1_010_000, 1_050_000), ("decode", 1_050_000, 1_200_000)]
    openai = {**rec, "server_received": None, "server_forward_entry": None, "server_prefill_finished": None,
              "server_finished": None, "status": "timeout"}
    assert request_slices(openai) == [("req 3 (timeout)", 1_000_000, 1_200_000),
                                      ("router wait", 1_000_000, 1_002_000),
                                      ("to first token", 1_002_000, 1_060_000), ("decode", 1_060_000, 1_200_000)]
    assert request_slices({**rec, "t_finish": None}) == []
    assert assign_lanes([(0, 10), (5, 8), (10, 20), (6, 12), (8, 9)]) == [1, 2, 1, 3, 2]


def test_prefill_and_decode_are_drawn_where_sglangs_stamps_put_them() -> None:
    """Issue 33 item 19: on a loaded host tracebench stamps t_written late, after the simulator had already received
    and prefilled the request; the host part ran past the prefill's start, so the prefill (clamped after it) had no
    width and was dropped: the request's slice lacked it. The host part is cut back instead."""
    rec = {"id": 7, "status": "ok", "t_arrival": 1.0, "t_released": 1.0001, "t_admitted": 1.0001, "t_assigned": 1.0002,
           "batch_wait_s": 0.0, "t_built": 1.0003, "t_dispatch": 1.0003,
           "t_written": 1.030,  # the loop came back to stamp the write 30 ms late
           "server_received": 1.001, "server_forward_entry": 1.002, "server_prefill_finished": 1.020,
           "server_finished": 1.100, "t_first_token": 1.031, "t_last_chunk": 1.101, "t_finish": 1.102}
    slices = request_slices(rec)
    names = [name for name, _, _ in slices[1:]]
    assert "prefill" in names and "decode" in names, slices
    parts = {name: (lo, hi) for name, lo, hi in slices[1:]}
    assert parts["prefill"] == (1_002_000, 1_020_000) and parts["decode"] == (1_020_000, 1_100_000)
    for (_, _, hi), (_, lo, _) in zip(slices[1:], slices[2:]):
        assert hi <= lo, slices  # in order, never overlapping
    assert all(1_000_000 <= lo < hi <= 1_102_000 for _, lo, hi in slices[1:])


# ---- the CI gate ------------------------------------------------------------------------------------------------

def test_fail_on_slo_exit_codes(capped_run: Path) -> None:
    """--fail-on-slo: the report is written, then exit 3 naming the run and the limit it missed when fewer than
    --slo-percentile % of the kept requests meet every limit; 0 when they do; 2 for a gate without an SLO."""
    from click.testing import CliRunner

    from tracebench.cli import main

    run = str(capped_run / "r")
    loaded = load_runs([run], capped_run).pop().requests  # in simulated seconds, as the report converts them
    ttft = sorted((loaded["t_first_token"] - loaded["t_arrival"]).to_list())
    limit = ttft[len(ttft) // 2]  # about half meet it
    share = sum(v <= limit for v in ttft) / len(ttft)
    out = capped_run / "gate.md"

    def report(*args: str):
        return CliRunner().invoke(main, ["report", run, "--bootstrap", "0", *args])

    missed = report("--slo", f"ttft={limit!r},total=100", "--fail-on-slo", "-o", str(out))
    assert missed.exit_code == 3, missed.output
    assert out.is_file()  # the report first, then the verdict
    assert f"run 'r': {share * 100:.1f}% of 60 kept requests meet every limit (needed 99%)" in missed.output
    assert f"ttft <= {limit:g} s met by {share * 100:.1f}%" in missed.output and "total <=" not in missed.output
    assert "fraction meeting ttft" in out.read_text()  # each limit alone in the SLO table
    assert "share of requests meeting every limit together" in out.read_text()  # what the gate reads (issue 33 A6)
    met = report("--slo", f"ttft={limit!r}", "--fail-on-slo", "--slo-percentile", f"{share * 100 - 1:g}")
    assert met.exit_code == 0 and "SLO met by every run" in met.output, met.output
    assert report("--slo", "ttft=100,total=100", "--fail-on-slo").exit_code == 0
    no_slo = report("--fail-on-slo")
    assert no_slo.exit_code == 2 and "--fail-on-slo needs --slo" in no_slo.output
    alone = report("--slo", "ttft=1", "--slo-percentile", "90")
    assert alone.exit_code == 2 and "give --fail-on-slo too" in alone.output


def test_fail_on_slo_never_passes_an_unfinished_run(capped_run: Path, tmp_path: Path) -> None:
    """Issue 33 item 5: a replay killed after 256 of 600 records (run.json still `running`) passed `--slo
    ttft=100,total=100 --fail-on-slo` with exit 0, "SLO met by every run", though the report said UNFINISHED."""
    from click.testing import CliRunner

    from tracebench.cli import main

    killed = tmp_path / "killed"
    shutil.copytree(capped_run / "r", killed)
    lines = (killed / "requests.jsonl").read_bytes().splitlines(keepends=True)
    (killed / "requests.jsonl").write_bytes(b"".join(lines[:25]))  # what reached the disk before kill -9
    for name in killed.glob("requests.columns*"):
        name.unlink()
    meta = json.loads((killed / "run.json").read_text())
    meta.update(status="running", t_end=None, counts=dict.fromkeys(meta["counts"], 0), records_written=0)
    (killed / "run.json").write_text(json.dumps(meta))
    gate = CliRunner().invoke(main, ["report", str(killed), "--bootstrap", "0", "--slo", "ttft=100,total=100",
                                     "--fail-on-slo"])
    assert gate.exit_code == 3, gate.output
    assert "run 'r' [UNFINISHED]: the run did not complete, 35 of 60 trace requests not recorded" in gate.output
    assert "SLO met by every run" not in gate.output

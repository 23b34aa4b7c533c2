"""Issue 23, "a second newcomer's hour": what got in a new user's way, each item with a test where it can fail.

Run folders for the report tests are written here (docs/run-format.md), not replayed: the report is what is under
test, and a synthetic run of a few hundred requests makes it in milliseconds with exactly the groups a test needs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli

# ---- synthetic run folders ----------------------------------------------------------------------------------------


def write_run(folder: Path, trace: Path, seed: int, policy: str, *, requests: int = 240, servers: int = 2,
              hit_share: float = 0.5, cached: bool = True, speed: float | None = None, stamps: bool = False,
              release_s: float = 0.0005) -> None:
    """A completed run of `trace` (its header read for the sha256 and the count; the requests' lengths are drawn
    here): every request ok; `hit_share` of them with cached_tokens = half their prompt (null without `cached`);
    with `stamps`, every stamp of the breakdown (docs/overhead.md) too, as today's replay records them; each request
    released `release_s` after its arrival."""
    from tracebench.trace.format import load_trace

    header, reqs = load_trace(trace)
    assert len(reqs) == requests
    rng = np.random.default_rng(seed)
    import hashlib

    sha = hashlib.sha256(trace.read_bytes()).hexdigest()
    lines = []
    for req in reqs:
        t_arrival = req.arrival_s
        t_released = t_arrival + release_s
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
        if stamps:  # each step a little after the one before it, in the run format's order (OK_ORDER)
            lines[-1].update({
                "t_admitted": t_released, "t_assigned": t_released + (t_dispatch - t_released) / 3,
                "t_built": t_released + (t_dispatch - t_released) * 2 / 3,
                "t_written": t_dispatch + 0.0001, "t_headers": t_dispatch + 0.002, "t_last_chunk": t_finish - 0.0001,
                "t_parsed": t_finish + 0.0001, "server_dispatched": t_dispatch + 0.0007,
                "server_first_sent": t_first - 0.0005,
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
    done = run_cli("report", *names, *args, cwd=root, env={"COLUMNS": str(columns)})
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
    if count == 4:  # too many columns to wrap: split into parts, each with the label columns
        assert "Latency (ms) (1/" in _report(four_runs, names, 80, "--layout", "wide")


def test_tracebench_policies_fits_the_terminal() -> None:
    for columns in (80, 120):
        done = run_cli("policies", env={"COLUMNS": str(columns)})
        assert done.returncode == 0, done.stderr
        assert max(map(len, done.stdout.splitlines())) <= columns
        assert "--policy-opt w_speed=..." in done.stdout and "--router sglang-router" in done.stdout


# ---- item 9: a run that never started does not keep its name -------------------------------------------------------

def test_a_retry_replaces_a_run_that_never_started(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--rate", "50", "--num-requests", "5", "-o", str(trace)).returncode == 0
    # nothing listens on port 1: the run never starts (exit 1), its folder says not_started
    failed = run_cli("replay", str(trace), "--attach", "http://127.0.0.1:1", "--run-name", "r", "--out-dir",
                     str(tmp_path), "--quiet")
    assert failed.returncode == 1 and "never started, no request was sent" in failed.stderr
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "not_started"
    # the retry, and the second one, on the virtual clock: the run folder's name is the replay's, whatever its clock
    retry = run_cli("replay", str(trace), "--clock", "virtual", "--run-name", "r", "--out-dir", str(tmp_path),
                    "--quiet")
    assert retry.returncode == 0, retry.stderr
    assert f"replacing {tmp_path / 'r'}: its run never started, no request was sent (ServerStartError" in retry.stderr
    assert json.loads((tmp_path / "r" / "run.json").read_text())["status"] == "completed"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # nothing left aside
    # a run that started keeps its name, whatever its end
    again = run_cli("replay", str(trace), "--clock", "virtual", "--run-name", "r", "--out-dir", str(tmp_path),
                    "--quiet")
    assert again.returncode == 2 and "already exists" in again.stderr


def test_only_a_never_started_folder_is_replaced(tmp_path: Path) -> None:
    from tracebench.errors import ConfigError
    from tracebench.replay.run import claim_run_dir, never_started

    def folder(name: str, status: str, *files: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "run.json").write_text(json.dumps({"status": status, "error": "ServerStartError: no\nmore"}))
        for file in files:
            (path / file).write_text("x")
        return path

    assert never_started(folder("a", "not_started", "server-0.log", "server-1.log", "router.log")) == \
        "ServerStartError: no"
    for name, status, files in (("b", "failed", ()), ("c", "running", ()), ("d", "not_started", ("notes.txt",)),
                                ("e", "not_started", ("requests.jsonl",))):
        path = folder(name, status, *files)
        assert never_started(path) is None
        with pytest.raises(ConfigError, match="already exists"):
            claim_run_dir(tmp_path, name, generated=False)
        assert (path / "run.json").is_file()  # untouched
    (tmp_path / "f").mkdir()  # no run.json at all
    assert never_started(tmp_path / "f") is None
    assert claim_run_dir(tmp_path, "a", generated=False) == tmp_path / "a"
    assert list((tmp_path / "a").iterdir()) == []


# ---- items 2 and 8: what the OpenAI routes report, on the simulator as on sglang -----------------------------------

def _post(url: str, body: dict) -> dict:
    import urllib.request

    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def test_sim_openai_routes_report_cached_tokens_only_with_enable_cache_report_and_read_lengths_as_sglang(
        sim_server) -> None:
    prompt = list(range(1000, 1064))
    reporting, silent = sim_server("--speed", "50", "--enable-cache-report"), sim_server("--speed", "50")
    for server, reported in ((reporting, True), (silent, False)):
        first = _post(f"{server.url}/v1/completions", {"prompt": prompt, "max_tokens": 2})
        again = _post(f"{server.url}/v1/completions", {"prompt": prompt, "max_tokens": 2})
        assert first["usage"]["prompt_tokens_details"] is None  # nothing cached yet: sglang says nothing
        assert again["usage"]["prompt_tokens_details"] == ({"cached_tokens": 63} if reported else None)
        chat = _post(f"{server.url}/v1/chat/completions", {"messages": [{"role": "user", "content": "w5 w6 w7"}]} |
                     {"max_completion_tokens": None, "max_tokens": 3})
        assert chat["usage"]["completion_tokens"] == 3  # max_completion_tokens or max_tokens, as serving_chat.py
        info = json.loads(__import__("urllib.request").request.urlopen(f"{server.url}/server_info").read())
        assert info["enable_cache_report"] is reported
    # /v1/completions has no max_completion_tokens (sglang 0.5.17's CompletionRequest): ignored, max_tokens 16
    ignored = _post(f"{silent.url}/v1/completions", {"prompt": [1001, 1002], "max_completion_tokens": 5})
    assert ignored["usage"]["completion_tokens"] == 16
    help_text = run_cli("sim-server", "--help").stdout
    assert "/v1/completions" in help_text and "/v1/chat/completions" in help_text and "--enable-cache-report" in help_text


def test_openai_replays_know_their_cache_hits_or_say_they_cannot(tmp_path: Path, sim_server) -> None:
    trace = tmp_path / "p.jsonl"
    # 2 req/s, 20/s of run time at --speed 10: each prompt arrives ~50 ms after the one before, its group's prefix
    # long cached by then however busy the machine (at 40 req/s a loaded host let prompts overlap: 18 hits of 24)
    assert run_cli("generate", "--workload", "shared-prompt", "--groups", "2", "--prefix-len", "256", "--rate", "2",
                   "--num-requests", "24", "-o", str(trace)).returncode == 0
    # launched: replay starts the simulators with --enable-cache-report
    done = run_cli("replay", str(trace), "--backend", "sim", "--speed", "10", "--api", "chat", "--run-name", "chat",
                   "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in (tmp_path / "chat" / "requests.jsonl").read_text().splitlines()]
    assert all(r["cached_tokens"] is not None for r in records) and sum(r["cached_tokens"] > 0 for r in records) >= 20
    assert json.loads((tmp_path / "chat" / "run.json").read_text())["cache_reported"] is True
    report = " ".join(run_cli("report", str(tmp_path / "chat")).stdout.split())  # words, not the lines they wrap into
    assert "Prefix cache" in report and "exist only for --api generate runs" in report
    assert "cannot know its prefix-cache hits" not in report
    # attached without --enable-cache-report: the run says it cannot know, and so does the report
    server = sim_server("--speed", "10")
    fast = tmp_path / "fast.jsonl"   # real time here: what the run knows of the cache does not depend on the rate
    assert run_cli("generate", "--workload", "shared-prompt", "--groups", "2", "--prefix-len", "256", "--rate", "40",
                   "--num-requests", "24", "-o", str(fast)).returncode == 0
    done = run_cli("replay", str(fast), "--attach", server.url, "--api", "completions", "--run-name", "blind",
                   "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "server(s) 0 run without --enable-cache-report" in done.stderr and "cannot know its cache hits" in done.stderr
    records = [json.loads(line) for line in (tmp_path / "blind" / "requests.jsonl").read_text().splitlines()]
    assert all(r["cached_tokens"] is None for r in records)
    assert json.loads((tmp_path / "blind" / "run.json").read_text())["cache_reported"] is False
    report = " ".join(run_cli("report", str(tmp_path / "blind")).stdout.split())
    assert "cannot know its prefix-cache hits (its servers ran without --enable-cache-report" in report
    assert "Prefix cache" not in report


# ---- item 7: closed loop said where the user looks -----------------------------------------------------------------

def test_closed_loop_is_explained_by_generate_replay_and_report(tmp_path: Path) -> None:
    trace = tmp_path / "chat.jsonl"
    done = run_cli("generate", "--workload", "multi-turn", "--sessions", "4", "--turns", "3", "--think-time", "0.5",
                   "--input-len", "64", "--output-len", "8", "--closed-loop", "-o", str(trace))
    assert done.returncode == 0, done.stderr
    assert "12 requests, closed loop: 4 sessions starting at 8/s (poisson)" in done.stdout
    assert "req/s, poisson" not in done.stdout  # no rate: the servers set it
    assert "Closed loop:" in run_cli("replay", "--help").stdout
    done = run_cli("replay", str(trace), "--clock", "virtual", "--run-name", "cl", "--out-dir", str(tmp_path),
                   "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "cl" / "run.json").read_text())["trace"]["closed_loop"] == 8
    report = " ".join(run_cli("report", str(tmp_path / "cl")).stdout.split())
    assert "closed loop: 8 of its 12 requests are sent their delay_s after the request they follow finished" in report


# ---- item 5: TTFT of hits and misses, like with like ----------------------------------------------------------------

def test_ttft_by_prefix_hit_is_per_prompt_band_with_n_and_no_tiny_groups(four_runs: Path) -> None:
    from tracebench.report.metrics.definitions import MIN_GROUP, PROMPT_BANDS

    names = _names(four_runs, 4)
    doc = json.loads(_report(four_runs, names, 120, "--format", "json"))
    expected: dict[str, dict[str, tuple[int, float | None]]] = {}
    for name in names:
        groups: dict[str, list[float]] = {}
        for line in (four_runs / "reports" / name / "requests.jsonl").read_text().splitlines():
            r = json.loads(line)
            band = PROMPT_BANDS[int(np.searchsorted(PROMPT_BANDS[1:], r["input_len"], side="right"))]
            key = f"{band}.{'hit' if r['cached_tokens'] > 0 else 'miss'}"
            groups.setdefault(key, []).append(r["t_first_token"] - r["t_dispatch"])
        expected[name] = {k: (len(v), float(np.percentile(v, 50)) if len(v) >= MIN_GROUP else None)
                          for k, v in groups.items()}
    shown = {k for e in expected.values() for k, (n, _) in e.items() if n >= MIN_GROUP}
    hidden = {k for e in expected.values() for k in e} - shown
    assert hidden and any(n < MIN_GROUP for e in expected.values() for k, (n, _) in e.items() if k in shown), \
        "the fixture must have a tiny group hidden and one shown beside a big one"
    for run, name in zip(doc["runs"], names):
        section = run["cache_ttft"]
        assert set(section) == shown  # groups too small in every run are left out
        for key in shown:
            n, p50 = expected[name].get(key, (0, None))
            assert section[key]["n"] == (n or None)
            assert (section[key]["p50"] is None) == (p50 is None)  # a tiny group shows its n, no percentile
            if p50 is not None:
                assert section[key]["p50"] == pytest.approx(p50, rel=1e-9)
    assert "ttft_hit" not in doc["runs"][0]["latency"]  # the pooled split (short first turns as misses) is gone
    table = _report(four_runs, names[:2], 120)
    assert "TTFT from dispatch by prefix hit, within prompt-length bands" in table and "prompt 512-1,023 tokens, hit" in table


# ---- items 4 and 6: capacity beside the trace, and examples where routing matters ----------------------------------

def test_inspect_puts_kv_beside_the_working_set_and_warns_of_overload(tmp_path: Path) -> None:
    from tracebench.capacity import costs_named, offered_load

    fits, spread = tmp_path / "fits.jsonl", tmp_path / "spread.jsonl"
    for path, groups, prefix, rate in ((fits, 16, 1024, 5), (spread, 128, 2048, 60)):
        done = run_cli("generate", "--workload", "shared-prompt", "--groups", str(groups), "--prefix-len", str(prefix),
                       "--input-len", "256", "--output-len", "128", "--rate", str(rate), "--num-requests", "600",
                       "-o", str(path))
        assert done.returncode == 0, done.stderr
    small = json.loads(run_cli("inspect", str(fits), "--servers", "4", "--json").stdout)["capacity"]
    assert small["kv_tokens_per_server"] == 231_818 and small["servers"] == 4
    assert small["shared_tokens"] == 16 * 1024  # every group's prompt is sent by more than one request
    assert small["working_set"].startswith("they fit in what one server's KV has") and small["load"] < 0.75
    big = run_cli("inspect", str(spread), "--servers", "4")
    fit = json.loads(run_cli("inspect", str(spread), "--servers", "4", "--json").stdout)["capacity"]
    assert fit["shared_tokens"] > 231_818 and "routing matters here" in fit["working_set"]
    assert fit["load"] > 1 and "warning: the offered load is" in big.stdout
    # the rule by hand, for the stats inspect gives
    stats = json.loads(run_cli("inspect", str(spread), "--json").stdout)
    costs = costs_named("llama-2-7b-h200-triton")
    assert costs is not None
    i, o, f = stats["input_len"]["mean"], stats["output_len"]["mean"], stats["prefix"]["reusable_fraction"]
    batch = int(costs.kv_tokens // (i + o))
    per_request = (costs.prefill_per_token_s * i * (1 - f) + costs.prefill_per_token_sq_s * i * i * (1 - f * f)
                   + o * (costs.decode_base_s / batch + costs.decode_per_req_s + costs.decode_per_kv_token_s * (i + o / 2)))
    assert fit["load"] == pytest.approx(stats["mean_rate"] * per_request / 4, rel=1e-9)
    assert offered_load(costs, rate=stats["mean_rate"], input_mean=i, output_mean=o, cached_fraction=f,
                        servers=4, cap=8).batch == 8  # a cap bounds the batch
    assert "--servers" in run_cli("inspect", "--help").stdout


def test_report_shows_kv_beside_the_working_set_and_warns_of_overload(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    assert run_cli("generate", "--workload", "shared-prompt", "--groups", "2", "--prefix-len", "256", "--rate", "200",
                   "--num-requests", "120", "--output-len", "16", "-o", str(trace)).returncode == 0
    done = run_cli("replay", str(trace), "--clock", "virtual", "--max-running-requests", "2", "--run-name", "busy",
                   "--out-dir", str(tmp_path), "--quiet")
    assert done.returncode == 0, done.stderr
    assert "tracebench replay: warning: the trace offers" in done.stderr  # said before the run, too
    assert json.loads((tmp_path / "busy" / "run.json").read_text())["trace"]["prefix"]["shared_tokens"] == 512
    report = " ".join(run_cli("report", str(tmp_path / "busy")).stdout.split())
    assert "KV capacity, all servers (tokens) 231,818" in report
    assert "trace working set (shared blocks, tokens) 512" in report
    assert "run 'busy': the trace offers" in report and "the servers fall behind" in report


def test_readme_routing_examples_use_shared_prefixes() -> None:
    from test_readme import README_BLOCKS

    text = "\n".join(block.text for block in README_BLOCKS if block.skip is None)
    router = next(b for b in README_BLOCKS if "--router sglang-router" in b.text and b.skip is None)
    trace = re.search(r"replay (\S+) ", router.text)[1]  # type: ignore[index]
    made = next(line for line in re.sub(r"\\\n\s*", "", text).splitlines() if f"-o {trace}" in line)
    assert "--workload shared-prompt" in made  # its cache_aware has prefixes to route by (issue 23 item 6)
    assert "--gpus 4" in text and "routing-cache_aware" in text and "inspect traces/routing.jsonl --servers 4" in text


# ---- item 10: one unit, one percentile, and nothing written unsaid --------------------------------------------------

def test_html_says_ms_and_names_the_png_it_writes(four_runs: Path) -> None:
    names = _names(four_runs, 2)
    out = four_runs / "cmp.html"
    done = run_cli("report", *names, "-o", str(out), cwd=four_runs)
    assert done.returncode == 0, done.stderr
    assert f"{out.with_suffix('.png')} (its latency CDFs as an image)" in done.stderr and out.with_suffix(".png").is_file()
    page = out.read_text()
    assert "over completed requests (seconds)" not in page and "shown in ms, as in the tables and plots" in page
    # every latency CDF panel in ms, whatever its range (total latency reaches seconds here)
    for label in ("total", "TTFT from arrival", "server latency, client", "router wait", "TPOT"):
        assert f"{label} (ms)" in page and f"{label} (s)" not in page, label


def test_inspect_percentiles_are_the_reports_and_the_package_installs_without_warnings() -> None:
    from tracebench.trace.inspect import length_stats

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    values = np.array([1, 2, 3, 4, 100])
    stats = length_stats(values)
    assert stats is not None and (stats.p50, stats.p90) == (3.0, pytest.approx(61.6))  # numpy's linear, as the report
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"  # an SPDX string: no deprecated license table
    assert project["build-system"]["requires"] == ["setuptools>=77"]
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    assert "512 in / 128 out" not in readme.split("## Quick tour")[1].split("On GPUs")[0].replace(
        "lognormal lengths, means 512 in / 128 out", "")

"""Replay pieces that need no server: the cap schedule, input ids, option checking, the command line's refusals."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli, run_cli_in_process
from tracebench.policies.registry import load_policy
from tracebench.errors import ConfigError
from tracebench.replay.caps import CapChange, parse_cap_schedule
from tracebench.replay.client import SglangClient
from tracebench.replay.clock import RunClock, VirtualRunClock
from tracebench.replay.loop import run_virtual
from tracebench.replay.records import RecordWriter
from tracebench.replay.flight import HttpSender
from tracebench.replay.summary import ModelledHops
from tracebench.replay.router import OBSERVED_REFRESH_S, Router, ServerState
from tracebench.replay.run import ReplayConfig, plan_servers
from tracebench.replay.tokens import TOKEN_ID_LOW, InputIds, vocab_size_from_model
from tracebench.trace.format import TraceRequest, format_request_line, write_trace

SHA = "0f" * 32


def test_cap_schedule_parses_every_form() -> None:
    changes = parse_cap_schedule("60s:server1=2, 30s:8,45.5:all=3,0.5s:server0=1", num_servers=2)
    assert changes == [
        CapChange(0.5, 0, 1), CapChange(30.0, None, 8), CapChange(45.5, None, 3), CapChange(60.0, 1, 2),
    ]
    # times are trace seconds: at --speed 4 they come 4 times sooner on the run clock
    sped_up = parse_cap_schedule("60s:server1=2,30s:8", num_servers=2, speed=4.0)
    assert sped_up == [CapChange(7.5, None, 8), CapChange(15.0, 1, 2)]


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("30s", "cannot read '30s'"),
        ("30s:server2=4", "no server2"),
        ("30s:0", "must be an integer from 1 to 2"),
        ("x:4", "cannot read 'x:4'"),
        ("10s:server1=-1", "must be an integer from 1 to 2"),
        ("1s:99999999999999999999999", "must be an integer from 1 to 2"),  # issue 33 item 10: crashed run.json
        ("10s:gpu1=3", "cannot read"),
    ],
)
def test_cap_schedule_refuses(spec: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        parse_cap_schedule(spec, num_servers=2)


def _launch_value(command: list[str] | None) -> str | None:
    assert command is not None
    return command[command.index("--max-running-requests") + 1] if "--max-running-requests" in command else None


@pytest.mark.parametrize(
    ("initial", "schedule", "launched"),
    [
        (8, "10s:16,20s:server1=4", "16"),  # a scheduled raise: the server must be able to run 16
        (8, "10s:server1=32,20s:2", "32"),  # the largest cap anywhere in the schedule, on every server
        (8, "10s:4,20s:server0=2", "8"),  # only lowered: the initial cap
        (8, None, "8"),
        (None, "10s:4", None),  # no initial cap: the run starts uncapped, the server keeps its own default
        (None, None, None),
    ],
)
def test_launch_cap_is_the_largest_cap_of_the_run(tmp_path: Path, initial: int | None, schedule: str | None,
                                                  launched: str | None) -> None:
    for backend, extra in (("sglang", {"model": "m"}), ("sim", {})):
        cfg = _cfg(backend=backend, gpus=2, max_running_requests=initial, cap_schedule=schedule, **extra).resolve()
        changes = parse_cap_schedule(schedule, cfg.num_servers) if schedule else []
        plans = plan_servers(cfg, tmp_path, 32000, changes)
        assert [_launch_value(plan.command) for plan in plans] == [launched, launched], backend


def test_input_ids_deterministic_exact_and_in_vocabulary() -> None:
    ids = InputIds(SHA, 32000)
    a = ids.ids(7, 512)
    assert a.shape == (512,) and a.dtype == np.int64
    assert a.min() >= TOKEN_ID_LOW and a.max() < 32000
    assert np.array_equal(a, InputIds(SHA, 32000).ids(7, 512))  # same (trace, id): same ids
    assert not np.array_equal(a, ids.ids(8, 512))  # another request: other ids
    assert not np.array_equal(a, InputIds("1e" * 32, 32000).ids(7, 512))  # another trace: other ids
    assert ids.ids(7, 1).shape == (1,)
    small = InputIds(SHA, 2001).ids(3, 4000)
    assert small.min() >= TOKEN_ID_LOW and small.max() <= 2000
    with pytest.raises(ConfigError, match="too small"):
        InputIds(SHA, 1500)


def test_vocab_size_from_model_config(tmp_path: Path) -> None:
    model = tmp_path / "llama"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 32000}))  # llama-2-7b's
    assert vocab_size_from_model(model) == 32000
    assert vocab_size_from_model(model / "config.json") == 32000
    with pytest.raises(ConfigError, match="no config.json"):
        vocab_size_from_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="vocab_size"):
        vocab_size_from_model(tmp_path)


def _cfg(**kw: object) -> ReplayConfig:
    return ReplayConfig(trace=Path("t.jsonl"), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"batch_size": 4}, "--batch-size is for --mode static"),
        ({"batch_timeout": 1.0, "backend": "sim"}, "--batch-timeout is for --mode static"),
        ({"mode": "static", "backend": "sim"}, "needs --batch-size"),
        ({"attach": ("http://127.0.0.1:1",), "backend": "sim"}, "--backend is for servers tracebench launches"),
        ({"attach": ("http://127.0.0.1:1",), "gpus": 2}, "--gpus 2 with 1 --attach"),
        ({"attach": ("http://127.0.0.1:1",), "speed": 2.0}, "--speed"),
        ({"attach": ("http://127.0.0.1:1",), "server_args": ("--x",)}, "--server-arg"),
        ({"attach": ("http://127.0.0.1:1", "http://127.0.0.1:1")}, "the same URL twice"),
        ({"backend": "sglang", "speed": 2.0, "model": "m"}, "--speed is for --backend sim"),
        ({"backend": "sglang"}, "needs --model"),
        ({}, "needs --model"),  # sglang is the default backend
        ({"backend": "sim", "model": "m"}, "--model is for --backend sglang"),
        ({"backend": "sim", "sjf_key": "input"}, "--sjf-key is an option of --policy sjf"),
        ({"backend": "sim", "policy": "sjf", "sjf_key": "input", "policy_options": (("key", "output"),)}, "say the same thing"),
        ({"backend": "sim", "gpus": 0}, "--gpus must be >= 1"),
        ({"backend": "sim", "timeout": 0.0}, "--timeout must be > 0"),
        ({"backend": "sim", "port_base": 70000}, "--port-base must be a port"),
        ({"backend": "sim", "policy_options": (("a", "1"), ("a", "2"))}, "given twice"),
    ],
)
def test_contradictions_refused(options: dict[str, object], why: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACEBENCH_MODEL", raising=False)
    with pytest.raises(ConfigError, match=why):
        _cfg(**options).resolve()


def test_resolve_fills_defaults() -> None:
    cfg = _cfg(backend="sim").resolve()
    assert (cfg.gpus, cfg.port_base, cfg.startup_timeout) == (1, None, 30.0)  # no --port-base: free ports
    cfg = _cfg(model="m").resolve()
    assert (cfg.backend, cfg.startup_timeout) == ("sglang", 600.0)
    cfg = _cfg(attach=("http://a:1", "http://b:2"), vocab_size=100).resolve()
    assert (cfg.backend, cfg.gpus) == ("attach", 2)
    cfg = _cfg(backend="sim", policy="sjf", sjf_key="input").resolve()
    assert dict(cfg.policy_options) == {"key": "input"}


def test_sglang_model_and_server_args_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """`tracebench replay t.jsonl --gpus 4` works as the user wrote it once TRACEBENCH_MODEL is set; flags win."""
    monkeypatch.setenv("TRACEBENCH_MODEL", "/models/llama-2-7b-hf")
    monkeypatch.setenv("TRACEBENCH_SERVER_ARGS", "--load-format dummy")
    cfg = _cfg(gpus=4).resolve()
    assert (cfg.backend, cfg.model, cfg.server_args) == ("sglang", "/models/llama-2-7b-hf", ("--load-format dummy",))
    cfg = _cfg(model="m", server_args=("--x 1",)).resolve()
    assert (cfg.model, cfg.server_args) == ("m", ("--x 1",))
    cfg = _cfg(backend="sim").resolve()  # the simulator takes neither
    assert (cfg.model, cfg.server_args) == (None, ())
    monkeypatch.delenv("TRACEBENCH_MODEL")
    with pytest.raises(ConfigError, match="TRACEBENCH_MODEL"):
        _cfg(gpus=4).resolve()


def test_cli_refuses_before_anything_starts(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    write_trace(trace, {"num_requests": 1, "duration_s": 0.0}, [format_request_line(0, 0.0, 8, 2)])
    out = tmp_path / "runs"
    for args, why in [
        (["--backend", "sim", "--batch-size", "4"], "--batch-size is for --mode static"),
        (["--backend", "sim", "--policy-opt", "novalue"], "expected KEY=VALUE"),
        (["--backend", "sim", "--policy", "nosuchpolicy"], "unknown policy 'nosuchpolicy'"),
        (["--backend", "sim", "--cap-schedule", "5s:server3=1"], "no server3"),
        (["--attach", "http://127.0.0.1:9", "--model", str(tmp_path)], "no config.json"),
        (["--backend", "sim", "--server-arg", "--port 5"], "tracebench sets --port itself"),
    ]:
        # refused before anything starts (no server, no event loop): answered in this process as the process answers it
        # (conftest.run_cli_in_process; tests/test_cli_in_process.py checks the two answer alike)
        result = run_cli_in_process("replay", str(trace), "--out-dir", str(out), *args)
        assert result.returncode != 0, args
        assert why in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
    assert not out.exists()  # nothing was started, no run folder was made


def test_policies_command_lists_builtins() -> None:
    result = run_cli("policies")
    assert result.returncode == 0, result.stderr
    names = [line.split()[0] for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert names == ["random", "round_robin", "least_outstanding", "sjf", "power_of_two", "param_aware", "cache_aware", "prefix_hash"]


def test_a_release_after_close_is_not_recorded_twice(tmp_path: Path) -> None:
    """The engine runs until it is cancelled after Router.close(); a request it releases meanwhile is already among
    the never-released ones that close() records (seen once as a duplicate id in an interrupted run)."""
    path = tmp_path / "requests.jsonl"
    requests = [TraceRequest(i, 0.5 * i, 8, 2) for i in range(3)]

    async def main() -> None:
        async def slow_health_check(index: int) -> None:
            await asyncio.sleep(30)

        client = SglangClient(None, True)
        writer = RecordWriter(path)
        router = Router(clock=RunClock(), servers=[ServerState(0, "http://127.0.0.1:9", None, True)],
                        policy=load_policy("round_robin", np.random.default_rng(0), {}), sender=HttpSender(client, InputIds(SHA, 32000)), writer=writer,
                        total=len(requests), health_check=slow_health_check, modelled_hops=[ModelledHops(0.0, 0.0)], speed=2.0)
        router.suspect(0, "connection lost")  # a probe under way: close() cancels it and waits for it
        closing = asyncio.ensure_future(router.close(requests[1:], "interrupted (SIGINT)"))
        await asyncio.sleep(0)  # close() runs up to that wait
        router.release(requests[1], 0.25)  # meanwhile the engine, not cancelled yet, releases the next request
        await closing
        writer.close()
        await client.close()

    asyncio.run(main())
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert sorted(r["id"] for r in records) == [1, 2]
    assert all(r["status"] == "not_sent" and r["t_released"] is None for r in records)
    assert all(r["error"] == "not sent: interrupted (SIGINT)" for r in records)
    assert [r["t_arrival"] for r in records] == [0.25, 0.5]  # arrival_s / speed


def test_default_run_name_names_the_policy_only_where_it_decides() -> None:
    from tracebench.replay.run import default_run_name

    policy = load_policy("sjf", np.random.default_rng(0), {})
    assert re.fullmatch(r"t-continuous-1g-\d{8}-\d{6}", default_run_name(_cfg(backend="sim").resolve(), policy))
    capped = _cfg(backend="sim", max_running_requests=4).resolve()  # sjf orders the queue at the cap
    assert default_run_name(capped, policy).startswith("t-sjf-continuous-1g-")
    assert default_run_name(_cfg(backend="sim", gpus=2).resolve(), policy).startswith("t-sjf-continuous-2g-")


def test_policy_time_warning_names_each_kind_of_call() -> None:
    """Issue 33 item 18: the slow-policy warning counted assign and on_complete together ("in 5 calls", "assign p99")."""
    import time as _time

    from tracebench.replay.policy_time import PolicyTime

    timer = PolicyTime("p")
    for _ in range(3):
        timer.call("assign", lambda: None)
    timer.call("on_complete", _time.sleep, 0.03)
    timer.call("on_complete", lambda: None)
    warning = timer.warning()
    assert warning is not None and "assign: 3 call(s)" in warning and "on_complete: 2 call(s)" in warning, warning
    longest = [int(m) for m in re.findall(r"longest call (\d+) ms", warning)]
    assert longest[0] < 20 <= longest[1], warning


def test_recent_completions_are_the_filtered_window() -> None:
    """A server's observed figures come from RecentCompletions, kept as completions come and go; they must be what
    filtering the last OBSERVED_MAX completions by t_finish >= since and sorting gives (completions out of order
    by t_finish, without a TTFT, bursts that overflow OBSERVED_MAX, gaps that empty the window)."""
    import random
    from collections import deque

    from tracebench.replay.router import OBSERVED_MAX, OBSERVED_WINDOW_S, RecentCompletions

    rng = random.Random(1)
    checked = 0
    for _ in range(60):
        recent, plain = RecentCompletions(), deque(maxlen=OBSERVED_MAX)
        t = 0.0
        for _ in range(rng.randrange(1, 900)):
            t += rng.expovariate(rng.choice([1, 10, 100]))
            entry = (t - rng.random() * rng.choice([0, 0.5, 20]), round(rng.random(), 2),
                     None if rng.random() < 0.2 else round(rng.random(), 2))
            recent.add(*entry)
            plain.append(entry)
            if rng.random() < 0.3:
                since = t - OBSERVED_WINDOW_S
                window = [e for e in plain if e[0] >= since]
                recent.expire(since)
                assert len(recent.live) == len(window)
                assert recent.latencies == sorted(e[1] for e in window)
                assert recent.ttfts == sorted(e[2] for e in window if e[2] is not None)
                if window:
                    assert recent.first_t() == window[0][0]
                    checked += 1
    assert checked > 1000


@pytest.mark.parametrize(("reads_age", "reads_observed"), [(True, True), (False, True), (True, False), (False, False)])
def test_the_routers_cached_views_equal_views_made_afresh(tmp_path: Path, reads_age: bool, reads_observed: bool
                                                          ) -> None:
    """Router._views remakes a server's view only where it can have changed (ServerState's setters mark it; reports'
    ages each round, for a policy that reads them; every server once per refresh of the observed figures, for a
    policy that reads them). Through random changes of every field a view shows, at times within and past the
    refresh, the cached views equal views made afresh for every server; for a policy that does not read the ages, but
    for the ages, which are then as of a moment less than the refresh interval ago (any earlier moment when it does
    not read the observed figures either, which are then never computed)."""
    rng = np.random.default_rng(7)

    async def main() -> None:
        client = SglangClient(None, True)
        writer = RecordWriter(tmp_path / "requests.jsonl")
        servers = [ServerState(i, f"http://127.0.0.1:{9 + i}", 4, True) for i in range(6)]
        clock = VirtualRunClock(asyncio.get_running_loop())
        policy = load_policy("round_robin", rng, {})
        policy.reads_report_age = reads_age  # type: ignore[misc]  # the class says False
        policy.reads_observed = reads_observed  # type: ignore[misc]  # the class says False
        router = Router(clock=clock, servers=servers, policy=policy,
                        sender=HttpSender(client, InputIds(SHA, 32000)), writer=writer, total=1,
                        health_check=lambda index: asyncio.sleep(0), modelled_hops=[ModelledHops(0.0, 0.0)] * len(servers))
        remade = 0
        for step in range(600):
            now = clock.now()
            s = servers[int(rng.integers(len(servers)))]
            change = int(rng.integers(6))
            if change == 0:
                s.in_flight += 1
            elif change == 1 and s.in_flight:
                s.in_flight -= 1
                s.recent.add(now, float(rng.uniform(0.1, 2.0)), float(rng.uniform(0.01, 0.2)))
            elif change == 2:
                router.set_cap(s.index, int(rng.integers(1, 8)), "test")
            elif change == 3:
                router.report_load(s.index, (int(rng.integers(9)), int(rng.integers(9)), 0.5, 10.0), (float(step),))
            elif change == 4:
                s.state = "probing" if s.state == "up" else "up"
            await asyncio.sleep(float(rng.choice([0.0, 0.003, 0.04, 0.15])))  # virtual seconds
            now = clock.now()
            cached, free = router._views(now)
            fresh = [router._view(server, now) for server in servers]
            if not reads_age:
                for v, w in zip(cached, fresh):
                    if v.reported is not None:
                        assert 0.0 <= w.reported.age - v.reported.age < (OBSERVED_REFRESH_S if reads_observed
                                                                         else w.reported.age + 1e-9), step
                cached, fresh = [[v._replace(reported=v.reported and v.reported._replace(age=0.0)) for v in views]
                                 for views in (cached, fresh)]
            assert cached == fresh, step
            assert free == [v.free_slots for v in fresh], step
            remade += sum(v is not w for v, w in zip(cached, fresh))
        assert remade > 0
        if reads_observed:
            assert any(v.latency_p50 is not None for v in fresh)  # the completions added show
        else:
            assert all((v.completed_per_s, v.latency_p50, v.ttft_p50) == (0.0, None, None) for v in fresh)
        writer.close()
        await client.close()

    run_virtual(main())


@pytest.mark.parametrize("debug", [False, True])
def test_virtual_loop_handles_behave_as_asyncios(debug: bool) -> None:
    """VirtualLoop makes its handles itself (one frame, not asyncio's four): they run in asyncio's order, in the
    context given, at their time, and cancel, report and fail as asyncio's do; in debug mode asyncio's own methods."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="none")
    seen: list[object] = []
    failures: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_debug(debug)
        loop.set_exception_handler(lambda _loop, context: failures.append(context["message"]))
        var.set("main")
        other = contextvars.copy_context()
        other.run(var.set, "other")
        soon = loop.call_soon(lambda: seen.append(("soon", loop.time(), var.get())))
        later = loop.call_later(0.5, lambda: seen.append(("later", loop.time(), var.get())))
        at = loop.call_at(0.25, lambda: seen.append(("at", loop.time(), var.get())), context=other)
        gone = loop.call_at(0.1, seen.append, "cancelled")
        gone.cancel()
        loop.call_soon(lambda: 1 / 0)
        assert type(soon) is asyncio.Handle and type(later) is asyncio.TimerHandle and later.when() == 0.5
        assert gone.cancelled() and "cancelled" in repr(gone) and "when=0.25" in repr(at)
        await asyncio.sleep(1.0)
        assert loop.time() == 1.0

    from tracebench.replay.loop import OWN_HANDLES
    assert OWN_HANDLES  # this Python's handles are the ones VirtualLoop makes itself: the test runs its own path
    run_virtual(main())
    assert seen == [("soon", 0.0, "main"), ("at", 0.25, "other"), ("later", 0.5, "main")]
    assert len(failures) == 1 and failures[0].startswith("Exception in callback"), failures


def test_virtual_run_collects_young_objects_less_often_and_puts_the_thresholds_back() -> None:
    import gc

    from tracebench.replay.loop import VIRTUAL_GC_YOUNG

    before = gc.get_threshold()

    async def inside() -> tuple[int, int, int]:
        return gc.get_threshold()

    async def fails() -> None:
        raise RuntimeError("boom")

    assert run_virtual(inside()) == (VIRTUAL_GC_YOUNG, *before[1:])
    assert gc.get_threshold() == before
    with pytest.raises(RuntimeError, match="boom"):
        run_virtual(fails())
    assert gc.get_threshold() == before

"""Each built-in routing policy against hand-built server views and queues: its defining behaviour, and the rules
every policy must keep (only healthy servers with a free slot, each request once, work left only when all are full)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
import pytest

from tracebench.errors import ConfigError
from tracebench.policies import UNCAPPED, Policy, QueuedRequest, ReportedLoad, ServerView
from tracebench.policies.registry import builtin_policies, load_policy
from tracebench.policies.sjf import ShortestJobFirstPolicy


def server(
    index: int,
    in_flight: int = 0,
    cap: int = UNCAPPED,
    healthy: bool = True,
    reported: ReportedLoad | None = None,
    latency_p50: float | None = None,
    latency_p90: float | None = None,
    ttft_p50: float | None = None,
    completed_per_s: float = 0.0,
) -> ServerView:
    return ServerView(
        index=index, url=f"http://127.0.0.1:{30000 + index}", healthy=healthy, in_flight=in_flight, cap=cap,
        completed_per_s=completed_per_s, latency_p50=latency_p50, latency_p90=latency_p90, ttft_p50=ttft_p50,
        reported=reported,
    )


def report(running: int = 0, waiting: int = 0, usage: float = 0.0, throughput: float = 0.0) -> ReportedLoad:
    return ReportedLoad(num_running_reqs=running, num_waiting_reqs=waiting, token_usage=usage,
                        gen_throughput=throughput, age=0.2)


def request(id: int, output_len: int = 100, input_len: int = 100, t: float | None = None) -> QueuedRequest:
    t = float(id) if t is None else t
    return QueuedRequest(id=id, input_len=input_len, output_len=output_len, t_arrival=t, t_released=t)


def make(name: str, seed: int = 0, **options: str) -> Policy:
    return load_policy(name, np.random.default_rng(seed), options)


def check_rules(picks: list, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> None:
    """The router's rules, plus: requests stay queued only when no server has a free slot."""
    ids = [req.id for req, _ in picks]
    assert len(ids) == len(set(ids)), "a request assigned twice"
    queued = {req.id: req for req in queue}
    assert all(queued.get(req.id) is req for req, _ in picks), "assigned a request not in the queue"
    given = Counter(srv.index for _, srv in picks)
    by_index = {s.index: s for s in servers}
    for index, count in given.items():
        assert by_index[index].healthy, f"assigned to unhealthy server {index}"
        assert count <= by_index[index].free_slots, f"server {index} got {count} > {by_index[index].free_slots}"
    assert len(picks) == min(len(queue), sum(s.free_slots for s in servers)), "left work queued with slots free"


def run_single(policy: Policy, servers: list[ServerView], n: int) -> list[int]:
    """`n` calls with one queued request each, on unchanging views; the server index chosen each time."""
    chosen = []
    for i in range(n):
        queue = [request(i)]
        picks = policy.assign(queue, servers)
        check_rules(picks, queue, servers)
        chosen.append(picks[0][1].index)
    return chosen


ALL = sorted(builtin_policies()) + ["policies/example_least_loaded.py:LeastLoaded",
                                    "policies/example_sticky_prefix.py:StickyFirstBlock"]


@pytest.mark.parametrize("name", ALL)
def test_rules_hold_on_random_scenarios(name: str) -> None:
    scenario_rng = np.random.default_rng(1234)
    policy = make(name, seed=7)
    for _ in range(400):
        servers = []
        for index in range(int(scenario_rng.integers(1, 6))):
            cap = int(scenario_rng.choice([1, 2, 4, UNCAPPED]))
            has_latency = bool(scenario_rng.random() < 0.6)
            servers.append(server(
                index, in_flight=int(scenario_rng.integers(0, 6)), cap=cap,
                healthy=bool(scenario_rng.random() < 0.8),
                reported=report(int(scenario_rng.integers(0, 5)), int(scenario_rng.integers(0, 3)),
                                float(scenario_rng.random()), float(scenario_rng.random() * 1000))
                if scenario_rng.random() < 0.7 else None,
                latency_p50=float(scenario_rng.random()) if has_latency else None,
                latency_p90=float(scenario_rng.random()) + 1 if has_latency else None,
                ttft_p50=float(scenario_rng.random()) / 10 if has_latency else None,
            ))
        queue = [request(i, output_len=int(scenario_rng.integers(1, 500)), input_len=int(scenario_rng.integers(1, 500)))
                 for i in range(int(scenario_rng.integers(0, 12)))]
        check_rules(policy.assign(queue, servers), queue, servers)


@pytest.mark.parametrize("name", ALL)
def test_everything_waits_when_no_server_has_a_free_slot(name: str) -> None:
    servers = [server(0, in_flight=2, cap=2), server(1, in_flight=5, cap=3), server(2, healthy=False)]
    assert make(name).assign([request(0), request(1)], servers) == []


@pytest.mark.parametrize("name", ALL)
def test_never_an_unhealthy_or_full_server(name: str) -> None:
    servers = [server(0, healthy=False), server(1, in_flight=4, cap=4), server(2, in_flight=9, cap=10), server(3)]
    policy = make(name, seed=3)
    for _ in range(50):
        queue = [request(i) for i in range(3)]
        picks = policy.assign(queue, servers)
        check_rules(picks, queue, servers)
        assert len(picks) == 3 and all(s.index in (2, 3) for _, s in picks)
        assert sum(1 for _, s in picks if s.index == 2) <= 1


# round_robin -------------------------------------------------------------------------------------------------------
def test_round_robin_alternates() -> None:
    servers = [server(0), server(1)]
    assert run_single(make("round_robin"), servers, 6) == [0, 1, 0, 1, 0, 1]


def test_round_robin_within_one_call_and_across_calls() -> None:
    policy = make("round_robin")
    servers = [server(0), server(1), server(2)]
    queue = [request(i) for i in range(4)]
    assert [s.index for _, s in policy.assign(queue, servers)] == [0, 1, 2, 0]
    assert [s.index for _, s in policy.assign([request(9)], servers)] == [1]


def test_round_robin_skips_full_and_unhealthy() -> None:
    servers = [server(0), server(1, in_flight=2, cap=2), server(2), server(3, healthy=False)]
    assert run_single(make("round_robin"), servers, 5) == [0, 2, 0, 2, 0]


def test_round_robin_same_turns_in_any_server_order() -> None:
    # in index order the server whose turn it is is looked at alone; in any other order every open server is: both
    # give the same turns, a server filling up within the call included
    servers = [server(0, cap=2), server(1, cap=1), server(2), server(3, healthy=False)]
    for order in (servers, servers[::-1], [servers[2], servers[0], servers[3], servers[1]]):
        queue = [request(i) for i in range(7)]
        picks = make("round_robin").assign(queue, order)
        check_rules(picks, queue, order)
        assert [s.index for _, s in picks] == [0, 1, 2, 0, 2, 2, 2]


# least_outstanding -------------------------------------------------------------------------------------------------
def test_least_outstanding_balances() -> None:
    servers = [server(0, in_flight=3), server(1, in_flight=0), server(2, in_flight=1)]
    picks = make("least_outstanding").assign([request(i) for i in range(5)], servers)
    after = Counter({s.index: s.in_flight for s in servers})
    after.update(s.index for _, s in picks)
    assert [s.index for _, s in picks] == [1, 1, 2, 1, 2]  # ties go to the lowest index
    assert max(after.values()) - min(after.values()) <= 1


def test_least_outstanding_respects_caps() -> None:
    servers = [server(0, in_flight=0, cap=1), server(1, in_flight=3, cap=8)]
    picks = make("least_outstanding").assign([request(i) for i in range(3)], servers)
    assert [s.index for _, s in picks] == [0, 1, 1]


# sjf ---------------------------------------------------------------------------------------------------------------
def test_sjf_picks_the_shortest_queued_job_first() -> None:
    queue = [request(0, output_len=500), request(1, output_len=20), request(2, output_len=80), request(3, output_len=20)]
    servers = [server(0, in_flight=3, cap=4), server(1, in_flight=4, cap=4)]
    picks = make("sjf").assign(queue, servers)
    assert [(r.id, s.index) for r, s in picks] == [(1, 0)]  # one free slot: the shortest, the older of the tie
    servers = [server(0, in_flight=2, cap=4), server(1, in_flight=3, cap=4)]
    picks = make("sjf").assign(queue, servers)
    assert [r.id for r, _ in picks] == [1, 3, 2]
    assert [s.index for _, s in picks] == [0, 0, 1]  # each to the least loaded server with a free slot


def test_sjf_key_input() -> None:
    queue = [request(0, input_len=900, output_len=1), request(1, input_len=10, output_len=999)]
    servers = [server(0, in_flight=0, cap=1)]
    assert make("sjf").assign(queue, servers)[0][0].id == 0
    assert make("sjf", key="input").assign(queue, servers)[0][0].id == 1
    assert make("sjf", key="input").describe()["settings"] == {"key": "input"}


def test_sjf_is_fcfs_when_every_request_fits() -> None:
    queue = [request(0, output_len=500), request(1, output_len=20)]
    picks = make("sjf").assign(queue, [server(0), server(1)])
    assert {r.id for r, _ in picks} == {0, 1}


def test_sjf_long_queue_only_the_free_slots_go() -> None:
    lengths = np.random.default_rng(5).integers(1, 10_000, size=2000)
    queue = [request(i, output_len=int(n)) for i, n in enumerate(lengths)]
    servers = [server(0, in_flight=6, cap=8), server(1, in_flight=7, cap=8)]
    picks = make("sjf").assign(queue, servers)
    assert sorted(r.output_len for r, _ in picks) == sorted(int(n) for n in lengths)[:3]


def test_sjf_bad_key() -> None:
    with pytest.raises(ConfigError, match="key='tokens'.*output, input"):
        make("sjf", key="tokens")


# random ------------------------------------------------------------------------------------------------------------
def test_random_is_uniform_within_bounds() -> None:
    n, servers = 30_000, [server(0), server(1), server(2), server(3, in_flight=1, cap=1)]
    counts = Counter(run_single(make("random", seed=11), servers, n))
    assert counts[3] == 0
    expected = n / 3
    chi2 = sum((counts[i] - expected) ** 2 / expected for i in range(3))
    assert chi2 < 13.8  # chi-square, 2 degrees of freedom: p = 0.001


def test_random_is_deterministic_for_a_seed() -> None:
    servers = [server(i) for i in range(4)]
    first = run_single(make("random", seed=42), servers, 200)
    assert first == run_single(make("random", seed=42), servers, 200)
    assert first != run_single(make("random", seed=43), servers, 200)


# power_of_two ------------------------------------------------------------------------------------------------------
def test_power_of_two_takes_the_less_loaded_of_its_two_draws() -> None:
    # three servers: every draw of two holds the idle one or the 5-loaded one, never only the 9-loaded one.
    servers = [server(0, in_flight=0), server(1, in_flight=5), server(2, in_flight=9)]
    n = 6000
    counts = Counter(run_single(make("power_of_two", seed=1), servers, n))
    assert counts[2] == 0  # the most loaded loses every pair it is drawn into
    # server 0 is in 2 of the 3 possible pairs and wins both; server 1 wins only the pair {1, 2}
    assert abs(counts[0] / n - 2 / 3) < 0.03 and abs(counts[1] / n - 1 / 3) < 0.03


def test_power_of_two_tie_broken_by_reported_load_when_both_reported() -> None:
    servers = [server(0, in_flight=2, reported=report(running=2, waiting=6)),
               server(1, in_flight=2, reported=report(running=2, waiting=0))]
    assert set(run_single(make("power_of_two"), servers, 50)) == {1}
    # one side has no report: the reported numbers are not compared; the tie goes to the first draw (random)
    servers = [server(0, in_flight=2, reported=None), server(1, in_flight=2, reported=report(running=2, waiting=0))]
    assert set(run_single(make("power_of_two"), servers, 50)) == {0, 1}


def test_power_of_two_counts_its_own_picks_in_one_call() -> None:
    picks = make("power_of_two").assign([request(i) for i in range(6)], [server(0), server(1)])
    assert Counter(s.index for _, s in picks) == {0: 3, 1: 3}


# param_aware -------------------------------------------------------------------------------------------------------
def test_param_aware_prefers_lower_reported_load() -> None:
    policy = make("param_aware")
    busy, calm = report(running=8, waiting=4, usage=0.7, throughput=400), report(running=2, usage=0.1, throughput=200)
    servers = [server(0, in_flight=2, reported=busy), server(1, in_flight=2, reported=calm)]
    assert run_single(policy, servers, 3) == [1, 1, 1]
    servers = [server(0, in_flight=2, reported=calm), server(1, in_flight=2, reported=busy)]
    assert run_single(policy, servers, 3) == [0, 0, 0]


def test_param_aware_prefers_better_observed_latency() -> None:
    servers = [server(0, in_flight=1, latency_p50=2.0, ttft_p50=0.05),
               server(1, in_flight=1, latency_p50=0.5, ttft_p50=0.30)]
    assert run_single(make("param_aware"), servers, 2) == [1, 1]
    assert run_single(make("param_aware", latency="ttft"), servers, 2) == [0, 0]
    assert run_single(make("param_aware", w_latency="0"), servers, 2) == [0, 0]  # tie: the lowest index


def test_param_aware_prefers_faster_decode_per_running_request() -> None:
    servers = [server(0, in_flight=4, reported=report(running=4, throughput=200)),   # 50 tok/s per request
               server(1, in_flight=4, reported=report(running=4, throughput=800))]   # 200 tok/s per request
    assert run_single(make("param_aware"), servers, 2) == [1, 1]


def test_param_aware_missing_report_drops_reported_terms_for_all() -> None:
    # server 1 has no report yet: its absence must not read as "idle". Reported terms are left out for both,
    # so the router's in-flight count decides.
    servers = [server(0, in_flight=1, reported=report(running=1, waiting=9, usage=0.9)),
               server(1, in_flight=3, reported=None)]
    assert run_single(make("param_aware"), servers, 1) == [0]
    costs = make("param_aware").costs(servers, {0: 1, 1: 3})  # type: ignore[attr-defined]
    assert costs == {0: pytest.approx(1 / 3), 1: pytest.approx(1.0)}


def test_param_aware_missing_latency_drops_the_latency_term() -> None:
    servers = [server(0, in_flight=0, latency_p50=None), server(1, in_flight=1, latency_p50=0.1)]
    costs = make("param_aware").costs(servers, {0: 0, 1: 1})  # type: ignore[attr-defined]
    assert costs == {0: 0.0, 1: pytest.approx(1.0)}


def test_param_aware_balances_in_flight_within_one_call() -> None:
    picks = make("param_aware").assign([request(i) for i in range(8)], [server(0), server(1)])
    assert Counter(s.index for _, s in picks) == {0: 4, 1: 4}


@pytest.mark.parametrize("options, match", [
    ({"w_usage": "-1"}, "w_usage='-1'.*>= 0"),
    ({"w_usage": "heavy"}, "w_usage='heavy'"),
    ({"w_speed": "nan"}, "w_speed='nan'"),
    ({"latency": "p99"}, "latency='p99'.*p50, p90, ttft"),
    ({"w_tokens": "1"}, "unknown option.*w_tokens.*accepts: latency, w_in_flight"),
])
def test_param_aware_bad_options(options: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        make("param_aware", **options)


def test_param_aware_settings_recorded() -> None:
    settings = make("param_aware", w_usage="2.5").describe()["settings"]
    assert settings["w_usage"] == 2.5 and settings["w_in_flight"] == 1.0 and settings["latency"] == "p50"


def test_builtins_refuse_unknown_options() -> None:
    for name in builtin_policies():
        with pytest.raises(ConfigError, match=f"policy '{name}': unknown option"):
            make(name, bogus="1")
    assert isinstance(make("sjf"), ShortestJobFirstPolicy)


def test_every_builtin_has_a_name_and_one_line_description() -> None:
    for name, cls in builtin_policies().items():
        assert cls.name == name and cls.description and "\n" not in cls.description

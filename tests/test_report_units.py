"""Report pieces that need no run folder: the bootstrap shortcut against plain resampling, busy-time union, the
--slo parser, and the CLI's import hygiene."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from tracebench.errors import ConfigError
from tracebench.report.metrics import _busy_time, _integral_of_count, bootstrap_percentile, parse_slo


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("n", [7, 60, 301])
def test_bootstrap_shortcut_has_the_distribution_of_plain_resampling(q: float, n: int) -> None:
    rng = np.random.default_rng(n)
    values = np.sort(np.round(rng.lognormal(0, 1, n), 2))  # rounded: ties, like real stamps
    resamples = 20_000
    fast = bootstrap_percentile(values, q, resamples, np.random.default_rng(1))
    plain = np.quantile(values[rng.integers(0, n, (resamples, n))], q, axis=1)
    # the same distribution: its quantiles agree within Monte-Carlo noise
    for level in (0.025, 0.25, 0.5, 0.75, 0.975):
        a, b = np.quantile(fast, level), np.quantile(plain, level)
        spread = np.quantile(plain, 0.975) - np.quantile(plain, 0.025)
        assert abs(a - b) <= 0.08 * spread + 1e-12, (level, a, b, spread)
    assert abs(fast.mean() - plain.mean()) <= 0.03 * spread + 1e-12


def test_bootstrap_is_seeded() -> None:
    values = np.sort(np.random.default_rng(0).exponential(1, 500))
    a = bootstrap_percentile(values, 0.9, 100, np.random.default_rng([1, 2]))
    b = bootstrap_percentile(values, 0.9, 100, np.random.default_rng([1, 2]))
    assert np.array_equal(a, b)


def test_busy_time_is_the_union_of_intervals() -> None:
    rng = np.random.default_rng(3)
    starts = rng.uniform(0, 100, 400)
    ends = starts + rng.exponential(0.2, 400)
    grid = np.linspace(0, 101, 1_010_001)  # 0.1 ms resolution
    covered = np.zeros(grid.size, dtype=bool)
    for s, e in zip(starts, ends):
        covered[np.searchsorted(grid, s):np.searchsorted(grid, e)] = True
    assert _busy_time(starts, ends) == pytest.approx(covered.sum() * (grid[1] - grid[0]), abs=0.05)
    assert _busy_time(np.array([0.0, 1.0, 1.5]), np.array([2.0, 1.2, 3.0])) == pytest.approx(3.0)
    assert _busy_time(np.empty(0), np.empty(0)) == 0.0


def test_integral_of_count_matches_a_direct_sum() -> None:
    rng = np.random.default_rng(4)
    starts = rng.uniform(0, 10, 50)
    ends = starts + rng.uniform(0, 3, 50)
    at = np.array([0.0, 2.5, 5.0, 13.0])
    direct = [sum(max(0.0, min(t, e) - min(t, s)) for s, e in zip(starts, ends)) for t in at]
    assert np.allclose(_integral_of_count(starts, ends, at), direct)


def test_slo_spec() -> None:
    assert parse_slo("ttft=0.5,total=10") == {"ttft": 0.5, "total": 10.0}
    assert parse_slo(" tpot = 50ms , server=2s,wait=1e-1") == {"tpot": 0.05, "server": 2.0, "wait": 0.1}
    for bad, why in (("ttft", "KEY=SECONDS"), ("ttft=1,ttft=2", "given twice"), ("e2e=1", "unknown key"),
                     ("ttft=-1", "not a duration"), ("ttft=0ms", "must be > 0"), ("ttft=1h", "not a duration")):
        with pytest.raises(ConfigError, match=why):
            parse_slo(bad)


def test_cli_help_does_not_import_polars_or_matplotlib() -> None:
    code = ("import sys, tracebench.report.commands; "
            "bad = [m for m in ('polars', 'matplotlib', 'numpy') if m in sys.modules]; assert not bad, bad")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_short_run_labels_keep_what_differs() -> None:
    from tracebench.report.render import short_labels

    auto = ["t-random-continuous-2g-20261124-132705", "t-round_robin-continuous-2g-20261124-132700",
            "t-sjf-continuous-2g-20261124-132702"]
    assert short_labels(auto) == ["random", "round_robin", "sjf"]  # the date and time go when the rest tells apart
    same_policy = ["t-sjf-continuous-2g-20261124-132705", "t-sjf-continuous-2g-20261124-132800"]
    assert short_labels(same_policy) == ["132705", "132800"]
    assert short_labels(["wide", "narrow"]) == ["wide", "narrow"]
    assert short_labels(["a-b", "c"]) == ["a-b", "c"]  # not split alike: whole


def _meta(servers: int, caps: list, port_base: int, policy: str = "random") -> dict:
    return {
        "backend": "sim", "speed": None, "mode": "continuous", "batch_size": None, "gpu_names": [],
        "policy": {"name": policy, "options": {}},
        "servers": [{"gpu": None, "version": "0.5.17", "server_info": {"tracebench_sim": {"accelerator": "NVIDIA H200"}}}
                    for _ in range(servers)],
        "caps": {"initial": caps, "changes": []}, "trace": {"path": "t.jsonl"},
        "options": {"port_base": port_base, "control_port": None, "startup_timeout": 30.0, "seed": 0},
    }


def test_what_changed_leaves_out_settings_that_change_nothing_measured() -> None:
    from tracebench.report.metrics import config_of, diff_config

    diff = diff_config([_meta(2, [None, None], 30000), _meta(2, [None, None], 31000)])
    assert diff.changed == []  # only --port-base differs: nothing measured changed
    assert not any(key in ("--port-base", "--control-port", "--startup-timeout") for key, _ in diff.same)
    # one server, no cap: the policy decides nothing, and the settings say so; with a cap it orders the queue
    assert config_of(_meta(1, [None], 30000))["policy"] == "random (no effect: 1 server, no cap)"
    assert config_of(_meta(1, [4], 30000))["policy"] == "random"
    assert config_of(_meta(2, [None, None], 30000))["gpu model"] == "NVIDIA H200 (simulated)"


def test_itl_buckets_reconstruct_gaps_within_one_percent() -> None:
    from tracebench.itl import FLOOR_S, HIST_PATTERN, ItlGaps, bucket_of, bucket_value, parse_hist

    gaps = np.random.default_rng(5).lognormal(np.log(0.007), 1.5, 20_000)
    for gap in gaps:
        if gap >= FLOOR_S:
            assert abs(bucket_value(bucket_of(gap)) / gap - 1) <= 0.0100001
    assert bucket_of(0.0) == bucket_of(FLOOR_S / 2) == 0 and bucket_value(0) == 0.0
    acc = ItlGaps()
    for gap in gaps[:100]:
        acc.add(float(gap))
    largest, text = acc.fields()
    hist = parse_hist(text)
    assert re.fullmatch(HIST_PATTERN, text) and largest == gaps[:100].max()
    assert sum(n for _, n in hist) == 100 and [b for b, _ in hist] == sorted({bucket_of(float(g)) for g in gaps[:100]})
    assert ItlGaps().fields() == (None, None)


def test_itl_sure_range_is_its_bucket_and_nearly_all_of_it() -> None:
    """itl.sure_range (a decode run's gaps bucketed without a log each): every gap strictly inside it is in its
    bucket by bucket_of, and it is the bucket's whole range but for a billionth at each end."""
    import math

    from tracebench.itl import FLOOR_S, GROWTH, bucket_of, sure_range

    rng = np.random.default_rng(7)
    for bucket in range(0, 1200):
        lo, hi = sure_range(bucket)
        if bucket == 0:
            assert (lo, hi) == (-math.inf, FLOOR_S)
            continue
        start, end = FLOOR_S * GROWTH ** (bucket - 1), FLOOR_S * GROWTH ** bucket
        assert start < lo < start * (1 + 2e-9) and end * (1 - 2e-9) < hi < end
        inside = [math.nextafter(lo, math.inf), math.nextafter(hi, 0.0), *rng.uniform(lo, hi, 20)]
        assert all(bucket_of(float(gap)) == bucket for gap in inside), bucket


def test_pooled_itl_sums_every_pair_across_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CSV read of itl_hist (slices of ITL_SLICE records, joined and read as pairs of integers) against a plain
    per-record sum: same counts per bucket, hence the same statistics; records without gaps are left out."""
    import polars as pl

    from tracebench.itl import bucket_value, parse_hist
    from tracebench.report.metrics import pooled_itl, stats as stats_module

    monkeypatch.setattr(stats_module, "ITL_SLICE", 4_096)  # the slicing as of a big run, on a small one
    rng = np.random.default_rng(3)
    n = 2 * 4_096 + 1_000  # three slices, the last one short
    first = rng.integers(0, 900, n).tolist()  # ascending buckets from here, 1-5 of them, counts of 1 to 4 digits
    steps = rng.integers(1, 40, (n, 5)).tolist()
    widths = rng.integers(1, 6, n).tolist()
    counts = rng.integers(1, 2_000, (n, 5)).tolist()
    hists: list[str | None] = [
        None if i % 97 == 0 else ",".join(f"{b}:{c}" for b, c in zip(np.cumsum([first[i], *steps[i][:widths[i] - 1]]),
                                                                     counts[i][:widths[i]]))
        for i in range(n)]
    frame = pl.DataFrame({"itl_hist": hists, "itl_max": rng.uniform(0.01, 0.1, n)})
    stats, n_requests, zero = pooled_itl(frame, None)
    pooled: dict[int, int] = {}
    for text in hists:
        for b, count in parse_hist(text) if text is not None else ():
            pooled[b] = pooled.get(b, 0) + count
    total = sum(pooled.values())
    assert n_requests == sum(text is not None for text in hists)
    assert zero == pooled.get(0, 0) / total
    mean = sum(bucket_value(b) * c for b, c in pooled.items()) / total
    assert stats["mean"] == pytest.approx(mean, rel=1e-12)
    # the order statistics the percentiles rest on, from the plain sums (no 100-million-value array)
    values = [bucket_value(b) for b in sorted(pooled)]
    ends = np.cumsum([pooled[b] for b in sorted(pooled)])
    for name, q in (("p50", 0.5), ("p99", 0.99)):
        h = (total - 1) * q
        j = int(h)
        low, high = (values[int(np.searchsorted(ends, k, side="right"))] for k in (j, j + 1))
        assert stats[name] == pytest.approx(low + (h - j) * (high - low), rel=1e-12)


@pytest.mark.parametrize("ids, distinct", [([3, 1, 2, 0], True), ([0, 5, 5], False), ([0, -1, 2], False),
                                           ([0, 10**12], False), ([7], True)])
def test_ids_shown_distinct_by_counting_only_when_they_are(ids: list[int], distinct: bool) -> None:
    """The loader's shortcut for the id rule: True only for distinct ids in a countable range; anything else is
    left to the rule (which names the line)."""
    import polars as pl

    from tracebench.report.load import _ids_distinct

    assert _ids_distinct(pl.Series(ids, dtype=pl.Int64)) is distinct

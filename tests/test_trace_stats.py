"""Statistics of what generate makes, through the library: arrival rates and gap CVs, length means, the clamp.

Bounds are several standard errors wide for the sample sizes used (the draws are seeded, so the tests are
deterministic; the bounds say what a correct generator must satisfy for any seed)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from tracebench.errors import ConfigError
from tracebench.trace.arrivals import arrivals_by_count, arrivals_by_duration
from tracebench.trace.format import read_columns
from tracebench.trace.generate import GenerateArgs, generate_trace
from tracebench.trace.inspect import trace_stats
from tracebench.trace.lengths import clamp_to_context, make_distribution, sample_lengths

N = 200_000


def test_poisson_rate_within_confidence_bound_and_gap_cv_near_1() -> None:
    rate = 25.0
    gaps = np.diff(arrivals_by_count("poisson", rate, N + 1, np.random.default_rng(3)))
    # mean gap of N exponential gaps: standard error (1/rate)/sqrt(N); allow 5 of them
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / math.sqrt(N)
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.02
    assert (gaps >= 0).all()


@pytest.mark.parametrize("burstiness", [0.5, 2.0, 4.0])
def test_gamma_gap_cv_near_burstiness_at_the_asked_rate(burstiness: float) -> None:
    rate = 10.0
    gaps = np.diff(arrivals_by_count("gamma", rate, N + 1, np.random.default_rng(5), burstiness))
    assert abs(gaps.std() / gaps.mean() - burstiness) < 0.08 * burstiness
    assert abs(gaps.mean() * rate - 1.0) < 5 * burstiness / math.sqrt(N)


def test_constant_arrivals_are_exact_and_duration_cuts_at_the_span() -> None:
    arrivals = arrivals_by_count("constant", 3.0, 10, np.random.default_rng(0))
    assert arrivals.tolist() == [i / 3.0 for i in range(10)]
    spanned = arrivals_by_duration("constant", 3.0, 10.0, np.random.default_rng(0))
    assert len(spanned) == 30 and spanned[-1] < 10.0
    poisson = arrivals_by_duration("poisson", 50.0, 400.0, np.random.default_rng(1))
    assert poisson[0] == 0.0 and poisson[-1] < 400.0 and (np.diff(poisson) >= 0).all()
    assert abs(len(poisson) - 20_000) < 5 * math.sqrt(20_000)  # Poisson count: sd sqrt(rate * duration)


@pytest.mark.parametrize(("dist", "spread"), [
    ("fixed", None), ("uniform", 0.5), ("uniform", 0.1), ("normal", 0.5), ("normal", 1.0), ("lognormal", 0.5),
    ("lognormal", 2.0), ("zipf", 8.0), ("zipf", 2.5),
])
@pytest.mark.parametrize("mean", [128, 1000])
def test_each_length_distribution_has_the_asked_mean(dist: str, spread: float | None, mean: int) -> None:
    lengths = sample_lengths(make_distribution(dist, mean, spread), N, np.random.default_rng(11))
    assert lengths.dtype == np.int64 and lengths.min() >= 1
    cv = float(lengths.std() / lengths.mean())
    # standard error of the mean is cv*mean/sqrt(N) (< 1 % for every case here); allow 6 of them and 0.5 % rounding
    assert abs(lengths.mean() - mean) < 6 * cv * mean / math.sqrt(N) + 0.005 * mean
    if dist in ("uniform", "lognormal"):
        assert abs(cv - spread) < 0.1 * spread  # there the spread is the CV itself
    if dist == "zipf":
        assert lengths.max() <= round(spread * mean)


def test_distribution_arguments_that_cannot_work_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="does not apply to --length-dist fixed"):
        make_distribution("fixed", 100, 0.5)
    with pytest.raises(ConfigError, match="goes below 1"):
        make_distribution("uniform", 100, 0.7)
    with pytest.raises(ConfigError, match="at most 1"):
        make_distribution("normal", 100, 1.5)
    with pytest.raises(ConfigError, match="at least twice the mean"):
        make_distribution("zipf", 100, 1.5)
    with pytest.raises(ConfigError, match="no room to vary"):
        make_distribution("lognormal", 1, 0.5)


def test_clamp_keeps_the_prompt_and_shortens_the_answer() -> None:
    clamped = clamp_to_context(np.array([100, 3000, 5000, 4095]), np.array([50, 2000, 10, 1]), 4096)
    assert clamped.input_len.tolist() == [100, 3000, 4089, 4089]  # sglang 0.5.17 serves at most context - 7
    assert clamped.output_len.tolist() == [50, 1094, 5, 1]  # input + output <= context - 2 (sglang's clip)
    assert (clamped.clamped, clamped.input_cut) == (3, 2)


def test_generated_trace_respects_max_context_and_inspect_agrees(tmp_path: Path) -> None:
    result = generate_trace(GenerateArgs(rate=40.0, num_requests=20_000, input_len=1500, output_len=500,
                                         length_dist="lognormal", length_spread=1.0, max_context=4096, seed=2),
                            tmp_path / "t.jsonl")
    _, columns = read_columns(result.path)
    total = columns.input_len + columns.output_len
    assert total.max() <= 4094  # sglang generates the whole answer only up to context - 2
    clamped = result.header["clamped_requests"]
    assert 0 < clamped < 20_000 * 0.1
    assert int((total == 4094).sum()) >= clamped  # a clamped request fills the context exactly (less those 2)
    stats = trace_stats(result.path)
    assert stats.requests == 20_000
    assert abs(stats.mean_rate - 40.0) < 5 * 40.0 / math.sqrt(20_000)
    assert abs(stats.gap_cv - 1.0) < 0.05
    assert stats.input_len.max <= 4095 and stats.output_len.max <= 4095
    assert stats.input_len.mean == pytest.approx(columns.input_len.mean())

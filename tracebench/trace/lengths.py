"""Request length distributions (input and output tokens) and the context clamp.

Every distribution is asked for a mean (`--input-len` / `--output-len`) and honours it: the expected value of the
integer lengths it draws is that mean. `--length-spread` says how wide it is; its meaning depends on the distribution:

- fixed:     every length is the mean. No spread.
- uniform:   spread = coefficient of variation (std / mean). Integers drawn uniformly from mean - w .. mean + w with
             w = round(sqrt(3) * spread * mean), so the low end must stay >= 1 (spread < 0.577).
- normal:    spread = std / mean of the normal before truncation. Draws below 0.5 are redrawn (lengths >= 1) and the
             normal's centre is moved down so that the truncated mean is still the asked mean. 0 < spread <= 1.
- lognormal: spread = coefficient of variation (std / mean) of the lognormal: sigma_log = sqrt(ln(1 + spread^2)),
             mu_log = ln(mean) - sigma_log^2 / 2. Heavy right tail, like real prompt and answer lengths.
- zipf:      spread = the longest length as a multiple of the mean (>= 2). Lengths k = 1 .. round(spread * mean)
             with P(k) proportional to k^-a; the exponent a is solved so that the mean is the asked mean. A larger
             spread gives more short requests and a longer tail.

Continuous draws are rounded to the nearest integer. Defaults for --length-spread: DEFAULT_SPREAD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tracebench.errors import ConfigError

LENGTH_DISTS = ("fixed", "uniform", "normal", "lognormal", "zipf")
DEFAULT_SPREAD: dict[str, float] = {"uniform": 0.5, "normal": 0.5, "lognormal": 0.5, "zipf": 8.0}
# Zipf samples by inverse CDF over its whole support: keep the table a few tens of MB at most.
MAX_ZIPF_SUPPORT = 1 << 22
# The widest lognormal (std / mean): far beyond it spread^2 overflows (near 1e154) and the cap below cuts the tail.
MAX_LOGNORMAL_SPREAD = 100.0
# Continuous draws are capped here before becoming integers (far above any context; the clamp then applies).
_LENGTH_CAP = float(1 << 40)
# Normal draws below this are redrawn: rounded, they would be 0.
_NORMAL_FLOOR = 0.5


@dataclass(frozen=True)
class LengthDistribution:
    """A validated length distribution. `params` are the derived parameters (recorded in the trace header)."""

    dist: str
    mean: int
    spread: float | None
    params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"dist": self.dist, "mean": self.mean, "spread": self.spread, **({"params": self.params} if self.params else {})}


def make_distribution(dist: str, mean: int, spread: float | None, what: str = "length") -> LengthDistribution:
    """Validate and solve the parameters. `spread` None means the distribution's default. `what` names the flag
    in error messages (e.g. "--input-len")."""
    if dist not in LENGTH_DISTS:
        raise ConfigError(f"--length-dist must be one of {', '.join(LENGTH_DISTS)}, got {dist!r}")
    if isinstance(mean, bool) or not isinstance(mean, int) or mean < 1:
        raise ConfigError(f"{what} must be an integer >= 1, got {mean!r}")
    if dist == "fixed":
        if spread is not None:
            raise ConfigError("--length-spread does not apply to --length-dist fixed (every length is the mean)")
        return LengthDistribution(dist, mean, None)
    if mean < 2:
        raise ConfigError(f"{what} {mean}: a mean of 1 leaves no room to vary (lengths are >= 1); use --length-dist fixed")
    if spread is None:
        spread = DEFAULT_SPREAD[dist]
    if not (math.isfinite(spread) and spread > 0):
        raise ConfigError(f"--length-spread must be a number > 0, got {spread!r}")
    if dist == "uniform":
        half_width = round(math.sqrt(3.0) * spread * mean)
        if mean - half_width < 1:
            raise ConfigError(f"--length-spread {spread:g} is too wide for uniform lengths around {what} {mean}: "
                              f"the range {mean - half_width}..{mean + half_width} goes below 1 "
                              f"(uniform allows spread up to {(mean - 1) / (math.sqrt(3.0) * mean):.3f} here)")
        return LengthDistribution(dist, mean, spread, {"low": mean - half_width, "high": mean + half_width})
    if dist == "normal":
        if spread > 1:
            raise ConfigError(f"--length-spread {spread:g} is too wide for normal lengths (at most 1); "
                              f"use --length-dist lognormal for wider spreads")
        sigma = spread * mean
        return LengthDistribution(dist, mean, spread, {"mu": _solve_truncated_normal_mu(mean, sigma), "sigma": sigma,
                                                       "redrawn_below": _NORMAL_FLOOR})
    if dist == "lognormal":
        if spread > MAX_LOGNORMAL_SPREAD:
            raise ConfigError(f"--length-spread {spread:g} is too wide for lognormal lengths (at most "
                              f"{MAX_LOGNORMAL_SPREAD:g}: the tail would be cut at {_LENGTH_CAP:.0f} tokens, or "
                              f"overflow, and the mean not kept)")
        sigma_log = math.sqrt(math.log1p(spread * spread))
        return LengthDistribution(dist, mean, spread, {"mu_log": math.log(mean) - sigma_log * sigma_log / 2,
                                                       "sigma_log": sigma_log})
    # zipf
    support = round(spread * mean)
    if support < 2 * mean - 1:
        raise ConfigError(f"--length-spread {spread:g} is too small for zipf lengths: the longest length "
                          f"({support}) must be at least twice the mean ({what} {mean}); use spread >= 2")
    if support > MAX_ZIPF_SUPPORT:
        raise ConfigError(f"zipf lengths up to {support} tokens (--length-spread {spread:g} x {what} {mean}) are "
                          f"more than the {MAX_ZIPF_SUPPORT} supported")
    return LengthDistribution(dist, mean, spread, {"exponent": _solve_zipf_exponent(mean, support), "max": support})


def sample_lengths(dist: LengthDistribution, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` integer lengths >= 1 (int64)."""
    p = dist.params
    if dist.dist == "fixed":
        return np.full(count, dist.mean, dtype=np.int64)
    if dist.dist == "uniform":
        return rng.integers(p["low"], p["high"] + 1, count, dtype=np.int64)
    if dist.dist == "normal":
        values = rng.normal(p["mu"], p["sigma"], count)
        low = np.flatnonzero(values < _NORMAL_FLOOR)
        while low.size:  # redraw exactly the truncated ones (a deterministic continuation of the stream)
            values[low] = rng.normal(p["mu"], p["sigma"], low.size)
            low = low[values[low] < _NORMAL_FLOOR]
        return _to_lengths(values)
    if dist.dist == "lognormal":
        return _to_lengths(rng.lognormal(p["mu_log"], p["sigma_log"], count))
    cdf = _zipf_cdf(p["exponent"], p["max"])
    return np.searchsorted(cdf, rng.random(count), side="right").astype(np.int64) + 1


def _to_lengths(values: np.ndarray) -> np.ndarray:
    return np.maximum(np.floor(np.minimum(values, _LENGTH_CAP) + 0.5), 1.0).astype(np.int64)


def _normal_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2.0))


def _truncated_normal_mean(mu: float, sigma: float) -> float:
    """Mean of N(mu, sigma) conditioned on >= _NORMAL_FLOOR."""
    alpha = (_NORMAL_FLOOR - mu) / sigma
    pdf = math.exp(-0.5 * alpha * alpha) / math.sqrt(2.0 * math.pi)
    return mu + sigma * pdf / _normal_sf(alpha)


def _solve_truncated_normal_mu(mean: float, sigma: float) -> float:
    """The centre mu whose truncated mean is `mean` (the truncated mean grows with mu: bisection)."""
    low, high = _NORMAL_FLOOR - 10.0 * sigma, float(mean)
    for _ in range(200):
        mid = (low + high) / 2
        if _truncated_normal_mean(mid, sigma) < mean:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _zipf_weights(exponent: float, support: int) -> np.ndarray:
    return np.exp(-exponent * np.log(np.arange(1, support + 1, dtype=np.float64)))


def _zipf_cdf(exponent: float, support: int) -> np.ndarray:
    cdf = np.cumsum(_zipf_weights(exponent, support))
    cdf /= cdf[-1]
    cdf[-1] = 1.0  # random() < 1, so every draw lands inside the support
    return cdf


def _solve_zipf_exponent(mean: float, support: int) -> float:
    """The exponent a >= 0 with mean `mean` over 1..support (the mean falls as a grows: bisection)."""
    ks = np.arange(1, support + 1, dtype=np.float64)
    log_ks = np.log(ks)
    low, high = 0.0, 64.0
    for _ in range(64):
        mid = (low + high) / 2
        weights = np.exp(-mid * log_ks)
        if float(ks @ weights) / float(weights.sum()) > mean:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True)
class Clamped:
    """Lengths after the context clamp. `clamped` requests changed, of which `input_cut` also lost prompt tokens
    (`input_cut_mask` marks them)."""

    input_len: np.ndarray
    output_len: np.ndarray
    clamped: int
    input_cut: int
    input_cut_mask: np.ndarray


# sglang 0.5.17 refuses a prompt of context_len - 6 tokens or more (its scheduler's max_req_input_len is
# context_len - 6; a 4096-context model serves prompts of at most 4089 tokens): .DUCUMENT/failure-modes.md.
PROMPT_RESERVE = 7
# ...and generates at most context_len - 2 - input_len tokens: it clips max_new_tokens to max_req_len - input_len - 1
# with max_req_len = context_len - 1 (scheduler.py L2132-2141, tp_worker.py L509-513 of 0.5.17), although it answers
# 200 up to input_len + max_new_tokens = context_len. A trace asks only for what sglang generates in full.
OUTPUT_RESERVE = 2


def clamp_to_context(input_len: np.ndarray, output_len: np.ndarray, max_context: int) -> Clamped:
    """Make every request one sglang serves in full: input_len + output_len <= max_context - OUTPUT_RESERVE (4094
    for a 4096 context) and input_len <= max_context - PROMPT_RESERVE (4089). The prompt is kept and the answer
    shortened (output_len = max_context - 2 - input_len): the prompt is what the user sent. Only a prompt longer than
    max_context - PROMPT_RESERVE is cut to that length (its output_len then at most PROMPT_RESERVE - OUTPUT_RESERVE,
    5). Only requests this changes are counted as clamped."""
    if max_context <= PROMPT_RESERVE:
        raise ConfigError(f"--max-context must be more than {PROMPT_RESERVE} (sglang keeps {PROMPT_RESERVE - 1} "
                          f"positions of the context from the prompt), got {max_context}")
    longest_prompt = max_context - PROMPT_RESERVE
    longest_request = max_context - OUTPUT_RESERVE
    input_cut_mask = input_len > longest_prompt
    over = ((input_len + output_len) > longest_request) | input_cut_mask
    new_input = np.minimum(input_len, longest_prompt)
    new_output = np.minimum(output_len, longest_request - new_input)
    return Clamped(new_input, new_output, int(over.sum()), int(input_cut_mask.sum()), input_cut_mask)

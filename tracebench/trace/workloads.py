"""Synthetic workloads with shared prompt prefixes (`tracebench generate --workload ...`, docs/trace-format.md).

- shared-prompt: G groups, each with a system prompt of L tokens; each request picks a group (uniform or zipf) and
  adds its own question tokens. The group's prompt is its first L // block_size blocks (the same ids in every request
  of the group); the rest of the prompt is blocks of the request's own.
- multi-turn: S sessions of T turns. A session is one stream of tokens, user_1 answer_1 user_2 answer_2 ...; turn k's
  prompt is the stream's first P_k = P_{k-1} + answer_{k-1} + user_k tokens, its blocks the stream's first
  ceil(P_k / block_size) blocks (ids of the session's own). Since a request's partial last block holds the first
  tokens of its block, turn k starts with exactly turn k-1's prompt; the answer tokens that follow are the trace's, not
  what the server generated, so a server's cache serves turn k at most turn k-1's prompt.

Block ids are consecutive integers handed out in a fixed order (groups first, then requests in order; sessions in
order), so the same arguments give the same ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tracebench.errors import ConfigError
from tracebench.trace.lengths import PROMPT_RESERVE, Clamped, clamp_to_context

WORKLOADS = ("shared-prompt", "multi-turn")
GROUP_DISTS = ("uniform", "zipf")
THINK_DISTS = ("exponential", "fixed", "uniform")


@dataclass(frozen=True)
class WorkloadRequests:
    """Requests in trace order (arrival order): arrivals, lengths as clamped to the context, optional fields
    (`extras[i]`: prefix_blocks first, then the closed-loop fields, then the informational group / session / turn)
    and what the header says about the workload."""

    arrivals: np.ndarray
    lengths: Clamped
    extras: list[dict[str, Any]]
    info: dict[str, Any]


def check_think(dist: str, mean_s: float) -> None:
    if dist not in THINK_DISTS:
        raise ConfigError(f"--think-dist must be one of {', '.join(THINK_DISTS)}, got {dist!r}")
    if not (np.isfinite(mean_s) and mean_s > 0):
        raise ConfigError(f"--think-time must be a number of seconds > 0, got {mean_s!r}")


def think_times(dist: str, mean_s: float, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Seconds between a turn and the next: exponential (mean `mean_s`), fixed, or uniform on [0, 2 * mean_s]."""
    check_think(dist, mean_s)
    if dist == "exponential":
        return rng.exponential(mean_s, shape)
    if dist == "uniform":
        return rng.uniform(0.0, 2.0 * mean_s, shape)
    return np.full(shape, float(mean_s))


def pick_groups(groups: int, dist: str, exponent: float | None, count: int, rng: np.random.Generator) -> np.ndarray:
    """Group of each request: uniform over 0..G-1, or zipf P(g) ~ (g+1)^-exponent (group 0 the most popular)."""
    if dist == "uniform":
        return rng.integers(0, groups, count)
    weights = np.arange(1, groups + 1, dtype=np.float64) ** -float(exponent)  # type: ignore[arg-type]
    cdf = np.cumsum(weights) / weights.sum()
    cdf[-1] = 1.0
    return np.searchsorted(cdf, rng.random(count), side="right").astype(np.int64)


def shared_prompt(arrivals: np.ndarray, questions: np.ndarray, output_len: np.ndarray, group: np.ndarray,
                  groups: int, prefix_len: int, block_size: int, max_context: int) -> WorkloadRequests:
    """Prompt = the group's prefix_len tokens + the request's question tokens, clamped to the context."""
    clamp = clamp_to_context(prefix_len + questions, output_len, max_context)
    shared = prefix_len // block_size  # whole blocks of the group's prompt: the same ids across the group
    counts = -(-clamp.input_len // block_size)
    own = np.maximum(counts - shared, 0)
    next_own = groups * shared + np.cumsum(own) - own  # first own id of each request
    extras = []
    for g, n, k, first in zip(group.tolist(), counts.tolist(), own.tolist(), next_own.tolist()):
        blocks = list(range(g * shared, g * shared + min(n, shared))) + list(range(first, first + k))
        extras.append({"prefix_blocks": blocks, "group": g})
    info = {"groups": groups, "prefix_len": prefix_len, "shared_blocks_per_group": shared,
            "shared_tokens_per_group": shared * block_size}
    return WorkloadRequests(arrivals, clamp, extras, info)


def multi_turn(starts: np.ndarray, user_len: np.ndarray, answer_len: np.ndarray, think: np.ndarray,
               block_size: int, max_context: int, closed_loop: bool) -> WorkloadRequests:
    """`user_len`, `answer_len`: (S, T) tokens of each turn as drawn; `think`: (S, T-1) seconds after each turn.
    A session ends early at the first turn whose prompt no longer fits the context (prompt > max_context - 7, the
    longest sglang accepts); turn 1 is always kept (clamped like any request)."""
    sessions, turns = user_len.shape
    # prompt of turn k = everything before it in the session's stream + its user tokens
    stream_before = np.concatenate([np.zeros((sessions, 1), np.int64),
                                    np.cumsum(user_len + answer_len, axis=1)[:, :-1]], axis=1)
    prompt = stream_before + user_len
    kept = prompt <= max_context - PROMPT_RESERVE
    kept[:, 0] = True
    kept = np.logical_and.accumulate(kept, axis=1)
    times = starts[:, None] + np.concatenate([np.zeros((sessions, 1)), np.cumsum(think, axis=1)], axis=1)

    session_of, turn_of = np.nonzero(kept)  # session-major: a session's turns in order
    clamp = clamp_to_context(prompt[kept], answer_len[kept], max_context)
    # session s owns the block ids base[s] .. base[s] + (blocks of its longest kept prompt) - 1
    counts = -(-clamp.input_len // block_size)
    last_turn = np.zeros(sessions, dtype=np.int64)
    np.maximum.at(last_turn, session_of, np.arange(session_of.size))
    session_blocks = counts[last_turn]
    base = np.cumsum(session_blocks) - session_blocks
    # trace order: arrival time, then session, then turn (a turn never comes before its predecessor)
    order = np.lexsort((turn_of, session_of, times[kept]))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)  # row (session-major) -> id
    extras = []
    for row in order.tolist():
        s, k = int(session_of[row]), int(turn_of[row])
        start = int(base[s])
        extra: dict[str, Any] = {"prefix_blocks": list(range(start, start + int(counts[row])))}
        if closed_loop and k > 0:
            extra["after"] = int(rank[row - 1])  # the previous turn is the previous row of the session
            extra["delay_s"] = round(float(think[s, k - 1]), 6)
        extra["session"] = s
        extra["turn"] = k + 1
        extras.append(extra)
    turns_kept = kept.sum(axis=1)
    info = {"sessions": sessions, "turns": turns, "sessions_cut_short": int((turns_kept < turns).sum()),
            "turns_dropped": int(sessions * turns - turns_kept.sum()), "closed_loop": closed_loop}
    in_order = Clamped(clamp.input_len[order], clamp.output_len[order], clamp.clamped, clamp.input_cut,
                       clamp.input_cut_mask[order])
    return WorkloadRequests(times[kept][order], in_order, extras, info)

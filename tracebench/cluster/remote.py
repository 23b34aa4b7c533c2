"""What the replay's Ray actors share (replay/ray_fleet.py's servers, replay/ray_senders.py's senders): a remote
clock's offset measured NTP-style, how an actor that ended is named, an error's first line. It imports no ray: the
callers hand it the module."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CLOCK_SAMPLES = 8


def clock_offset(read_remote: Callable[[], float], read_here: Callable[[], float],
                 same_node: bool) -> tuple[float, float, float]:
    """(round trip, offset, applied offset) of a remote clock against this process's: CLOCK_SAMPLES round trips
    through `read_remote`, the one with the shortest kept (offset = remote - the midpoint of `read_here` around it,
    uncertain by half that round trip). Applied when larger than its uncertainty: another machine's clock (an
    offset of seconds or days: always applied); an actor on this process's node shares its clock (0, exact)."""
    samples = []
    for _ in range(CLOCK_SAMPLES):
        before = read_here()
        remote = read_remote()
        after = read_here()
        samples.append((after - before, remote - (before + after) / 2))
    round_trip, offset = min(samples)
    applied = 0.0 if same_node or abs(offset) <= round_trip / 2 else offset
    return round_trip, offset, applied


def actor_lost(ray: Any, err: BaseException, where: str) -> str:
    """An actor whose call failed with Ray's actor error (its node removed, or the actor killed), in words.
    Unavailable: its connection closed (a node going away, seen first); died: the cluster declared it dead."""
    state = "is unreachable" if isinstance(err, ray.exceptions.ActorUnavailableError) else "died"
    return f"lost {where}: its Ray actor {state} ({first_line(err)})"


def first_line(err: BaseException) -> str:
    """A Ray error (whose text carries a whole remote traceback) as one short line."""
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0][:300]}" if text else type(err).__name__

"""The routing policy API. A policy sees the router queue and a read-only view of each server and returns
assignments; everything it does not assign stays queued. Guide: docs/policies.md.

    from tracebench.policies import Policy, QueuedRequest, ServerView

    class ShortestQueueFirst(Policy):
        name = "shortest_queue"
        description = "each waiting request to the server with the fewest requests in flight"

        def assign(self, queue, servers):
            picks, load = [], {s.index: s.in_flight for s in servers}
            for req in queue:                       # oldest first
                free = [s for s in servers if s.healthy and load[s.index] < s.cap]
                if not free:
                    break                           # the rest wait at the router
                best = min(free, key=lambda s: load[s.index])
                picks.append((req, best))
                load[best.index] += 1
            return picks
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple, TypeVar

import numpy as np

from tracebench.errors import ConfigError, PolicyError
from tracebench.paths import portable_path

T = TypeVar("T")

UNCAPPED = 1 << 30  # the cap a server has when none was set


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request waiting in the router queue (made once, when it enters). Time waited so far:
    `policy.now - req.t_released`.

    `prefix_blocks`: the prompt as the trace's block ids (None when the trace gives none for it), `block_size`
    tokens each except possibly the last, which holds `input_len - (len(prefix_blocks) - 1) * block_size` tokens.
    Two requests whose first k block ids agree send the same first k blocks of tokens, so a server that served one
    may hold those tokens in its prefix cache. `block_size` is the trace header's (None when the trace has none).
    Both come last, with defaults, so positional construction of the first five fields keeps working."""

    id: int
    input_len: int
    output_len: int
    t_arrival: float  # scheduled arrival, seconds since run start
    t_released: float  # when it entered the router queue
    prefix_blocks: tuple[int, ...] | None = None  # the prompt's block ids (trace `prefix_blocks`)
    block_size: int | None = None  # tokens per block (trace header `block_size`)


class ReportedLoad(NamedTuple):
    """What the server itself last reported (sglang `/v1/loads`), and how old that report is (seconds). Read-only
    (a named tuple: the router makes one per server per assignment round, so it must be cheap to make)."""

    num_running_reqs: int
    num_waiting_reqs: int
    token_usage: float
    gen_throughput: float
    age: float


def slots_left(cap: int, in_flight: int, healthy: bool) -> int:
    """How many more requests the router may send to a server now (ServerView.free_slots; the router's own check)."""
    return max(0, cap - in_flight) if healthy else 0


def free_slots_text(views: Sequence[ServerView]) -> str:
    """What `views` had free, as a message says it: the capped servers' free slots and how many healthy servers have
    no cap (an uncapped server's free_slots is UNCAPPED: summed, it said "2147483648 free slot(s)")."""
    uncapped = sum(1 for v in views if v.cap >= UNCAPPED and v.healthy)
    capped = [v for v in views if v.cap < UNCAPPED]
    parts = [f"{sum(v.free_slots for v in capped)} free slot(s)"] if capped or not uncapped else []
    if uncapped:
        parts.append(f"{uncapped} healthy uncapped server(s) (no slot limit)")
    return " and ".join(parts)


class ServerView(NamedTuple):
    """A read-only snapshot of one server, taken when `assign` is called (a named tuple: the router makes one per
    server per assignment round, ~0.4 us against ~2 us for a frozen dataclass, which a fleet of 1,024 servers feels).

    `in_flight` counts requests tracebench has sent and not yet seen finish; `cap` is the router cap in force
    (UNCAPPED when none). The observed figures are over tracebench's recent window of this server's completions
    (None until there is one). `reported` is None until the server's first load report arrived.
    """

    index: int
    url: str
    healthy: bool
    in_flight: int
    cap: int
    completed_per_s: float
    latency_p50: float | None
    latency_p90: float | None
    ttft_p50: float | None
    reported: ReportedLoad | None

    @property
    def free_slots(self) -> int:
        """How many more requests the router may send here now (0 when at or over the cap, or unhealthy)."""
        # slots_left's rule inlined: policies read this for every server at every call
        return self.cap - self.in_flight if self.healthy and self.cap > self.in_flight else 0


Assignment = tuple[QueuedRequest, ServerView]


class Policy:
    """Base class of routing policies.

    Subclasses set `name` and `description` and implement `assign`. The router calls `assign` when a request
    arrives and when a slot frees (and after a cap change). Rules, checked by the router (a violation stops the
    run with a PolicyError naming the policy): each request at most once, only requests from `queue`, only healthy
    servers, never more requests to a server than its `free_slots`.

    `self.rng` is a numpy Generator seeded from the run's seed: a random policy makes the same choices for the
    same run. `self.options` holds the `--policy-opt key=value` options given on the command line (strings); a
    policy accepts exactly the keys of its `options_help` (anything else is a ConfigError when it is made), and
    reads them with `self.option(key, default, parse)`. `self.now` is the run clock (seconds since start) at the
    moment `assign` is called. `queue` is the router's own queue, oldest first: read it, never change it.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    # option key -> one line saying what it does and its default (shown by `tracebench policies`)
    options_help: ClassVar[dict[str, str]] = {}
    # whether `assign` reads `ServerView.reported.age`. True: every call gets each report's age as of that call,
    # which remakes every reporting server's view at every call (a 64-server fleet: ~45 us a call). A policy that
    # never reads it may say False: a view is then remade only when what else it shows changed (and every 0.1 s),
    # and `age` is as of that moment (docs/policies.md)
    reads_report_age: ClassVar[bool] = True
    # whether `assign` reads a view's observed figures (completed_per_s, latency_p50, latency_p90, ttft_p50). False:
    # the router neither keeps nor computes them (completed_per_s 0.0, the others None), and does not remake every
    # server's view for them every 0.1 s (1,024 servers: ~4% of a virtual run); with reads_report_age False too, a
    # view's `reported.age` is then as of its last remake (docs/policies.md)
    reads_observed: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # the two flags are a promise about the class's own code: a subclass that does not repeat them (a user's
        # subclass of a built-in that reads `age`) gets the safe default True, not its parent's False
        super().__init_subclass__(**kwargs)
        for flag in ("reads_report_age", "reads_observed"):
            if flag not in cls.__dict__:
                setattr(cls, flag, True)

    def __init__(self, rng: np.random.Generator, options: dict[str, str] | None = None) -> None:
        self.rng = rng
        self.options: dict[str, str] = dict(options or {})
        self.now = 0.0
        self.settings: dict[str, Any] = {}  # every option read with option(), as used (defaults included)
        unknown = sorted(set(self.options) - set(self.options_help))
        if unknown:
            accepted = ", ".join(sorted(self.options_help)) or "none"
            raise ConfigError(
                f"policy {self.name or type(self).__name__!r}: unknown option(s) {', '.join(unknown)} "
                f"(it accepts: {accepted})"
            )

    def option(self, key: str, default: T, parse: Callable[[str], T]) -> T:
        """The option `key` parsed with `parse`, or `default` when it was not given. `parse` raises ValueError on a
        bad value; that becomes a ConfigError naming the policy, the key and the value."""
        if key not in self.options_help:
            raise PolicyError(f"policy {self.name!r} reads option {key!r} but does not declare it in options_help")
        if key not in self.options:
            self.settings[key] = default
            return default
        raw = self.options[key]
        try:
            value = parse(raw)
        except ValueError as err:
            raise ConfigError(f"policy {self.name!r}: option {key}={raw!r}: {err}") from err
        self.settings[key] = value
        return value

    def assign(self, queue: Sequence[QueuedRequest], servers: Sequence[ServerView]) -> list[Assignment]:
        raise NotImplementedError(f"{type(self).__name__}.assign")

    def on_complete(self, request_id: int, server_index: int, ok: bool) -> None:
        """Called when a dispatched request finished (ok or not). Optional; the default does nothing."""

    def describe(self) -> dict[str, Any]:
        """What run.json records about this policy: `options` as given, `settings` as used (defaults included), and
        the file that defines it with its sha256 (a user's policy file may change between runs)."""
        source = Path(inspect.getfile(type(self)))
        # a built-in as tracebench/policies/<name>.py wherever tracebench is installed; a user's file relative to the
        # working folder, or only its name when elsewhere (tracebench/paths.py): the sha256 identifies it
        package = Path(__file__).resolve().parents[1]
        roots = (package.parent,) if source.resolve().is_relative_to(package) else ()
        return {
            "name": self.name,
            "class": type(self).__qualname__,
            "file": portable_path(source, roots),
            "file_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
            "options": self.options,
            "settings": self.settings,
        }

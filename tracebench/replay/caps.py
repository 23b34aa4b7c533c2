"""Per-server caps changed during a run: the `--cap-schedule` spec and the localhost control endpoint's socket (its
HTTP server, with aiohttp, is control.py: a virtual run has none).

sglang 0.5.17 cannot change `--max-running-requests` after launch, so the run-time cap lives in tracebench's router:
raising it admits more at once, lowering it below the in-flight count admits nothing more on that server until it
drains below the cap. Both sources call `Router.set_cap`, which records every change in run.json.
"""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass

from tracebench.errors import ConfigError
from tracebench.options import INT64_MAX
from tracebench.replay.clock import RunClock, run_seconds

_ITEM = re.compile(r"^\s*(?P<t>\d+(?:\.\d*)?|\.\d+)s?\s*:\s*(?:(?P<target>all|server(?P<index>\d+))\s*=\s*)?(?P<cap>[+-]?\d+)\s*$")


@dataclass(frozen=True, slots=True)
class CapChange:
    """At run time `t` (seconds), set the cap of `server` (None: every server) to `cap`."""

    t: float
    server: int | None
    cap: int


def parse_cap_schedule(spec: str, num_servers: int, speed: float = 1.0) -> list[CapChange]:
    """`"30s:8,60s:server1=2"`: at 30 s every server's cap becomes 8, at 60 s server 1's becomes 2. A bare cap or
    `all=N` means every server; times are trace seconds (the `s` is optional), on the run clock at `speed`:
    `CapChange.t` = time / speed. Sorted by time, stable."""
    changes = []
    for item in spec.split(","):
        match = _ITEM.match(item)
        if match is None:
            raise ConfigError(
                f"--cap-schedule: cannot read {item.strip()!r} (expected TIMEs:CAP, TIMEs:all=CAP or TIMEs:serverI=CAP, "
                f"e.g. \"30s:8,60s:server1=2\")"
            )
        index = None if match["index"] is None else int(match["index"])
        if index is not None and index >= num_servers:
            raise ConfigError(f"--cap-schedule: {item.strip()!r}: there is no server{index} (servers are 0..{num_servers - 1})")
        cap = int(match["cap"])
        if not 1 <= cap <= INT64_MAX:
            raise ConfigError(f"--cap-schedule: {item.strip()!r}: the cap must be an integer from 1 to 2^63-1, got {cap}")
        changes.append(CapChange(t=run_seconds(float(match["t"]), speed), server=index, cap=cap))
    return sorted(changes, key=lambda c: c.t)


def launch_cap(initial: int | None, changes: list[CapChange]) -> int | None:
    """The `--max-running-requests` for the servers tracebench launches: the largest cap the run can use, i.e. the
    initial cap or a larger one of the schedule. sglang cannot raise its own value after launch, so a schedule that
    raises the cap needs it at launch; the router enforces each cap in force. None (no initial cap: the run starts
    uncapped) passes nothing, and the server keeps its own default."""
    if initial is None:
        return None
    return max([initial, *(change.cap for change in changes)])


SetCap = Callable[[int | None, int, str], None]  # (server or None for all, cap, source)


async def run_cap_schedule(changes: list[CapChange], clock: RunClock, set_cap: SetCap) -> None:
    """Apply each change at its run time (absolute schedule, like request releases)."""
    for change in changes:
        while (delay := change.t - clock.now()) > 0:
            await asyncio.sleep(delay)
        set_cap(change.server, change.cap, "schedule")


def bind_control_socket(port: int | None) -> socket.socket:
    """The control endpoint's listening socket on 127.0.0.1 (port None: a free one). A taken port fails fast."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port or 0))
    except OSError as err:
        sock.close()
        raise ConfigError(f"--control-port {port}: cannot listen on 127.0.0.1:{port} ({err.strerror})") from None
    sock.listen(16)
    return sock

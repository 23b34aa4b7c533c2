"""What runs beside the requests: the `/v1/loads` poller (telemetry.jsonl, and what policies see as
`ServerView.reported`) and the progress line on stderr."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import IO, Any, Protocol, runtime_checkable

import numpy as np
import orjson

from tracebench.errors import ServerProtocolError
from tracebench.replay.client import Fetched, SglangClient
from tracebench.replay.clock import RunClock, ticks
from tracebench.replay.records import AppendFile
from tracebench.replay.router import Router

_LOAD_FIELDS = ("num_running_reqs", "num_waiting_reqs", "token_usage", "gen_throughput")


def parse_loads(url: str, obj: Any) -> tuple[int, int, float, float]:
    """`/v1/loads` -> (num_running_reqs, num_waiting_reqs, token_usage, gen_throughput) over its `loads` entries
    (one per data-parallel rank: counts and throughput summed, token usage averaged)."""
    loads = obj.get("loads") if isinstance(obj, dict) else None
    if not isinstance(loads, list) or not loads:
        raise ServerProtocolError(f"{url}: no 'loads' list in the answer: {orjson.dumps(obj)[:300]!r}")
    values = {name: 0.0 for name in _LOAD_FIELDS}
    for i, entry in enumerate(loads):
        for name in _LOAD_FIELDS:
            value = entry.get(name) if isinstance(entry, dict) else None
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise ServerProtocolError(f"{url}: field 'loads[{i}].{name}' missing or not a number ({value!r})")
            values[name] += value
    return (
        int(values["num_running_reqs"]),
        int(values["num_waiting_reqs"]),
        values["token_usage"] / len(loads),
        values["gen_throughput"],
    )


def snapshot_stamps(url: str, obj: Any) -> tuple[float, ...]:
    """The `timestamp` of each `loads` entry of a `/v1/loads` answer checked by `parse_loads`: when the server's
    scheduler wrote that snapshot (.DUCUMENT/endpoints.md); a new one shows the scheduler at work (Router.report_load)."""
    stamps = []
    for i, entry in enumerate(obj["loads"]):
        stamp = entry.get("timestamp")
        if not isinstance(stamp, (int, float)) or isinstance(stamp, bool):
            raise ServerProtocolError(f"{url}: field 'loads[{i}].timestamp' missing or not a number ({stamp!r})")
        stamps.append(float(stamp))
    return tuple(stamps)


POLL_SPREAD_S = 0.002  # one /v1/loads GET of a poll round this long after the one before


async def _get_loads(client: SglangClient, url: str, timeout: float, delay: float) -> Any:
    if delay > 0:
        await asyncio.sleep(delay)
    return await client.get_json(url, timeout)


Load = tuple[int, int, float, float]  # parse_loads'


def _read_loads(url: str, obj: Any) -> tuple[Load, tuple[float, ...]]:
    """A good `/v1/loads` body's figures and snapshot stamps (what `LoadsAtOnce.loads_now` gives)."""
    return parse_loads(url, obj), snapshot_stamps(url, obj)


@runtime_checkable
class LoadsAtOnce(Protocol):
    """A client that gives a server's `/v1/loads` at once, as read (replay/inprocess.py's, whose servers are in this
    process): `loads_now(url)` is (`parse_loads`, `snapshot_stamps`) of what awaiting `get_json(url, ...)` gives,
    without the body and without a turn of the loop."""

    def loads_now(self, url: str) -> tuple[Load, tuple[float, ...]]: ...


async def _loads_at_once(client: LoadsAtOnce, urls: list[str]) -> list[tuple[Load, tuple[float, ...]]]:
    """What gathering a task per GET (`_get_loads`, no delay) gives when each is answered at once, at the same turns
    of the loop without the tasks (a poll of 1,024 servers made 1,024 of them): the answers a turn on, where the
    tasks would run; the poller back two turns later (the tasks' done callbacks, then gather's wake-up of its
    awaiter), so the order of events at equal times is as it was. Nothing to get: no turn, as gather of nothing."""
    if not urls:
        return []
    await asyncio.sleep(0)
    got = [client.loads_now(url) for url in urls]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return got


async def poll_loads(client: SglangClient, router: Router, clock: RunClock, interval: float, path: Path) -> None:
    """Every `interval` run seconds (absolute ticks; a slow poll skips ticks rather than drifting), ask every
    server that is not down for `/v1/loads` (the GETs POLL_SPREAD_S apart), hand the numbers to the router and append one line per server to
    telemetry.jsonl. A poll without a good answer is reported to the router (`poll_failed`), which decides whether
    to check the server's health. A write that fails (disk full) stops the run (records.AppendFile)."""
    timeout = max(2.0, 4 * interval)
    at_once = client if isinstance(client, LoadsAtOnce) else None  # in-process servers: no task, no body per GET
    with AppendFile(path, router.fail, flush_lines=1) as fh:
        async for _ in ticks(clock, interval):
            servers = router.servers
            live = [s for s in servers if s.state != "down"]
            # the GETs spread over a short window (POLL_SPREAD_S apart, within a quarter of the interval), not sent
            # at one instant: their answers, read at once, were a burst of work on the router's loop that the
            # releases due then waited for (32 servers: release lag p99 of 4-7 ms on a 16-core host)
            # (not on the virtual clock: its host time is no part of the measurement, and its runs stay as they were)
            gap = 0.0 if clock.virtual else min(POLL_SPREAD_S, interval / 4 / max(len(live), 1))
            # each live server's (load, snapshot stamps), or its Fetched when there was no good answer
            answers: list[tuple[Load, tuple[float, ...]] | Fetched]
            if at_once is not None and gap == 0.0:
                answers = list(await _loads_at_once(at_once, [f"{s.url}/v1/loads" for s in live]))
            else:
                fetched = await asyncio.gather(*(_get_loads(client, f"{s.url}/v1/loads", timeout, k * gap)
                                                 for k, s in enumerate(live)))
                answers = [f if f.error is not None else _read_loads(f"{s.url}/v1/loads", f.obj)
                           for s, f in zip(live, fetched)]
            results = {s.index: got for s, got in zip(live, answers)}
            t = clock.now()
            queue = router.queued
            caps = router.caps()
            lines = []
            for s in servers:
                line: dict[str, Any] = {
                    "t": t, "server": s.index, "healthy": s.state == "up", "in_flight": s.in_flight,
                    "cap": caps[s.index], "router_queue": queue,
                }
                got = results.get(s.index)
                if got is None or type(got) is Fetched:
                    line.update(dict.fromkeys(_LOAD_FIELDS))
                    line["error"] = "server is down" if got is None else got.error
                    if got is not None:
                        router.poll_failed(s.index, got)
                else:
                    load, stamps = got
                    router.report_load(s.index, load, stamps)
                    line.update(zip(_LOAD_FIELDS, load))
                lines.append(orjson.dumps(line))
            fh.write(b"\n".join(lines) + b"\n")


def progress_line(router: Router, t: float, rate: float, speed: float | None = None) -> str:
    """`t` and `rate` in run seconds. At --speed K the line shows simulated units (the report's): time x K, rate / K,
    latency x K, and says so (`sim s`, `req/sim-s`)."""
    k = speed or 1.0
    completed = router.completed  # ok + mismatch
    p50 = f"{float(np.median(router.e2e_ok[:completed])) * k:.3f}s" if completed else "-"
    failed = router.counts["error"] + router.counts["timeout"]  # not_sent/cancelled: only when the run stops
    mismatch = router.counts["mismatch"]
    clock, per = ("sim s", "req/sim-s") if speed is not None else ("s", "req/s")
    waiting = f"  client-wait {router.waiting_at_client}" if router.gate is not None else ""
    return (
        f"[{t * k:8.1f} {clock}] done {router.finished}/{router.total}  in-flight {router.in_flight}  queued "
        f"{router.queued}{waiting}  {rate / k:7.1f} {per}  p50 e2e {p50}" + (f"  errors {failed}" if failed else "")
        + (f"  mismatch {mismatch}" if mismatch else "")
    )


async def show_progress(router: Router, clock: RunClock, stream: IO[str], speed: float | None = None,
                        wall_paced: bool = False) -> None:
    """The progress line: redrawn 4 times a second on a terminal, a new line every 5 s otherwise (logs, CI).
    req/s is over the last period; at --speed K in simulated units (`progress_line`). `wall_paced` (--clock virtual):
    the run clock is simulated, so the line is checked every simulated second and drawn at the host's pace."""
    tty = stream.isatty()
    period = 0.25 if tty else 5.0
    last_done, last_t = 0, clock.now()
    last_wall = time.monotonic()
    while True:
        await asyncio.sleep(1.0 if wall_paced else period)
        if wall_paced:
            if time.monotonic() - last_wall < period:
                continue
            last_wall = time.monotonic()
        t = clock.now()
        rate = (router.finished - last_done) / (t - last_t)
        last_done, last_t = router.finished, t
        stream.write(("\r" if tty else "") + progress_line(router, t, rate, speed) + ("" if tty else "\n"))
        stream.flush()

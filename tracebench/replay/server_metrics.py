"""Server telemetry beside the load: every server's `/metrics` (sglang's Prometheus text) scraped every
`--metrics-interval` run seconds into server_metrics.jsonl (one row per scrape per server, the families the report
plots), and each server's whole text at the start and the end of the run (`metrics-<i>-start.txt`, `-end.txt`:
every family, every histogram bucket). docs/run-format.md describes the files.

The scraper is not the load poller (telemetry.py `poll_loads`): it feeds no routing decision and marks no server
suspect; a failed scrape is a row with `error`: no answer, an answer that is not Prometheus text (a sample line
without a number, or not one family of sglang's: random bytes), never the run's failure (issue 33 item 14: a
malformed line ended the benchmark at t=0). Behind sglang-router it asks the servers themselves (sglang-router
has its own, different /metrics).

Cost on the event loop: one GET per server per period, and one pass of a regular expression over the body for the
kept families' lines (real sglang's body is ~74 kB, 630 lines: ~0.08 ms on this machine, ~0.17 ms line by line), in
per-server steps, each server at its own phase of the interval (server k of N at k/N of it), so no request release
waits for more than one server's scrape. In-process servers (--clock virtual) give the kept samples' values without
the page (MetricsSamples: ~9 us a scrape where making and parsing the page took ~53 us); the page is made only for
the start and end texts.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from tracebench.errors import ServerProtocolError
from tracebench.replay.client import SglangClient
from tracebench.replay.clock import RunClock, ticks
from tracebench.replay.records import AppendFile, OnFailure

DEFAULT_INTERVAL_S = 1.0

# The families kept per scrape (.DUCUMENT/endpoints.md "/metrics"; all in the 0.5.17 capture metricsA.txt). Each is
# folded over its label sets as /v1/loads is (telemetry.py parse_loads): summed, except the ratios, averaged. A
# family the body lacks is null: sglang creates a labelled series at its first update (counters at the first
# finished request, cached_tokens_total at the first cached token: metrics_collector.py L1724-1752 of 0.5.17).
GAUGES = ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage", "gen_throughput", "cache_hit_rate")
COUNTERS = ("num_requests_total", "prompt_tokens_total", "generation_tokens_total", "cached_tokens_total",
            "num_aborted_requests_total")
# histograms: only their _sum and _count per scrape (the mean over any interval); buckets are in the start/end texts
HISTOGRAMS = ("time_to_first_token_seconds", "e2e_request_latency_seconds", "queue_time_seconds",
              "inter_token_latency_seconds")
FIELDS = (*GAUGES, *COUNTERS, *(f"{h}_{part}" for h in HISTOGRAMS for part in ("sum", "count")))
AVERAGED = frozenset({"token_usage", "cache_hit_rate"})
_PREFIX = "sglang:"
KEPT_NAMES = frozenset(_PREFIX + f for f in FIELDS)  # the kept samples' names in the body
_FOLDS = tuple((f, _PREFIX + f, f in AVERAGED) for f in FIELDS)
# the lines that start with a kept family's name, found in one pass in C (the body's other lines, most of it, are never
# looked at in Python: a line-by-line check of every prefix was most of a scrape's cost)
_KEPT_LINES = re.compile("\n(" + re.escape(_PREFIX) + "(?:" + "|".join(re.escape(f) for f in FIELDS) + ")[^\n]*)")


def parse_metrics(url: str, text: str) -> dict[str, float | None]:
    """The FIELDS from a Prometheus text body (sglang's), each folded over its label sets; None where absent. A line
    of a kept family whose value is not a number is a ServerProtocolError naming it."""
    return fold_samples(_samples(url, text))


def _samples(url: str, text: str) -> dict[str, list[float]]:
    """The values of the kept families' samples in a body, by sample name (prefix included), one per series."""
    values: dict[str, list[float]] = {}
    for line in _KEPT_LINES.findall("\n" + text):
        brace = line.find("{")
        end = line.find(" ") if brace < 0 else line.rfind("}") + 1
        name = line[:brace if brace >= 0 else end]
        if name not in KEPT_NAMES:
            continue  # a longer name that starts like a kept one (sglang:token_usage_x)
        parts = line[end:].split()
        try:
            value = float(parts[0])  # a sample may carry a timestamp after its value: ignored
        except (IndexError, ValueError):
            raise ServerProtocolError(f"{url}: /metrics line {line[:200]!r}: no number after the labels") from None
        values.setdefault(name, []).append(value)
    return values


def fold_samples(values: dict[str, list[float]]) -> dict[str, float | None]:
    """The FIELDS from the kept samples' values by sample name (`_samples`, MetricsSamples): each summed over its
    series, the AVERAGED ones averaged; None where absent."""
    out: dict[str, float | None] = {}
    for name, sample, averaged in _FOLDS:
        got = values.get(sample)
        if got is None:
            out[name] = None
        else:
            total = math.fsum(got)
            out[name] = total / len(got) if averaged else total
    return out


@runtime_checkable
class MetricsSamples(Protocol):
    """A client that can give a server's kept /metrics samples without the page (replay/inprocess.py's, whose
    servers hold the numbers): `metrics_samples(url, KEPT_NAMES)` is what `_samples` of the page's text gives, or
    None when the server serves no metrics. The scraper still reads the page when it keeps its text (start, end)."""

    def metrics_samples(self, url: str, names: frozenset[str]) -> dict[str, list[float]] | None: ...


class MetricsScraper:
    """Scrapes `urls` (server index -> base URL) every `interval` run seconds, each server on its own absolute ticks
    (a slow server skips ticks rather than drifting, and does not hold the others back). Rows go to
    server_metrics.jsonl in whole lines (records.AppendFile): a write that fails (disk full) is cut back to the last
    whole line, nothing more is written, and `on_failure` stops the run."""

    def __init__(self, client: SglangClient, urls: dict[int, str], clock: RunClock, interval: float,
                 run_dir: Path, on_failure: OnFailure) -> None:
        self.client = client
        # the kept samples without the page, where the client can (MetricsSamples): a virtual-clock run's scrapes
        self.samples = client if isinstance(client, MetricsSamples) else None
        self.urls = urls
        self.clock = clock
        self.interval = interval
        self.timeout = max(2.0, 4 * interval)
        self.run_dir = run_dir
        self.path = run_dir / "server_metrics.jsonl"
        # a row reaches the file as it is made; on the virtual clock every server's scrape of a tick is at one moment
        # (MetricsScraper.run): the tick's rows go in one write (a write per row was ~1% of a run of 1,024 servers)
        self.out = AppendFile(self.path, on_failure, flush_lines=len(urls) if clock.virtual else 1)
        self.rows = 0  # rows that reached the file
        self.failed = 0
        # per server: where its whole text was kept, at start and end, and why one is missing
        self.kept: dict[int, dict[str, Any]] = {
            i: {"start": None, "t_start": None, "end": None, "t_end": None, "end_error": None} for i in urls
        }

    async def run(self) -> None:
        # each server at its own phase of the interval: 32 scrapes at one instant were a burst of ~10 ms of work on
        # the router's loop, the releases due then waited for it (release lag p99 of 4-7 ms on a 16-core host)
        # (not on the virtual clock: its host time is no part of the measurement)
        count = 1 if self.clock.virtual else len(self.urls)
        try:
            await asyncio.gather(*(self._loop(i, k / count % 1.0) for k, i in enumerate(self.urls)))
        finally:
            # the rows of a tick not written yet (the virtual clock's one write per tick) reach the file when the
            # scraper is stopped, even where `finish` is never reached (an error after the run)
            self.out.flush()
            self.rows = self.out.lines_on_disk

    async def _loop(self, index: int, phase: float) -> None:
        async for _ in ticks(self.clock, self.interval, phase=phase):
            await self.scrape(index)

    async def scrape(self, index: int, moment: str | None = None) -> str | None:
        """One scrape of server `index`: a row, and its whole text when it is the first good one (the start) or
        `moment` is "end". Returns why it failed, or None."""
        t_sent = self.clock.now()
        url = f"{self.urls[index]}/metrics"
        kept = self.kept[index]
        if self.samples is not None and moment is None and kept["start"] is not None:
            samples = self.samples.metrics_samples(url, KEPT_NAMES)  # no text to keep: the numbers alone
            if samples is not None:
                t = self.clock.now()
                values: dict[str, float | None] | None = fold_samples(samples)
                error = None
                if all(v is None for v in values.values()):  # as a page without one of them: a failed scrape
                    values, error = None, f"{url}: not one sglang: family of the kept ones in its samples"
                return self._write_row(index, t, t - t_sent, values, error)
        got = await self.client.get_text(url, self.timeout)
        t = self.clock.now()
        values, error = None, got.error
        if error is None:
            text: str = got.obj
            try:
                values = parse_metrics(url, text)
            except ServerProtocolError as err:  # recorded in the row (and counted), the run goes on
                error = str(err)
            else:
                if all(v is None for v in values.values()):
                    values, error = None, (f"{url}: not one sglang: family of the kept ones in the answer "
                                           f"({len(text)} characters, starting {text[:80]!r})")
        if values is not None:
            which = moment or ("start" if kept["start"] is None else None)
            if which is not None:
                name = f"metrics-{index}-{which}.txt"
                (self.run_dir / name).write_text(text)
                kept[which], kept[f"t_{which}"] = name, t
        return self._write_row(index, t, t - t_sent, values, error)

    def _write_row(self, index: int, t: float, scrape_s: float, values: dict[str, float | None] | None,
                   error: str | None) -> str | None:
        """A scrape's row: its values, or (None) why it failed, counted. Returns `error`."""
        row: dict[str, Any] = {"t": t, "server": index, "scrape_s": scrape_s}
        if values is None:
            row["error"] = error
            self.failed += 1
        else:
            row.update(values)
        self.out.write(orjson.dumps(row) + b"\n")
        self.rows = self.out.lines_on_disk
        return error

    async def finish(self) -> None:
        """The last scrape of every server, after the run (its text kept as the end), then the file closed."""
        try:
            errors = await asyncio.gather(*(self.scrape(i, "end") for i in self.urls))
            for i, why in zip(self.urls, errors):
                self.kept[i]["end_error"] = why
        finally:
            self.out.close()
            self.rows = self.out.lines_on_disk

    def describe(self) -> dict[str, Any]:
        return {
            "file": self.path.name, "interval_s": self.interval, "rows": self.rows, "failed": self.failed,
            "servers": [{"server": i, "url": url, **self.kept[i]} for i, url in self.urls.items()],
        }

"""Telemetry beside the load that feeds no decision of the run: the servers' `/metrics` (server_metrics.py) and the
GPUs' utilisation, memory and power (gpu.py). One object for the run, so run.py only starts it, runs its coroutines
beside the engine and the load poller, finishes it, and writes what it describes into run.json."""

from __future__ import annotations

from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from tracebench.replay.client import SglangClient
from tracebench.replay.clock import RunClock
from tracebench.replay.gpu import GpuSampler, find_command
from tracebench.replay.records import OnFailure
from tracebench.replay.server_metrics import MetricsScraper


class BesideTelemetry:
    def __init__(self, run_dir: Path, metrics_interval: float) -> None:
        """`metrics_interval`: run seconds between two /metrics scrapes of a server; 0: none."""
        self.run_dir = run_dir
        self.metrics_interval = metrics_interval
        self.client: SglangClient | None = None
        self.servers: list[dict[str, Any]] = []
        self.urls: dict[int, str] = {}  # the servers to scrape: those started with --enable-metrics
        self.scraper: MetricsScraper | None = None
        self.gpu: GpuSampler | None = None
        self.gpu_why_not: str | None = None
        self.started = False

    async def start(self, client: SglangClient, servers: list[dict[str, Any]]) -> None:
        """Before the run clock starts. `servers`: per server `url`, `same_host`, `simulated`, `enable_metrics` and
        `gpu` (the CUDA_VISIBLE_DEVICES entry tracebench launched it on, else None). Starts nvidia-smi (its first
        samples wait in the pipe until `coroutines` reads them)."""
        self.client, self.servers, self.started = client, servers, True
        self.urls = {i: s["url"] for i, s in enumerate(servers) if s["enable_metrics"]}
        here = [s for s in servers if s["same_host"]]
        command, self.gpu_why_not = find_command(bool(here), all(s["simulated"] for s in here))
        if command is not None:
            server_of = {s["gpu"]: i for i, s in enumerate(servers) if s["gpu"] is not None}
            self.gpu = GpuSampler(command, self.run_dir / "gpu.jsonl", server_of)
            await self.gpu.start()

    def coroutines(self, clock: RunClock, on_failure: OnFailure) -> list[Coroutine[Any, Any, None]]:
        """What runs beside the requests from the clock's start (each ends only when cancelled, or the scraper on a
        server answer it cannot read: a ServerProtocolError that stops the run, like the poller's). A write to their
        files that fails (disk full) calls `on_failure` (the run stops; records.AppendFile)."""
        assert self.client is not None
        out: list[Coroutine[Any, Any, None]] = []
        if self.metrics_interval > 0 and self.urls:
            self.scraper = MetricsScraper(self.client, self.urls, clock, self.metrics_interval, self.run_dir,
                                          on_failure)
            out.append(self.scraper.run())
        if self.gpu is not None:
            out.append(self.gpu.read(clock, on_failure))
        return out

    async def finish(self) -> None:
        """After the run, before the client closes: the servers' last /metrics, nvidia-smi stopped."""
        try:
            if self.scraper is not None:
                await self.scraper.finish()
        finally:
            if self.gpu is not None:
                await self.gpu.stop()

    def describe(self) -> dict[str, Any]:
        """run.json's `server_metrics` and `gpu_telemetry` (null until the servers were asked)."""
        if not self.started:
            return {"server_metrics": None, "gpu_telemetry": None}
        if self.scraper is not None:
            metrics = self.scraper.describe()
            metrics["not_scraped"] = {
                str(i): "started without --enable-metrics: its /metrics is empty"
                for i in range(len(self.servers)) if i not in self.urls
            } or None
        else:
            why = ("--metrics-interval 0" if self.metrics_interval == 0 else
                   "no server was started with --enable-metrics (their /metrics is empty)" if not self.urls else
                   "the run clock never started")
            metrics = {"file": None, "interval_s": None, "not_scraped": why}
        gpu = self.gpu.describe() if self.gpu is not None else {"file": None, "not_sampled": self.gpu_why_not}
        return {"server_metrics": metrics, "gpu_telemetry": gpu}

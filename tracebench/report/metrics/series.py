"""The plot series of the HTML report: per run, the latency CDFs, latency by arrival, and on one time axis for all
runs the completions per second, requests in flight and queued, cap changes, and per server what it reported
(telemetry.jsonl)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from tracebench.report.load import Run, is_completed, read_beside
from tracebench.report.metrics.schema import GpuSeries, MetricsSeries, RunSeries, ServerSeries
from tracebench.report.metrics.stats import _RunStats


CDF_METRICS = ("total", "ttft", "server_client", "router_wait", "tpot")


SCATTER_POINTS = 4000  # latency-by-arrival points per run (an even sample of the ok requests beyond that)


CDF_POINTS = 600


TIME_BINS = 240


COMPLETIONS_PER_WINDOW = 40


def _cdf(sorted_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF, downsampled to at most ~CDF_POINTS points (denser in the tail, where the p99 lives)."""
    n = sorted_values.size
    if n == 0:
        return np.empty(0), np.empty(0)
    if n <= CDF_POINTS:
        return sorted_values, np.arange(1, n + 1) / n
    probs = np.unique(np.concatenate([
        np.linspace(1.0 / n, 1.0, CDF_POINTS // 2),
        1.0 - np.geomspace(0.1, 1.0 / n, CDF_POINTS // 2),
        [1.0],
    ]))
    idx = np.clip(np.ceil(probs * n).astype(np.int64), 1, n) - 1
    return sorted_values[idx], (idx + 1) / n


def _integral_of_count(starts: np.ndarray, ends: np.ndarray, at: np.ndarray) -> np.ndarray:
    """For each t in `at`: the integral over [0, t] of the number of intervals [start, end) covering the clock,
    i.e. sum_i (min(t, end_i) - min(t, start_i))."""
    def sum_min(points: np.ndarray) -> np.ndarray:
        ordered = np.sort(points)
        prefix = np.concatenate([[0.0], np.cumsum(ordered)])
        below = np.searchsorted(ordered, at, side="left")
        return prefix[below] + at * (ordered.size - below)
    return sum_min(ends) - sum_min(starts)


def _cap_labels(changes: list[dict[str, Any]], num_servers: int) -> list[tuple[float, str]]:
    """Cap changes as labelled moments: an `all` change (one entry per server in run.json) is one label."""
    by_time: dict[tuple[float, int], list[int]] = {}
    for change in changes:
        by_time.setdefault((float(change["t"]), int(change["cap"])), []).append(change["server"])
    labels = []
    for (t, cap), servers in sorted(by_time.items()):
        if len(servers) == num_servers > 1:
            labels.append((t, f"all={cap}"))
        else:
            labels += [(t, f"server{server}={cap}") for server in servers]
    return labels


def _series(run: Run, st: _RunStats) -> RunSeries:
    cdf = {key: _cdf(st.sorted_latency[key]) for key in CDF_METRICS}
    caps = _cap_labels(run.meta["caps"]["changes"], run.num_servers)
    ok = st.ok.select("t_arrival", (pl.col("t_finish") - pl.col("t_arrival")).alias("total")).sort("t_arrival")
    if ok.height > SCATTER_POINTS:
        ok = ok.gather_every(math.ceil(ok.height / SCATTER_POINTS))
    return RunSeries(cdf=cdf, time_edges=np.empty(0), completions_per_s=np.empty(0), smoothing_s=0.0,
                     in_flight=np.empty(0), queue=np.empty(0), cap_changes=caps,
                     by_arrival=(ok["t_arrival"].to_numpy(), ok["total"].to_numpy()))


def read_telemetry(run: Run) -> pl.DataFrame | None:
    """telemetry.jsonl (t, server, sglang's waiting count and KV usage), times in simulated seconds for a sped-up
    run; None when the run folder has none."""
    path = run.path / "telemetry.jsonl"
    if not path.is_file():
        return None
    schema = {"t": pl.Float64, "server": pl.Int64, "num_waiting_reqs": pl.Int64, "token_usage": pl.Float64}
    frame = pl.read_ndjson(path, schema=schema)
    return frame.with_columns(pl.col("t") * (run.speed or 1.0))


def _server_series(run: Run, edges: np.ndarray) -> list[ServerSeries]:
    c = pl.col
    step = edges[1] - edges[0]
    telemetry = read_telemetry(run)
    out = []
    for index in range(run.num_servers):
        mine = run.requests.filter(c("t_dispatch").is_not_null() & (c("server") == index))
        integral = _integral_of_count(mine["t_dispatch"].to_numpy(), mine["t_finish"].to_numpy(), edges)
        initial = run.meta["caps"]["initial"][index]
        steps = [(0.0, initial)] + [(float(ch["t"]), ch["cap"]) for ch in run.meta["caps"]["changes"]
                                    if ch["server"] == index]
        cap_t = np.array([t for t, _ in steps])
        cap_v = np.array([np.nan if v is None else float(v) for _, v in steps])
        if telemetry is None:
            tele = pl.DataFrame(schema={"t": pl.Float64, "num_waiting_reqs": pl.Int64, "token_usage": pl.Float64})
        else:
            tele = telemetry.filter(c("server") == index).sort("t")
        out.append(ServerSeries(
            in_flight=np.diff(integral) / step, cap_t=cap_t, cap_v=cap_v, telemetry_t=tele["t"].to_numpy(),
            waiting=tele["num_waiting_reqs"].cast(pl.Float64).to_numpy(), kv_usage=tele["token_usage"].to_numpy(),
        ))
    return out


def _nice_step(span: float, bins: int) -> float:
    raw = span / bins
    mag = 10 ** math.floor(math.log10(raw))
    for mult in (1, 2, 2.5, 5, 10):
        if raw <= mult * mag:
            return mult * mag
    return 10 * mag


def _common_time_axis(series: list[RunSeries], runs: list[Run], stats: list[_RunStats]) -> None:
    """Time series of the whole run (warm-up included; the plots shade it), on one axis for every run."""
    c = pl.col
    t_max = 0.0
    for run in runs:
        last = run.requests.select(pl.max_horizontal(c("t_finish").max(), c("t_arrival").max())).item()
        t_max = max(t_max, float(last), float(run.meta["t_end"] or 0.0))
    step = _nice_step(max(t_max, 1e-3), TIME_BINS)
    edges = np.arange(0.0, t_max + step, step)
    if edges.size < 2:
        edges = np.array([0.0, step])
    # Completions are a point process: per-bin counts are mostly noise at low rates, so the throughput curve is a
    # moving average over a window that holds ~COMPLETIONS_PER_WINDOW completions at the runs' mean rate.
    mean_rate = max(st.counts["completed"] for st in stats) / max(t_max, 1e-9)
    width_bins = int(np.clip(round(COMPLETIONS_PER_WINDOW / max(mean_rate, 1e-9) / step), 1, TIME_BINS // 8))
    for ser, run in zip(series, runs):
        frame = run.requests
        finish = frame.filter(is_completed())["t_finish"].to_numpy()
        ser.time_edges = edges
        counts = np.histogram(finish, edges)[0].astype(float)
        window = np.ones(width_bins)
        # divide by the bins actually inside the run at each end, so the curve does not sag at the edges
        ser.completions_per_s = np.convolve(counts, window, mode="same") / np.convolve(np.ones_like(counts), window, mode="same") / step
        ser.smoothing_s = width_bins * step
        flying = frame.filter(c("t_dispatch").is_not_null())
        integral = _integral_of_count(flying["t_dispatch"].to_numpy(), flying["t_finish"].to_numpy(), edges)
        ser.in_flight = np.diff(integral) / step
        # in the router queue from admission to dispatch; never dispatched: until the failure was seen (or the run
        # end). Admission is the release without --max-concurrency's gate (and in runs recorded before t_admitted);
        # with the gate, a request still held at the client when the run ended never entered the queue
        gated = run.meta.get("max_concurrency") is not None
        entered = c("t_admitted") if gated else pl.coalesce(c("t_admitted"), c("t_released"))
        queued = frame.filter(entered.is_not_null()).select(
            entered.alias("entered"),
            pl.coalesce(c("t_dispatch"), c("t_finish"), pl.lit(t_max)).alias("left"),
        )
        integral = _integral_of_count(queued["entered"].to_numpy(), queued["left"].to_numpy(), edges)
        ser.queue = np.diff(integral) / step
        ser.servers = _server_series(run, edges)
        ser.host_gpus = _beside_series(run, ser.servers)


HIT_WINDOW = 5  # scrapes per prefix-cache hit-rate point: one interval holds few finished requests


def _beside_series(run: Run, servers: list[ServerSeries]) -> list[GpuSeries]:
    """Each server's /metrics scrapes and GPU samples into its ServerSeries (times ×speed; a sped-up simulator's
    gen_throughput is per run second, so ÷speed); returns the GPUs of no known server."""
    k = run.speed or 1.0
    c = pl.col
    metrics = read_beside(run.path, run.meta, "server_metrics.jsonl")
    if metrics is not None:
        good = metrics.filter(c("error").is_null()).sort("t")
        for (index,), rows in good.group_by("server"):
            prompt = rows["prompt_tokens_total"].to_numpy().astype(float)
            # sglang creates cached_tokens_total at the first cached token (docs/run-format.md): absent means 0
            # while prompt tokens are being counted
            cached = rows["cached_tokens_total"].fill_null(0.0).to_numpy().astype(float)
            w = max(1, min(HIT_WINDOW, rows.height - 1))  # a short run: over what it has
            d_prompt = prompt[w:] - prompt[:-w]
            d_cached = cached[w:] - cached[:-w]
            counted = np.nan_to_num(d_prompt) > 0
            t = rows["t"].to_numpy() * k
            servers[index].metrics = MetricsSeries(
                t=t, running=_floats(rows, "num_running_reqs"), queued=_floats(rows, "num_queue_reqs"),
                token_usage=_floats(rows, "token_usage"), gen_throughput=_floats(rows, "gen_throughput") / k,
                hit_t=t[w:][counted], hit_rate=d_cached[counted] / d_prompt[counted],
            )
    gpus = read_beside(run.path, run.meta, "gpu.jsonl")
    unmapped: list[GpuSeries] = []
    if gpus is None:
        return unmapped
    names = {g["index"]: g["name"] for g in run.meta["gpu_telemetry"]["gpus"]}
    for (index,), rows in gpus.sort("t").group_by("gpu", maintain_order=True):
        series = GpuSeries(index=index, name=names.get(index, "?"), t=rows["t"].to_numpy() * k,
                           util_pct=_floats(rows, "util_pct"),
                           mem_pct=(rows["mem_used_mib"] / rows["mem_total_mib"] * 100.0).fill_null(np.nan).to_numpy(),
                           power_w=_floats(rows, "power_w"))
        server = rows["server"][0]
        if server is None or server >= len(servers):
            unmapped.append(series)
        else:
            servers[server].gpus.append(series)
    return sorted(unmapped, key=lambda g: g.index)


def _floats(frame: pl.DataFrame, name: str) -> np.ndarray:
    return frame[name].cast(pl.Float64).fill_null(np.nan).to_numpy()

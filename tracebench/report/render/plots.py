"""The report's figures (matplotlib, Agg backend). Each takes a Report built `with_series=True`."""

from __future__ import annotations

import io
import math
import re

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter, MaxNLocator, NullLocator  # noqa: E402

from tracebench.report.figure_options import SIZES, FigureOptions  # noqa: E402
from tracebench.report.metrics import LATENCY_LABELS, SLO_KEYS, Report  # noqa: E402

_COLOURS = plt.get_cmap("tab10").colors


def _colour(i: int) -> tuple[float, float, float]:
    return _COLOURS[i % len(_COLOURS)]


def _run_name(report: Report, i: int) -> str:
    run = report.runs[i]
    name = run.label + (" (baseline)" if i == report.baseline and len(report.runs) > 1 else "")
    if run.mark is not None:
        name += f" [{run.mark}]"
    return name


def _style(ax) -> None:
    ax.grid(True, color="#dddddd", linewidth=0.7)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


SLO_COLOUR = "#c0392b"


def mark_slo(ax, limit: float, unit: str, right: float) -> None:
    """The SLO as a dashed line where it falls inside the axis, else an arrow at the right edge saying where it is."""
    if limit <= right:
        ax.axvline(limit, color=SLO_COLOUR, linestyle="--", linewidth=1.2, label="_slo")
        ax.annotate(f" SLO {limit:g} {unit}", xy=(limit, 0.03), color=SLO_COLOUR, fontsize=9)
    else:
        ax.annotate(f"SLO {limit:g} {unit} →", xy=(1.0, 0.08), xycoords="axes fraction", ha="right",
                    color=SLO_COLOUR, fontsize=9)


CDF_TITLES = {"total": "Total latency (arrival → finish)", "ttft": "Time to first token (from arrival)",
              "server_client": "Server latency (dispatch → finish)", "router_wait": "Router wait (arrival → dispatch)",
              "tpot": "Time per output token"}


# (rows, columns) of the CDF grid for 1..5 panels; a spare cell holds the legend
_GRIDS = {1: (1, 1), 2: (1, 2), 3: (1, 3), 4: (2, 2), 5: (2, 3)}
_TAIL_TICKS = (0.5, 0.75, 0.9, 0.95, 0.99, 0.995, 0.999)


def latency_cdfs(report: Report, opts: FigureOptions | None = None) -> Figure:
    """The main figure: CDFs of total latency, TTFT, server latency, router wait and TPOT (or the panels `opts.plots`
    names, in that order), all runs overlaid; x linear or log, y linear or tail-focused (logit: p50, p90, p99, p99.9
    equally spaced); `opts.size` in inches (figure_options.SIZES)."""
    assert report.series is not None
    opts = opts if opts is not None else FigureOptions()
    keys = opts.plots
    slo_by_metric = {SLO_KEYS[k]: v for k, v in (report.slo or {}).items()}
    rows, cols = _GRIDS[len(keys)]
    spare = rows * cols > len(keys)
    slide = opts.size != "page"
    with plt.rc_context({"font.size": 13 if slide else 10}):
        fig, grid = plt.subplots(rows, cols, figsize=SIZES[opts.size], layout="constrained", squeeze=False)
    axes = grid.flatten()
    # tail: up to p99.9, or to the highest level below 1 that a run's CDF reaches (1 - 1/n for n requests)
    below_one = [float(p[p < 1].max()) for s in report.series for k in keys for p in (s.cdf[k][1],) if (p < 1).any()]
    y_top = min(0.999, max(below_one)) if below_one and max(below_one) > 0.5 else 0.99
    for ax, key in zip(axes, keys):
        top = max((float(s.cdf[key][0][-1]) for s in report.series if s.cdf[key][0].size), default=0.0)
        low = min((float(x[x > 0][0]) for s in report.series for x in (s.cdf[key][0],) if (x > 0).any()), default=0.0)
        scale, unit = 1000.0, "ms"  # every panel in ms, as the tables (issue 23: panels mixed s and ms)
        drawn = False
        for i, ser in enumerate(report.series):
            x, p = ser.cdf[key]
            if x.size == 0:
                continue
            drawn = True
            ax.step(np.concatenate([[x[0]], x]) * scale, np.concatenate([[0.0], p]), where="post",
                    color=_colour(i), linewidth=1.8, label=_run_name(report, i))
        tail = opts.y_scale == "tail"
        for q in (0.5, 0.9, 0.99):
            ax.axhline(q, color="#999999", linewidth=0.8, linestyle=":")
            if not tail:  # (the tail axis's own ticks say p50, p90, ...)
                ax.annotate(f"p{q * 100:g}", xy=(1.0, q), xycoords=("axes fraction", "data"), xytext=(2, 0),
                            textcoords="offset points", va="center", fontsize=8 if not slide else 11, color="#666666")
        right = _cdf_x_axis(ax, opts.x_scale == "log", low * scale, top * scale, slide)
        if key in slo_by_metric:
            mark_slo(ax, slo_by_metric[key] * scale, unit, right)
        ax.set_title(CDF_TITLES[key], fontsize=12 if not slide else 15)
        ax.set_xlabel(f"{LATENCY_LABELS[key]} ({unit}{', log scale' if ax.get_xscale() == 'log' else ''})")
        first_column = list(axes).index(ax) % cols == 0
        _cdf_y_axis(ax, tail, y_top, first_column)
        _style(ax)
        if not drawn:
            ax.text(0.5, 0.5, "no first-token stamps\n(not streamed)", ha="center", va="center", transform=ax.transAxes)
    handles, labels = axes[0].get_legend_handles_labels()
    legend_size = 10 if not slide else 13
    if spare:  # the first spare cell holds the legend, the others stay empty
        for ax in axes[len(keys):]:
            ax.axis("off")
        axes[len(keys)].legend(handles, labels, loc="center", frameon=False, fontsize=legend_size)
    else:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), frameon=False,
                   fontsize=legend_size)
    title = opts.title if opts.title is not None else "Latency CDFs"
    fig.suptitle(title + (f" (requests arriving after {report.warmup_s:g} s)" if report.warmup_s > 0 else ""),
                 fontsize=14 if not slide else 18, fontweight="bold")
    return fig


def _cdf_x_axis(ax: Axes, log: bool, low: float, top: float, slide: bool) -> float:
    """A CDF panel's x axis from the data's lowest positive value `low` to its highest `top` (ms): log or linear.
    Returns its right end."""
    # the axis follows the data, never the SLO: a far SLO would squeeze the curves into a corner
    if log and low > 0:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))  # 100, 1,000: not 10^2, 10^3
        right = top * 1.25
        ax.set_xlim(low / 1.25, right)
        return right
    right = top * 1.04 if top > 0 else 1.0
    ax.set_xlim(0, right)
    if slide:  # larger type: fewer ticks, so that 10,000 and 12,000 do not run into each other
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))
    return right


def _cdf_y_axis(ax: Axes, tail: bool, y_top: float, first_column: bool) -> None:
    """A CDF panel's y axis: linear 0..1, or tail-focused (logit, ticked p50 ... p99.9 up to `y_top`)."""
    if tail:
        ax.set_yscale("logit", nonpositive="clip")
        ax.set_ylim(0.5, y_top)
        ticks = [q for q in _TAIL_TICKS if q <= y_top + 1e-12]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_major_formatter(FixedFormatter([f"p{q * 100:g}" for q in ticks]))
        ax.yaxis.set_minor_locator(NullLocator())
        if first_column:
            ax.set_ylabel("percentile of completed requests (tail-focused)")
    else:
        if first_column:
            ax.set_ylabel("fraction of completed requests ≤ x")
        ax.set_ylim(0, 1.02)


def _clock_label(report: Report, step: float) -> str:
    clock = "run clock"
    if any(run.speed is not None for run in report.runs):
        clock += ", simulated seconds for sped-up runs"
    return f"{clock} (s since the run started; bins of {step:g} s, time-averaged)"


def _cap_lines(ax, report: Report, labelled: bool) -> None:
    """Each run's cap changes as dotted lines in its colour; on `labelled` axes with what changed."""
    for i, ser in enumerate(report.series):
        for t, text in ser.cap_changes:
            ax.axvline(t, color=_colour(i), linestyle=":", linewidth=1.0)
            if labelled:
                ax.annotate(f" cap {text}", xy=(t, 1.0), xycoords=("data", "axes fraction"), rotation=90,
                            va="top", ha="left", fontsize=7, color=_colour(i))


def over_time(report: Report) -> Figure:
    """Completions/s, requests in flight, router queue length over the run clock, and each request's total latency
    by its arrival (bursts), all runs overlaid."""
    assert report.series is not None
    fig, axes = plt.subplots(4, 1, figsize=(15, 12), sharex=True, layout="constrained")
    smoothing = report.series[0].smoothing_s
    panels = (
        ("completions_per_s", f"Throughput: requests completed per second (moving average over {smoothing:g} s)",
         "requests/s"),
        ("in_flight", "Requests in flight at the servers (dispatched, not finished; all servers)", "requests"),
        ("queue", "Router queue length (released and admitted, not yet dispatched)", "requests"),
    )
    for ax, (attr, title, ylabel) in zip(axes, panels):
        for i, ser in enumerate(report.series):
            ax.stairs(getattr(ser, attr), ser.time_edges, color=_colour(i), linewidth=1.5, label=_run_name(report, i),
                      baseline=None)
        _cap_lines(ax, report, labelled=attr == "in_flight")
        ax.set_title(title, fontsize=11, loc="left")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    ax = axes[3]
    scale, unit = 1000.0, "ms"  # as the tables and the CDFs
    for i, ser in enumerate(report.series):
        arrival, total = ser.by_arrival
        ax.scatter(arrival, total * scale, s=4, color=_colour(i), alpha=0.5, linewidths=0)
    _cap_lines(ax, report, labelled=False)
    ax.set_title("Total latency of each ok request by its arrival time (bursts show as columns)", fontsize=11, loc="left")
    ax.set_ylabel(f"total latency ({unit})")
    ax.set_ylim(bottom=0)
    for ax in axes:
        if report.warmup_s > 0:
            ax.axvspan(0, report.warmup_s, color="#eeeeee", zorder=0,
                       label=f"warm-up (first {report.warmup_s:g} s, excluded)" if ax is axes[0] else None)
        _style(ax)
    step = report.series[0].time_edges[1] - report.series[0].time_edges[0]
    axes[-1].set_xlabel(_clock_label(report, step))
    axes[-1].set_xlim(left=0)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), frameon=False, fontsize=10)
    if any(ser.cap_changes for ser in report.series):
        axes[1].text(1.0, 1.0, "dotted lines: cap changes", transform=axes[1].transAxes, fontsize=8, va="bottom",
                     ha="right")
    fig.suptitle("Over time", fontsize=14, fontweight="bold")
    return fig


MAX_SERVER_ROWS = 8


def per_server_over_time(report: Report) -> Figure:
    """One row per server: the router's in-flight count against that server's cap, sglang's own waiting queue, and
    its KV cache usage (telemetry.jsonl), all runs overlaid."""
    assert report.series is not None
    rows = min(max(len(ser.servers) for ser in report.series), MAX_SERVER_ROWS)
    fig, grid = plt.subplots(rows, 2, figsize=(15, 2.6 * rows + 1.2), sharex=True, squeeze=False,
                             layout="constrained")
    edges = report.series[0].time_edges
    t_end = float(edges[-1])
    for row in range(rows):
        left, right = grid[row]
        for i, ser in enumerate(report.series):
            if row >= len(ser.servers):
                continue
            srv = ser.servers[row]
            colour = _colour(i)
            left.stairs(srv.in_flight, edges, color=colour, linewidth=1.5, baseline=None,
                        label=f"{_run_name(report, i)}: in flight (router)")
            if not np.all(np.isnan(srv.cap_v)):
                left.step(np.append(srv.cap_t, t_end), np.append(srv.cap_v, srv.cap_v[-1]), where="post",
                          color=colour, linestyle="--", linewidth=1.2, label=f"{_run_name(report, i)}: cap")
            if srv.telemetry_t.size:
                left.plot(srv.telemetry_t, srv.waiting, color=colour, linestyle=":", linewidth=1.2,
                          label=f"{_run_name(report, i)}: waiting in sglang")
                right.plot(srv.telemetry_t, srv.kv_usage * 100.0, color=colour, linewidth=1.3)
        if not any(row < len(ser.servers) and ser.servers[row].telemetry_t.size for ser in report.series):
            right.text(0.5, 0.5, "no telemetry.jsonl", ha="center", va="center", transform=right.transAxes)
        _cap_lines(left, report, labelled=False)
        left.set_title(f"{server_name(report, row)}: requests in flight (solid), cap (dashed), waiting in sglang "
                       f"(dotted)", fontsize=10, loc="left")
        left.set_ylabel("requests")
        left.set_ylim(bottom=0)
        right.set_title(f"{server_name(report, row)}: KV cache usage (sglang token_usage)", fontsize=10, loc="left")
        right.set_ylabel("% of the KV cache")
        right.set_ylim(0, 105)
        _style(left)
        _style(right)
    step = edges[1] - edges[0]
    for ax in grid[-1]:
        ax.set_xlabel(_clock_label(report, step))
        ax.set_xlim(0, t_end)
    handles, labels = grid[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 3), frameon=False, fontsize=9)
    more = max(len(ser.servers) for ser in report.series) - rows
    fig.suptitle("Per server over time" + (f" (first {rows} servers; {more} more not drawn)" if more > 0 else ""),
                 fontsize=14, fontweight="bold")
    return fig


def has_server_telemetry(report: Report) -> bool:
    """Whether any run has /metrics scrapes or GPU samples to draw (runs recorded before them have neither)."""
    assert report.series is not None
    return any(ser.host_gpus or any(srv.metrics is not None or srv.gpus for srv in ser.servers)
               for ser in report.series)


def _gpu_lines(ax, power_ax, gpus: list, colour) -> None:
    for gpu in gpus:
        ax.plot(gpu.t, gpu.util_pct, color=colour, linewidth=1.3)
        ax.plot(gpu.t, gpu.mem_pct, color=colour, linewidth=1.1, linestyle="--")
        power_ax.plot(gpu.t, gpu.power_w, color=colour, linewidth=1.0, linestyle=":")


def _gpu_axes(ax, power_ax, title: str, drawn: bool) -> None:
    """A GPU panel, once its lines are drawn (a limit set before would stop the autoscale): util and memory in % on
    the left, power in W on the right axis."""
    ax.set_title(f"{title}: util %, mem % (dashed), W (dotted)", fontsize=9, loc="left")
    ax.set_ylabel("%")
    ax.set_ylim(0, 105)
    _style(ax)
    power_ax.spines["top"].set_visible(False)
    power_ax.set_ylim(bottom=0)
    if not drawn:
        power_ax.set_yticks([])
        ax.text(0.5, 0.5, "no GPU samples (simulated, attached\nor no nvidia-smi: run.json gpu_telemetry)",
                ha="center", va="center", transform=ax.transAxes, fontsize=8)


def server_telemetry(report: Report) -> Figure:
    """One row per server: what sglang's /metrics said (running and queued requests; KV usage and the prefix-cache
    hit rate; generation throughput) and its GPU (utilisation, memory, power), all runs overlaid; then the sampled
    GPUs of no known server (attached servers), four to a row."""
    assert report.series is not None
    servers = min(max(len(ser.servers) for ser in report.series), MAX_SERVER_ROWS)
    host = sorted({g.index for ser in report.series for g in ser.host_gpus})[:4 * MAX_SERVER_ROWS]
    host_rows = math.ceil(len(host) / 4)
    # a kind of panel no run has data for is left out (a simulated run has no GPU samples), not drawn empty
    any_metrics = any(srv.metrics is not None for ser in report.series for srv in ser.servers)
    any_gpu = any(srv.gpus for ser in report.series for srv in ser.servers)
    width = 3 * any_metrics + any_gpu
    cols = max(width, 4 if host else 1)
    fig, grid = plt.subplots(servers + host_rows, cols, figsize=(max(17 * cols / 4, 15),
                                                                 2.7 * (servers + host_rows) + 1.4),
                             sharex=True, squeeze=False, layout="constrained")
    for row in range(servers):
        cells = list(grid[row])
        for ax in cells[width:]:
            ax.set_visible(False)
        requests_ax, cache_ax, gen_ax = cells[:3] if any_metrics else (None, None, None)
        gpu_ax = cells[3 if any_metrics else 0] if any_gpu else None
        power_ax = gpu_ax.twinx() if gpu_ax is not None else None
        name_row = server_name(report, row)
        drawn_metrics = drawn_gpu = False
        for i, ser in enumerate(report.series):
            if row >= len(ser.servers):
                continue
            colour, name, srv = _colour(i), _run_name(report, i), ser.servers[row]
            m = srv.metrics
            if m is not None and requests_ax is not None:
                drawn_metrics = True
                requests_ax.plot(m.t, m.running, color=colour, linewidth=1.4, label=f"{name}: running")
                requests_ax.plot(m.t, m.queued, color=colour, linewidth=1.1, linestyle="--", label=f"{name}: queued")
                cache_ax.plot(m.t, m.token_usage * 100.0, color=colour, linewidth=1.4)
                cache_ax.plot(m.hit_t, m.hit_rate * 100.0, color=colour, linewidth=1.1, linestyle=":", marker=".",
                              markersize=3)
                gen_ax.plot(m.t, m.gen_throughput, color=colour, linewidth=1.3)
            if srv.gpus and gpu_ax is not None:
                drawn_gpu = True
                _gpu_lines(gpu_ax, power_ax, srv.gpus, colour)
        if any_metrics:
            _metrics_axes(requests_ax, cache_ax, gen_ax, name_row, drawn_metrics)
        if gpu_ax is not None:
            _gpu_axes(gpu_ax, power_ax, f"{name_row}: GPU", drawn_gpu)
    _host_gpu_panels(report, grid, servers, host, host_rows)
    clock = "run clock (s)" + (", simulated seconds for sped-up runs" if any(r.speed for r in report.runs) else "")
    for ax in grid.flatten():
        if ax.get_visible():
            ax.tick_params(labelbottom=True)
            ax.set_xlim(left=0)
    for ax in grid[-1]:
        ax.set_xlabel(clock)
    handles, labels = grid[0][0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 4), frameon=False, fontsize=9)
    more = max(len(ser.servers) for ser in report.series) - servers
    what = ("sglang's /metrics and the GPUs" if any_metrics and (any_gpu or host) else "sglang's /metrics (no run has GPU "
            "samples: simulated, attached or no nvidia-smi)" if any_metrics else "the GPUs (no run has /metrics scrapes)")
    fig.suptitle(f"Server telemetry: {what}" +
                 (f" (first {servers} servers; {more} more not drawn)" if more > 0 else ""),
                 fontsize=14, fontweight="bold")
    return fig


def _metrics_axes(requests_ax: Axes, cache_ax: Axes, gen_ax: Axes, name_row: str, drawn: bool) -> None:
    """Titles, units and ranges of a server row's three /metrics panels ("no /metrics scrapes" when none was drawn)."""
    for ax, what, ylabel in (
        (requests_ax, "sglang requests: running (solid), queued (dashed)", "requests"),
        (cache_ax, "KV usage (solid), prefix-cache hit rate (dotted)", "%"),
        (gen_ax, "generation throughput (sglang)", "tokens/s"),
    ):
        # the server's name once, on its row's first panel (it would not fit on every title)
        ax.set_title(f"{name_row}: {what}" if ax is requests_ax else what, fontsize=9, loc="left")
        ax.set_ylabel(ylabel)
        _style(ax)
        if not drawn:
            ax.text(0.5, 0.5, "no /metrics scrapes", ha="center", va="center", transform=ax.transAxes)
    requests_ax.set_ylim(bottom=0)
    gen_ax.set_ylim(bottom=0)
    cache_ax.set_ylim(0, 105)


def _host_gpu_panels(report: Report, grid: np.ndarray, servers: int, host: list[int], host_rows: int) -> None:
    """The sampled GPUs of no known server (attached servers), four to a row below the servers' rows."""
    for k, index in enumerate(host):
        ax = grid[servers + k // 4][k % 4]
        power_ax = ax.twinx()
        for i, ser in enumerate(report.series):
            _gpu_lines(ax, power_ax, [g for g in ser.host_gpus if g.index == index], _colour(i))
        _gpu_axes(ax, power_ax, f"GPU {index} (server unknown)", True)
    for k in range(len(host), 4 * host_rows):
        grid[servers + k // 4][k % 4].set_visible(False)


def server_name(report: Report, index: int) -> str:
    """`server 0`, with its PD role where a run gave it one (`server 0 (prefill)`; `server 0 (prefill in a, decode in
    b)` where the runs differ; a plain run's server has none)."""
    roles: dict[str, list[str]] = {}
    for i, loads in enumerate(report.servers):
        for load in loads:
            if load.server == index and load.role:
                roles.setdefault(load.role, []).append(report.runs[i].label)
    if not roles:
        return f"server {index}"
    plain = len(report.runs) - sum(map(len, roles.values()))
    if len(roles) == 1 and not plain:
        return f"server {index} ({next(iter(roles))})"
    return f"server {index} (" + ", ".join(f"{role} in {', '.join(runs)}" for role, runs in roles.items()) + ")"


def server_load(report: Report) -> Figure:
    """Per server: share of requests, busy fraction of the window, mean in flight; grouped by run."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2), layout="constrained")
    num_servers = max(len(loads) for loads in report.servers)
    width = 0.8 / len(report.runs)
    positions = np.arange(num_servers)
    panels = (
        ("share", "Share of dispatched requests", "% of requests", 100.0),
        ("busy_fraction", "Busy (≥ 1 request in flight)", "% of the measurement window", 100.0),
        ("mean_in_flight", "Mean requests in flight", "requests", 1.0),
    )
    for ax, (attr, title, ylabel, scale) in zip(axes, panels):
        for i, loads in enumerate(report.servers):
            values = [(getattr(load, attr) or 0.0) * scale for load in loads]
            bars = ax.bar(positions[: len(loads)] + (i - (len(report.runs) - 1) / 2) * width, values, width * 0.95,
                          color=_colour(i), label=_run_name(report, i))
            if num_servers * len(report.runs) <= 16:
                ax.bar_label(bars, fmt="%.1f" if scale == 100.0 else "%.2f", fontsize=8, padding=2)
        if attr == "share":
            ax.axhline(100.0 / num_servers, color="#555555", linestyle="--", linewidth=1, label="even split")
        ax.set_xticks(positions, [f"server {j}" for j in range(num_servers)])
        ax.set_title(title, fontsize=11)
        ax.set_ylabel(ylabel)
        _style(ax)
    axes[1].set_ylim(0, 105)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 5), frameon=False, fontsize=10)
    fig.suptitle("Per-server load", fontsize=14, fontweight="bold")
    return fig


_PATH_DATA = re.compile(r' d="[^"]*"')
_DECIMAL = re.compile(r"-?\d+\.\d{2,}")


def to_svg(fig: Figure) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    text = buf.getvalue()
    # path coordinates to 0.1 pt (matplotlib writes micro-points): invisible at any zoom, and a page whose CDFs step
    # through every request is a third smaller
    text = _PATH_DATA.sub(lambda path: _DECIMAL.sub(lambda n: f"{float(n.group()):.1f}", path.group()), text)
    return text[text.index("<svg"):]


def to_png(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, facecolor="white")
    return buf.getvalue()


def close(fig: Figure) -> None:
    plt.close(fig)

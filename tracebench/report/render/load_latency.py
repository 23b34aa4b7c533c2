"""The load-latency figure of a sweep (`tracebench sweep`), and its self-contained HTML page.

Input: the sweep's summary document (summary.json), so the figure is drawn from what the sweep wrote.
"""

from __future__ import annotations

from html import escape
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from tracebench.report.render import plots
from tracebench.report.render.plots import SLO_COLOUR, _colour, _style

_PANELS = (("ttft", "Time to first token (from arrival)"), ("tpot", "Time per output token"),
           ("itl", "Inter-token latency (every gap, pooled)"), ("total", "Total latency (arrival → finish)"))


def _series(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Points grouped by (gpus, PD ratio, policy), each group sorted by its x value."""
    kind = doc["kind"]
    groups: dict[tuple[int, str | None, str], list[dict[str, Any]]] = {}
    for row in doc["points"]:
        groups.setdefault((row["gpus"], row.get("pd"), row["policy"]), []).append(row)
    out = []
    for (gpus, pd, policy), rows in groups.items():
        rows.sort(key=lambda r: _x(r, kind))
        label = f"{gpus} server{'s' if gpus > 1 else ''}, {policy}" if pd is None else f"PD {pd}, {policy}"
        out.append((label, rows))
    return out


def _x(row: dict[str, Any], kind: str) -> float:
    return float(row["concurrency"] if kind == "concurrency" else row["rate"])


def load_latency(doc: dict[str, Any]) -> Figure:
    """Throughput and goodput against the load, then TTFT, TPOT, ITL and total latency p50 (dashed) and p99
    (solid) with their 95% intervals (bars); over-saturated points as × at the top of each latency panel."""
    import matplotlib.pyplot as plt

    kind = doc["kind"]
    x_label = "requests in flight (--max-concurrency)" if kind == "concurrency" else "offered rate (req/s)"
    series = _series(doc)
    fig, grid = plt.subplots(2, 3, figsize=(15, 8.6), layout="constrained")
    axes = grid.flatten()
    _throughput_panel(axes[0], doc, series, x_label)
    limits = (doc.get("slo") or {}).get("limits_s", {})
    for ax, (metric, title) in zip(axes[1:5], _PANELS):
        _latency_panel(ax, metric, title, series, kind, x_label, limits)
    for ax in axes[:5]:
        if kind == "concurrency":
            from matplotlib.ticker import ScalarFormatter

            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_formatter(ScalarFormatter())
        for i, entry in enumerate(doc.get("capacity") or []):
            if entry.get("max_rate") is not None:
                ax.axvline(entry["max_rate"], color=_colour(i), linestyle="-.", linewidth=1.0)
    _legend(axes[-1], doc, series, limits)
    what = {"rate": "rate sweep", "concurrency": "concurrency sweep", "capacity": "capacity search"}[kind]
    fig.suptitle(f"Load and latency: {what} {doc['name']}", fontsize=14, fontweight="bold")
    return fig


def _throughput_panel(ax: Any, doc: dict[str, Any], series: list[tuple[str, list[dict[str, Any]]]],
                      x_label: str) -> None:
    """Achieved throughput (and goodput under --slo) of each series against the load."""
    kind = doc["kind"]
    for i, (label, rows) in enumerate(series):
        xs = np.array([_x(r, kind) for r in rows])
        thr = np.array([np.nan if r["throughput_rps"] is None else r["throughput_rps"] for r in rows])
        ax.plot(xs, thr, marker="o", color=_colour(i), linewidth=1.8, label=f"{label}: achieved")
        if doc.get("slo") and kind != "concurrency":
            good = np.array([np.nan if r["goodput_rps"] is None else r["goodput_rps"] for r in rows])
            ax.plot(xs, good, marker="s", linestyle="--", color=_colour(i), linewidth=1.2, label=f"{label}: goodput")
        sat = [r for r in rows if r["saturated"]]
        if sat:
            ax.scatter([_x(r, kind) for r in sat], [r["throughput_rps"] or 0 for r in sat], marker="x", s=80,
                       color="#c0392b", zorder=5, label="over-saturated (stopped)" if i == 0 else None)
    if kind != "concurrency" and doc["points"]:
        top = max(_x(r, kind) for r in doc["points"])
        ax.plot([0, top], [0, top], color="#999999", linestyle=":", linewidth=1, label="achieved = offered")
    ax.set_title("Throughput (ok requests/s)" + (" and goodput (meeting every SLO)" if doc.get("slo") else ""),
                 fontsize=11)
    ax.set_xlabel(x_label)
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0)
    _style(ax)


def _latency_panel(ax: Any, metric: str, title: str, series: list[tuple[str, list[dict[str, Any]]]], kind: str,
                   x_label: str, limits: dict[str, float]) -> None:
    """One latency metric's p50 and p99 with their 95% intervals, the SLO limit, over-saturated points as ×."""
    if kind == "concurrency" and metric in ("ttft", "total"):  # a closed loop: from dispatch (headline.py)
        title = {"ttft": "Time to first token (from dispatch)", "total": "Latency (dispatch → finish)"}[metric]
    tops = [est["value"] for _, rows in series for r in rows if r["latency_s"]
            for est in r["latency_s"][metric].values() if est["value"] is not None]
    in_ms = (max(tops) if tops else 0) < 2.0
    scale, unit = (1000.0, "ms") if in_ms else (1.0, "s")
    for i, (label, rows) in enumerate(series):
        for stat, style, marker in (("p50", "--", "o"), ("p99", "-", "s")):
            pts = [(r, r["latency_s"][metric][stat]) for r in rows if r["latency_s"] is not None
                   and r["latency_s"][metric][stat]["value"] is not None]
            if not pts:
                continue
            xs = np.array([_x(r, kind) for r, _ in pts])
            ys = np.array([e["value"] for _, e in pts]) * scale
            low = np.array([(e["value"] - e["ci95"][0]) if e["ci95"] and e["ci95"][0] is not None else 0.0
                            for _, e in pts]) * scale
            high = np.array([(e["ci95"][1] - e["value"]) if e["ci95"] and e["ci95"][1] is not None else 0.0
                             for _, e in pts]) * scale
            ax.errorbar(xs, ys, yerr=[low, high], color=_colour(i), linestyle=style, marker=marker,
                        markersize=4, linewidth=1.5, capsize=3, label=f"{label}: {stat}")
        sat = [_x(r, kind) for r in rows if r["saturated"]]
        if sat:
            ax.scatter(sat, [0.96] * len(sat), transform=ax.get_xaxis_transform(), marker="x", s=60,
                       color="#c0392b", zorder=5)
    slo_key = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "total": "total"}[metric]
    if slo_key in limits:
        ax.axhline(limits[slo_key] * scale, color=SLO_COLOUR, linestyle="--", linewidth=1.2)
        ax.annotate(f" SLO {limits[slo_key] * scale:g} {unit}", xy=(0.0, limits[slo_key] * scale),
                    xycoords=("axes fraction", "data"), va="bottom", color=SLO_COLOUR, fontsize=9)
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(x_label)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    _style(ax)


def _legend(ax: Any, doc: dict[str, Any], series: list[tuple[str, list[dict[str, Any]]]],
            limits: dict[str, float]) -> None:
    """The sixth panel: one legend for the series' colours and the marks and lines of every panel."""
    from matplotlib.lines import Line2D

    kind = doc["kind"]
    grey = "#555555"
    handles = [Line2D([], [], color=_colour(i), linewidth=2.5, label=label) for i, (label, _) in enumerate(series)]
    handles += [Line2D([], [], color=grey, marker="o", linewidth=1.8, label="throughput achieved (circles)")]
    if doc.get("slo") and kind != "concurrency":  # a closed loop has no goodput (headline.py)
        handles.append(Line2D([], [], color=grey, marker="s", linestyle="--", label="goodput (squares, dashed)"))
    handles += [Line2D([], [], color=grey, marker="o", linestyle="--", label="latency p50 (dashed)"),
                Line2D([], [], color=grey, marker="s", linestyle="-", label="latency p99 (solid); bars: 95% interval")]
    if kind != "concurrency":
        handles.append(Line2D([], [], color="#999999", linestyle=":", label="achieved = offered"))
    if any(r["saturated"] for r in doc["points"]):
        handles.append(Line2D([], [], color="#c0392b", marker="x", linestyle="none", markersize=8,
                              label="over-saturated: stopped early, no latency"))
    if limits:
        handles.append(Line2D([], [], color=SLO_COLOUR, linestyle="--", label="SLO limit"))
    if doc.get("capacity"):
        handles.append(Line2D([], [], color=grey, linestyle="-.", label="highest rate that met every SLO"))
    ax.axis("off")
    title = f"simulated seconds (--speed {doc['speed']:g})" if doc.get("speed") else None
    ax.legend(handles=handles, loc="center", frameon=False, fontsize=9, title=title, title_fontsize=9)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.1f}"


def render_sweep_html(doc: dict[str, Any]) -> tuple[str, bytes]:
    """A self-contained page (the figure as inline SVG, the points, the rules), and the figure as PNG bytes."""
    fig = load_latency(doc)
    svg, png = plots.to_svg(fig), plots.to_png(fig)
    plots.close(fig)
    kind = doc["kind"]
    head = ["point", "rate" if kind != "concurrency" else "concurrency", "servers", "policy", "status", "req/s",
            "goodput", "TTFT p50", "TTFT p99", "TPOT p99", "ITL p99", "total p99", "SLO"]
    body_rows = []
    for r in doc["points"]:
        lat = r["latency_s"] or {}

        def cell(metric: str, stat: str) -> str:
            est = lat.get(metric, {}).get(stat)
            if est is None:
                return "-"
            ci = f" [{_ms(est['ci95'][0])}, {_ms(est['ci95'][1])}]" if est["ci95"] else ""
            return _ms(est["value"]) + ci

        x = r["concurrency"] if kind == "concurrency" else f"{r['rate']:.4g}"
        servers = str(r["gpus"]) if r.get("pd") is None else f"{r['gpus']} (PD {r['pd']})"
        cells = [r["point"], str(x), servers, r["policy"], r["status"],
                 "-" if r["throughput_rps"] is None else f"{r['throughput_rps']:.2f}",
                 "-" if r["goodput_rps"] is None else f"{r['goodput_rps']:.2f}",
                 cell("ttft", "p50"), cell("ttft", "p99"), cell("tpot", "p99"), cell("itl", "p99"),
                 cell("total", "p99"), r["verdict"] or "-"]
        body_rows.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in cells) + "</tr>")
    rules = "".join(f"<h3>{escape(k)}</h3><pre>{escape(v)}</pre>" for k, v in doc["rules"].items() if v)
    page = (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{escape(doc['name'])}</title><style>body{{font-family:sans-serif;max-width:1500px;margin:24px auto;"
        "padding:0 16px}table{border-collapse:collapse;font-size:.9em}td,th{padding:3px 8px;border-bottom:1px solid "
        "#ddd;white-space:nowrap}figure svg{width:100%;height:auto}pre{white-space:pre-wrap;font-size:.85em}"
        "</style></head><body>\n"
        f"<h1>tracebench sweep {escape(doc['name'])}</h1>"
        f"<p>{escape(kind)} sweep of {escape(doc['trace']['path'])} ({doc['trace']['num_requests']} requests), "
        f"status {escape(doc['status'])}. Latencies in ms with 95% bootstrap intervals.</p>"
        f"<figure>{svg}</figure><table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head)
        + "</tr></thead><tbody>" + "".join(body_rows) + "</tbody></table>"
        + f"<h2>Rules</h2>{rules}</body></html>\n"
    )
    return page, png

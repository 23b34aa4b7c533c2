"""The sweep summary as CSV and as a terminal table (at most 100 columns), from the summary document (run.py)."""

from __future__ import annotations

import csv
import io
from typing import Any

from tracebench.replay.records import STATUSES
from tracebench.report.headline import HEADLINE_METRICS, HEADLINE_STATS
from tracebench.report.load import COMPLETED_STATUSES

WIDTH = 100


def _csv_columns(doc: dict[str, Any]) -> list[str]:
    cols = ["point", "rate", "offered_rps", "concurrency", "gpus", "pd", "policy", "status", "verdict", "requests", "ok",
            "mismatch", "not_completed", "duration_s", "throughput_rps", "output_tokens_per_s", "goodput_rps", "slo_fraction"]
    for metric in HEADLINE_METRICS:
        for stat in HEADLINE_STATS:
            cols += [f"{metric}_{stat}_s", f"{metric}_{stat}_ci95_low_s", f"{metric}_{stat}_ci95_high_s"]
    slo = doc.get("slo")
    if slo:
        p = f"p{slo['percentile']:g}"
        for key in slo["limits_s"]:
            cols += [f"slo_{key}_limit_s", f"slo_{key}_{p}_s", f"slo_{key}_{p}_ci95_low_s",
                     f"slo_{key}_{p}_ci95_high_s", f"slo_{key}_verdict"]
    return cols + ["saturation", "wall_s"]


def _inf(value: Any, has_value: bool) -> Any:
    """CSV: a percentile that falls on failed requests (null in JSON) is written inf."""
    return "inf" if value is None and has_value else value


def summary_csv(doc: dict[str, Any]) -> str:
    """One line per point: the columns of _csv_columns (seconds; empty = not measured, inf = the percentile falls
    on requests that did not finish)."""
    cols = _csv_columns(doc)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=cols, lineterminator="\n")
    writer.writeheader()
    slo = doc.get("slo")
    for row in doc["points"]:
        counts = row["counts"]
        line: dict[str, Any] = {k: row.get(k) for k in ("point", "rate", "offered_rps", "concurrency", "gpus", "pd", "policy",
                                                       "status", "verdict", "requests", "duration_s", "throughput_rps",
                                                       "output_tokens_per_s", "goodput_rps", "slo_fraction",
                                                       "saturation", "wall_s")}
        line["ok"], line["mismatch"] = counts.get("ok", 0), counts.get("mismatch", 0)
        # the record statuses that did not complete (counts also holds the derived `completed`, ok + mismatch)
        line["not_completed"] = sum(counts.get(k, 0) for k in STATUSES if k not in COMPLETED_STATUSES)
        latency = row["latency_s"] or {}
        for metric in HEADLINE_METRICS:
            for stat in HEADLINE_STATS:
                est = latency.get(metric, {}).get(stat)
                if est is None:
                    continue
                line[f"{metric}_{stat}_s"] = est["value"]
                if est["ci95"] is not None:
                    line[f"{metric}_{stat}_ci95_low_s"], line[f"{metric}_{stat}_ci95_high_s"] = est["ci95"]
        if slo and row.get("slo_check"):
            p = f"p{slo['percentile']:g}"
            for key, check in row["slo_check"].items():
                line[f"slo_{key}_limit_s"] = check["limit_s"]
                line[f"slo_{key}_{p}_s"] = _inf(check["value"], True)
                if check["ci95"] is not None:
                    low, high = check["ci95"]
                    line[f"slo_{key}_{p}_ci95_low_s"], line[f"slo_{key}_{p}_ci95_high_s"] = _inf(low, True), _inf(high, True)
                line[f"slo_{key}_verdict"] = check["verdict"]
        writer.writerow(line)
    return out.getvalue()


# ------------------------------------------------------------------------------------------------ terminal

def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    ms = value * 1000.0
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.2f}"


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _lat(row: dict[str, Any], metric: str, stat: str) -> str:
    latency = row["latency_s"]
    if latency is None:
        return "-"
    est = latency.get(metric, {}).get(stat)
    return _ms(est["value"]) if est is not None else "-"


def _result(row: dict[str, Any]) -> str:
    if row["saturated"]:
        return "saturated"
    if row.get("faults"):
        return "FAULT"
    if row["status"] != "completed":
        return row["status"].upper()
    return row["verdict"] or "ok"


def _wrap(text: str, indent: str = "  ") -> list[str]:
    words, lines, line = text.split(), [], indent
    for word in words:
        if len(line) + len(word) + 1 > WIDTH and line.strip():
            lines.append(line.rstrip())
            line = indent + "  "
        line += word + " "
    if line.strip():
        lines.append(line.rstrip())
    return lines


def setup_name(gpus: int, pd: str | None) -> str:
    """`2 servers`, or `PD 1:3 (4 servers)` for PD points."""
    servers = f"{gpus} server{'s' if gpus > 1 else ''}"
    return servers if pd is None else f"PD {pd} ({servers})"


def terminal_summary(doc: dict[str, Any], folder: str) -> str:
    """The sweep as a table that fits WIDTH columns (one block per --gpus / --policy combination), then the
    capacity found, the notes, the folder."""
    points = doc["points"]
    kind = doc["kind"]
    slo = doc.get("slo")
    # with --slo, both of its figures under their own names (issue 33 A6): "all met", the share of requests meeting
    # every limit together (the report's figure and its --fail-on-slo gate), and "result", each key's percentile
    # against its limit (the sweep's verdict)
    head = ["conc." if kind == "concurrency" else "rate", "req/s", "good/s", "TTFT p50", "p99", "TPOT p50", "p99",
            "ITL p99", "total p99", *(["all met"] if slo else []), "result"]
    groups: dict[tuple[int, str | None, str], list[list[str]]] = {}
    for row in points:
        value = row["concurrency"] if kind == "concurrency" else row["rate"]
        share = row.get("slo_fraction")
        groups.setdefault((row["gpus"], row.get("pd"), row["policy"]), []).append([
            f"{value:.4g}", _num(row["throughput_rps"]), _num(row["goodput_rps"]), _lat(row, "ttft", "p50"),
            _lat(row, "ttft", "p99"), _lat(row, "tpot", "p50"), _lat(row, "tpot", "p99"), _lat(row, "itl", "p99"),
            _lat(row, "total", "p99"), *([("-" if share is None else f"{share * 100:.1f}%")] if slo else []),
            _result(row)])
    rows = [r for block in groups.values() for r in block]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = []
    speed = f" at --speed {doc['speed']:g}" if doc.get("speed") else ""
    what = {"rate": "rate sweep", "concurrency": "concurrency sweep", "capacity": "capacity search"}[kind]
    lines += _wrap(f"tracebench sweep {doc['name']}: {what} of {doc['trace']['path']} "
                   f"({doc['trace']['num_requests']} requests){speed}, {len(points)} point(s) in "
                   f"{doc['wall_s']:.1f} s, {doc['status']}", indent="")

    def fmt(cells: list[str]) -> str:
        return "  " + "  ".join(c.ljust(w) if i == len(cells) - 1 else c.rjust(w)
                                for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    multi = len(groups) > 1
    lines.append(fmt(head))
    for (gpus, pd, policy), block in groups.items():
        if multi:
            lines.append(f"  {setup_name(gpus, pd)}, policy {policy}:")
        lines += [fmt(r) for r in block]
    notes = _notes(doc)
    for note in notes:
        lines += _wrap(note)
    if doc.get("error"):
        lines += _wrap(f"! the sweep {doc['status']}: {doc['error']}", indent="")
    for warning in doc.get("warnings") or []:
        lines += _wrap("! " + warning, indent="")
    lines += _capacity_lines(doc)
    lines += _wrap(f"folder: {folder} (summary.csv, summary.json, load-latency.html and .png, traces/, one run "
                   "folder per point: `tracebench report` compares any of them)", indent="")
    return "\n".join(lines) + "\n"


def _notes(doc: dict[str, Any]) -> list[str]:
    """What the table's figures are, and the notes the points call for: the closed loop, the SLO verdict, saturated
    and faulted points."""
    points = doc["points"]
    kind = doc["kind"]
    slo = doc.get("slo")
    notes = ["latencies in ms (p50/p99 over ok requests, the report's definitions; their 95% intervals are in "
             "summary.csv and summary.json); req/s: ok requests per second of the point's window; "
             + ("good/s: requests meeting every --slo limit per second." if slo else "good/s needs --slo.")]
    if kind == "concurrency":
        notes.append("closed loop: TTFT and total latency are from dispatch (when the client sent the request, as "
                     "bench_serving measures a closed loop), not from arrival (every request arrives at 0); the SLO "
                     "check uses them too; goodput (the report's, from arrival) is left out.")
    if slo:
        limits = ", ".join(f"{k} <= {_ms(v)} ms" for k, v in slo["limits_s"].items())
        notes.append(f"result (the sweep's SLO verdict): the p{slo['percentile']:g} of each SLO key ({limits}) with its "
                     "95% bootstrap interval: met when the interval's upper end is within every limit, missed when a "
                     "lower end is above one, else uncertain (a request that did not finish counts as a miss). all "
                     "met: the share of the point's requests meeting every limit together, the report's \"fraction "
                     "meeting all\", on which `tracebench report --slo ... --fail-on-slo` gates (it may be below "
                     f"{slo['percentile']:g}% while each key alone is met).")
    if any(r["saturated"] for r in points):
        notes.append(f"saturated: the point was stopped as over-saturated (--saturation-window "
                     f"{doc['saturation_window_s']:g} s; docs/sweep.md): no latency is reported for it. First: "
                     + next(r["saturation"] for r in points if r["saturated"]))
    faulted = [r for r in points if r.get("faults")]
    if faulted:
        notes.append("FAULT: a server went down, a request stalled or failed during the point: its figures measure "
                     "the fault, not the rate, so it has no SLO verdict, and the sweep stops there (docs/sweep.md; "
                     f"the reasons: summary.json points[].faults): {', '.join(r['point'] for r in faulted)}.")
    return notes


def _capacity_lines(doc: dict[str, Any]) -> list[str]:
    """Each setup's capacity found (--find-max-rate), with its SLO checks at the highest rate that met them."""
    points = doc["points"]
    lines: list[str] = []
    for entry in doc.get("capacity") or []:
        lines += _wrap(f"capacity, {setup_name(entry['gpus'], entry.get('pd'))}, policy {entry['policy']}: "
                       f"{capacity_line(entry)}", indent="")
        best = next((r for r in points if r["gpus"] == entry["gpus"] and r.get("pd") == entry.get("pd")
                     and r["policy"] == entry["policy"] and r["rate"] == entry.get("max_rate")), None)
        if best is not None and best.get("slo_check"):
            checks = "; ".join(
                f"{k} p{c['percentile']:g} {_ms(c['value'])} ms [{_ms(c['ci95'][0]) if c['ci95'] else '-'}, "
                f"{_ms(c['ci95'][1]) if c['ci95'] else '-'}] <= {_ms(c['limit_s'])}"
                for k, c in best["slo_check"].items())
            lines += _wrap(f"at {best['rate']:.4g} req/s: {checks}", indent="  ")
    return lines


def _fmt_value(value: float) -> str:
    return f"{value:.4g}"


def capacity_line(entry: dict[str, Any]) -> str:
    """One capacity search's answer in words (the terminal's and the sweep's progress line)."""
    lo, hi = entry.get("max_rate"), entry.get("lowest_rate_not_met")
    if lo is None:
        return (f"no rate met the SLO (lowest tried {_fmt_value(hi)} req/s); {entry.get('stopped')}" if hi
                else f"no answer; {entry['stopped']}" if entry.get("stopped") else "no point")
    if hi is None:
        return f"every rate tried met the SLO, up to {_fmt_value(lo)} req/s; {entry.get('stopped')}"
    per = f", {_fmt_value(lo / entry['gpus'])} per server" if entry["gpus"] > 1 else ""
    return (f"max rate {_fmt_value(lo)} req/s{per} (met; {_fmt_value(hi)} did not), {len(entry.get('points', []))} "
            f"points; {entry.get('stopped')}")

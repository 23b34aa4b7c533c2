"""CSV, long ("tidy") form: one number per line, columns run, metric, stat, value, unit.

metric is `section.name` (`latency.total`, `throughput.requests_per_s`, `server.1`, ...); a delta against the
baseline is the stat with a suffix: `p50.delta`, `p50.delta_pct`, `p50.ci95_low`, `p50.ci95_high`,
`p50.significant` (1/0). A few descriptive lines (`run.status`, `run.times`, `balance.verdict`) carry text in
`value`. `run.speed` is the replay's --speed K (empty: real time); the times of such a run are simulated seconds.
`mismatch_reason` lines count a run's mismatch records by reason (the reason in `stat`, the count in `value`).
`breakdown.<stage>` lines (where the time went, report/breakdown.py) have a `whose` line: tracebench, sglang, both, or
the run's own setting whose wait it is (--max-concurrency, router cap, static batching)."""

from __future__ import annotations

import csv
import io

from tracebench.report.breakdown import BY_KEY as BREAKDOWN_STAGES
from tracebench.report.metrics import Report

HEADER = ("run", "metric", "stat", "value", "unit")


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return ""
    return str(int(value)) if unit in ("requests", "tokens") else repr(float(value))


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(HEADER)
    for i, run in enumerate(report.runs):
        label = run.label
        out.writerow((label, "run", "status", run.status, ""))
        out.writerow((label, "run", "baseline", "1" if i == report.baseline else "0", ""))
        out.writerow((label, "run", "speed", _num(run.speed), "x"))
        times = "seconds (run clock)" if run.speed is None else f"simulated seconds ({run.speed_conversion})"
        out.writerow((label, "run", "times", times, ""))
        out.writerow((label, "run", "records", run.records, "requests"))
        out.writerow((label, "run", "missing", run.missing, "requests"))
        out.writerow((label, "run", "kept", run.kept, "requests"))
        out.writerow((label, "run", "window_start", _num(run.window_start), "s"))
        out.writerow((label, "run", "window_end", _num(run.window_end), "s"))
        out.writerow((label, "run", "max_concurrency", _num(run.max_concurrency, "requests"), "requests"))
        for reason, count in run.mismatch_reasons.items():  # stat: the reason (the request's own numbers taken out)
            out.writerow((label, "mismatch_reason", reason, count, "requests"))
        for section in report.sections:
            for row in section.rows:
                metric = f"{section.key}.{row.metric}"
                if section.key == "breakdown" and row.stat == "p50":  # once per stage: whose time it is
                    out.writerow((label, metric, "whose", BREAKDOWN_STAGES[row.metric].whose, ""))
                out.writerow((label, metric, row.stat, _num(row.values[i], row.unit), row.unit))
                delta = row.deltas[i]
                if delta is None:
                    continue
                out.writerow((label, metric, f"{row.stat}.delta", _num(delta.abs, row.unit), row.unit))
                out.writerow((label, metric, f"{row.stat}.delta_pct", _num(delta.pct), "%"))
                if delta.ci_low is not None:
                    out.writerow((label, metric, f"{row.stat}.ci95_low", _num(delta.ci_low), row.unit))
                    out.writerow((label, metric, f"{row.stat}.ci95_high", _num(delta.ci_high), row.unit))
                    out.writerow((label, metric, f"{row.stat}.significant", int(bool(delta.significant)), ""))
        for load in report.servers[i]:
            metric = f"server.{load.server}"
            out.writerow((label, metric, "requests", load.requests, "requests"))
            out.writerow((label, metric, "share", _num(load.share), "fraction"))
            out.writerow((label, metric, "busy_s", _num(load.busy_s), "s"))
            out.writerow((label, metric, "busy_fraction", _num(load.busy_fraction), "fraction"))
            out.writerow((label, metric, "mean_in_flight", _num(load.mean_in_flight), "requests (time-average)"))
            if load.cache_hit_rate is not None:
                out.writerow((label, metric, "cache_hit_rate", _num(load.cache_hit_rate), "fraction"))
                out.writerow((label, metric, "prefill_tokens", load.prefill_tokens, "tokens"))
        bal = report.balance[i]
        out.writerow((label, "balance", "verdict", bal.verdict, ""))
        out.writerow((label, "balance", "cv", _num(bal.cv), ""))
        out.writerow((label, "balance", "max_min_ratio", _num(bal.max_min_ratio), ""))
    return buf.getvalue()

"""JSON: every number, machine-readable. Latencies in seconds; `units` says the unit of each section's values."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import orjson

from tracebench.report.breakdown import ALL_STAGES
from tracebench.report.metrics import BALANCE_CV_MAX, CI_LEVEL, LATENCY_METRICS, Report, time_note

# sections with several statistics per metric: metric -> stat -> value
MULTI_STAT = ("latency", "pd", "cache_ttft", "breakdown")

REPORT_FORMAT_VERSION = 1


def _value(unit: str, value: float | None) -> float | int | None:
    """Counts are whole numbers: written as integers."""
    return int(value) if unit in ("requests", "tokens") and value is not None else value


def report_dict(report: Report) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i, run in enumerate(report.runs):
        entry: dict[str, Any] = {
            "label": run.label, "path": run.path, "run_name": run.run_name, "status": run.status, "mark": run.mark,
            "baseline": i == report.baseline, "backend": run.backend,
            "trace": {"path": run.trace_path, "sha256": run.trace_sha256, "num_requests": run.trace_requests},
            "records": run.records, "missing": run.missing, "kept": run.kept,
            "window": {"start": run.window_start, "end": run.window_end, "duration_s": run.duration}, "t_end": run.t_end,
            "speed": run.speed, "max_concurrency": run.max_concurrency,
            "mismatch_reasons": run.mismatch_reasons,  # kept mismatch records by reason
            "times": "seconds (run clock)" if run.speed is None else f"simulated seconds ({run.speed_conversion})",
        }
        deltas: dict[str, Any] = {}
        for section in report.sections:
            values: dict[str, Any] = {}
            section_deltas: dict[str, Any] = {}
            for row in section.rows:
                if section.key in MULTI_STAT:
                    values.setdefault(row.metric, {})[row.stat] = row.values[i]
                else:
                    values[row.metric] = _value(row.unit, row.values[i])
                delta = row.deltas[i]
                if delta is None:
                    continue
                d = {"abs": _value(row.unit, delta.abs), "pct": delta.pct}
                if delta.ci_low is not None:
                    d |= {"ci95_low": delta.ci_low, "ci95_high": delta.ci_high, "significant": delta.significant}
                if section.key in MULTI_STAT:
                    section_deltas.setdefault(row.metric, {})[row.stat] = d
                else:
                    section_deltas[row.metric] = d
            entry[section.key] = values
            if i != report.baseline:
                deltas[section.key] = section_deltas
        entry["servers"] = [asdict(load) for load in report.servers[i]]
        entry["balance"] = asdict(report.balance[i])
        if report.pd and report.pd[i] is not None:   # a PD run: stages, KV transfers, pools (report/pd.py)
            entry["pd_detail"] = asdict(report.pd[i])
        if i != report.baseline:
            entry["delta"] = deltas
        runs.append(entry)
    return {
        "tracebench_report": REPORT_FORMAT_VERSION,
        "baseline": report.runs[report.baseline].label,
        "options": {
            "warmup_s": report.warmup_s, "bootstrap_resamples": report.bootstrap, "seed": report.seed,
            "slo_s": report.slo, "percentile_method": "linear (numpy default)", "ci_level": CI_LEVEL,
            "balance_cv_max": BALANCE_CV_MAX,
        },
        "units": {"requests": "requests", "throughput": {"duration": "s", "requests_per_s": "req/s",
                  "input_tokens_per_s": "tok/s", "output_tokens_per_s": "tok/s"}, "latency": "s", "breakdown": "s",
                  "slo": {"met": "requests", "fraction": "fraction of kept requests", "goodput": "req/s",
                          **{f"fraction_{key}": "fraction of kept requests" for key in report.slo or {}}}},
        "latency_definitions": {key: definition for key, _, definition in LATENCY_METRICS},
        # the breakdown's stages (report/breakdown.py, docs/overhead.md): the two stamps, whose time it is, and the
        # duration field that cuts the span (slot_wait_s, batch_wait_s: "in" it, or the span "less" it; null: the
        # whole span)
        "breakdown_stages": {s.key: {"label": s.label, "from": s.start, "to": s.end, "whose": s.whose, "what": s.what,
                                     "part": None if s.part is None else {"how": s.part[0], "field": s.part[1]}}
                             for s in ALL_STAGES},
        "warnings": report.warnings,
        "notes": [note] if (note := time_note(report.runs)) is not None else [],
        "config": {
            "changed": {key: dict(zip((r.label for r in report.runs), values)) for key, values in report.config.changed},
            "same": dict(report.config.same),
        },
        "runs": runs,
    }


def render_json(report: Report) -> str:
    return orjson.dumps(report_dict(report), option=orjson.OPT_INDENT_2).decode() + "\n"

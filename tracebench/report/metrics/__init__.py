"""The report's numbers, split by family: `definitions` (what each number is), `stats` (per run), `ci` (intervals),
`sections` (the report assembled: `build_report`), `series` (HTML plots), `config` (what a run was configured as),
`schema` (the Report's dataclasses). This face hands on the names callers import from `tracebench.report.metrics`."""

from tracebench.report.metrics.ci import bootstrap_ci, bootstrap_percentile, ratio_ci
from tracebench.report.metrics.config import (SPEED_SENSITIVE, attached_sim_speeds, backend_text, config_of, diff_config,
                                              simulated_accelerators, speed_text, speed_warning, time_note)
from tracebench.report.metrics.definitions import (BALANCE_CV_MAX, CI_LEVEL, LATENCY,
                                                   LATENCY_LABELS, LATENCY_METRICS, LATENCY_STATS, PERCENTILES, POOLED,
                                                   SLO_KEYS, MetricDef, latency_expr, parse_slo)
from tracebench.report.metrics.schema import (Balance, ConfigDiff, Delta, Report, Row, RunSeries, RunSummary, Section,
                                              ServerLoad, ServerSeries)
from tracebench.report.metrics.sections import SECTIONS, build_report, check_same_trace
from tracebench.report.metrics.series import (CDF_METRICS, CDF_POINTS, COMPLETIONS_PER_WINDOW, SCATTER_POINTS, TIME_BINS,
                                              _cap_labels, _integral_of_count, read_telemetry)
from tracebench.report.metrics.stats import CacheStats, _busy_time, pooled_itl

__all__ = [
    "BALANCE_CV_MAX", "CDF_METRICS", "CDF_POINTS", "CI_LEVEL", "COMPLETIONS_PER_WINDOW",
    "LATENCY", "LATENCY_LABELS", "LATENCY_METRICS", "LATENCY_STATS", "PERCENTILES", "POOLED", "SCATTER_POINTS",
    "SECTIONS", "SLO_KEYS", "SPEED_SENSITIVE", "TIME_BINS", "Balance", "CacheStats", "ConfigDiff", "Delta",
    "MetricDef", "Report", "Row", "RunSeries", "RunSummary", "Section", "ServerLoad", "ServerSeries", "_busy_time",
    "_cap_labels", "_integral_of_count", "attached_sim_speeds", "backend_text", "bootstrap_ci", "bootstrap_percentile",
    "build_report", "check_same_trace", "config_of", "diff_config", "latency_expr", "parse_slo", "pooled_itl",
    "ratio_ci", "read_telemetry", "simulated_accelerators", "speed_text", "speed_warning", "time_note",
]

"""`tracebench report ... --slo SPEC --fail-on-slo`: the CI gate. A run meets its SLO when at least P% of its kept
requests (P = --slo-percentile, 99 by default) meet every limit, i.e. the report's "fraction meeting all" (a kept
request that did not finish ok meets none); each limit holds then at the P-th percentile. Every RUN given is
checked, the baseline too. A run that did not complete (run.json status other than `completed`: killed, still
`running`, interrupted, failed, stopped as over-saturated) or lacks records of its trace's requests never passes,
whatever fraction its records reach (issue 33 item 5: a replay killed after 256 of 600 records passed)."""

from __future__ import annotations

from tracebench.report.metrics.schema import Report


def slo_misses(report: Report, percentile: float) -> list[str]:
    """One line per run that misses, naming the run, what fraction met all, and each limit it misses alone."""
    assert report.slo is not None
    rows = {row.metric: row for section in report.sections if section.key == "slo" for row in section.rows}
    need = percentile / 100.0
    lines = []
    for i, run in enumerate(report.runs):
        fraction = rows["fraction"].values[i]
        if run.status != "completed" or run.missing:
            not_recorded = f", {run.missing} of {run.trace_requests} trace requests not recorded" if run.missing else ""
            lines.append(f"run '{run.label}' [{run.mark or run.status}]: the run did not complete{not_recorded}: an "
                         "unfinished run never passes the gate")
            continue
        if fraction is not None and fraction >= need:
            continue
        missed = [f"{key} <= {limit:g} s met by {_pct(rows[f'fraction_{key}'].values[i])}"
                  for key, limit in report.slo.items()
                  if (alone := rows[f"fraction_{key}"].values[i]) is None or alone < need]
        status = "" if run.status == "completed" else f" [{run.status}]"
        lines.append(f"run '{run.label}'{status}: {_pct(fraction)} of {run.kept} kept requests meet every limit "
                     f"(needed {percentile:g}%): " + ("; ".join(missed) if missed else
                                                     "each limit alone is met, not all together"))
    return lines


def _pct(value: float | None) -> str:
    return "none" if value is None else f"{value * 100:.1f}%"

"""Renderers of a Report. `document()` lays the report out once as titled tables of text cells; the terminal
table, Markdown and HTML renderers draw that layout; CSV and JSON write the numbers themselves."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracebench.report.breakdown import BY_KEY as BREAKDOWN_STAGES
from tracebench.report.metrics import BALANCE_CV_MAX, CI_LEVEL, PERCENTILES, Delta, Report, Row, time_note

LAYOUTS = ("auto", "wide", "runs")
RUNS_LAYOUT_FROM = 3  # --layout auto: the runs layout from this many runs on


@dataclass
class Cell:
    text: str
    tone: str | None = None  # "good" / "bad" / "warn": the terminal colours it, HTML styles it
    strong: bool = False


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[Cell]]
    align: list[str]  # "l" / "r" per column
    notes: list[str] = field(default_factory=list)
    # How the terminal table narrows a table wider than the terminal (render/table.py): the first `keys` columns are
    # repeated in every part when the columns are split; columns with the same `groups` value stay in one part
    # (None: each column on its own); the body cells of the `wrap` columns may wrap at spaces (headers always may).
    keys: int = 1
    groups: list[int] | None = None
    wrap: frozenset[int] = frozenset()


@dataclass
class Document:
    title: str
    lines: list[str]  # under the title: what the numbers mean
    warnings: list[str]
    tables: list[Table]


# ------------------------------------------------------------------------------------------------ numbers as text

def _num(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def _latency_ms(seconds: float) -> str:
    ms = seconds * 1000.0
    size = abs(ms)
    return _num(ms, 0 if size >= 1000 else 1 if size >= 10 else 2 if size >= 0.1 else 3)


def fmt_value(unit: str, value: float | None) -> str:
    """`unit` as shown: "ms" values arrive in seconds (latencies); "s" is shown in seconds (durations)."""
    if value is None:
        return "-"
    if unit == "ms":
        return _latency_ms(value)
    if unit == "s":
        return _num(value, 2)
    if unit in ("requests", "tokens"):
        return _num(value, 0)
    if unit == "fraction":
        return f"{value * 100:.1f}%"
    if unit == "req/s":
        return _num(value, 2 if abs(value) < 1000 else 0)
    if unit == "tok/s":
        return _num(value, 1 if abs(value) < 100 else 0)
    return _num(value, 2)


def unit_shown(row: Row) -> str:
    """Latencies are shown in ms (they are stored in seconds); everything else in its own unit."""
    return "ms" if row.unit == "s" and row.section in ("latency", "pd", "cache_ttft", "breakdown") else row.unit


def fmt_signed(unit: str, value: float) -> str:
    if unit == "fraction":
        return f"{value * 100:+.1f} pp"
    text = fmt_value(unit, abs(value))
    return ("-" if value < 0 else "+") + text


def delta_tone(row: Row, delta: Delta) -> str | None:
    """Green when better, red when worse. Rows with an interval are coloured only when it excludes 0."""
    if delta.abs is None or delta.abs == 0 or row.better is None:
        return None
    if row.stat in PERCENTILES and delta.significant is not None:
        if not delta.significant:
            return None
    elif delta.pct is not None and abs(delta.pct) < 1.0:
        return None
    better = delta.abs < 0 if row.better == "lower" else delta.abs > 0
    return "good" if better else "bad"


def fmt_delta(row: Row, delta: Delta) -> Cell:
    if delta.abs is None:
        return Cell("-")
    text = fmt_signed(unit_shown(row), delta.abs)
    if delta.pct is not None and row.unit != "fraction":
        text += f" ({delta.pct:+.1f}%)"
    return Cell(text, delta_tone(row, delta))


def fmt_ci(row: Row, delta: Delta) -> Cell:
    if delta.ci_low is None or delta.ci_high is None:
        return Cell("")
    unit = unit_shown(row)
    text = f"[{fmt_signed(unit, delta.ci_low)}, {fmt_signed(unit, delta.ci_high)}]"
    if delta.significant:
        return Cell(text + " significant", delta_tone(row, delta), strong=True)
    return Cell(text)


# ------------------------------------------------------------------------------------------------ layout

def short_labels(labels: list[str]) -> list[str]:
    """Column headings for runs with long auto-made names (`trace-policy-mode-Ng-date-time`): only the `-`-separated
    parts that differ between the runs, without the date and time when the rest tells them apart. Labels that do not
    split alike, or would not stay distinct, are kept whole."""
    parts = [label.split("-") for label in labels]
    if len(labels) < 2 or len({len(p) for p in parts}) != 1:
        return labels
    differ = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
    undated = [i for i in differ if not all(p[i].isdigit() and len(p[i]) in (6, 8) for p in parts)]
    for positions in (undated, differ):
        short = ["-".join(p[i] for i in positions) for p in parts]
        if positions and len(set(short)) == len(short):
            return short
    return labels


def run_heading(report: Report, index: int) -> str:
    run = report.runs[index]
    text = short_labels([r.label for r in report.runs])[index]
    if index == report.baseline and len(report.runs) > 1:
        text += " (baseline)"
    if run.mark is not None:
        text += f" [{run.mark}]"
    return text


def _wide_section_table(report: Report, title: str, rows: list[Row], with_stat: bool) -> Table:
    others = [i for i in range(len(report.runs)) if i != report.baseline]
    with_ci = any(d is not None and d.ci_low is not None for row in rows for d in row.deltas)
    header = ["metric"] + (["stat"] if with_stat else []) + [run_heading(report, i) for i in range(len(report.runs))]
    align = ["l"] + (["l"] if with_stat else []) + ["r"] * len(report.runs)
    for i in others:
        header.append(f"Δ {short_labels([r.label for r in report.runs])[i]}")
        align.append("r")
        if with_ci:
            header.append(f"{int(CI_LEVEL * 100)}% CI of Δ")
            align.append("l")
    keys = 2 if with_stat else 1
    # a run's Δ and its interval stay side by side when the terminal splits the table
    groups = list(range(len(header))) if not with_ci else \
        list(range(keys + len(report.runs))) + [keys + len(report.runs) + i // 2 for i in range(2 * len(others))]
    out: list[list[Cell]] = []
    previous = None
    for row in rows:
        cells = _label_cells(row, previous, with_stat)
        previous = row.metric
        cells += [Cell(fmt_value(unit_shown(row), v)) for v in row.values]
        for i in others:
            delta = row.deltas[i]
            assert delta is not None
            cells.append(fmt_delta(row, delta))
            if with_ci:
                cells.append(fmt_ci(row, delta))
        out.append(cells)
    # the metric's label and the intervals may wrap (at spaces; an interval stays whole)
    wrap = frozenset([0, *(i for i, name in enumerate(header) if name.endswith("CI of Δ"))])
    return Table(title, header, out, align, keys=keys, groups=groups, wrap=wrap)


def _label_cells(row: Row, previous: str | None, with_stat: bool) -> list[Cell]:
    """A row's first cells: its metric's label (once per metric; with its unit where the table has no stat column),
    then its stat."""
    name = row.label if row.metric != previous else ""
    if not with_stat and row.unit not in ("requests", "tokens"):
        name = f"{row.label} ({unit_shown(row)})" if row.unit != "fraction" else row.label
    return [Cell(name)] + ([Cell(row.stat)] if with_stat else [])


def _delta_short(row: Row, delta: Delta | None) -> str:
    """A run's change against the baseline in a runs-layout cell: % of the baseline (pp for a fraction), `*` when its
    95% interval excludes 0."""
    if delta is None or delta.abs is None or (delta.abs == 0 and delta.pct is None):
        return ""
    if row.unit == "fraction":
        text = f"{delta.abs * 100:+.1f}pp"
    elif delta.pct is None:
        text = fmt_signed(unit_shown(row), delta.abs)
    else:
        text = f"{delta.pct:+.1f}%"
    return text + ("*" if delta.significant else "")


def _runs_layout_table(report: Report, title: str, rows: list[Row], with_stat: bool) -> Table:
    """The many-run layout (--layout runs): one column per run, each cell its value and its change against the
    baseline (%; `*` when the change's 95% interval excludes 0); under a percentile, a row of each run's own 95%
    interval. Narrow enough for five runs at 120 columns."""
    n = len(report.runs)
    header = ["metric"] + (["stat"] if with_stat else []) + [run_heading(report, i) for i in range(n)]
    align = ["l"] + (["l"] if with_stat else []) + ["r"] * n
    out: list[list[Cell]] = []
    previous = None
    for row in rows:
        cells = _label_cells(row, previous, with_stat)
        previous = row.metric
        for i, value in enumerate(row.values):
            delta = row.deltas[i]
            change = _delta_short(row, delta) if i != report.baseline else ""
            text = fmt_value(unit_shown(row), value) + (f" {change}" if change else "")
            cells.append(Cell(text, None if delta is None else delta_tone(row, delta)))
        out.append(cells)
        if row.cis is not None and any(ci is not None for ci in row.cis):
            unit = unit_shown(row)
            out.append([Cell("")] + ([Cell("95% CI")] if with_stat else []) + [
                Cell("" if ci is None else f"{fmt_value(unit, ci[0])}–{fmt_value(unit, ci[1])}") for ci in row.cis])
    notes = []
    if n > 1:
        notes.append("each run: its value and its change against the baseline (% of the baseline's value; pp for a "
                     "fraction; * when the change's 95% bootstrap interval excludes 0)")
    if any(row.cis for row in rows):
        notes.append("95% CI: the run's own interval of that percentile (bootstrap over its requests)")
    return Table(title, header, out, align, notes, keys=2 if with_stat else 1, wrap=frozenset([0]))


def _config_by_value_table(report: Report) -> Table:
    """What changed, for many runs (--layout runs): one row per setting and value, naming the runs that had it."""
    shorts = [run_heading(report, i) for i in range(len(report.runs))]
    rows: list[list[Cell]] = []
    for key, values in report.config.changed:
        first = True
        for value in dict.fromkeys(values):
            who = ", ".join(shorts[i] for i, v in enumerate(values) if v == value)
            rows.append([Cell(key if first else ""), Cell(value.replace('","', '", "'), strong=True), Cell(who)])
            first = False
    table = _config_table(report)
    return Table(table.title, ["setting", "value", "runs"], rows, ["l"] * 3, table.notes, wrap=frozenset((1, 2)))


def _runs_table(report: Report) -> Table:
    header = ["run", "status", "backend", "trace", "requests recorded", "kept", "window (s)"]
    shorts = short_labels([run.label for run in report.runs])
    if shorts != [run.label for run in report.runs]:
        header.insert(0, "column")  # the short heading the other tables use for this run
    rows = []
    for i, run in enumerate(report.runs):
        status = Cell(run.status if run.mark is None else run.mark, None if run.mark is None else "warn",
                      strong=run.mark is not None)
        # (no window without a completed request: its end is the last one's finish)
        window = ("-" if run.window_start is None or run.window_end is None
                  else f"{run.window_start:.2f} – {run.window_end:.2f}")
        rows.append([
            Cell(run.label + (" (baseline)" if i == report.baseline and len(report.runs) > 1 else "")), status,
            Cell(run.backend), Cell(f"{run.trace_path} ({run.trace_sha256[:12]})"),
            Cell(f"{run.records:,} of {run.trace_requests:,}", "warn" if run.missing else None),
            Cell(f"{run.kept:,}"), Cell(window),
        ])
        if header[0] == "column":
            rows[-1].insert(0, Cell(shorts[i]))
    offset = 1 if header[0] == "column" else 0
    wrap = frozenset(offset + i for i in (0, 2, 3, 6))  # run, backend, trace, window
    return Table("Runs", header, rows, ["l"] * (len(header) - 3) + ["r", "r", "r"], wrap=wrap)


# replay options worth repeating when they are the same everywhere (all the others are listed only when they differ)
SHOWN_OPTIONS = ("--speed", "--stream", "--timeout", "--server-args", "--batch-timeout", "--seed")


def _config_table(report: Report) -> Table:
    header = ["setting"] + [run_heading(report, i) for i in range(len(report.runs))]
    rows = [[Cell(key)] + [Cell(v, strong=True) for v in values] for key, values in report.config.changed]
    notes = []
    if len(report.runs) > 1 and not rows:
        notes.append("nothing: every run has the same settings")
    shown = [(k, v) for k, v in report.config.same if not k.startswith("--") or k in SHOWN_OPTIONS]
    hidden = len(report.config.same) - len(shown)
    same = " · ".join(f"{k} {v}" for k, v in shown) + (f" (+{hidden} more options alike)" if hidden else "")
    notes.append(("same in all runs: " if len(report.runs) > 1 else "settings: ") + same)
    return Table("What changed" if len(report.runs) > 1 else "Settings", header, rows, ["l"] * len(header), notes,
                 wrap=frozenset(range(1, len(header))))


def _servers_table(report: Report) -> Table:
    with_cache = any(load.cache_hit_rate is not None for loads in report.servers for load in loads)
    header = ["run", "server", "requests", "share", "busy (s)", "busy", "mean in-flight"]
    header += ["cache hit rate", "prefill tokens"] if with_cache else []
    rows: list[list[Cell]] = []
    shorts = short_labels([run.label for run in report.runs])
    for i, loads in enumerate(report.servers):
        for j, load in enumerate(loads):
            rows.append([
                Cell(shorts[i] if j == 0 else ""), Cell(f"{load.server} {load.role + ' ' if load.role else ''}{load.url}"),
                Cell("-" if load.requests is None else f"{load.requests:,}"), Cell(fmt_value("fraction", load.share)),
                Cell("-" if load.busy_s is None else f"{load.busy_s:,.2f}"), Cell(fmt_value("fraction", load.busy_fraction)),
                Cell("-" if load.mean_in_flight is None else f"{load.mean_in_flight:.2f}"),
            ])
            if with_cache:
                rows[-1] += [Cell(fmt_value("fraction", load.cache_hit_rate)),
                             Cell(fmt_value("tokens", None if load.prefill_tokens is None else float(load.prefill_tokens)))]
    notes = []
    for i, bal in enumerate(report.balance):
        detail = ""
        if bal.cv is not None:
            ratio = "inf (a server got none)" if bal.max_min_ratio is None else f"{bal.max_min_ratio:.2f}"
            detail = f" (CV of request counts {bal.cv:.3f} {'<=' if bal.cv <= BALANCE_CV_MAX else '>'} {BALANCE_CV_MAX:.2f}; max/min {ratio})"
        notes.append(f"{report.runs[i].label}: {bal.verdict}{detail}")
    return Table("Per server", header, rows, ["l", "l"] + ["r"] * (len(header) - 2), notes, keys=2,
                 wrap=frozenset((1,)))


def _pd_servers_table(report: Report) -> Table:
    """Each PD run's servers by pool: requests, KV transfers (the prefill servers' counters) and sglang's own
    per-stage means over the run."""
    header = ["run", "pool", "server", "requests", "KV transfers", "KV (MiB)", "transfer (ms, mean)", "GiB/s",
              "sglang stage means (ms)"]
    rows: list[list[Cell]] = []
    shorts = short_labels([run.label for run in report.runs])
    notes = []
    for i, pd in enumerate(report.pd):
        if pd is None:
            continue
        notes.append(f"{report.runs[i].label}: {pd.ratio}, {pd.routing}; {pd.link}")
        for j, row in enumerate(pd.servers):
            stages = ", ".join(f"{k} {fmt_value('ms', v)}" for k, v in row.stages.items() if v is not None)
            rows.append([
                Cell(shorts[i] if j == 0 else ""), Cell(row.role), Cell(f"{row.server} {row.url}"),
                Cell("-" if row.requests is None else f"{row.requests:,}"),
                Cell("-" if row.kv_transfers is None else f"{row.kv_transfers:,}"),
                Cell(fmt_value("MiB", row.kv_mib)), Cell(fmt_value("", row.kv_ms_mean)),
                Cell(fmt_value("GiB/s", row.kv_gib_s)), Cell(stages or ("-" if row.error is None else row.error)),
            ])
    return Table("PD servers", header, rows, ["l", "l", "l"] + ["r"] * 5 + ["l"], notes, keys=3,
                 wrap=frozenset((2, 8)))


_BREAKDOWN_NOTES = [
        "each stage lies between two stamps of a request's record (docs/overhead.md); the main stages follow one "
        "another from release lag to answer checked (their means add up to arrival -> record complete); first token "
        "out/in run beside them, on the way to the first token; sglang's stamps are its time.time() on the run clock",
        "whose: tracebench (this client), sglang (the server), both (the wire and both ends' reads and writes, not "
        "split further by the stamps), --max-concurrency (the run's own client limit), router cap (the run's own "
        "per-server cap: the wait for a free slot, record field slot_wait_s), static batching (the run's --mode "
        "static: the wait in a forming batch until it was sent, record field batch_wait_s)",
]


def _breakdown_table(report: Report, rows: list[Row], title: str, runs_layout: bool) -> Table:
    """The breakdown's stages with whose time each is and the two stamps it lies between."""
    table = (_runs_layout_table if runs_layout else _wide_section_table)(report, title, rows, with_stat=True)
    assert len(table.rows) == len(rows), "a breakdown row has no interval row under it"
    if runs_layout:  # narrower: whose and the two stamps in the stage's cell, "(tracebench): t_a -> t_b"; five runs
        # then fit 120 columns (a column of its own for the stamps took the room of a run)
        for row, cells in zip(rows, table.rows):
            if cells[0].text:
                stage = BREAKDOWN_STAGES[row.metric]
                cells[0] = Cell(f"{cells[0].text} ({stage.whose}): {stage.span}")
        table.header[0] = "stage (whose): from -> to"
        table.notes.append(_BREAKDOWN_NOTES[0])
        table.notes.append(_BREAKDOWN_NOTES[1].replace("whose:", "(whose):"))
        return table
    table.header[1:1] = ["whose", "from -> to"]
    table.align[1:1] = ["l", "l"]
    # the two new columns are keys too (repeated in every part of a split table); whose and the stamps may wrap
    table.keys += 2
    if table.groups is not None:
        table.groups[1:1] = [-1, -2]
    table.wrap = frozenset([*(i if i < 1 else i + 2 for i in table.wrap), 1, 2])
    previous = None
    for row, cells in zip(rows, table.rows):
        stage = BREAKDOWN_STAGES[row.metric]
        first = row.metric != previous
        previous = row.metric
        cells[1:1] = [Cell(stage.whose if first else ""), Cell(stage.span if first else "")]
    table.notes += _BREAKDOWN_NOTES
    return table


def resolve_layout(layout: str, runs: int, out_format: str) -> str:
    """--layout auto: `runs` for the terminal table (format `table`) of RUNS_LAYOUT_FROM runs or more, else `wide`
    (a page scrolls sideways; a terminal splits the table)."""
    if layout == "auto":
        return "runs" if runs >= RUNS_LAYOUT_FROM and out_format == "table" else "wide"
    return layout


def document(report: Report, layout: str = "wide") -> Document:
    """The report as titled tables. `layout` wide: each run's values, then each run's change against the baseline
    with the 95% interval of that change, in columns of their own; runs: one column per run (value, change, its own
    interval under each percentile)."""
    n = len(report.runs)
    runs_layout = layout == "runs"
    _section_table = _runs_layout_table if runs_layout else _wide_section_table
    lines = []
    if n > 1:
        lines.append(f"baseline: {report.runs[report.baseline].label} · Δ = run − baseline (absolute, and % of the baseline)")
    lines.append("latencies over completed requests (ok + mismatch), in ms · percentiles by linear interpolation "
                 "(numpy's default)")
    if n > 1 and report.bootstrap > 0 and not runs_layout:
        lines.append(f"{int(CI_LEVEL * 100)}% CI of Δ: bootstrap over requests, {report.bootstrap} resamples, seed {report.seed}; "
                     "'significant' only when it excludes 0")
    lines.append("duration: first arrival to last completed finish" + (f"; warm-up: arrivals before {report.warmup_s:g} s excluded"
                                                               if report.warmup_s > 0 else ""))
    note = time_note(report.runs)
    if note is not None:
        lines.append(note)
    tables = [_runs_table(report), _config_by_value_table(report) if runs_layout and n > 1 else _config_table(report)]
    by_key = {s.key: s for s in report.sections}
    tables.append(_section_table(report, "Requests and throughput",
                                 by_key["requests"].rows + by_key["throughput"].rows, with_stat=False))
    tables.append(_section_table(report, "Latency (ms)", by_key["latency"].rows, with_stat=True))
    if "slo" in by_key:
        tables.append(_section_table(report, by_key["slo"].title, by_key["slo"].rows, with_stat=False))
    if "cache" in by_key:
        tables.append(_section_table(report, by_key["cache"].title, by_key["cache"].rows, with_stat=False))
    if "cache_ttft" in by_key:
        table = _section_table(report, by_key["cache_ttft"].title, by_key["cache_ttft"].rows, with_stat=True)
        table.notes.append("like with like: a miss computes its whole prompt, a hit only its uncached part, and a "
                           "longer prompt takes longer either way, so hits and misses are compared within bands of "
                           "prompt length (input_len); TTFT from dispatch leaves out the router's queue, which "
                           "does not depend on the cache; 'uncached mean': prompt tokens computed per request")
        tables.append(table)
    if "pd" in by_key:
        table = _section_table(report, by_key["pd"].title, by_key["pd"].rows, with_stat=True)
        table.notes.append("stages from both servers' sglang stamps (prefill queue = dispatch -> prefill forward; "
                           "KV transfer = prefill done -> KV at the decode server; they add up to TTFT from "
                           "dispatch); '-' for a plain run (its TTFT is in the latency table) and for a run through "
                           "sglang-router, whose records have no prefill stamps (its servers' own stage means are "
                           "in the PD servers table)")
        tables.append(table)
        tables.append(_pd_servers_table(report))
    if "breakdown" in by_key:
        tables.append(_breakdown_table(report, by_key["breakdown"].rows, by_key["breakdown"].title, runs_layout))
    tables.append(_servers_table(report))
    title = "tracebench report: " + " vs ".join(run.label for run in report.runs)
    return Document(title, lines, merged_warnings(report.warnings), tables)


_RUN_WARNING = re.compile(r"run '((?:[^']|'(?!: ))*)': (.*)", re.S)


def merged_warnings(warnings: list[str]) -> list[str]:
    """The same warning about several runs once, naming them all (`runs 'a', 'b': ...`), where the first was."""
    out: list[str] = []
    runs_of: dict[str, list[str]] = {}
    for warning in warnings:
        match = _RUN_WARNING.fullmatch(warning)
        if match is None:
            out.append(warning)
            continue
        if match[2] not in runs_of:
            runs_of[match[2]] = []
            out.append(match[2])
        runs_of[match[2]].append(match[1])
    return [text if text not in runs_of else
            (f"run '{runs_of[text][0]}': " if len(runs_of[text]) == 1 else
             "runs " + ", ".join(f"'{run}'" for run in runs_of[text]) + ": ") + text
            for text in out]

"""One self-contained HTML page: the figures as inline SVG, the tables, the definitions. No external file or script."""

from __future__ import annotations

from html import escape

from tracebench.report.breakdown import ALL_STAGES
from tracebench.report.figure_options import FigureOptions
from tracebench.report.metrics import LATENCY_METRICS, Report
from tracebench.report.render import Cell, Document, Table

_CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px auto; max-width: 1500px;
       color: #222; padding: 0 16px; }
h1 { font-size: 1.5em; margin-bottom: 4px; } h2 { font-size: 1.2em; margin-top: 28px; }
ul.lines { color: #555; margin-top: 4px; } .warn { background: #fff3cd; border: 1px solid #e0b000; padding: 8px 12px;
  margin: 8px 0; font-weight: bold; }
table { border-collapse: collapse; font-size: 0.9em; margin: 6px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #e4e4e4; white-space: nowrap; }
th { background: #f4f4f4; text-align: left; } td.r { text-align: right; font-variant-numeric: tabular-nums; }
td.good { color: #1a7f37; } td.bad { color: #c62828; } td.warn { color: #9a6700; } td.strong { font-weight: bold; }
p.note { margin: 2px 0; color: #444; font-size: 0.9em; } figure { margin: 12px 0 24px; }
figure svg { width: 100%; height: auto; } dl { font-size: 0.9em; } dt { font-weight: bold; } dd { margin-bottom: 4px; }
"""


def _cell(cell: Cell, align: str) -> str:
    classes = [c for c in ("r" if align == "r" else "", cell.tone or "", "strong" if cell.strong else "") if c]
    attr = f' class="{" ".join(classes)}"' if classes else ""
    return f"<td{attr}>{escape(cell.text)}</td>"


def _table(table: Table) -> str:
    parts = [f"<h2>{escape(table.title)}</h2>"]
    if table.rows:
        parts.append("<table><thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in table.header) + "</tr></thead><tbody>")
        parts += ["<tr>" + "".join(_cell(c, a) for c, a in zip(row, table.align)) + "</tr>" for row in table.rows]
        parts.append("</tbody></table>")
    parts += [f'<p class="note">{escape(note)}</p>' for note in table.notes]
    return "\n".join(parts)


def render_html(report: Report, doc: Document, figure: FigureOptions | None = None) -> tuple[str, bytes, bytes | None]:
    """The page, the main figure (latency CDFs) as PNG bytes, and the server telemetry figure as PNG bytes (None when
    no run has /metrics scrapes or GPU samples)."""
    from tracebench.report.render import plots

    main = plots.latency_cdfs(report, figure)
    main_svg, main_png = plots.to_svg(main), plots.to_png(main)
    plots.close(main)
    figures = []
    for make in (plots.over_time, plots.server_load, plots.per_server_over_time):
        fig = make(report)
        figures.append(plots.to_svg(fig))
        plots.close(fig)
    telemetry_svg = telemetry_png = None
    if plots.has_server_telemetry(report):
        fig = plots.server_telemetry(report)
        telemetry_svg, telemetry_png = plots.to_svg(fig), plots.to_png(fig)
        plots.close(fig)

    tables = {t.title: t for t in doc.tables}
    head, rest = doc.tables[:2], doc.tables[2:]
    body = [f"<h1>{escape(doc.title)}</h1>", '<ul class="lines">' + "".join(f"<li>{escape(x)}</li>" for x in doc.lines) + "</ul>"]
    body += [f'<div class="warn">⚠ {escape(w)}</div>' for w in doc.warnings]
    body += [_table(t) for t in head]
    body.append(f'<figure id="latency-cdfs">{main_svg}</figure>')
    body += [_table(t) for t in rest if t.title != "Per server"]
    body.append(f'<figure id="over-time">{figures[0]}</figure>')
    body.append(_table(tables["Per server"]))
    body.append(f'<figure id="server-load">{figures[1]}</figure>')
    body.append(f'<figure id="per-server-over-time">{figures[2]}</figure>')
    if telemetry_svg is not None:
        body.append(f'<figure id="server-telemetry">{telemetry_svg}</figure>')
    body.append("<h2>Definitions</h2><dl>")
    body += [f"<dt>{escape(label)}</dt><dd>{escape(definition)}, over completed requests (shown in ms, as in the "
             f"tables and plots; JSON and CSV keep seconds)</dd>" for _, label, definition in LATENCY_METRICS]
    if "breakdown" in {s.key for s in report.sections}:
        body += [f"<dt>{escape(s.label)} ({escape(s.whose)})</dt><dd>{escape(s.span)}: "
                 f"{escape(s.what)}</dd>" for s in ALL_STAGES]
    body.append("<dt>completed</dt><dd>ok and mismatch requests: mismatch = finished, but the server generated or "
                "counted something else than the trace asked (the record's mismatch field says what)</dd>")
    body.append("<dt>duration</dt><dd>first arrival of a kept request to the last finish of a kept completed request; "
                "throughput = completed requests (their input_len / completion_tokens) per second of it</dd>")
    body.append("<dt>percentiles</dt><dd>linear interpolation between order statistics (numpy's default)</dd></dl>")
    page = ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(doc.title)}</title><style>{_CSS}</style></head>\n<body>\n"
            + "\n".join(body) + "\n</body></html>\n")
    return page, main_png, telemetry_png

"""Markdown: one GitHub-flavoured table per section."""

from __future__ import annotations

from tracebench.report.render import Cell, Document


def _cell(cell: Cell) -> str:
    text = cell.text.replace("|", "\\|")
    return f"**{text}**" if cell.strong and text else text


def render_md(doc: Document) -> str:
    lines = [f"# {doc.title}", ""] + [f"- {line}" for line in doc.lines]
    if doc.warnings:
        lines.append("")
        lines += [f"> **Warning:** {w}" for w in doc.warnings]
    for table in doc.tables:
        lines += ["", f"## {table.title}", ""]
        if table.rows:
            lines.append("| " + " | ".join(h.replace("|", "\\|") for h in table.header) + " |")
            lines.append("| " + " | ".join("---:" if a == "r" else "---" for a in table.align) + " |")
            lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
            if table.notes:
                lines.append("")
        lines += [f"{note}  " for note in table.notes]
    return "\n".join(lines) + "\n"

"""The terminal table: aligned columns; deltas coloured (green better, red worse) only when asked (stdout a TTY)."""

from __future__ import annotations

from tracebench.report.render import Cell, Document, Table

_TONES = {"good": "32", "bad": "31", "warn": "33"}


def _paint(cell: Cell, colour: bool) -> str:
    if not colour or (cell.tone is None and not cell.strong):
        return cell.text
    codes = ([_TONES[cell.tone]] if cell.tone else []) + (["1"] if cell.strong and cell.tone else [])
    if not codes:
        return cell.text
    return f"\x1b[{';'.join(codes)}m{cell.text}\x1b[0m"


def _table(table: Table, colour: bool) -> list[str]:
    if not table.rows:  # e.g. nothing changed between the runs: the notes say so
        return [table.title] + [f"  {note}" for note in table.notes]
    rows = [[Cell(h) for h in table.header]] + table.rows
    widths = [max(len(row[col].text) for row in rows) for col in range(len(table.header))]
    out = [_paint(Cell(table.title, strong=True), colour) if colour else table.title]
    for r, row in enumerate(rows):
        parts = []
        for col, cell in enumerate(row):
            pad = widths[col] - len(cell.text)
            text = _paint(cell, colour and r > 0)
            parts.append(" " * pad + text if table.align[col] == "r" else text + " " * pad)
        out.append(("  " + "  ".join(parts)).rstrip())
    out += [f"  {note}" for note in table.notes]
    return out


def render_table(doc: Document, colour: bool) -> str:
    lines = [doc.title] + [f"  {line}" for line in doc.lines]
    for warning in doc.warnings:
        lines.append(_paint(Cell(f"! {warning}", "warn", strong=True), colour))
    for table in doc.tables:
        lines.append("")
        lines += _table(table, colour)
    return "\n".join(lines) + "\n"

"""The terminal table: aligned columns; deltas coloured (green better, red worse) only when asked (stdout a TTY)."""

from __future__ import annotations

import textwrap

from tracebench.report.render import Cell, Document, Table

_TONES = {"good": "32", "bad": "31", "warn": "33"}
PROSE_WIDTH = 110  # notes, lines and warnings wrap here (the tables keep their rows whole)


def _wrapped(text: str, indent: str) -> list[str]:
    """`text` in lines of at most PROSE_WIDTH; a list of settings (`a 1 · b 2 · ...`) breaks only between items."""
    items = text.split(" · ")
    if len(items) == 1:
        return textwrap.wrap(text, PROSE_WIDTH, initial_indent=indent, subsequent_indent=indent + "  ",
                             break_on_hyphens=False) or [indent]
    lines = [indent + items[0]]
    for item in items[1:]:
        if len(lines[-1]) + 3 + len(item) > PROSE_WIDTH:
            lines[-1] += " ·"
            lines.append(indent + "  " + item)
        else:
            lines[-1] += " · " + item
    return lines


def _paint(cell: Cell, colour: bool) -> str:
    if not colour or (cell.tone is None and not cell.strong):
        return cell.text
    codes = ([_TONES[cell.tone]] if cell.tone else []) + (["1"] if cell.strong and cell.tone else [])
    if not codes:
        return cell.text
    return f"\x1b[{';'.join(codes)}m{cell.text}\x1b[0m"


def _table(table: Table, colour: bool) -> list[str]:
    if not table.rows:  # e.g. nothing changed between the runs: the notes say so
        return [table.title] + [line for note in table.notes for line in _wrapped(note, "  ")]
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
    out += [line for note in table.notes for line in _wrapped(note, "  ")]
    return out


def render_table(doc: Document, colour: bool) -> str:
    lines = [doc.title] + [wrapped for line in doc.lines for wrapped in _wrapped(line, "  ")]
    for warning in doc.warnings:
        lines += [_paint(Cell(line, "warn", strong=True), colour) for line in _wrapped(f"! {warning}", "")]
    for table in doc.tables:
        lines.append("")
        lines += _table(table, colour)
    return "\n".join(lines) + "\n"

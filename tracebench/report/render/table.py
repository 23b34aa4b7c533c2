"""The terminal table: aligned columns fitted to the terminal's width; deltas coloured (green better, red worse) only
when asked (stdout a TTY)."""

from __future__ import annotations

import re
import textwrap

from tracebench.report.render import Cell, Document, Table

_TONES = {"good": "32", "bad": "31", "warn": "33"}
PROSE_WIDTH = 110  # notes, lines and warnings wrap here, or at the terminal's width when narrower
INDENT = "  "  # before every row of a table
GAP = "  "  # between two columns


def _wrapped(text: str, indent: str, width: int = PROSE_WIDTH) -> list[str]:
    """`text` in lines of at most `width`; a list of settings (`a 1 · b 2 · ...`) breaks only between items."""
    items = text.split(" · ")
    if len(items) == 1:
        return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent + "  ",
                             break_on_hyphens=False) or [indent]
    lines = [indent + items[0]]
    for item in items[1:]:
        if len(lines[-1]) + 3 + len(item) + 2 > width:  # room for the " ·" that ends a line
            lines[-1] += " ·"
            lines.append(indent + "  " + item)
        else:
            lines[-1] += " · " + item
    return [out for line in lines for out in (textwrap.wrap(line, width, subsequent_indent=indent + "    ",
                                                            break_on_hyphens=False) if len(line) > width else [line])]


def _paint(cell: Cell, colour: bool) -> str:
    if not colour or (cell.tone is None and not cell.strong):
        return cell.text
    codes = ([_TONES[cell.tone]] if cell.tone else []) + (["1"] if cell.strong and cell.tone else [])
    if not codes:
        return cell.text
    return f"\x1b[{';'.join(codes)}m{cell.text}\x1b[0m"


_BRACKETED = re.compile(r"\[[^\]]*\]")  # an interval "[-1.2, +3.4]": never broken across lines


def _words(text: str) -> list[str]:
    """The pieces a cell may break between: words, a bracketed span counting as one."""
    return _BRACKETED.sub(lambda m: m.group(0).replace(" ", "\0"), text).split()


def _cell_lines(text: str, width: int) -> list[str]:
    """A cell's text in lines of at most `width`, broken at spaces only (a longer word, or interval, stays whole)."""
    if len(text) <= width:
        return [text]
    lines = textwrap.wrap(" ".join(_words(text)), width, break_long_words=False, break_on_hyphens=False)
    return [line.replace("\0", " ") for line in lines] or [""]


def _longest_word(text: str) -> int:
    return max((len(word) for word in _words(text)), default=0)


def _widths(table: Table, columns: list[int], width: int) -> tuple[list[int], bool]:
    """The width of each of `columns` so that the rows fit `width`: every column at its natural width when they fit,
    else narrowed, the widest first: the headers wrapping at spaces first, then the body cells of `table.wrap`
    columns too, none below its longest word (numbers never wrap). Second value: whether they fit."""
    natural, headed, least = [], [], []
    for col in columns:
        body = [len(row[col].text) for row in table.rows]
        natural.append(max([len(table.header[col]), *body]))
        headed.append(max([_longest_word(table.header[col]), *body]))
        wrapped = [_longest_word(row[col].text) for row in table.rows] if col in table.wrap else body
        least.append(max([_longest_word(table.header[col]), *wrapped]))
    widths = list(natural)
    room = width - len(INDENT) - len(GAP) * (len(columns) - 1)
    for floor in (headed, least):
        while sum(widths) > room:
            narrowable = [i for i in range(len(columns)) if widths[i] > floor[i]]
            if not narrowable:
                break
            widest = max(narrowable, key=lambda i: widths[i])
            widths[widest] -= 1
    return widths, sum(widths) <= room


def _parts(table: Table, width: int) -> list[list[int]]:
    """The table's columns split into parts that each fit `width` (one part when the whole table fits): every part
    starts with the key columns, then as many of the other columns (a group kept whole) as fit."""
    every = list(range(len(table.header)))
    if _widths(table, every, width)[1]:
        return [every]
    keys = every[:table.keys]
    group_of = table.groups if table.groups is not None else every
    groups: list[list[int]] = []
    for col in every[table.keys:]:
        if groups and group_of[groups[-1][-1]] == group_of[col]:
            groups[-1].append(col)
        else:
            groups.append([col])
    parts: list[list[int]] = []
    current: list[int] = []
    for group in groups:
        if current and not _widths(table, keys + current + group, width)[1]:
            parts.append(keys + current)
            current = []
        current += group  # a group too wide on its own gets a part of its own, wrapped as far as it goes
    parts.append(keys + current)
    return parts


def _rows(table: Table, columns: list[int], widths: list[int], colour: bool) -> list[str]:
    out = []
    for r, row in enumerate([[Cell(h) for h in table.header]] + table.rows):
        cells = [row[col] for col in columns]
        texts = [_cell_lines(cell.text, w) for cell, w in zip(cells, widths)]
        for line in range(max(len(t) for t in texts)):
            parts = []
            for cell, text, w, col in zip(cells, texts, widths, columns):
                piece = text[line] if line < len(text) else ""
                pad = " " * (w - len(piece))
                if piece and colour and r > 0:
                    piece = _paint(Cell(piece, cell.tone, cell.strong), True)
                parts.append(pad + piece if table.align[col] == "r" else piece + pad)
            out.append((INDENT + GAP.join(parts)).rstrip())
    return out


def _table(table: Table, colour: bool, width: int) -> list[str]:
    prose = min(PROSE_WIDTH, width)
    if not table.rows:  # e.g. nothing changed between the runs: the notes say so
        return _wrapped(table.title, "", width) + [line for note in table.notes for line in _wrapped(note, "  ", prose)]
    parts = _parts(table, width)
    out: list[str] = []
    for number, columns in enumerate(parts):
        title = table.title if len(parts) == 1 else f"{table.title} ({number + 1}/{len(parts)})"
        if number:
            out.append("")
        out += [_paint(Cell(line, strong=True), colour) if colour else line for line in _wrapped(title, "", width)]
        out += _rows(table, columns, _widths(table, columns, width)[0], colour)
    out += [line for note in table.notes for line in _wrapped(note, "  ", prose)]
    return out


def render_table(doc: Document, colour: bool, width: int | None = None) -> str:
    """The report for a terminal `width` columns wide (default: termwidth.terminal_width(), i.e. COLUMNS, else the
    terminal's, else 120): prose wraps, a table too wide wraps its headers and text cells, then splits its columns
    into parts (1/2, 2/2) that repeat the label columns."""
    if width is None:
        from tracebench.termwidth import terminal_width

        width = terminal_width()
    prose = min(PROSE_WIDTH, width)
    lines = [wrapped for wrapped in _wrapped(doc.title, "", width)]
    lines += [wrapped for line in doc.lines for wrapped in _wrapped(line, "  ", prose)]
    for warning in doc.warnings:
        lines += [_paint(Cell(line, "warn", strong=True), colour) for line in _wrapped(f"! {warning}", "", prose)]
    for table in doc.tables:
        lines.append("")
        lines += _table(table, colour, width)
    return "\n".join(lines) + "\n"

"""The width the terminal output is laid out for (`tracebench report`'s table, `tracebench policies`).

COLUMNS when it is set (a positive integer), else the width of the terminal on stdout, else DEFAULT_WIDTH (stdout a
pipe or a file): what `shutil.get_terminal_size` gives, with our fallback. Never below MIN_WIDTH: narrower than that
a table cannot keep its label column and one value."""

from __future__ import annotations

import shutil

DEFAULT_WIDTH = 120  # stdout not a terminal and COLUMNS unset (a file, a pipe, a CI log)
MIN_WIDTH = 40


def terminal_width() -> int:
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)

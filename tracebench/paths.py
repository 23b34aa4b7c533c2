"""Paths as a run folder records them, so that it can be shared (docs/run-format.md, "Paths"): a path inside the
run folder relative to it, a path inside the working folder (where the command ran: the repository) relative to
that, and a path anywhere else only by its last component after `…/` — a file there is identified by its name and
the sha256 recorded beside it (the trace's, the policy file's, the dataset's in the trace header), never by a
home folder or a machine's layout.

`tracebench replay` records its own paths this way (the trace, --out-dir, --model, the policy file, the servers' and
sglang-router's launch commands); `tracebench pack --shareable` rewrites what else a run folder keeps (the servers'
answers, the trace header, logs) with `shareable_json` / `shareable_text`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ELSEWHERE = "…/"  # marks a path outside the run folder and the working folder: only its last component is kept

# The usual top-level folders of a machine's users, scratch and installed things. In free text (a log line, a server
# answer) only paths under these are rewritten: an HTTP route like `/v1/loads` has the same shape as a path.
MACHINE_ROOTS = ("home", "Users", "root", "tmp", "var", "work", "workspace", "opt", "mnt", "srv", "data", "scratch",
                 "private", "Volumes", "nix", "media", "gpfs", "lustre", "storage", "shared", "net", "cluster",
                 "export", "builds", "usr/local")
_PART = r"[\w.+@%{}~-]"
_ANY_PATH = re.compile(rf"(?<![\w.~$}}\-/:])(?:/|\.\./|~/){_PART}*(?:/{_PART}*)*")
_TEXT_PATH = re.compile(rf"(?<![\w.~$}}/])(?:/(?:{'|'.join(MACHINE_ROOTS)})(?![\w.-])|\.\./|~/){_PART}*"
                        rf"(?:/{_PART}*)*")


def portable_path(path: str | os.PathLike[str], roots: Sequence[Path] = (), base: Path | None = None) -> str:
    """`path` as a shared run folder records it: relative to the first of `roots` (the run folder; tracebench's
    own source folder) that holds it, else relative to `base` (default: the working folder) when inside it, else
    `…/<last component>`."""
    text = os.fspath(path)
    if text.startswith("~"):
        return ELSEWHERE + _last(text)
    base = Path.cwd() if base is None else base
    where = os.path.normpath(os.path.join(base, text))  # lexical: a symlinked venv python stays where it was named
    for folder in [*roots, base]:
        root = os.path.normpath(os.path.join(base, folder))
        if where == root:
            return "."
        if where.startswith(root.rstrip(os.sep) + os.sep):
            return os.path.relpath(where, root)
    return ELSEWHERE + _last(text)


def portable_words(words: Iterable[str], roots: Sequence[Path] = (), base: Path | None = None) -> list[str]:
    """A command line as recorded: every path in it (a word, or the value of `--flag=PATH`) made portable."""
    return [portable_text(word, roots, base, everywhere=True) for word in words]


def portable_text(text: str, roots: Sequence[Path] = (), base: Path | None = None, *,
                  everywhere: bool = False) -> str:
    """`text` with its paths made portable: with `everywhere`, every absolute, `../` or `~/` path (a command's
    arguments); otherwise only those under a machine's usual top-level folders, `../` and `~/` (free text, where
    `/v1/loads` is a route, not a path)."""
    pattern = _ANY_PATH if everywhere else _TEXT_PATH
    return pattern.sub(lambda m: portable_path(m.group(0), roots, base) if m.group(0) not in ("/", "../", "~/")
                       else m.group(0), text)


def shareable_text(text: str, roots: Sequence[Path] = (), base: Path | None = None) -> str:
    """A log or message with its machine paths made portable (free text: `portable_text`)."""
    return portable_text(text, roots, base)


def shareable_json(value: Any, roots: Sequence[Path] = (), base: Path | None = None) -> Any:
    """A JSON value (run.json) with every path in it made portable: a string that is one path (no space, starting
    with `/`, `../` or `~/`) as a path, any other string as free text. Keys, numbers and the structure are kept."""
    if isinstance(value, dict):
        return {key: shareable_json(item, roots, base) for key, item in value.items()}
    if isinstance(value, list):
        return [shareable_json(item, roots, base) for item in value]
    if isinstance(value, str):
        if value.startswith(("/", "../", "~/")) and not any(c.isspace() for c in value) and len(value) > 1:
            return portable_path(value, roots, base)
        return shareable_text(value, roots, base)
    return value


def _last(text: str) -> str:
    return text.rstrip("/").rsplit("/", 1)[-1] or text

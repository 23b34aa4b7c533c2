"""Paths as a shareable run folder records them (docs/run-format.md, "Paths"): inside the run folder or the working
folder, relative to it; elsewhere only `…/<last component>` (the sha256 beside it identifies the file), never a home
folder. `replay` records its own paths so; `pack --shareable` rewrites the rest (`shareable_json`, `shareable_text`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ELSEWHERE = "…/"  # marks a path outside the run folder and the working folder: only its last component is kept

# A machine's usual top-level folders (users, scratch, installs). In free text only paths under these are rewritten:
# an HTTP route like `/v1/loads` has a path's shape.
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


def portable_policy(spec: str | None) -> str | None:
    """A --policy spec as a shared folder records it: a file's path made portable (`portable_path`), the class name
    kept (`<elsewhere>/p.py:Cls` -> `…/p.py:Cls`); a built-in or policies/ name unchanged."""
    if spec is None or not (spec.endswith(".py") or ":" in spec):
        return spec
    if spec.endswith(".py"):
        return portable_path(spec)
    path, _, cls = spec.rpartition(":")
    return f"{portable_path(path)}:{cls}"


def portable_words(words: Iterable[str], roots: Sequence[Path] = (), base: Path | None = None) -> list[str]:
    """A command line as recorded: every path in it (a word, or the value of `--flag=PATH`) made portable."""
    return [shareable_text(word, roots, base, everywhere=True) for word in words]


def shareable_text(text: str, roots: Sequence[Path] = (), base: Path | None = None, *,
                   everywhere: bool = False) -> str:
    """A log line or message with its paths made portable: those under MACHINE_ROOTS and `../`, `~/` ones; with
    `everywhere` (a command line) every absolute one too."""
    pattern = _ANY_PATH if everywhere else _TEXT_PATH
    return pattern.sub(lambda m: portable_path(m[0], roots, base) if m[0] not in ("/", "../", "~/") else m[0], text)


def shareable_json(value: Any, roots: Sequence[Path] = (), base: Path | None = None) -> Any:
    """run.json with its paths made portable: a string that is one path (starts with `/`, `../` or `~/`, no space) as
    a path, any other as free text; keys and numbers kept."""
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

"""The repository stands on its own (issue 25): no tracked file names an absolute path of the machine it was made on,
a home folder, a `file://` address, or a folder outside the repository (`../...` that leaves it). Checked over every
tracked file, the packed example runs' `run.json.xz` and `*.log.xz` decompressed, by pattern: any path under a
usual top-level folder of a machine, not one machine's prefix.

A committed run folder is made shareable by `tracebench pack --shareable` (docs/run-format.md); a capture or log
kept beside it is shortened the same way (tracebench/paths.py) where it named such a path.
"""

from __future__ import annotations

import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO

# Top-level folders under which a machine keeps its users', its scratch and its installed things: a path under one
# of these in a committed file is a path of the machine that wrote it. (/usr/bin/env, /dev/null, /proc are the
# same on every machine and stay out.)
MACHINE_ROOTS = ("home", "Users", "root", "tmp", "var", "work", "workspace", "opt", "mnt", "srv", "data", "scratch",
                 "private", "Volumes", "nix", "media", "gpfs", "lustre", "storage", "shared", "net", "cluster",
                 "export", "builds", "usr/local")
ABSOLUTE = re.compile(r"(?<![\w.~$}/])/(?:" + "|".join(MACHINE_ROOTS) + r")(?![\w.-])")
HOME = re.compile(r"(?<![\w/.])~[\w.-]*/[\w.-]|[A-Za-z]:\\(?:Users|home)\\")
FILE_URL = re.compile(r"file://[/\w]", re.IGNORECASE)
PARENT = re.compile(r"(?<![\w.])(?:\.\./)+[^\s'\"`)\]<>,;|*]*")

# Places on the GPU machine that a user of the repository really uses, as the repository documents them.
ALLOWED = {
    "/opt/sgl-overlay": "bench/gpu/device/setup-on-device.sh unpacks sglang 0.5.17 there on the GPU machine; sglang's "
                        "own warnings in the captures print its files from there",
    "/opt/router": "bench/gpu/README.md installs the sglang-router wheel there on the GPU machine (two-call recipe)",
    "/tmp/sglang_weight_cache_rank{global_rank}.sock": "sglang's own default for --weight-cache-socket on the GPU "
                                                       "machine (python/sglang/srt/server_args.py L3406 of 0.5.17), "
                                                       "in its --help text captured in .DUCUMENT/captures/",
}


def _tracked() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode().strip()}")
    return [name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]


def _text(name: str) -> str | None:
    """The file's text (an .xz decompressed), None for a binary file (Parquet, PNG)."""
    data = (REPO / name).read_bytes()
    if name.endswith(".xz"):
        data = lzma.decompress(data)
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _allowed(text: str, start: int) -> bool:
    return any(text.startswith(prefix, start) for prefix in ALLOWED)


def _parent_escapes(name: str, ref: str) -> bool:
    """`ref` starts with ../: from the repository root (where every command runs) it leaves the repository; it is
    kept only as a link from a subfolder to something that exists in the repository (docs' `../README.md`)."""
    ref = ref.split("#", 1)[0].rstrip(".:")
    here = (REPO / name).parent
    target = Path(os.path.normpath(here / ref))
    return not target.is_relative_to(REPO) or not target.exists()


def find_machine_paths(name: str, text: str) -> list[str]:
    if not any(pattern.search(text) for pattern in (ABSOLUTE, HOME, FILE_URL, PARENT)):
        return []  # most files: one pass over the whole text, no line split
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        hits = [m.group(0) for m in ABSOLUTE.finditer(line) if not _allowed(line, m.start())]
        hits += [m.group(0) for m in HOME.finditer(line)]
        hits += [m.group(0) for m in FILE_URL.finditer(line)]
        hits += [m.group(0) for m in PARENT.finditer(line) if _parent_escapes(name, m.group(0))]
        found += [f"{name}:{lineno}: {hit!r} in {line.strip()[:160]!r}" for hit in hits]
    return found


def test_no_tracked_file_names_a_machine_path_or_an_outside_folder() -> None:
    names = _tracked()
    assert len(names) > 100
    assert any(name.endswith("run.json.xz") for name in names)
    found = []
    for name in names:
        text = _text(name)
        if text is not None:
            found += find_machine_paths(name, text)
    assert not found, f"{len(found)} machine path(s) or outside reference(s):\n" + "\n".join(found[:40])


# `§` stands for `/` in these samples: written literally, they would be what the test above refuses in this file
@pytest.mark.parametrize("line", [
    "model_path='§tmp§A§llama-2-7b-hf'", "see §work§shared§seeds§notes.txt", "--out §root§out", "§home§me§x.py",
    "cp -r ..§shared§sglang-device .carry§", "PYTHONPATH=§tmp§pytest-site", "file:§§§etc§x", "~§models§llama",
    '"python": "§opt§torch§.venv§bin§python3"', "C:\\Users\\me\\trace.jsonl", "Not kept (`§tmp`)", "§Users§me",
    "§data§traces§x.jsonl", "rootdir: §work§main§.carry§tb",
])
def test_the_patterns_catch_machine_paths(line: str) -> None:
    line = line.replace("§", "/")
    assert find_machine_paths("docs/x.md", line), line


@pytest.mark.parametrize("line", [
    "#!/usr/bin/env bash", "curl -o /dev/null http://127.0.0.1:8000/generate", "see [the format](../docs/run-format.md)",
    "GET /v1/loads", "tests/data/sglang-0.5.17/api_capture.json", "tokens/s, p50/p99", "HTTP/1.1",
    "source /opt/sgl-overlay/x.sh", "PYTHONPATH=/opt/router", "…/python3", "$TMPDIR/x",
])
def test_the_patterns_leave_what_is_not_a_machine_path(line: str) -> None:
    assert not find_machine_paths("docs/x.md", line), line

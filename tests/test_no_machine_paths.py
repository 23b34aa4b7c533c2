"""The repository stands on its own (issue 25): no tracked file (the packed examples' .xz decompressed) names a path
under a machine's usual top-level folders, a home folder, a `file://` address, or a `../` folder outside the
repository. Checked by pattern, not by one machine's prefix; run folders are made so by `tracebench pack --shareable`."""

from __future__ import annotations

import lzma
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO
from tracebench.paths import MACHINE_ROOTS

ABSOLUTE = re.compile(r"(?<![\w.~$}/])/(?:" + "|".join(MACHINE_ROOTS) + r")(?![\w.-])")
HOME = re.compile(r"(?<![\w/.])~[\w.-]*/[\w.-]|[A-Za-z]:\\(?:Users|home)\\")
FILE_URL = re.compile(r"file://[/\w]", re.IGNORECASE)
PARENT = re.compile(r"(?<![\w.])(?:\.\./)+[^\s'\"`)\]<>,;|*]*")

# Places on the GPU machine that a user of the repository really uses, as the repository documents them.
ALLOWED = {
    "/opt/sgl-overlay": "bench/gpu/device/setup-on-device.sh unpacks sglang there; sglang's warnings in the captures "
                        "name its files there",
    "/opt/router": "bench/gpu/README.md installs the sglang-router wheel there (two-call recipe)",
    "/opt/pd": "bench/gpu/stage.sh stages PD's mooncake and sglang-router there for bench/gpu/pd.sh (issue 21)",
    "/opt/pyspy": "bench/gpu/stage.sh installs the py-spy profiler there for bench/gpu/overhead.sh (issue 19)",
    "/opt/report": "bench/gpu/stage_report.sh unpacks polars there for the sweep and the telemetry check on the GPU machine",
    "/tmp/sglang_weight_cache_rank{global_rank}.sock": "sglang's own --weight-cache-socket default (server_args.py "
                                                       "L3406 of 0.5.17), in its captured --help",
}


def _text(name: str) -> str | None:
    """The file's text (an .xz decompressed), None for a binary file (Parquet, PNG)."""
    data = (REPO / name).read_bytes()
    data = lzma.decompress(data) if name.endswith(".xz") else data
    try:
        return None if b"\0" in data[:8192] else data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _parent_escapes(name: str, ref: str) -> bool:
    """From the repository root, where commands run, a `../` path leaves the repository: kept only as a link from a
    subfolder to something that exists in it (docs' `../README.md`)."""
    target = Path(os.path.normpath((REPO / name).parent / ref.split("#", 1)[0].rstrip(".:")))
    return not target.is_relative_to(REPO) or not target.exists()


def find_machine_paths(name: str, text: str) -> list[str]:
    if not any(pattern.search(text) for pattern in (ABSOLUTE, HOME, FILE_URL, PARENT)):
        return []  # most files: one pass over the whole text
    found = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        hits = [m[0] for m in ABSOLUTE.finditer(line) if not any(line.startswith(a, m.start()) for a in ALLOWED)]
        hits += [m[0] for m in (*HOME.finditer(line), *FILE_URL.finditer(line))]
        hits += [m[0] for m in PARENT.finditer(line) if _parent_escapes(name, m[0])]
        found += [f"{name}:{lineno}: {hit!r} in {line.strip()[:160]!r}" for hit in hits]
    return found


def test_no_tracked_file_names_a_machine_path_or_an_outside_folder() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode().strip()}")
    names = [name for name in listed.stdout.decode().split("\0") if name and (REPO / name).is_file()]
    assert len(names) > 100 and any(name.endswith("run.json.xz") for name in names)
    found = [hit for name in names if (text := _text(name)) is not None for hit in find_machine_paths(name, text)]
    assert not found, f"{len(found)} machine path(s) or outside reference(s):\n" + "\n".join(found[:40])


# `§` stands for `/` in these samples: written literally, they would be what the test above refuses in this file
@pytest.mark.parametrize("line", [
    "model_path='§tmp§A§llama-2-7b-hf'", "see §work§shared§notes.txt", "--out §root§out", "§home§me§x.py",
    "cp -r ..§shared§sglang-device .carry§", "X=§tmp§site", "file:§§§etc§x", "~§models§llama", "Not kept (`§tmp`)",
    '"python": "§opt§torch§.venv§bin§python3"', "C:\\Users\\me\\t.jsonl", "§Users§me", "§data§traces§x.jsonl",
])
def test_the_patterns_catch_machine_paths(line: str) -> None:
    assert find_machine_paths("docs/x.md", line.replace("§", "/")), line


@pytest.mark.parametrize("line", [
    "#!/usr/bin/env bash", "curl -o /dev/null http://127.0.0.1:8000/generate", "see [the format](../docs/run-format.md)",
    "GET /v1/loads", "tests/data/x.json", "tokens/s, p50/p99", "HTTP/1.1", "source /opt/sgl-overlay/x.sh",
    "PYTHONPATH=/opt/router", "…/python3", "$TMPDIR/x",
])
def test_the_patterns_leave_what_is_not_a_machine_path(line: str) -> None:
    assert not find_machine_paths("docs/x.md", line), line

"""The tracked tree stays light: a GPU call carries the working tree plus the 53 MiB sglang overlay within the device
tool's 64 MiB (bench/gpu/README.md), and the brief holds the repository under 8 MiB tracked."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import REPO

LIMIT_BYTES = 8 * 1024 * 1024


def test_tracked_tree_is_under_8_mib() -> None:
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot list the tracked files")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True)
    if listed.returncode != 0:
        pytest.skip(f"{REPO} is not a git checkout: {listed.stderr.decode().strip()}")
    paths = [REPO / name for name in listed.stdout.decode().split("\0") if name]
    assert len(paths) > 100
    # the working tree's size (what travels), as `git ls-files -z | xargs -0 du -bc`; a file deleted but still in
    # the index does not travel
    sizes = {path: os.lstat(path).st_size for path in paths if os.path.lexists(path)}
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert total <= LIMIT_BYTES, (f"tracked tree {total / 2**20:.2f} MiB > {LIMIT_BYTES / 2**20:g} MiB; largest: "
                                  + ", ".join(f"{p.relative_to(REPO)} {s / 1e3:.0f} kB" for p, s in largest))

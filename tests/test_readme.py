"""Every command of the READMEs runs as written, in order, from a fresh copy of the repository (issue 15).

The convention (README.md says it too, in an HTML comment above its Quick tour):
- every fenced block opened with ```bash (or ```sh / ```shell) is a list of commands; output excerpts go in plain
  ``` blocks, which are not run;
- a block that must not run here (it needs GPUs, a running replay, or runs the suite itself) has, on the line right
  above its fence, an HTML comment `<!-- readme-test: skip REASON -->`; the test shows it as skipped with REASON;
- README.zh-CN.md gives the same commands in the same blocks (comments may be translated), so only README.md's blocks
  are run, and the Chinese one is checked against them.
Blocks run with bash (`set -euo pipefail`, echoing each command) in one copy of the tracked and untracked-unignored
files, in README order: a block's files (`-o traces/tour.jsonl`, `--run-name ...`) are there for the blocks after it
that name them (`needs`; chains of blocks that share no file may run on several pytest processes, each in its own copy).
Keep runnable blocks small (the simulator, a few hundred requests): the whole file should take ~30 s.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

SHELLS = ("bash", "sh", "shell")
SKIP = re.compile(r"^<!--\s*readme-test:\s*skip\b\s*(.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: str
    line: int  # 1-based line of the opening fence
    text: str
    skip: str | None  # why it is not run; None: it runs

    @property
    def commands(self) -> list[str]:
        """The commands, comments removed and continuation lines joined (what must agree between the READMEs)."""
        joined = re.sub(r"\\\n\s*", "", self.text)
        out = []
        for line in joined.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            if line:
                out.append(re.sub(r"\s+", " ", line))
        return out


def shell_blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\w*)\s*$", lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        assert end is not None, f"{path.name}:{i + 1}: a code block that is never closed"
        if fence[1] in SHELLS:
            above = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            marker = SKIP.match(above)
            if marker is not None and not marker[1]:
                raise AssertionError(f"{path.name}:{i}: readme-test: skip needs a reason")
            blocks.append(Block(path.name, i + 1, "\n".join(lines[i + 1:end]), marker[1] if marker else None))
        i = end + 1
    return blocks


README_BLOCKS = shell_blocks(REPO / "README.md")

# What a block makes for the blocks after it: `-o FILE`, `--run-name NAME`, `--name NAME` (a sweep's folder)
MADE = re.compile(r"(?:^|\s)(?:-o|--run-name|--name)\s+([^\s;|&]+)")


def needs(blocks: list[Block]) -> dict[int, list[Block]]:
    """For each runnable block (by line), the runnable blocks it needs run first, itself last, in README order: the
    earlier blocks that make a file or run it names, and theirs. Blocks that need none of each other's files (the tour,
    the sweep, the routing example) run apart, on several pytest processes at once (conftest.py's scheduler)."""
    runnable = [b for b in blocks if b.skip is None]
    made = {b.line: set(MADE.findall(b.text)) for b in runnable}
    out: dict[int, list[Block]] = {}
    for i, block in enumerate(runnable):
        words = set(re.findall(r"[^\s;|&'\"=]+", block.text))
        wanted = {e.line for e in runnable[:i] if made[e.line] & words}
        for line in list(wanted):
            wanted |= {e.line for e in out[line]}
        out[block.line] = [e for e in runnable[:i] if e.line in wanted] + [block]
    return out


README_NEEDS = needs(README_BLOCKS)


def chains(needed: dict[int, list[Block]]) -> dict[int, int]:
    """Each runnable block's chain, named by its first block: blocks linked by what they need of each other, which
    share no file with another chain. conftest.py's scheduler keeps a chain on one pytest process and may give
    another chain to the other."""
    first = {line: line for line in needed}

    def root(line: int) -> int:
        while first[line] != line:
            line = first[line]
        return line

    for line, blocks in needed.items():
        for block in blocks:
            a, b = sorted((root(line), root(block.line)))
            first[b] = a
    return {line: root(line) for line in needed}


README_CHAINS = chains(README_NEEDS)


def test_readme_has_commands_to_run() -> None:
    assert any(block.skip is None for block in README_BLOCKS)


def test_blocks_run_after_the_blocks_whose_files_they_name() -> None:
    blocks = [Block("R", 1, "tracebench generate -o traces/a.jsonl\ntracebench generate -o traces/b.jsonl", None),
              Block("R", 2, "tracebench replay traces/b.jsonl --run-name run-b --quiet", None),
              Block("R", 3, "tracebench generate --rate 5 -o traces/c.jsonl", None),
              Block("R", 4, "make all", "needs make"),
              Block("R", 5, "tracebench report run-b  # nothing of block 3", None)]
    needed = needs(blocks)
    assert {line: [b.line for b in bl] for line, bl in needed.items()} == {1: [1], 2: [1, 2], 3: [3], 5: [1, 2, 5]}
    assert chains(needed) == {1: 1, 2: 1, 3: 3, 5: 1}


def test_chinese_readme_gives_the_same_commands() -> None:
    zh = shell_blocks(REPO / "README.zh-CN.md")
    assert [b.commands for b in zh] == [b.commands for b in README_BLOCKS], (
        "README.zh-CN.md's shell blocks must give README.md's commands, block by block")
    assert [b.skip is None for b in zh] == [b.skip is None for b in README_BLOCKS], "the same blocks skipped"


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The repository as a fresh clone has it (plus untracked files git does not ignore), and the blocks run so far."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    root = tmp_path_factory.mktemp("readme") / "tracebench"
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    return {"root": root, "done": set()}


def _run(block: Block, root: Path) -> None:
    # it runs with this test's own environment on PATH: an install there would re-point it (an editable install to
    # the temporary copy, deleted after the test) and break every later test
    assert not re.search(r"\bpip3? install\b|\bmake\b", block.text), (
        f"{block.path}:{block.line}: a block that installs needs a readme-test: skip marker (say it in prose instead)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("TRACEBENCH_MODEL", None)
    env.pop("TRACEBENCH_SERVER_ARGS", None)
    done = subprocess.run(["bash", "-euo", "pipefail", "-xc", block.text], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (
        f"{block.path}:{block.line}: a command failed (exit {done.returncode}); the last ones, then its output:\n"
        f"{done.stderr[-3000:]}\n{done.stdout[-2000:]}")


@pytest.mark.parametrize("block", README_BLOCKS, ids=[f"{b.path}:{b.line}" for b in README_BLOCKS])
def test_readme_block_runs_as_written(block: Block, fresh_copy: dict) -> None:
    if block.skip is not None:
        pytest.skip(f"{block.path}:{block.line} marked readme-test: skip {block.skip}")
    # the blocks it needs first (when it is run alone, with -k, or on a pytest process the earlier ones did not run on)
    for earlier in README_NEEDS[block.line]:
        if earlier.line not in fresh_copy["done"]:
            _run(earlier, fresh_copy["root"])
            fresh_copy["done"].add(earlier.line)


def test_the_schedulers_figures_name_units_that_exist() -> None:
    """conftest.py's SLOWEST_FIRST ranks the xdist units by their seconds: a key that names no unit (a renamed file, a
    README chain renamed) ranks nothing, and that unit then counts a second a test, possibly starting last."""
    from conftest import SLOWEST_FIRST, readme_unit

    units = {readme_unit(line) for line in README_CHAINS} | {
        f"tests/{path.name}" for path in (REPO / "tests").glob("test_*.py")}
    assert {"tests/test_readme.py::chain-traces/tour.jsonl", "tests/test_readme.py::chain-traces/routing.jsonl"} <= units
    assert set(SLOWEST_FIRST) <= units, sorted(set(SLOWEST_FIRST) - units)

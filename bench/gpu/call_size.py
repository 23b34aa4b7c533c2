"""What one GPU call (the `device` tool's `run`) carries, against its limit of 64 MiB: the working tree that travels
(tracked files and untracked files git does not ignore) plus the carried folders.

    python3 bench/gpu/call_size.py [CARRIED ...]        (default: .carry)

Run it from the repository root before a call; bench/gpu/README.md has the figures measured when it was written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

LIMIT = 64 * 2**20


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def main(carried: list[str]) -> None:
    def listed(*flags: str) -> list[Path]:
        out = subprocess.run(["git", "ls-files", "-z", *flags], check=True, capture_output=True).stdout.decode()
        return [Path(name) for name in out.split("\0") if name and os.path.lexists(name)]

    tracked = sum(os.lstat(p).st_size for p in listed())
    untracked = sum(os.lstat(p).st_size for p in listed("--others", "--exclude-standard"))
    rows = [("tracked files", tracked), ("untracked, not ignored", untracked)]
    for name in carried:
        path = Path(name)
        if not path.exists():
            raise SystemExit(f"call_size: {name}: no such file or folder")
        rows.append((f"carried {name}", folder_bytes(path)))
    total = sum(size for _, size in rows)
    for label, size in rows + [("total", total)]:
        print(f"{label:<40} {size:>12,} B {size / 2**20:8.2f} MiB")
    print(f"{'limit':<40} {LIMIT:>12,} B {LIMIT / 2**20:8.2f} MiB  (headroom {(LIMIT - total) / 2**20:.2f} MiB)")
    if total > LIMIT:
        raise SystemExit("call_size: over the limit: this call would be refused")


if __name__ == "__main__":
    main(sys.argv[1:] or [".carry"])

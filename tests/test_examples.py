"""The committed example runs (reports/examples/): every run folder there is stored packed (`tracebench pack`) and
still loads and reports; the README's four-GPU command works on the folders as they are in git."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, run_cli
from tracebench.report.load import is_packed, is_run_folder, load_runs
from tracebench.report.metrics import build_report
from tracebench.report.render import document
from tracebench.report.render.md import render_md

EXAMPLES = REPO / "reports" / "examples"


def _run_folders() -> list[Path]:
    return sorted(p for p in EXAMPLES.rglob("*") if p.is_dir() and is_run_folder(p))


def test_every_example_run_is_packed_and_reports() -> None:
    folders = _run_folders()
    assert len(folders) >= 23  # h200-node-level 4, h200x2-routing 5, h200x4-routing 5, sim2-routing 4, sim4-routing 5
    unpacked = [str(p.relative_to(REPO)) for p in folders if not is_packed(p)]
    assert not unpacked, f"example runs not packed (run `tracebench pack` on them): {unpacked}"
    for parent in sorted({p.parent for p in folders}):
        group = [p for p in folders if p.parent == parent]
        runs = load_runs([str(p) for p in group], EXAMPLES)
        for run in runs:
            assert run.status == "completed", run.path
            assert run.requests.height == run.meta["trace"]["num_requests"], run.path
            assert (run.requests["status"] == "ok").all(), run.path
        text = render_md(document(build_report(runs, 0, bootstrap=0, allow_different_traces=True)))
        for run in runs:
            assert f"| {run.label} " in text, (parent, run.label)


def test_readme_four_gpu_command_on_the_committed_runs() -> None:
    done = run_cli("report", "reports/examples/h200x4-routing/random", "reports/examples/h200x4-routing/sjf",
                   cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "random (baseline)" in done.stdout and "sjf" in done.stdout
    assert done.stdout.count("1,350 of 1,350") == 2
    assert "NVIDIA H200" in done.stdout

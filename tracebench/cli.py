"""The `tracebench` command. The only place that turns tracebench's errors into messages and exit codes.

Subcommands are imported lazily, by name, so that `tracebench replay` never imports the report's polars/matplotlib
(only after a big run, to write its columnar copy: `_finish_run_folder`) and `tracebench report` never imports the
replay path.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from tracebench import __version__
from tracebench.errors import TracebenchError

# command name -> "module:attribute" of its click command
_COMMANDS = {
    "generate": "tracebench.trace.commands:generate",
    "inspect": "tracebench.trace.commands:inspect_cmd",
    "sim-server": "tracebench.sim.commands:sim_server",
    "replay": "tracebench.replay.commands:replay",
    "sweep": "tracebench.sweep.commands:sweep",
    "policies": "tracebench.replay.commands:policies_cmd",
    "report": "tracebench.report.commands:report",
    "pack": "tracebench.report.commands:pack",
    "record": "tracebench.record.commands:record",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def invoke(self, ctx: click.Context):  # type: ignore[override]
        try:
            result = super().invoke(ctx)
            if ctx.invoked_subcommand == "replay":
                _finish_run_folder(result)
            return result
        except TracebenchError as err:
            click.echo(f"tracebench: error: {err}", err=True)
            sys.exit(err.exit_code)


def _finish_run_folder(run_dir: Path) -> None:
    """After a replay that ended cleanly (`replay` returned its run folder): a big run's requests.jsonl gets its
    columnar copy (tracebench/report/columns.py finish_run_copy, which each sweep point runs too), then the folder is
    printed. Here, because replay/ never imports the report's polars. A copy that cannot be written (a full disk) or
    is stopped by SIGINT/SIGTERM leaves the run whole: the folder is printed and stderr says so; only a signal
    changes the exit code (130, 143: what a shell reports for a process the signal killed)."""
    from tracebench.errors import Interrupted
    from tracebench.report.columns import finish_run_copy

    try:
        not_written = finish_run_copy(run_dir)
    except Interrupted as err:
        click.echo(run_dir)
        click.echo(f"tracebench replay: {err}", err=True)
        sys.exit(err.exit_code)
    if not_written is not None:
        click.echo(f"tracebench replay: warning: {not_written}", err=True)
    click.echo(run_dir)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="tracebench")
def main() -> None:
    """Record-and-replay benchmarking for LLM serving on sglang.

    \b
    tracebench generate --rate 8                     make a trace (JSONL, deterministic)
    tracebench inspect traces/x.jsonl                its statistics
    tracebench replay trace.jsonl --gpus 4           replay it on sglang servers (or --backend sim)
    tracebench sweep trace.jsonl --rates 5,10,20     replay it at several loads (or --find-max-rate --slo ...)
    tracebench report run_a run_b                    compare runs of the same trace
    tracebench pack run_a run_b                      store finished runs compactly (Parquet, xz)
    tracebench record --listen 127.0.0.1:31000 --upstream http://127.0.0.1:30000
                                                     record live traffic as a trace (a proxy)
    tracebench sim-server --port 30000               a simulated sglang server
    tracebench policies                              the routing policies
    """

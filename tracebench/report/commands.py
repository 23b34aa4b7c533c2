"""`tracebench report`. Only click at import time: polars, numpy and matplotlib load inside the command."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

FORMATS = ("table", "md", "csv", "json", "html")
_SUFFIX_FORMATS = {".txt": "table", ".md": "md", ".csv": "csv", ".json": "json", ".html": "html", ".htm": "html"}


def _resolve_format(fmt: str | None, output: Path | None) -> str:
    from tracebench.errors import ConfigError

    guessed = _SUFFIX_FORMATS.get(output.suffix.lower()) if output is not None else None
    if fmt is None:
        if output is None:
            return "table"
        if guessed is None:
            raise ConfigError(f"-o {output}: cannot tell the format from the suffix; add --format ({'|'.join(FORMATS)})")
        return guessed
    if guessed is not None and guessed != fmt:
        raise ConfigError(f"--format {fmt} contradicts -o {output} (a .{output.suffix.lstrip('.')} file)")
    if fmt == "html" and output is None:
        raise ConfigError("--format html writes a file (and a PNG beside it): give -o FILE.html")
    if fmt == "html" and output is not None and output.suffix.lower() == ".png":
        raise ConfigError(f"-o {output}: the HTML page needs another name (its main figure goes to a .png beside it)")
    return fmt


def _write_files(files: dict[Path, bytes]) -> None:
    """Write every file to a temporary name first, then rename them all: a failure leaves nothing half-written."""
    temps: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
            temp.write_bytes(data)
            temps.append((temp, path))
        for temp, path in temps:
            os.replace(temp, path)
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)


@click.command("report")
@click.argument("runs", nargs=-1, required=True, metavar="RUN [RUN ...]")
@click.option("--baseline", metavar="RUN",
              help="The run the others are compared against (default: the first RUN). Need not be among RUN ...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="table (terminal, the default), md, csv (long: run,metric,stat,value,unit), json, or html "
                   "(one self-contained page with plots, plus its main figure as <FILE>.png). "
                   "Default: from the -o suffix, else table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Write to FILE (atomically) instead of stdout. Needed for html.")
@click.option("--slo", metavar="SPEC",
              help="Service-level objectives, e.g. 'ttft=0.5,total=10' (seconds; '500ms' works too). Keys: "
                   "ttft (first token, from arrival), total (arrival to finish), tpot (time per output token), "
                   "server (dispatch to finish), wait (router wait: arrival to dispatch), itl (every gap between a "
                   "streamed answer's chunks, i.e. its largest inter-token latency). Reports the fraction of "
                   "requests meeting all of them and the goodput (those requests per second).")
@click.option("--warmup", type=float, default=0.0, show_default=True, metavar="S",
              help="Leave out requests that arrive in the first S seconds of the trace.")
@click.option("--allow-different-traces", is_flag=True,
              help="Compare runs of different traces (refused otherwise: run.json trace sha256 must match).")
@click.option("--bootstrap", type=int, default=1000, show_default=True, metavar="N",
              help="Bootstrap resamples for the 95% interval of each latency-percentile difference (0: none).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the bootstrap.")
@click.option("--reports-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"),
              show_default=True, help="Where a RUN given by name is looked up.")
def report(runs: tuple[str, ...], baseline: str | None, fmt: str | None, output: Path | None, slo: str | None,
           warmup: float, allow_different_traces: bool, bootstrap: int, seed: int, reports_dir: Path) -> None:
    """Compare runs of the same trace, side by side, against a baseline.

    A RUN is a run folder written by `tracebench replay`, or its name in reports/
    (`tracebench report demo-round_robin demo-sjf`).

    \b
    It shows, per run: what changed between the runs (policy, mode, caps, max concurrency,
    servers, ...); requests ok/mismatch/error/timeout/cancelled (mismatch: finished, but
    not as the trace asked; counted by reason, with a warning that they distort TPOT, total
    latency and output throughput); duration (first arrival to last completed finish) and
    throughput (requests/s, input and output tokens/s); latency mean/p50/p90/p99/max over
    completed (ok + mismatch) requests of total, router wait, client wait (with
    --max-concurrency), server latency (client-seen and sglang-reported), TTFT from
    arrival and from dispatch, TPOT, release lag and ITL (inter-token latency: every
    gap of the streams, pooled); per-server share, busy time, mean in-flight and a
    balance verdict; SLO attainment and goodput with --slo.
    A run at --speed K is in simulated seconds: the simulators' time x K, tracebench's
    host time as measured; comparing runs made at different speeds is warned about.
    Each number of a run also appears as a change against the baseline (absolute
    and %); latency percentiles get a bootstrap 95% interval of the change, called
    "significant" only when it excludes 0. docs/report.md defines every number.

    \b
    Examples:
      tracebench report demo-round_robin demo-sjf
      tracebench report reports/a reports/b --slo ttft=0.5,total=10,itl=50ms --warmup 5
      tracebench report a b c --baseline b --format html -o reports/abc.html
    """
    from tracebench.report.load import load_runs, resolve_run_dir
    from tracebench.report.metrics import build_report, parse_slo
    from tracebench.report.render import document

    out_format = _resolve_format(fmt, output)
    slo_spec = parse_slo(slo) if slo is not None else None
    specs = list(runs)
    base_index = 0
    if baseline is not None:
        base_dir = resolve_run_dir(baseline, reports_dir).resolve()
        matches = [i for i, spec in enumerate(specs) if resolve_run_dir(spec, reports_dir).resolve() == base_dir]
        if matches:
            base_index = matches[0]
        else:
            specs.insert(0, baseline)
    loaded = load_runs(specs, reports_dir)
    result = build_report(loaded, base_index, warmup=warmup, slo=slo_spec, bootstrap=bootstrap, seed=seed,
                          allow_different_traces=allow_different_traces, with_series=out_format == "html")

    if out_format == "html":
        from tracebench.report.render.html_page import render_html

        assert output is not None
        page, main_png = render_html(result, document(result))
        _write_files({output: page.encode(), output.with_suffix(".png"): main_png})
        click.echo(f"wrote {output} and {output.with_suffix('.png')}", err=True)
        return
    if out_format == "table":
        from tracebench.report.render.table import render_table

        colour = output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        text = render_table(document(result), colour=colour)
    elif out_format == "md":
        from tracebench.report.render.md import render_md

        text = render_md(document(result))
    elif out_format == "csv":
        from tracebench.report.render.tidy import render_csv

        text = render_csv(result)
    else:
        from tracebench.report.render.jsondoc import render_json

        text = render_json(result)
    if output is None:
        click.echo(text, nl=False)
    else:
        _write_files({output: text.encode()})
        click.echo(f"wrote {output}", err=True)


@click.command("pack")
@click.argument("runs", nargs=-1, required=True, metavar="RUN [RUN ...]")
@click.option("--log-tail", type=click.IntRange(min=1), default=None, metavar="LINES",
              help="Keep only the last LINES lines of each server-<i>.log, dropping the rest (default: the whole "
                   "log, compressed).")
@click.option("--shareable", is_flag=True, default=False,
              help="Also rewrite this machine's paths in run.json and the logs (docs/run-format.md, \"Paths\"); on "
                   "a packed run, only those files.")
@click.option("--reports-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"),
              show_default=True, help="Where a RUN given by name is looked up.")
def pack(runs: tuple[str, ...], log_tail: int | None, shareable: bool, reports_dir: Path) -> None:
    """Store finished run folders compactly, in place, losing no record.

    A RUN is a run folder written by `tracebench replay`, or its name in reports/.

    \b
      run.json         -> run.json.xz        (xz: xzcat run.json.xz)
      requests.jsonl   -> requests.parquet   (Parquet, zstd; pl.read_parquet / pd.read_parquet)
      telemetry.jsonl  -> telemetry.parquet  (Parquet, zstd)
      server-<i>.log   -> server-<i>.log.xz  (xz; --log-tail keeps only its end)

    A packed folder is read by `tracebench report` (and every other reader of run
    folders) exactly like the original: the same records, columns and types
    (docs/run-format.md). The example runs of reports/examples/ came out 8x
    smaller (20.7 MB -> 2.6 MB for 28 runs).

    \b
    All or nothing: every RUN is checked first (refused: a run still `running`
    in run.json, one already packed unless --shareable, a record `tracebench
    report` would refuse); each packed file is written under a temporary name,
    read back and compared with the original record by record; only when every
    RUN passed are the packed files renamed into place and the originals removed.

    --shareable (a run folder to publish): run.json and the logs keep no path
    of this machine, only names (relative inside the run or working folder).

    \b
    Examples:
      tracebench pack demo-round_robin demo-sjf
      tracebench pack reports/gpu-runs/*/ --log-tail 100 --shareable
    """
    from tracebench.report.load import resolve_run_dir
    from tracebench.report.pack import pack_runs

    folders = [resolve_run_dir(spec, reports_dir) for spec in runs]
    for run in pack_runs(folders, log_tail, shareable):
        done = "made shareable" if all(final == original for _, final, original in run.moves) else "packed"
        click.echo(f"{done} {run.folder}: {run.bytes_before / 1e6:.2f} MB -> {run.bytes_after / 1e6:.2f} MB "
                   f"({', '.join(final.name for _, final, _ in run.moves)})", err=True)

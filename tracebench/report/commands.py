"""`tracebench report`. Only click at import time: polars, numpy and matplotlib load inside the command."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tracebench.options import FINITE, INT64_MAX, SEED, BoundedInt

if TYPE_CHECKING:
    from tracebench.report.figure_options import FigureOptions
    from tracebench.report.metrics import Report

COUNT = BoundedInt(0, INT64_MAX, "an integer >= 0")

FORMATS = ("table", "md", "csv", "json", "html", "png", "svg", "perfetto")
_SUFFIX_FORMATS = {".txt": "table", ".md": "md", ".csv": "csv", ".json": "json", ".html": "html", ".htm": "html",
                   ".trace": "perfetto", ".png": "png", ".svg": "svg"}


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
    if fmt in ("png", "svg") and output is None:
        raise ConfigError(f"--format {fmt} writes the latency figure to a file: give -o FILE.{fmt}")
    if fmt == "html" and output is not None and output.suffix.lower() == ".png":
        raise ConfigError(f"-o {output}: the HTML page needs another name (its main figure goes to a .png beside it)")
    return fmt


def _write_files(files: dict[Path, bytes]) -> None:
    """Write every file to a temporary name first, then rename them all: a failure leaves nothing half-written. A
    folder that cannot be written (read-only, full, not a folder) is a ConfigError naming the file (exit 2)."""
    from tracebench.cleanup import temp_name
    from tracebench.errors import ConfigError

    temps: list[tuple[Path, Path]] = []
    placed: list[str] = []
    current = None
    try:
        for path, data in files.items():
            current = path
            path.parent.mkdir(parents=True, exist_ok=True)
            temp = temp_name(path)
            temps.append((temp, path))
            temp.write_bytes(data)
        for temp, path in temps:
            current = path
            os.replace(temp, path)
            placed.append(str(path))
    except OSError as err:
        written = f"only {', '.join(placed)} was written" if placed else "nothing was written"
        raise ConfigError(f"-o {current}: cannot write it ({err.strerror}); {written}") from None
    finally:
        for temp, _ in temps:
            if temp.exists():  # (unlink of a missing file in a read-only folder fails with EROFS, not ENOENT)
                temp.unlink()


@click.command("report")
@click.argument("runs", nargs=-1, required=True, metavar="RUN [RUN ...]")
@click.option("--baseline", metavar="RUN",
              help="The run the others are compared against (default: the first RUN). Need not be among RUN ...")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default=None,
              help="table (terminal, the default), md, csv (long: run,metric,stat,value,unit), json, html "
                   "(one self-contained page with plots, plus its main figure as <FILE>.png), png or svg (the latency "
                   "figure alone, slide-sized: --size, --plots, --x-scale, --y-scale, --title, --label), or perfetto (the "
                   "runs' timeline as Chrome-trace JSON for ui.perfetto.dev: a track per server, each request a "
                   "slice split into router wait, server queue, prefill and decode, cap changes and server events "
                   "as markers, telemetry as counters; no comparison, so no --baseline/--slo/--warmup). "
                   "Default: from the -o suffix (.trace: perfetto, .png, .svg), else table.")
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Write to FILE (atomically) instead of stdout. Needed for html.")
@click.option("--slo", metavar="SPEC",
              help="Service-level objectives, e.g. 'ttft=0.5,total=10' (seconds; '500ms' works too). Keys: "
                   "ttft (first token, from arrival), total (arrival to finish), tpot (time per output token), "
                   "server (dispatch to finish), wait (router wait: arrival to dispatch), itl (every gap between a "
                   "streamed answer's chunks, i.e. its largest inter-token latency). Reports the fraction of "
                   "requests meeting all of them and the goodput (those requests per second).")
@click.option("--fail-on-slo", is_flag=True,
              help="A CI gate: after writing the report, exit 3 (not 1, a failure, nor 2, bad input) when a RUN "
                   "misses --slo: fewer than --slo-percentile % of its kept requests meet every limit (a request "
                   "not ok meets none). Prints each run that missed, with the limits it missed, on stderr. Every "
                   "RUN is checked, the baseline too.")
@click.option("--slo-percentile", type=FINITE, default=None, metavar="P",
              help="--fail-on-slo: the share of kept requests (percent) that must meet every limit, i.e. each "
                   "limit holds at the P-th percentile. [default: 99]")
@click.option("--warmup", type=FINITE, default=0.0, show_default=True, metavar="S",
              help="Leave out requests that arrive in the first S seconds of the trace.")
@click.option("--allow-different-traces", is_flag=True,
              help="Compare runs of different traces (refused otherwise: run.json trace sha256 must match).")
@click.option("--bootstrap", type=COUNT, default=1000, show_default=True, metavar="N",
              help="Bootstrap resamples for the 95% interval of each latency-percentile difference (0: none).")
@click.option("--seed", type=SEED, default=0, show_default=True, help="Seed of the bootstrap.")
@click.option("--reports-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("reports"),
              show_default=True, help="Where a RUN given by name is looked up.")
@click.option("--title", metavar="TEXT", default=None,
              help="The report's title, and the latency figure's (png, svg, html).  [default: the runs' names; "
                   "the figure: Latency CDFs]")
@click.option("--label", "labels", metavar="RUN=TEXT", multiple=True,
              help="Call RUN (as given, or its run name) TEXT in the tables and the figures' legends; repeatable: "
                   "--label a=\"4 plain\" --label b=3P1D.")
@click.option("--plots", metavar="PANELS", default=None,
              help="The latency figure's panels, in this order (png, svg, html): comma-separated from total, ttft, "
                   "server, wait, tpot.  [default: all five]")
@click.option("--x-scale", type=click.Choice(("linear", "log")), default=None,
              help="The latency figure's x axis: log keeps a run far slower than the others from squashing them.  "
                   "[default: linear]")
@click.option("--y-scale", type=click.Choice(("linear", "tail")), default=None,
              help="The latency figure's y axis: tail spreads p50 ... p99.9 evenly (logit), for tail differences.  "
                   "[default: linear]")
@click.option("--size", type=click.Choice(("slide", "slide-4:3", "page")), default=None,
              help="--format png/svg: slide (13.33 x 7.5 in, 16:9; a PNG at 150 dpi, 2000 x 1125 px), slide-4:3 "
                   "(10 x 7.5 in) or page (15 x 8.6 in, the HTML page's).  [default: slide]")
@click.option("--layout", type=click.Choice(("auto", "wide", "runs")), default="auto", show_default=True,
              help="Tables of the table, md and html formats. wide: each run's values, then each run's change "
                   "against the baseline and the 95% interval of that change, in columns of their own (a terminal "
                   "too narrow splits them into parts 1/2, 2/2); runs: one column per run, each cell its value and "
                   "its change against the baseline in % (* when the change's interval excludes 0), each percentile "
                   "with the run's own 95% interval under it (five runs fit 120 columns); auto: runs for the terminal "
                   "table of 3 runs or more, else wide.")
def report(runs: tuple[str, ...], baseline: str | None, fmt: str | None, output: Path | None, slo: str | None,
           fail_on_slo: bool, slo_percentile: float | None, warmup: float, allow_different_traces: bool, bootstrap: int,
           seed: int, reports_dir: Path, title: str | None, labels: tuple[str, ...], plots: str | None,
           x_scale: str | None, y_scale: str | None, size: str | None, layout: str) -> None:
    """Compare runs of the same trace, side by side, against a baseline.

    A RUN is a run folder written by `tracebench replay`, or its name in reports/
    (`tracebench report demo-round_robin demo-sjf`).

    \b
    It shows, per run: what changed between the runs (policy, mode, caps, max concurrency,
    servers, ...); requests ok/mismatch/error/timeout/cancelled/not_sent (mismatch: finished,
    but not as the trace asked; counted by reason, with a warning that they distort TPOT,
    total latency and output throughput; not_sent: never dispatched, the run stopped first);
    duration (first arrival to last completed finish) and
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
      tracebench report a --format perfetto -o a.json.trace     # open in ui.perfetto.dev
      tracebench report new --slo ttft=500ms,total=10 --fail-on-slo   # CI: exit 3 if < 99% meet both
      tracebench report plain-4 pd-3p1d -o slide.png --plots ttft,tpot --x-scale log \\
          --title "4 plain vs 3P1D, H100" --label plain-4="4 servers" --label pd-3p1d=3P1D
    """
    from tracebench.errors import ConfigError
    from tracebench.report.figure_options import apply_labels, figure_options
    from tracebench.report.load import load_runs, read_jsonl_in_large_pieces
    from tracebench.report.metrics import build_report
    from tracebench.report.render import resolve_layout

    read_jsonl_in_large_pieces()
    out_format = _resolve_format(fmt, output)
    figure = figure_options(out_format, title, plots, x_scale, y_scale, size, labels)
    percentile = _gate_percentile(slo, fail_on_slo, slo_percentile)
    if warmup < 0:
        raise ConfigError(f"--warmup must be >= 0, got {warmup:g}")
    if out_format == "perfetto":
        _perfetto(list(runs), output, reports_dir, baseline=baseline, slo=slo, warmup=warmup, title=title,
                  label=labels or None)
        return
    slo_spec = _slo_spec(slo)
    specs, base_index = _with_baseline(list(runs), baseline, reports_dir)
    loaded = load_runs(specs, reports_dir)
    apply_labels(figure.labels, specs, loaded)
    layout = resolve_layout(layout, len(loaded), out_format)
    result = build_report(loaded, base_index, warmup=warmup, slo=slo_spec, bootstrap=bootstrap, seed=seed,
                          allow_different_traces=allow_different_traces,
                          with_series=out_format in ("html", "png", "svg"))
    _write_report(result, out_format, output, figure, layout, title)
    _gate(result, fail_on_slo, percentile)


def _gate_percentile(slo: str | None, fail_on_slo: bool, slo_percentile: float | None) -> float:
    """The share of kept requests (percent) --fail-on-slo requires to meet every limit, the options checked."""
    from tracebench.errors import ConfigError

    if fail_on_slo and slo is None:
        raise ConfigError("--fail-on-slo needs --slo KEY=LIMIT,... (the objectives to check)")
    if slo_percentile is not None and not fail_on_slo:
        raise ConfigError("--slo-percentile is the --fail-on-slo gate's: give --fail-on-slo too")
    percentile = 99.0 if slo_percentile is None else slo_percentile
    if not 0 < percentile <= 100:
        raise ConfigError(f"--slo-percentile must be in (0, 100], got {percentile:g}")
    return percentile


def _slo_spec(slo: str | None) -> dict[str, float] | None:
    """--slo parsed: seconds per key, each finite."""
    from tracebench.errors import ConfigError
    from tracebench.report.metrics import parse_slo

    slo_spec = parse_slo(slo) if slo is not None else None
    for key, seconds in (slo_spec or {}).items():
        if not math.isfinite(seconds):  # '1e400' parses as inf: an objective every request meets
            raise ConfigError(f"--slo: {key} must be a finite number of seconds, got {seconds}")
    return slo_spec


def _with_baseline(specs: list[str], baseline: str | None, reports_dir: Path) -> tuple[list[str], int]:
    """The runs to load and the baseline's index among them: --baseline's run, put first when it is not among RUN."""
    from tracebench.report.load import resolve_run_dir

    if baseline is None:
        return specs, 0
    base_dir = resolve_run_dir(baseline, reports_dir).resolve()
    matches = [i for i, spec in enumerate(specs) if resolve_run_dir(spec, reports_dir).resolve() == base_dir]
    if matches:
        return specs, matches[0]
    return [baseline, *specs], 0


def _write_report(result: Report, out_format: str, output: Path | None, figure: FigureOptions, layout: str,
                  title: str | None) -> None:
    """The report in `out_format`, to `output` (written atomically) or stdout; where each file went on stderr."""
    from tracebench.report.render import document as document_of

    def document():  # type: ignore[no-untyped-def]
        doc = document_of(result, layout)
        if title is not None:
            doc.title = title
        return doc

    if out_format in ("png", "svg"):
        from tracebench.report.figure_options import SLIDE_DPI
        from tracebench.report.render import plots as draw

        assert output is not None
        fig = draw.latency_cdfs(result, figure)
        data = draw.to_png(fig, dpi=SLIDE_DPI) if out_format == "png" else draw.to_svg(fig).encode()
        draw.close(fig)
        _write_files({output: data})
        click.echo(f"wrote {output} (the latency CDFs, {figure.size})", err=True)
        return
    if out_format == "html":
        from tracebench.report.render.html_page import render_html

        assert output is not None
        page, main_png, telemetry_png = render_html(result, document(), figure)
        files = {output: page.encode(), output.with_suffix(".png"): main_png}
        if telemetry_png is not None:  # the runs' /metrics scrapes and GPU samples, per server
            files[output.with_suffix(".telemetry.png")] = telemetry_png
        _write_files(files)
        what = {output: "the report", output.with_suffix(".png"): "its latency CDFs as an image",
                output.with_suffix(".telemetry.png"): "the servers' telemetry as an image"}
        click.echo("wrote " + ", ".join(f"{path} ({what[path]})" for path in files), err=True)
        return
    if out_format == "table":
        from tracebench.report.render.table import render_table

        colour = output is None and sys.stdout.isatty() and "NO_COLOR" not in os.environ
        text = render_table(document(), colour=colour)
    elif out_format == "md":
        from tracebench.report.render.md import render_md

        text = render_md(document())
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


def _gate(result: Report, fail_on_slo: bool, percentile: float) -> None:
    """--fail-on-slo, once the report is out: SloMissed (exit 3) naming each run that missed, and what it missed."""
    if not fail_on_slo:
        return
    from tracebench.errors import SloMissed
    from tracebench.report.metrics.gate import slo_misses

    misses = slo_misses(result, percentile)
    if misses:
        raise SloMissed(f"SLO missed by {len(misses)} run(s) (--fail-on-slo, exit 3):\n  " + "\n  ".join(misses))
    click.echo(f"SLO met by every run: at least {percentile:g}% of each run's kept requests meet every limit", err=True)


def _perfetto(specs: list[str], output: Path | None, reports_dir: Path, **unused: object) -> None:
    """`--format perfetto`: the runs' timelines, no comparison (tracebench/report/render/perfetto.py)."""
    from tracebench.errors import ConfigError
    from tracebench.report.load import load_runs
    from tracebench.report.render.perfetto import render_perfetto

    given = [f"--{name}" for name, value in unused.items() if value not in (None, 0.0)]
    if given:
        raise ConfigError(f"{', '.join(given)}: --format perfetto draws the runs' timelines, it compares nothing")
    data = render_perfetto(load_runs(specs, reports_dir))
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    _write_files({output: data})
    click.echo(f"wrote {output}: open it in https://ui.perfetto.dev (Open trace file) or chrome://tracing", err=True)


@click.command("pack")
@click.argument("runs", nargs=-1, required=True, metavar="RUN [RUN ...]")
@click.option("--log-tail", type=BoundedInt(1, INT64_MAX, "an integer >= 1"), default=None, metavar="LINES",
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
      requests.columns.parquet  removed (the copy a big replay leaves of requests.jsonl)

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
    from tracebench.cleanup import StopSignals
    from tracebench.report.columns import is_copy_temp
    from tracebench.report.load import resolve_run_dir
    from tracebench.report.pack import pack_runs

    def stale(path: Path, pid: int) -> None:
        if is_copy_temp(path):
            click.echo(f"tracebench: removed {path}, left by a replay (pid {pid}, no longer running) killed while it "
                       f"wrote the run's columnar copy", err=True)
            return
        click.echo(f"tracebench: removed {path}, left by a pack (pid {pid}, no longer running) killed before it "
                   f"finished", err=True)

    folders = [resolve_run_dir(spec, reports_dir) for spec in runs]
    with StopSignals("pack stopped by {signal}: nothing was packed (its temporary files removed, every run as it "
                     "was)") as stop:
        for run in pack_runs(folders, log_tail, shareable, stop, stale):
            done = "made shareable" if all(final == original for _, final, original in run.moves) else "packed"
            click.echo(f"{done} {run.folder}: {run.bytes_before / 1e6:.2f} MB -> {run.bytes_after / 1e6:.2f} MB "
                       f"({', '.join(final.name for _, final, _ in run.moves)})", err=True)
        stop.check("the packed files were being put in place: that was finished, every run given is packed")

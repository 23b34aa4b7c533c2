"""What `report --title/--plots/--x-scale/--y-scale/--label/--size` ask of the latency figure, parsed and checked.
Light (no polars, no matplotlib): the command checks these before it loads a run."""

from __future__ import annotations

from dataclasses import dataclass, field

from tracebench.errors import ConfigError

# --plots names (the --slo keys) -> the CDF series' keys, in the figure's default order
PANELS = {"total": "total", "ttft": "ttft", "server": "server_client", "wait": "router_wait", "tpot": "tpot"}
X_SCALES = ("linear", "log")
Y_SCALES = ("linear", "tail")
# --size: a 16:9 slide (13.33 x 7.5 in, PowerPoint's and Google Slides' default) and a 4:3 one, at 150 dpi
SIZES = {"slide": (40 / 3, 7.5), "slide-4:3": (10.0, 7.5), "page": (15.0, 8.6)}
SLIDE_DPI = 150


@dataclass(frozen=True)
class FigureOptions:
    title: str | None = None
    plots: tuple[str, ...] = tuple(PANELS.values())  # CDF series keys, in the order asked
    x_scale: str = "linear"
    y_scale: str = "linear"
    size: str = "page"
    labels: dict[str, str] = field(default_factory=dict)  # run spec or run name -> label


def parse_plots(text: str | None) -> tuple[str, ...]:
    """`ttft,tpot` -> the CDF keys; unknown or repeated names are a ConfigError naming them."""
    if text is None:
        return tuple(PANELS.values())
    names = [part.strip() for part in text.split(",")]
    unknown = [name for name in names if name not in PANELS]
    if unknown or not names:
        raise ConfigError(f"--plots: unknown panel {', '.join(repr(n) for n in unknown) or repr(text)} "
                          f"(choose from {', '.join(PANELS)}, comma-separated)")
    if len(set(names)) != len(names):
        raise ConfigError(f"--plots {text}: a panel is named twice")
    return tuple(PANELS[name] for name in names)


def parse_labels(items: tuple[str, ...]) -> dict[str, str]:
    """`RUN=TEXT` items -> {RUN: TEXT}; a missing `=`, an empty side or a RUN given twice is a ConfigError."""
    labels: dict[str, str] = {}
    for item in items:
        run, sep, text = item.partition("=")
        if not sep or not run.strip() or not text.strip():
            raise ConfigError(f"--label {item!r}: expected RUN=TEXT (a RUN as given, or its run name)")
        if run in labels:
            raise ConfigError(f"--label: run {run!r} is labelled twice")
        labels[run] = text.strip()
    return labels


def apply_labels(labels: dict[str, str], specs: list[str], runs: list) -> None:
    """Rename the loaded runs (`runs[i]` loaded from `specs[i]`) by --label, matched against the RUN as given, its
    run name or its folder name. A label that matches no run, or two runs left with one name, is a ConfigError."""
    used = set()
    for spec, run in zip(specs, runs):
        for key in (spec, spec.rstrip("/"), run.meta["run_name"], run.path.name):
            if key in labels:
                run.label = labels[key]
                used.add(key)
                break
    unused = [key for key in labels if key not in used]
    if unused:
        raise ConfigError(f"--label {unused[0]}=...: no such RUN among {', '.join(specs)}")
    names = [run.label for run in runs]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"--label: two runs would both be called {twice[0]!r}")


FIGURE_FORMATS = ("png", "svg", "html")


def figure_options(out_format: str, title: str | None, plots: str | None, x_scale: str | None, y_scale: str | None,
                   size: str | None, labels: tuple[str, ...]) -> FigureOptions:
    """The figure options of a `report` call, checked against its format: --plots, --x-scale, --y-scale and --size
    shape the latency figure, so they need a format that draws it (png, svg, html); --size page is html's size."""
    shaping = {"--plots": plots, "--x-scale": x_scale, "--y-scale": y_scale, "--size": size}
    given = [flag for flag, value in shaping.items() if value is not None]
    if given and out_format not in FIGURE_FORMATS:
        raise ConfigError(f"{', '.join(given)}: shape the latency figure, drawn only by --format png, svg or html "
                          f"(this is --format {out_format})")
    if size is not None and out_format == "html" and size != "page":
        raise ConfigError(f"--size {size}: the HTML page's figure is page-sized; for a slide, --format png or svg")
    if title is not None and not title.strip():
        raise ConfigError("--title: empty")
    return FigureOptions(title=title, plots=parse_plots(plots), x_scale=x_scale or "linear",
                         y_scale=y_scale or "linear", size=size or ("page" if out_format == "html" else "slide"),
                         labels=parse_labels(labels))

"""A model's benchmark report (``GET /v1/models/{id}/report``) as rich tables and a PNG chart.

The functions take the API's JSON as a plain dict, so the CLI, a notebook or a CI job can render a
report it fetched or saved without the server's models. Nothing here touches the network.

Conventions of the report that the rendering relies on:

* ``latency_ms`` is end to end; its ``median`` is what "p50" means throughout.
* ``regression.median_ms_delta`` is now minus previous, so negative means faster, and
  ``regression.median_ratio`` is now / previous.
* ``best`` is true on the chosen variant of a sweep, false on the others, null when there is no
  choice to make.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, cast

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from enginefarm.client.safepaths import atomic_write

Report = Mapping[str, Any]
Row = Mapping[str, Any]

DASH = "—"
BEST_MARK = "★"
# A slowdown of the median beyond this fraction is flagged red; smaller ones are noise on shared GPUs.
SLOWER_TOLERANCE = 0.05
# Above this max/min ratio of the plotted values, a linear axis flattens the small bars to nothing.
LOG_SPAN = 100.0
_BATCH_KEY = re.compile(r"batch=(\d+)")
# The width, in cells, below which a column that wraps reads badly (a status of three words a line).
ROOMY = 20


# ------------------------------------------------------------------------------ formatting


def fmt_ms(value: float | None, *, signed: bool = False) -> str:
    """Milliseconds with about three significant digits: enough to compare, short enough for a table."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    sign = "+" if signed else ""
    magnitude = abs(value)
    if magnitude >= 100:
        return f"{value:{sign}.1f}"
    if magnitude >= 10:
        return f"{value:{sign}.2f}"
    if magnitude >= 0.1 or magnitude == 0:
        return f"{value:{sign}.3f}"
    return f"{value:{sign}.3g}"


def fmt_qps(value: float | None, *, signed: bool = False) -> str:
    """Throughput in queries per second; whole numbers once the decimal stops mattering."""
    if value is None:
        return DASH
    sign = "+" if signed else ""
    return f"{value:{sign},.0f}" if abs(value) >= 1000 else f"{value:{sign},.1f}"


def human_bytes(n: int | float | None, *, signed: bool = False) -> str:
    """Binary units (KiB, MiB, GiB), the ones engine files and GPU memory are counted in."""
    if n is None:
        return DASH
    sign = ("+" if n > 0 else "-" if n < 0 else "") if signed else ("-" if n < 0 else "")
    size = float(abs(n))
    if size < 1024:
        return f"{sign}{int(size)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{sign}{size:.1f} {unit}"
    raise AssertionError("unreachable")


def fmt_small(value: float | str | None, *, signed: bool = False) -> str:
    """Scientific notation for error metrics and cosine deltas, which live around 1e-3 .. 1e-7. A figure that was
    not finite is stored as its text ("inf", "nan") and shown as it is."""
    if value is None:
        return DASH
    if isinstance(value, str):
        return value
    if value == 0:
        return "0"
    return f"{value:+.2e}" if signed else f"{value:.2e}"


def shape_label(row: Row) -> str:
    """``batch=8`` reads as "batch 8"; a shape key without its batch in it ("opt") as the inputs' measured shapes,
    ``images 8x3x640x640``, so that two builds measured at different shapes read differently; else the key."""
    key = str(row.get("shape_key") or DASH)
    if match := _BATCH_KEY.fullmatch(key):
        return f"batch {match.group(1)}"
    shapes = row.get("shapes") or {}
    if key == "opt" and shapes:
        return ", ".join(f"{name} {'x'.join(map(str, dims))}" for name, dims in sorted(shapes.items()))
    return key


def model_title(report: Report) -> str:
    """ "name version N", the way models are named everywhere else in the farm."""
    model = report.get("model") or {}
    return f"{model.get('name', '?')} version {model.get('version', '?')}"


def _stat(row: Row, key: str, phase: str = "latency_ms") -> float | None:
    stats = row.get(phase)
    return None if not stats else stats.get(key)


def _variant_cell(row: Row) -> Text:
    variant = str(row.get("variant") or DASH)
    if row.get("preparation"):
        variant += f" ({row['preparation']})"
    if row.get("best") is True:
        return Text.assemble(variant, " ", (BEST_MARK, "bold yellow"))
    return Text(variant, style="dim" if row.get("best") is False else "")


def profiles_label(profiles: Sequence[dict[str, Any]] | None) -> str:
    """Each optimization profile on a line, its inputs as trtexec writes ranges: ``images 1x3x64x64..4x3x1024x1024``;
    a static input shows its one shape."""
    lines = []
    profiles = profiles or []
    for i, profile in enumerate(profiles):
        parts = []
        for name, rng in sorted(profile.items()):
            lo, hi = ("x".join(map(str, rng[k])) for k in ("min", "max"))
            parts.append(f"{name} {lo}" if lo == hi else f"{name} {lo}..{hi}")
        lines.append((f"{i}: " if len(profiles) > 1 else "") + ", ".join(parts))
    return "\n".join(lines) or DASH


class Words:
    """Text that wraps only between its units: a word, or words that read as one (``cos 0.999987``, a `code span` to
    copy). A unit wider than the width breaks between its words, an option kept with its value."""

    CODE_OR_WORD = re.compile(r"\S*`[^`]*`\S*|\S+")
    PART = re.compile(r"-\S+ (?!-)\S+|\S+")

    def __init__(self, *lines: Sequence[str | tuple[str, str]], style: str = "") -> None:
        self.lines = [[(u, "") if isinstance(u, str) else u for u in line] for line in lines]
        self.style = style

    @classmethod
    def of(cls, text: str, style: str = "") -> Words:
        """``text``'s lines, a code span (with what touches it) one unit, any other word one unit."""
        return cls(*(cls.CODE_OR_WORD.findall(line) for line in text.splitlines()), style=style)

    @property
    def whole(self) -> int:
        """The width that keeps every unit whole."""
        return max((cell_len(u) for line in self.lines for u, _ in line), default=0)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        parts = [cell_len(p) for line in self.lines for u, _ in line for p in self.PART.findall(u)]
        lines = [cell_len(" ".join(u for u, _ in line)) for line in self.lines]
        return Measurement(max(parts, default=0), max(lines, default=0))

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width, text = options.max_width, Text(style=self.style)
        for n, line in enumerate(self.lines):
            used = 0
            if n:
                text.append("\n")
            for unit, style in line:
                for part in [unit] if cell_len(unit) <= width else self.PART.findall(unit):
                    if used and used + 1 + cell_len(part) > width:
                        text.append("\n")
                        used = 0
                    elif used:
                        text.append(" ")
                        used += 1
                    text.append(part, style)
                    used += cell_len(part)
        yield text


def _accuracy_cell(row: Row) -> Text | Words:
    accuracy = row.get("accuracy")
    if not accuracy:
        return Text(DASH, style="dim")
    verdict = {True: ("PASS", "bold green"), False: ("FAIL", "bold red")}.get(accuracy.get("pass"), (DASH, "dim"))
    units: list[str | tuple[str, str]] = [verdict]
    metrics = accuracy.get("metrics") or {}
    if (cosine := metrics.get("cosine")) is not None:
        units.append(f"cos {cosine:.6f}")
    if (mean_abs := metrics.get("mean_abs")) is not None:
        units.append(f"mae {fmt_small(mean_abs)}")
    return Words(units)


def _status_cell(row: Row) -> Words:
    status = str(row.get("status") or "?")
    check = row.get("check") or {}
    if status == "measured" and check.get("state") == "failed":  # some shapes measured, the check still failed
        return Words.of(f"measured; {check.get('detail')}", style="red")
    style = {"measured": "green", "pending": "yellow", "failed": "red"}.get(status, "")
    detail = str(row.get("detail") or "") if status != "measured" else ""
    if not detail:
        return Words.of(status, style=style)
    # Details usually say "benchmark pending: …" already; don't print the status twice.
    return Words.of(detail if status in detail.lower() else f"{status}: {detail}", style=style)


# ------------------------------------------------------------------------------ tables


class FittedTable(Table):
    """A table that fits the width it is drawn at without breaking a word or a number: it leaves out its optional
    columns, least important first, until every column that wraps can have ``ROOMY`` cells (or its widest line), says
    which it left out in its caption, and shares the width left among the columns that wrap at one level, none
    narrower than its longest word nor, where the width allows, than its widest unit of ``Words``. Where even the
    longest words can't fit, rich lays it out as any table."""

    def __init__(self, *args: Any, optional: Sequence[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.optional = tuple(optional)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        sizes = {id(c): _column_sizes(console, options, c) for c in self.columns}
        kept = list(self.columns)
        left_out: list[str] = []
        for name in self.optional:
            if self._fill(kept, sizes, width, ROOMY) is not None:
                break
            kept = [c for c in kept if c.header != name]
            left_out.append(name)
        widths = self._fill(kept, sizes, width, 0) or self._fill(kept, sizes, width, 0, whole=False)
        if widths is None:
            yield from super().__rich_console__(console, options)
            return
        table = copy.copy(self)
        table.columns = [dataclasses.replace(c, width=w, _index=i) for i, (c, w) in enumerate(zip(kept, widths))]
        if left_out:
            table.caption = f"left out to fit {width} columns: {', '.join(left_out)}"
        yield from Table.__rich_console__(table, console, options)

    def _fill(
        self,
        columns: Sequence[Column],
        sizes: Mapping[int, tuple[int, int, int]],
        width: int,
        floor: int,
        whole: bool = True,
    ) -> list[int] | None:
        """Content widths of ``columns`` within ``width``, each wrapping column at least ``floor`` cells (or its widest
        line), its longest word and, with ``whole``, its widest unit; None where they can't fit."""
        edges = len(columns) + 1 if self.box and self.show_edge else len(columns) - 1 if self.box else 0
        room = width - edges - (self.padding[1] + self.padding[3]) * len(columns)
        tops, lows = [], []
        for c in columns:
            word, top, unit = sizes[id(c)]
            tops.append(top)
            lows.append(top if c.no_wrap else max(word, min(top, floor), unit if whole else 0))
        if sum(lows) > room:
            return None
        level = max(tops, default=0)
        while sum(max(low, min(top, level)) for low, top in zip(lows, tops)) > room:
            level -= 1
        return [max(low, min(top, level)) for low, top in zip(lows, tops)]


def _column_sizes(console: Console, options: ConsoleOptions, column: Column) -> tuple[int, int, int]:
    """A column's longest word, longest line and widest unit of ``Words``, header included, padding left out."""
    wide = options.update_width(10_000)  # measured at any width
    ranges = [Measurement.get(console, wide, cell) for cell in (column.header, *column.cells)]
    unit = max((cell.whole for cell in column.cells if isinstance(cell, Words)), default=0)
    return max(r.minimum for r in ranges), max(r.maximum for r in ranges), unit


def report_table(report: Report) -> Table:
    """Every engine × measured shape on one line, pending and failed ones with the reason why. Where the width is
    short, the profiles, p90, size and device columns are left out, in that order."""
    table = FittedTable(
        title=model_title(report), title_style="bold", optional=("profiles", "p90 ms", "size", "device")
    )
    table.add_column("target", no_wrap=True)
    table.add_column("variant")
    table.add_column("profiles")
    table.add_column("shape")
    table.add_column("device")
    for name in ("p50", "p90", "p99"):
        table.add_column(f"{name} ms", justify="right", no_wrap=True)
    table.add_column("qps", justify="right", no_wrap=True)
    table.add_column("accuracy")
    table.add_column("size", justify="right", no_wrap=True)
    table.add_column("status")
    for row in report.get("rows") or []:
        table.add_row(
            str(row.get("target") or DASH),
            _variant_cell(row),
            Text(profiles_label(row.get("profiles")), style="dim"),
            shape_label(row),
            str(row.get("device") or DASH),
            fmt_ms(_stat(row, "median")),
            fmt_ms(_stat(row, "p90")),
            fmt_ms(_stat(row, "p99")),
            fmt_qps(row.get("throughput_qps")),
            _accuracy_cell(row),
            human_bytes(row.get("size")),
            _status_cell(row),
        )
    return table


def _median_change(row: Row) -> tuple[float | None, float | None, float | None, float | None]:
    """(previous, now, delta, percent) of the median latency, from whichever fields are present."""
    regression = row.get("regression") or {}
    now = _stat(row, "median")
    delta = regression.get("median_ms_delta")
    previous: float | None = None
    if now is not None and delta is not None:
        previous = now - delta
    elif regression.get("median_ms") is not None:
        previous = regression["median_ms"]
        if now is None and delta is not None:
            now = previous + delta
    if delta is None and now is not None and previous is not None:
        delta = now - previous
    ratio = regression.get("median_ratio")
    if ratio is not None:
        percent: float | None = (ratio - 1) * 100
    elif delta is not None and previous:
        percent = delta / previous * 100
    else:
        percent = None
    return previous, now, delta, percent


def regression_table(report: Report) -> Table | None:
    """What changed since the model's previous version, per engine and shape; None with nothing to compare."""
    previous_model = report.get("previous")
    rows = [row for row in report.get("rows") or [] if row.get("regression")]
    if not previous_model or not rows:
        return None
    table = FittedTable(
        title=f"{model_title(report)} vs version {previous_model.get('version', '?')}",
        title_style="bold",
        optional=("size Δ", "qps Δ", "cosine Δ", "p99 Δ ms"),
    )
    table.add_column("target", no_wrap=True)
    table.add_column("variant")
    table.add_column("shape")
    for name in ("p50 ms", "Δ ms", "Δ %", "p99 Δ ms", "qps Δ", "size Δ", "cosine Δ"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        regression = row["regression"]
        previous, now, delta, percent = _median_change(row)
        style = ""
        if delta is not None and delta < 0:
            style = "green"
        elif percent is not None and percent > SLOWER_TOLERANCE * 100:
            style = "red"
        table.add_row(
            str(row.get("target") or DASH),
            _variant_cell(row),
            shape_label(row),
            f"{fmt_ms(previous)} → {fmt_ms(now)}",
            Text(fmt_ms(delta, signed=True), style=style),
            Text(DASH if percent is None else f"{percent:+.1f} %", style=style),
            fmt_ms(regression.get("p99_ms_delta"), signed=True),
            fmt_qps(regression.get("throughput_delta"), signed=True),
            human_bytes(regression.get("size_delta"), signed=True),
            fmt_small(regression.get("cosine_delta"), signed=True),
        )
    return table


# ------------------------------------------------------------------------------ chart


def _plotted_groups(rows: Sequence[Row]) -> list[tuple[str, list[Row]]]:
    """Measured rows grouped for the x axis: one group per target and engine, so every variant is drawn (the web
    report draws them all too). A target with several variants labels each one; the sweep's chosen variant, the
    engine clients fetch, carries the star."""
    by_target: dict[str, dict[Any, list[Row]]] = {}
    for row in rows:
        if row.get("status") == "measured" and _stat(row, "median") is not None:
            engines = by_target.setdefault(str(row.get("target") or DASH), {})
            engines.setdefault(row.get("engine_id", row.get("spec_hash")), []).append(row)
    groups: list[tuple[str, list[Row]]] = []
    for target, engines in by_target.items():
        for engine_rows in engines.values():
            first = engine_rows[0]
            label = target
            if len(engines) > 1:
                variant = (
                    first.get("variant") or str(first.get("spec_hash") or "")[:8] or f"engine {first.get('engine_id')}"
                )
                label = f"{target} · {variant}"
            if first.get("best") is True:
                label += f" {BEST_MARK}"
            groups.append((label, engine_rows))
    return groups


def _nothing_measured(report: Report) -> ValueError:
    rows = report.get("rows") or []
    if not rows:
        return ValueError(f"nothing measured yet: {model_title(report)} has no engines to report on")
    counts = Counter(str(row.get("status")) for row in rows)
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    details = sorted({str(row["detail"]) for row in rows if row.get("detail")})
    why = f" ({'; '.join(details[:3])})" if details else ""
    return ValueError(f"nothing measured yet: {model_title(report)} has {len(rows)} rows, {summary}{why}")


def _shape_order(groups: Sequence[tuple[str, list[Row]]]) -> list[str]:
    """Legend order: by batch size where known, then in order of appearance."""
    first_seen: dict[str, tuple[float, int]] = {}
    for _, rows in groups:
        for row in rows:
            label = shape_label(row)
            if label not in first_seen:
                batch = row.get("batch")
                first_seen[label] = (math.inf if batch is None else float(batch), len(first_seen))
    return sorted(first_seen, key=first_seen.__getitem__)


def plot_report(report: Report, path: Path, *, dpi: int = 120) -> Path:
    """Grouped bars of median latency per target and shape, with whiskers up to p99, written as PNG.

    Uses the object-oriented Agg API rather than pyplot, so it needs no display and leaves no global
    figure state behind in a long-running process. The file is written as every file of the client is
    (``safepaths.atomic_write``): a reader never sees half a PNG and a failure leaves no partial file.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    groups = _plotted_groups(report.get("rows") or [])
    if not groups:
        raise _nothing_measured(report)
    shapes = _shape_order(groups)

    width_in = min(max(6.4, 1.5 + 1.4 * len(groups) * max(1.0, len(shapes) / 3)), 30.0)
    fig = Figure(figsize=(width_in, 4.8), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    bar_width = 0.8 / len(shapes)
    values: list[float] = []
    for i, shape in enumerate(shapes):
        xs, heights, upper = [], [], []
        for x, (_, rows) in enumerate(groups):
            row = next((r for r in rows if shape_label(r) == shape), None)
            if row is None:
                continue
            median = _stat(row, "median")
            assert median is not None  # a measured row has its median
            p99 = _stat(row, "p99")
            xs.append(x - 0.4 + bar_width * (i + 0.5))
            heights.append(median)
            upper.append(max(float(p99) - median, 0.0) if p99 is not None else 0.0)
            values.extend(v for v in (median, p99) if v is not None)
        ax.bar(
            xs,
            heights,
            bar_width * 0.9,
            yerr=[[0.0] * len(xs), upper],
            capsize=3,
            label=shape,
            error_kw={"elinewidth": 1, "ecolor": "0.2"},
        )

    labels = []
    for label, rows in groups:
        devices = {row.get("device") for row in rows if row.get("device")}
        labels.append(f"{label}\n{devices.pop()}" if len(devices) == 1 else label)
    ax.set_xticks(
        range(len(groups)),
        labels,
        rotation=20 if len(groups) > 4 else 0,
        ha="right" if len(groups) > 4 else "center",
        fontsize="small",
    )
    ax.set_xlim(-0.6, len(groups) - 0.4)
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > LOG_SPAN:
        ax.set_yscale("log")
    ax.set_ylabel("latency (ms), bars p50, whiskers p99")
    ax.set_title(f"{model_title(report)}: latency by target and batch size")
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    ax.legend(title="shape", fontsize="small")

    with atomic_write(path, None, prefix=f".tmp-{path.name}.") as out:
        fig.savefig(cast("IO[bytes]", out), format="png", dpi=dpi)  # a binary file, though typed RawIOBase
    return path

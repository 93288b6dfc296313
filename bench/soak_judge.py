"""The soak's verdicts on its samples: a least-squares slope per series after a warm-up, judged against the series'
own mean level (a resource that would double within the horizon fails), the summary table, the plots and the JSON
report."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

DAY, HOUR = 86400.0, 3600.0
# The smallest level a slope is judged against: a series that sits at 0 (an empty queue) and gains one is no leak.
FLOOR = {
    "rss_mb": 50.0,
    "fds": 32.0,
    "threads": 16.0,
    "db_fds": 10.0,
    "db_connections": 20.0,
    "queue": 10.0,
    "disk_mb": 1.0,
}


@dataclass
class Verdict:
    series: str  # KIND|WHO (a process's longest lifetime, its pid last)
    points: int
    first: float
    last: float
    mean: float
    slope_h: float  # per hour, after the warm-up
    per_day: float  # slope x one day
    ratio: float  # per_day / max(mean, floor)
    verdict: str  # ok, FAIL, report (grows by design), short (too few points)
    why: str = ""


def series_of(samples: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """name -> [(t, value)]; a queue missing from a sample is empty (Redis keeps no empty list)."""
    out: dict[str, list[tuple[float, float]]] = {}
    queues: set[str] = set()
    for s in samples:
        for name, v in s["series"].items():
            out.setdefault(name, []).append((s["t"], float(v)))
            if name.startswith("queue|"):
                queues.add(name)
        for q in queues - s["series"].keys():
            out[q].append((s["t"], 0.0))
    return out


def fit(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (per second)."""
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return 0.0 if var == 0 else sum((t - mt) * (v - mv) for t, v in points) / var


def longest(series: dict[str, list[tuple[float, float]]]) -> dict[str, str]:
    """KIND|ROLE -> the name of its longest-lived series (a restarted process starts a new one)."""
    best: dict[str, str] = {}
    for name, pts in series.items():
        group = name.split("#")[0]
        span = pts[-1][0] - pts[0][0]
        if group not in best or span > series[best[group]][-1][0] - series[best[group]][0][0]:
            best[group] = name
    return best


def halved(points: list[tuple[float, float]]) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """The points of the first and of the second half of their time span."""
    middle = (points[0][0] + points[-1][0]) / 2
    return [p for p in points if p[0] < middle], [p for p in points if p[0] >= middle]


def calm(pts: list[tuple[float, float]], events: list[float]) -> list[tuple[float, float]]:
    """A farm-wide series' longest stretch between two process restarts (``events``): each restart drops and
    rebuilds what the process held, a step no slope should be fitted across."""
    cuts = [pts[0][0], *sorted(e for e in events if pts[0][0] < e < pts[-1][0]), pts[-1][0] + 1]
    a, b = max(zip(cuts, cuts[1:]), key=lambda ab: ab[1] - ab[0])
    return [p for p in pts if a <= p[0] < b]


def judge(
    samples: list[dict],
    warmup_s: float,
    horizon: float,
    by_design: dict[str, str],
    events: list[float] = (),
    min_points: int = 6,
    gross: bool = False,
    min_span_s: float = 0.0,
) -> list[Verdict]:
    """One verdict per KIND|ROLE. ``by_design``: a substring of a series' name -> why it grows by design (reported,
    not failed). FAIL when slope x ``horizon`` exceeds the mean level after the warm-up, and the slope of each half
    of that stretch exceeds half of it (a leak rises in both; a pool or cache filling towards its bound, or a
    single step, rises in one) (the first ``warmup_s`` of a
    process's life; of a farm-wide series, of its longest stretch between restarts, at most a third of it).
    ``gross`` (a run of minutes): also only when the fitted rise over the judged points exceeds the kind's floor
    (a step of one thread or connection as a pool warms is no leak; one per reconciler pass is hundreds).
    ``min_span_s``: a stretch shorter than this after the warm-up is too short to judge a daily slope by (a process
    killed soon after its warm-up, whose first large build was still filling it)."""
    series = series_of(samples)
    out = []
    for name in sorted(longest(series).values()):
        pts = series[name]
        kind = name.split("|")[0]
        if "#" not in name and kind != "disk_mb":  # bytes on disk outlive the processes that wrote them
            pts = calm(pts, list(events))
        start = pts[0][0] + (warmup_s if "#" in name else min(warmup_s, (pts[-1][0] - pts[0][0]) / 3))
        kept = [p for p in pts if p[0] >= start]
        mean = sum(v for _, v in kept) / len(kept) if kept else float("nan")
        slope = fit(kept) if len(kept) >= 2 else 0.0
        level = max(mean, FLOOR.get(kind, 1.0))
        ratio = slope * DAY / level if kept else 0.0
        reason = next((why for key, why in by_design.items() if key in name), "")
        span = kept[-1][0] - kept[0][0] if kept else 0.0
        if len(kept) < min_points:
            verdict, why = "short", f"{len(kept)} points after the warm-up"
        elif span < min_span_s:
            verdict, why = "short", f"{span / 60:.1f} min after the warm-up, under {min_span_s / 60:.0f} min"
        elif reason:
            verdict, why = "report", reason
        elif slope * horizon > level and (not gross or slope * (kept[-1][0] - kept[0][0]) > FLOOR.get(kind, 1.0)):
            halves = [fit(h) if len(h) >= 2 else slope for h in halved(kept)]
            # Against half the bar: a leak just past it still fails when one half's noisier slope falls short.
            if all(h * horizon > level / 2 for h in halves):
                verdict, why = "FAIL", f"would double within {horizon / HOUR:.0f} h"
            else:  # a leak rises in every stretch of a life; a pool or a cache filling, or one step, does not
                verdict = "ok"
                why = "rises in one half only ({:+.2f}/h, then {:+.2f}/h): a step or a fill, not a steady leak".format(
                    *(h * HOUR for h in halves)
                )
        else:
            verdict, why = "ok", ""
        out.append(
            Verdict(name, len(kept), pts[0][1], pts[-1][1], mean, slope * HOUR, slope * DAY, ratio, verdict, why)
        )
    out += across_lives(series, horizon, by_design)
    return out


def across_lives(
    series: dict[str, list[tuple[float, float]]], horizon: float, by_design: dict[str, str], min_lives: int = 3
) -> list[Verdict]:
    """A process killed and started again many times is judged across its lives as well: each life's level (the mean
    of its second half, once it has warmed) against when it lived. A leak that each life starts from afresh does not
    show here; one that outlives the process (on disk, in a cache it reloads) rises from life to life, even where no
    single life is long enough to be judged alone. FAIL when the rise would double the level within ``horizon``."""
    lives: dict[str, list[tuple[float, float]]] = {}
    for name, pts in series.items():
        if "#" in name and len(pts) >= 4:
            second = halved(pts)[1]
            lives.setdefault(name.split("#")[0], []).append((pts[0][0], sum(v for _, v in second) / len(second)))
    out = []
    for group, levels in sorted(lives.items()):
        if len(levels) < min_lives:
            continue
        levels.sort()
        kind = group.split("|")[0]
        mean = sum(v for _, v in levels) / len(levels)
        level = max(mean, FLOOR.get(kind, 1.0))
        slope = fit(levels)
        reason = next((why for key, why in by_design.items() if key in group), "")
        if reason:
            verdict, why = "report", reason
        elif slope * horizon > level:
            verdict, why = "FAIL", f"rises from life to life: would double within {horizon / HOUR:.0f} h"
        else:
            verdict, why = "ok", "life to life"
        name = f"{group} ({len(levels)} lives)"
        first, last = levels[0][1], levels[-1][1]
        out.append(
            Verdict(name, len(levels), first, last, mean, slope * HOUR, slope * DAY, slope * DAY / level, verdict, why)
        )
    return out


def table(verdicts: list[Verdict]) -> str:
    head = f"{'series':52} {'n':>4} {'first':>9} {'last':>9} {'mean':>9} {'slope/h':>9} {'Δ/day':>10} {'ratio':>6}"
    head += "  verdict"
    lines = [head, "-" * len(head)]
    for v in verdicts:
        lines.append(
            f"{v.series[:52]:52} {v.points:4d} {v.first:9.1f} {v.last:9.1f} {v.mean:9.1f} {v.slope_h:9.2f} "
            f"{v.per_day:10.1f} {v.ratio:6.2f}  {v.verdict}{' (' + v.why + ')' if v.why else ''}"
        )
    return "\n".join(lines)


def worst_ratio(verdicts: list[Verdict]) -> float:
    # Not those that rise in one half only: their whole-window ratio is not what they were judged by.
    judged = [v.ratio for v in verdicts if v.verdict in ("ok", "FAIL") and not v.why and not math.isnan(v.ratio)]
    return max(judged, default=0.0)


def plot(samples: list[dict], out: Path, title: str) -> list[Path]:
    """One PNG per resource kind, a line per series, time in minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = series_of(samples)
    kinds = sorted({n.split("|")[0] for n in series})
    written = []
    for kind in kinds:
        fig, ax = plt.subplots(figsize=(10, 5))
        for name, pts in sorted(series.items()):
            if name.split("|")[0] == kind:
                ax.plot([t / 60 for t, _ in pts], [v for _, v in pts], label=name.split("|", 1)[1], linewidth=1)
        ax.set_xlabel("minutes")
        ax.set_ylabel(kind)
        ax.set_title(f"{title}: {kind}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        path = out / f"{kind}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def write_report(out: Path, samples: list[dict], verdicts: list[Verdict], extra: dict) -> Path:
    path = out / "soak.json"
    path.write_text(json.dumps({**extra, "verdicts": [asdict(v) for v in verdicts], "samples": samples}, indent=1))
    return path

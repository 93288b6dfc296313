"""What deploy machines measured of a model's engines, in text, from a model report's rows (their ``fleet``: per
device class, the median over machines). ``enginefarm report`` prints it after its tables, beside the farm's own
figures and never mixed with them; a report without fleet figures prints nothing more."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.table import Table

from enginefarm.client.report import fmt_ms

Report = Mapping[str, Any]


def fleet_table(report: Report) -> Table | None:
    """One line per engine and device class the fleet measured it on; None where it measured nothing."""
    seen: set[int] = set()
    lines = []
    for row in report.get("rows") or []:
        if row["engine_id"] in seen or not row.get("fleet"):
            continue
        seen.add(row["engine_id"])
        for f in row["fleet"]:
            shapes = ", ".join(f"{n}:{'x'.join(map(str, d))}" for n, d in (f.get("shapes") or {}).items())
            flagged = f"{len(f['flagged'])} left out" if f.get("flagged") else ""
            lines.append(
                (str(row["engine_id"]), row["target"], row["precision"], f["label"], shapes, f["median_ms"], flagged)
            )
    if not lines:
        return None
    table = Table(title="measured by the fleet (enginefarm measure), median over machines", title_style="bold")
    for name in ("engine", "target", "prec", "measured on", "shape"):
        table.add_column(name)
    table.add_column("p50 ms", justify="right", no_wrap=True)
    table.add_column("outliers")
    for engine, target, precision, label, shapes, ms, flagged in lines:
        table.add_row(engine, target, precision, label, shapes, fmt_ms(ms), flagged)
    return table

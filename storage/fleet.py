"""The fleet's measurements in the catalog: figures deploy machines posted of an engine (DeviceMeasurementRow),
each the project's whose token posted it. Summing them per device class is the kernel's (enginefarm.core.fleet)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from enginefarm.core.fleet import DeviceFigure, class_figures
from enginefarm.core.shapes import shapes_key
from storage.tables import DeviceMeasurementRow, EngineRow


def add_measurement(
    session: Session, engine: EngineRow, project: str, token_id: int | None, **fields: Any
) -> DeviceMeasurementRow:
    """Record one posted measurement (the generation of the engine's model bytes moves with it:
    storage.generation)."""
    row = DeviceMeasurementRow(engine=engine, engine_id=engine.id, project=project, token_id=token_id, **fields)
    session.add(row)
    session.flush()
    return row


def posts_since(session: Session, token_id: int, since: datetime) -> int:
    """How many measurements this token posted since ``since`` (its rate limit)."""
    return (
        session.scalar(
            select(func.count())
            .select_from(DeviceMeasurementRow)
            .where(DeviceMeasurementRow.token_id == token_id, DeviceMeasurementRow.created_at >= since)
        )
        or 0
    )


def measurements_of(session: Session, engine_id: int, project: str) -> list[DeviceMeasurementRow]:
    """The project's fleet measurements of one engine, oldest first."""
    return list(
        session.scalars(
            select(DeviceMeasurementRow)
            .where(DeviceMeasurementRow.engine_id == engine_id, DeviceMeasurementRow.project == project)
            .order_by(DeviceMeasurementRow.id)
        )
    )


def figure_of(row: DeviceMeasurementRow) -> DeviceFigure:
    return DeviceFigure(
        row.machine_id, row.gpu_name, row.compute_capability, row.cpu_name, shapes_key(row.shapes), row.median_ms
    )


def flagged_ids(rows: list[DeviceMeasurementRow]) -> set[int]:
    """The rows left out of their class's median as outliers (``enginefarm.core.fleet``): of each machine's latest
    figure, those flagged in any class it stands for."""
    latest = {r.machine_id: r for r in rows}
    figures = class_figures([figure_of(r) for r in latest.values()])
    machines = {m for f in figures.values() for m in f.flagged}
    return {r.id for r in latest.values() if r.machine_id in machines}


_FIGURES = (
    DeviceMeasurementRow.engine_id,
    DeviceMeasurementRow.machine_id,
    DeviceMeasurementRow.gpu_name,
    DeviceMeasurementRow.compute_capability,
    DeviceMeasurementRow.cpu_name,
    DeviceMeasurementRow.shapes,
    DeviceMeasurementRow.median_ms,
)


def figures_of(session: Session, engine_ids: list[int], project: str) -> dict[int, list[DeviceFigure]]:
    """Each engine's fleet figures posted for ``project``: each machine's latest only, so what resolution reads
    grows with the machines that measured, not with how often they posted."""
    if not engine_ids:
        return {}
    out: dict[int, list[DeviceFigure]] = {}
    latest = (
        select(func.max(DeviceMeasurementRow.id))
        .where(DeviceMeasurementRow.engine_id.in_(engine_ids), DeviceMeasurementRow.project == project)
        .group_by(DeviceMeasurementRow.engine_id, DeviceMeasurementRow.machine_id)
    )
    rows = session.execute(
        select(*_FIGURES).where(DeviceMeasurementRow.id.in_(latest)).order_by(DeviceMeasurementRow.id)
    )
    for engine_id, machine_id, gpu, cc, cpu, shapes, ms in rows:
        out.setdefault(engine_id, []).append(DeviceFigure(machine_id, gpu, cc, cpu, shapes_key(shapes), ms))
    return out


def flagged_machines(session: Session, engine_id: int, project: str) -> set[str]:
    """The machines whose latest figure of this engine is left out of its class's median as an outlier."""
    figures = class_figures(figures_of(session, [engine_id], project).get(engine_id, []))
    return {m for f in figures.values() for m in f.flagged}

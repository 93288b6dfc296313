"""Engines as a project sees them: the listing, one engine, its measurements, its int8 stage or fp16 repair. The
routes (api/routes/engines.py) and the dashboard's engine page both call these; the bytes are served by
``api.http.downloads.engine_content``."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from api.schemas import EngineOut
from api.schemas.int8 import PrecisionStage, engine_int8
from api.services.checkstates import engine_checks
from enginefarm.core.config import Settings
from enginefarm.core.errors import NotFound
from storage import builtengines, quantizing
from storage import checks as project_checks
from storage.tables import EngineRow, ModelRow


def answers(session: Session, settings: Settings, rows: list[tuple[EngineRow, ModelRow]]) -> list[EngineOut]:
    """Each engine as the project of the model it is seen through sees it: that project's checks and verdict."""
    by_project: dict[str, list[EngineRow]] = {}
    for e, m in rows:
        by_project.setdefault(m.project, []).append(e)
    views = {p: project_checks.project_view(session, es, p) for p, es in by_project.items()}
    checks = {p: engine_checks(session, settings, es, views[p]) for p, es in by_project.items()}
    return [EngineOut.of(e, m, checks[m.project][e.id], verdict=views[m.project].verdict(e)) for e, m in rows]


def engine(session: Session, settings: Settings, engine_id: int, project: str | None) -> EngineOut:
    """One engine of the project (404 for another project's or none)."""
    return answers(session, settings, [builtengines.engine_in_project(session, engine_id, project)])[0]


def benchmarks(session: Session, engine_id: int, project: str | None) -> list[dict[str, Any]]:
    """Every measurement of the engine its project made: per shape and device, all statistics and the machine
    fingerprint."""
    row, model = builtengines.engine_in_project(session, engine_id, project)
    return [
        {
            "id": b.id,
            "shape_key": b.shape_key,
            "shapes": b.shapes,
            "gpu_name": b.gpu_name,
            "cpu_name": b.cpu_name,
            "compute_capability": b.compute_capability,
            "median_ms": b.median_ms,
            "p99_ms": b.p99_ms,
            "throughput_qps": b.throughput_qps,
            "stats": b.stats,
            "machine": b.machine,
            "created_at": b.created_at.isoformat(),
        }
        for b in row.benchmarks
        if b.project == model.project
    ]


def stage_of(session: Session, row: EngineRow, model: ModelRow) -> PrecisionStage | None:
    """The engine's int8 stage, or its build's fp16 repair, as its model's project sees it (that project's
    benchmarks), or None."""
    build = quantizing.quantizing_builds(session, [row.id], model.project).get(row.id)
    return engine_int8(row, build, [b for b in row.benchmarks if b.project == model.project])


def precision_stage(
    session: Session, engine_id: int, project: str | None, precision: str, lacks: str
) -> PrecisionStage:
    """The int8 stage or fp16 repair (``precision``) of an engine of the project: a 404 that says it has no
    ``lacks`` where the engine is of another precision or has none."""
    row, model = builtengines.engine_in_project(session, engine_id, project)
    found = stage_of(session, row, model) if row.precision == precision else None
    if found is None:
        raise NotFound(f"engine {row.id} ({row.target}, {row.precision}) has no {lacks}")
    return found

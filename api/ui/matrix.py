"""The build matrix of a model: its versions × the targets they were built for, one cell per pair, assembled from
the same catalog reads the API's build and report routes use (``catalog.list_builds``, ``reports.engine_checks``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from enginefarm.api import reports, services
from enginefarm.config import Settings
from enginefarm.storage import catalog, checks as project_checks
from enginefarm.storage import liveness
from enginefarm.storage.db import as_utc
from enginefarm.storage.tables import BuildTaskRow, ModelRow

MAX_VERSIONS = 8
LIVE = {"queued", "running", "waiting"}


@dataclass
class Cell:
    """One version on one target: its newest build task, and the engine's numbers once it has them."""

    state: str  # the task's: queued, waiting, running, succeeded, failed, cancelled
    build_id: int
    task_id: int
    started_at: datetime | None = None
    detail: str | None = None  # why it waits, or why it failed
    engine_id: int | None = None
    p50_ms: float | None = None
    accuracy: str | None = None  # pass, fail, or None while unchecked
    check: str | None = None  # the benchmark and accuracy check: none, pending, running, succeeded, failed
    check_detail: str | None = None
    checking: bool = False  # a live worker will finish the check

    @property
    def verdict(self) -> str:
        """What the cell's colour stands for, in a word (the page shows it as text too)."""
        if self.state != "succeeded":
            return self.state
        if self.accuracy == "fail" or self.check == "failed":
            return "check-failed"
        return "succeeded"


@dataclass
class Matrix:
    versions: list[ModelRow]
    targets: list[str]
    cells: dict[tuple[int, str], Cell] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Something in it is still changing: worth polling."""
        return any(c.state in LIVE or c.checking for c in self.cells.values())

    def cell(self, version_id: int, target: str) -> Cell | None:
        return self.cells.get((version_id, target))


def _cell(task: BuildTaskRow, served: dict[str, set[str]]) -> Cell:
    detail = task.error if task.state == "failed" else services.wait_reason(task.target, task.state, served)
    return Cell(state=task.state, build_id=task.build_id, task_id=task.id, started_at=as_utc(task.started_at),
                detail=detail, engine_id=task.engine_id)


def model_matrix(session: Session, settings: Settings, model: ModelRow, project: str | None) -> Matrix:
    """The matrix of ``model``'s name: its newest versions (MAX_VERSIONS), each version's newest task per target."""
    versions = catalog.find_models(session, model.name, project=model.project)[:MAX_VERSIONS]
    served = liveness.served_targets(session, settings.worker_ttl_seconds)
    matrix = Matrix(versions=versions, targets=[])
    targets: set[str] = set()
    for version in versions:
        for build in catalog.list_builds(session, model_id=version.id, limit=200, project=project):  # newest first
            for task in build.tasks:
                targets.add(task.target)
                matrix.cells.setdefault((version.id, task.target), _cell(task, served))
    matrix.targets = sorted(targets)
    engines = catalog.engines_by_id(session, [c.engine_id for c in matrix.cells.values() if c.engine_id])
    view = project_checks.project_view(session, list(engines.values()), model.project)
    checks = reports.engine_checks(session, settings, list(engines.values()), view)
    for cell in matrix.cells.values():
        engine = engines.get(cell.engine_id) if cell.engine_id else None
        if engine is None:
            continue
        head = reports.headline(engine, view)
        cell.p50_ms = head.median_ms if head is not None else None
        passed = view.accuracy_pass(engine)
        cell.accuracy = None if passed is None else ("pass" if passed else "fail")
        check = checks[engine.id]
        cell.check, cell.check_detail, cell.checking = check["state"], check["detail"], check["in_progress"]
    return matrix

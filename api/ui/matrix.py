"""The build matrix of a model: its versions × the targets they were built for, one column per target and precision
(and build spec, where one version has several of a target and precision), assembled from the same catalog reads
the API's build and report routes use (``catalog.list_builds``, ``checkstates.engine_checks``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session

from api.services import builds as services
from api.services import checkstates, fleet, reports
from enginefarm.core.config import Settings
from enginefarm.core.domain import ModelInfo
from enginefarm.core.validation import target_precision
from storage import builtengines, catalog, liveness
from storage import checks as project_checks
from storage.db import as_utc
from storage.tables import BuildRow, BuildTaskRow, ModelRow

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
    fleet: str | None = None  # what deploy machines measured of its engine, on the nearest class they report

    @property
    def verdict(self) -> str:
        """What the cell's colour stands for, in a word (the page shows it as text too)."""
        if self.state != "succeeded":
            return self.state
        if self.accuracy == "fail" or self.check == "failed":
            return "check-failed"
        if self.check in ("pending", "running") or self.checking:
            return "built"  # not measured nor checked yet: not the green of a measured and checked engine
        return "succeeded"


@dataclass(frozen=True, order=True)
class Column:
    """A target in one precision; ``spec`` (a build's spec hash) only where a version has several builds of them."""

    target: str
    precision: str
    spec: str = ""
    label: str = ""  # the spec's variant name or short hash, shown under the precision


@dataclass
class Matrix:
    versions: list[ModelRow]
    columns: list[Column]
    cells: dict[tuple[int, Column], Cell] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        """Something in it is still changing: worth polling."""
        return any(c.state in LIVE or c.checking for c in self.cells.values())

    def cell(self, version_id: int, column: Column) -> Cell | None:
        return self.cells.get((version_id, column))

    def state(self) -> bytes:
        """What the page shows of it, as bytes whose tag (``buildwait.tag_of``) moves with any change: the page's
        long poll holds that tag. A running cell's clock is not in it (the page counts it)."""
        versions = [(v.id, v.version) for v in self.versions]
        return repr((versions, self.columns, sorted(self.cells.items()))).encode()


def _precisions(build: BuildRow) -> dict[int, str]:
    """Per task, the precision its target builds for the build's spec (a CPU builds fp32 for an fp16 spec)."""
    spec = build.spec or {}
    try:
        parsed, info = build.build_spec, ModelInfo.from_dict(build.model.info)
        return {t.id: target_precision(parsed, t.parsed_target, info)[0].value for t in build.tasks}
    except (ValueError, TypeError, KeyError):  # a spec older rules no longer read: its own word
        return {t.id: str(spec.get("precision") or "fp32") for t in build.tasks}


def _cell(task: BuildTaskRow, served: dict[str, set[str]]) -> Cell:
    detail = task.error if task.state == "failed" else services.task_wait_reason(task, served)
    return Cell(
        state=task.state,
        build_id=task.build_id,
        task_id=task.id,
        started_at=as_utc(task.started_at),
        detail=detail,
        engine_id=task.engine_id,
    )


def model_matrix(session: Session, settings: Settings, model: ModelRow, project: str | None) -> Matrix:
    """The matrix of ``model``'s name: its newest versions (MAX_VERSIONS), each version's newest task per target."""
    versions = catalog.find_models(session, model.name, project=model.project)[:MAX_VERSIONS]
    served = liveness.served_targets(session, settings.worker_ttl_seconds)
    matrix = Matrix(versions=versions, columns=[])
    # (version, target, precision) -> spec hash -> newest task of that spec, and each spec's label.
    found: dict[tuple[int, str, str], dict[str, BuildTaskRow]] = {}
    labels: dict[str, str] = {}
    for version in versions:
        for build in catalog.list_builds(session, model_id=version.id, limit=200, project=project):  # newest first
            precisions = _precisions(build)
            labels.setdefault(build.spec_hash, build.variant or build.spec_hash[:8])
            for task in build.tasks:
                specs = found.setdefault((version.id, task.target, precisions[task.id]), {})
                specs.setdefault(build.spec_hash, task)
    # A target and precision splits by spec only where some version was built more than one way.
    split = {(target, precision) for (_, target, precision), specs in found.items() if len(specs) > 1}
    for (version_id, target, precision), specs in found.items():
        for spec_hash, task in specs.items():
            column = (
                Column(target, precision, spec_hash, labels[spec_hash])
                if (target, precision) in split
                else Column(target, precision)
            )
            if (version_id, column) not in matrix.cells or task.id > matrix.cells[(version_id, column)].task_id:
                matrix.cells[(version_id, column)] = _cell(task, served)
    matrix.columns = sorted({column for _, column in matrix.cells})
    engines = builtengines.engines_by_id(session, [c.engine_id for c in matrix.cells.values() if c.engine_id])
    view = project_checks.project_view(session, list(engines.values()), model.project)
    checks = checkstates.engine_checks(session, settings, list(engines.values()), view)
    by_fleet = fleet.by_engine(session, list(engines), model.project)
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
        if figures := by_fleet.get(engine.id):  # the GPU model's class before the compute capability's
            f = min(figures, key=lambda f: (not f.device_class.startswith("fleet:gpu:"), f.device_class))
            cell.fleet = f"fleet p50 {f.median_ms:.3g} ms on {f.label}"
    return matrix

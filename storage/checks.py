"""A project's checks of an engine: the benchmark tasks, what they measured and the verdicts they reached.

An engine is shared by every project that uploads its model's bytes; what is checked about it is not. A check
runs with one project's settings and samples, and its benchmarks and accuracy verdict are stored under that
project. Every read here takes the project whose view it builds, so one project's check can never change what
another project is handed, gated on or shown (docs/architecture.md, "What projects share").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError as SAIntegrityError
from sqlalchemy.orm import Session

from enginefarm.core.domain import TaskState
from enginefarm.core.spec import BuildSpec
from storage.generation import bump
from storage.rows import claim_row, get_row
from storage.tables import BenchmarkRow, BenchmarkTaskRow, EngineRow, VerdictRow, utcnow


def ensure_benchmark_task(
    session: Session, engine: EngineRow, spec: BuildSpec, project: str
) -> BenchmarkTaskRow | None:
    """Queue the benchmark and accuracy check of this engine with these settings for this project, once; returns
    the new task (to publish after the commit), or None when it exists already or the spec turns both off.

    A check belongs to the project whose build asked for it (its samples, its settings, its verdict): two
    projects sharing an engine through identical bytes each get their own, even with identical settings."""
    if not (spec.benchmark.enabled or spec.accuracy.enabled):
        return None
    checks = spec.checks_hash()
    found = session.scalars(
        select(BenchmarkTaskRow).where(
            BenchmarkTaskRow.engine_id == engine.id,
            BenchmarkTaskRow.checks_hash == checks,
            BenchmarkTaskRow.project == project,
        )
    ).first()
    if found is not None:
        gate = spec.stored()["gate"]
        if found.spec.get("gate") != gate:  # the project's latest word on its evidence applies from now on
            found.spec = {**found.spec, "gate": gate}
        return None
    task = BenchmarkTaskRow(
        engine_id=engine.id,
        target=engine.target,
        checks_hash=checks,
        spec=spec.stored(),
        state=TaskState.QUEUED.value,
        project=project,
    )
    try:
        with session.begin_nested():
            session.add(task)
    except SAIntegrityError:  # another build queued the same check at the same moment
        return None
    return task


def get_benchmark_task(session: Session, task_id: int) -> BenchmarkTaskRow:
    return get_row(session, BenchmarkTaskRow, task_id, "benchmark task")


def claim_benchmark(session: Session, task_id: int, worker_id: str, max_deliveries: int | None = None) -> bool:
    return claim_row(session, BenchmarkTaskRow, task_id, worker_id, max_deliveries)


def end_benchmark(session: Session, task_id: int, state: TaskState, error: str | None = None) -> None:
    values: dict[str, Any] = {"state": state.value, "error": error}
    if state is TaskState.QUEUED:  # back to the queue after an infrastructure error
        values.update(worker_id=None, started_at=None)
    else:
        values["finished_at"] = utcnow()
    session.execute(update(BenchmarkTaskRow).where(BenchmarkTaskRow.id == task_id).values(**values))


def record_benchmark(
    session: Session,
    engine_id: int,
    *,
    project: str,
    shape_key: str,
    shapes: dict,
    machine: dict,
    gpu_name: str | None,
    compute_capability: str | None,
    stats: dict,
    cpu_name: str | None = None,
) -> BenchmarkRow:
    """Store one measurement for a project, replacing that project's earlier one of the same engine, shape and
    device."""
    same_device = BenchmarkRow.gpu_name.is_(None) if gpu_name is None else BenchmarkRow.gpu_name == gpu_name
    session.execute(
        delete(BenchmarkRow).where(
            BenchmarkRow.engine_id == engine_id,
            BenchmarkRow.project == project,
            BenchmarkRow.shape_key == shape_key,
            same_device,
        )
    )
    e2e = stats["e2e"]
    row = BenchmarkRow(
        engine_id=engine_id,
        project=project,
        shape_key=shape_key,
        shapes=shapes,
        gpu_name=gpu_name,
        cpu_name=cpu_name if gpu_name is None else None,
        compute_capability=compute_capability,
        machine=machine,
        median_ms=e2e["median"],
        p99_ms=e2e["p99"],
        throughput_qps=stats.get("throughput_qps"),
        stats=stats,
    )
    session.add(row)
    return row


def record_verdict(
    session: Session,
    engine_id: int,
    project: str,
    result: dict,
    *,
    task_id: int | None = None,
    device_memory_bytes: int | None = None,
    run_options: dict[str, str] | None = None,
) -> None:
    """Store a project's accuracy verdict on an engine: its last finished check replaces its earlier one (one
    upsert, so two checks of one project finishing together cannot both insert). The engine's device memory and the
    provider options measured fastest for it are facts of its bytes on a GPU, not verdicts, so they stay on the
    engine."""
    engine = get_row(session, EngineRow, engine_id, "engine")
    if device_memory_bytes is not None:
        engine.device_memory_bytes = device_memory_bytes
    if run_options is not None:
        engine.run_options = run_options
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    values = {
        "accuracy": result,
        "accuracy_pass": result.get("pass"),
        "benchmark_task_id": task_id,
        "checked_at": utcnow(),
    }
    session.execute(
        insert(VerdictRow)
        .values(engine_id=engine_id, project=project, **values)
        .on_conflict_do_update(index_elements=["engine_id", "project"], set_=values)
    )
    # A statement, not a flush: raise the generation of the engine's model bytes by hand (storage.generation).
    bump(session, {engine.model_sha256})


def verdicts_of(session: Session, engine_ids: list[int], project: str) -> dict[int, VerdictRow]:
    """This project's verdicts on these engines, by engine id (an engine it never checked has none)."""
    if not engine_ids:
        return {}
    query = select(VerdictRow).where(VerdictRow.engine_id.in_(sorted(set(engine_ids))), VerdictRow.project == project)
    return {row.engine_id: row for row in session.scalars(query)}


def benchmark_tasks_of(session: Session, engine_ids: list[int], project: str) -> dict[int, list[BenchmarkTaskRow]]:
    """This project's checks of these engines, oldest first, by engine id."""
    return _by_engine(session, BenchmarkTaskRow.engine_id.in_(engine_ids), project) if engine_ids else {}


def benchmark_tasks_of_shas(session: Session, shas: list[str], project: str) -> dict[int, list[BenchmarkTaskRow]]:
    """``benchmark_tasks_of`` the engines of these model bytes, found without reading the engines first."""
    return _by_engine(session, EngineRow.model_sha256.in_(shas), project) if shas else {}


def _by_engine(session: Session, engines: Any, project: str) -> dict[int, list[BenchmarkTaskRow]]:
    query = select(BenchmarkTaskRow).join(EngineRow, EngineRow.id == BenchmarkTaskRow.engine_id)
    by_engine: dict[int, list[BenchmarkTaskRow]] = {}
    for row in session.scalars(query.where(engines, BenchmarkTaskRow.project == project).order_by(BenchmarkTaskRow.id)):
        by_engine.setdefault(row.engine_id, []).append(row)
    return by_engine


class ProjectView:
    """One project's evidence on a set of engines: its verdicts and its benchmarks, nothing another project
    measured. Reports, the release gate and the dashboard read engines through one."""

    def __init__(self, project: str, verdicts: dict[int, VerdictRow]):
        self.project, self.verdicts = project, verdicts

    def benchmarks(self, engine: EngineRow) -> list[BenchmarkRow]:
        return [b for b in engine.benchmarks if b.project == self.project]

    def verdict(self, engine: EngineRow) -> VerdictRow | None:
        return self.verdicts.get(engine.id)

    def accuracy(self, engine: EngineRow) -> dict | None:
        v = self.verdicts.get(engine.id)
        return v.accuracy if v is not None else None

    def accuracy_pass(self, engine: EngineRow) -> bool | None:
        v = self.verdicts.get(engine.id)
        return v.accuracy_pass if v is not None else None


def project_view(session: Session, engines: list[EngineRow], project: str) -> ProjectView:
    """The view of ``project`` (a model's own project: what its owner and its readers are shown) on these engines."""
    return ProjectView(project, verdicts_of(session, [e.id for e in engines], project))


def latest_check(session: Session, engine_id: int, project: str) -> BenchmarkTaskRow | None:
    """The project's latest check of the engine: the settings (and gate) a device's check is held to."""
    return session.scalars(
        select(BenchmarkTaskRow)
        .where(BenchmarkTaskRow.engine_id == engine_id, BenchmarkTaskRow.project == project)
        .order_by(BenchmarkTaskRow.id.desc())
        .limit(1)
    ).first()


def verdict_of(session: Session, engine_id: int, project: str) -> VerdictRow | None:
    return verdicts_of(session, [engine_id], project).get(engine_id)

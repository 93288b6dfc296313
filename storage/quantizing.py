"""The int8 quantization stage's state on a build (``BuildRow.quantize``): claimed, updated, failed with its
waiting tasks, or done, when those tasks are pointed at the derived model and queued."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from enginefarm.core.config import Settings
from enginefarm.core.domain import FP16_REPAIR_STAGE, Target, TaskState
from storage.catalog import get_build, reuse_engine
from storage.tables import BenchmarkTaskRow, BuildRow, BuildTaskRow, ModelRow, utcnow


def claim_quantize(session: Session, build_id: int, worker_id: str) -> bool:
    """Take a build's queued quantization stage (row-locked where the database can)."""
    build = session.scalars(select(BuildRow).where(BuildRow.id == build_id).with_for_update()).first()
    if build is None or not build.quantize or build.quantize.get("state") != TaskState.QUEUED.value:
        return False
    build.quantize = {
        **build.quantize,
        "state": TaskState.RUNNING.value,
        "worker_id": worker_id,
        "started_at": utcnow().isoformat(),
        "error": None,
    }
    return True


def set_quantize(session: Session, build_id: int, state: str, **fields: Any) -> None:
    build = get_build(session, build_id)
    build.quantize = {**(build.quantize or {}), "state": state, **fields}


def fail_quantize(session: Session, build_id: int, error: str) -> None:
    """End the quantization stage (or fp16 repair stage) and every task waiting on it with the reason."""
    set_quantize(session, build_id, TaskState.FAILED.value, error=error, finished_at=utcnow().isoformat())
    fp16 = (get_build(session, build_id).quantize or {}).get("kind") == FP16_REPAIR_STAGE
    what = "fp16 accuracy repair failed" if fp16 else "int8 quantization failed"
    session.execute(
        update(BuildTaskRow)
        .where(BuildTaskRow.build_id == build_id, BuildTaskRow.state == TaskState.WAITING.value)
        .values(state=TaskState.FAILED.value, error=f"{what}: {error}", finished_at=utcnow())
    )


def release_waiting(
    session: Session,
    build: BuildRow,
    model: ModelRow,
    backend_versions: dict[str, set[str]],
    model_for: Callable[[BuildTaskRow], ModelRow] | None = None,
) -> tuple[list[tuple[int, Target]], list[BenchmarkTaskRow]]:
    """Point a build whose quantization finished at the derived model and queue its waiting tasks (or
    answer them from the catalog); returns the tasks to publish and the benchmark checks queued. ``model_for``: the
    model each task builds from, where the stage made one per target family (else ``model``)."""
    build.model_id = model.id
    spec = build.build_spec
    queued: list[tuple[int, Target]] = []
    checks: list[BenchmarkTaskRow] = []
    for task in build.tasks:
        if task.state != TaskState.WAITING.value:
            continue
        source = model_for(task) if model_for else model
        if not reuse_engine(session, task, source, spec, build.spec_hash, backend_versions, checks):
            task.state = TaskState.QUEUED.value
            queued.append((task.id, task.parsed_target))
    session.flush()
    return queued, checks


def finish_stage(
    settings: Settings, release: Callable[[Session], tuple[list[tuple[int, Target]], list[BenchmarkTaskRow]]]
) -> list[tuple[int, Target]]:
    """End a quantize or fp16 repair stage: ``release`` (the stage's report recorded, its waiting tasks queued or
    answered from the catalog) in one transaction, then the benchmark checks it queued published; returns the build
    tasks to publish."""
    from storage import queue
    from storage.db import session_scope

    with session_scope(settings) as s:
        queued, checks = release(s)
        published = [(c.id, c.parsed_target) for c in checks]
    for check_id, target in published:
        queue.publish_benchmark(check_id, target)
    return queued


def quantizing_builds(session: Session, engine_ids: list[int], project: str) -> dict[int, BuildRow]:
    """Engine id → the build of ``project`` whose int8 stage made the model the engine was built from: of that
    project's builds with an int8 stage report and a task for the engine, the one that built it (else the newest
    that reused it). Another project's build of the same bytes is not this project's to see."""
    if not engine_ids:
        return {}
    rows = session.execute(
        select(BuildTaskRow.engine_id, BuildTaskRow.reused, BuildRow)
        .join(BuildRow, BuildRow.id == BuildTaskRow.build_id)
        .join(ModelRow, ModelRow.id == BuildRow.model_id)
        .where(BuildTaskRow.engine_id.in_(engine_ids), ModelRow.project == project)
    ).all()
    out: dict[int, BuildRow] = {}
    # Those that reused it first, then those that built it, each oldest first: the last one kept is the answer.
    for engine_id, _, build in sorted(rows, key=lambda r: (not r[1], r[2].id)):
        if engine_id is not None and (build.quantize or {}).get("reports"):
            out[engine_id] = build
    return out

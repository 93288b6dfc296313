"""Which workers are alive, and the tasks that change hands when one is not: heartbeats write a worker's row,
the reconciler requeues the running tasks of a worker whose heartbeats stopped, a late worker takes back what was
not claimed meanwhile, and a stopping worker puts back what it still runs. All in the catalog's tables, in the
caller's transaction."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, cast

from sqlalchemy import CursorResult, Select, case, delete, func, or_, select, update
from sqlalchemy.orm import Session

from enginefarm.core.domain import BACKEND_MODULES, Target, TaskState
from storage.db import as_utc
from storage.queue import Message
from storage.tables import BenchmarkTaskRow, BuildRow, BuildTaskRow, WorkerRow, utcnow

# --------------------------------------------------------------------------- workers


def heartbeat(
    session: Session,
    worker_id: str,
    hostname: str,
    targets: list[str],
    probe: dict,
    bench_targets: list[str] | None = None,
) -> None:
    row = session.get(WorkerRow, worker_id)
    if row is None:
        session.add(
            WorkerRow(id=worker_id, hostname=hostname, targets=targets, probe=probe, bench_targets=bench_targets or [])
        )
    else:
        row.targets, row.probe, row.last_seen = targets, probe, utcnow()
        row.bench_targets = bench_targets or []


def remove_worker(session: Session, worker_id: str) -> None:
    row = session.get(WorkerRow, worker_id)
    if row is not None:
        session.delete(row)


def prune_workers(session: Session, older_than_seconds: float) -> int:
    """Forget workers silent for this long; returns how many. Every process start is a new worker id, so a
    killed worker's row is never removed by its own shutdown. One that was only stalled writes its row again
    at its next heartbeat."""
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=older_than_seconds)
    pruned = cast("CursorResult[Any]", session.execute(delete(WorkerRow).where(WorkerRow.last_seen < cutoff)))
    return pruned.rowcount or 0


def live_workers(session: Session, ttl_seconds: float) -> list[WorkerRow]:
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=ttl_seconds)
    rows = session.scalars(select(WorkerRow).order_by(WorkerRow.id)).all()
    return [r for r in rows if as_utc(r.last_seen) >= cutoff]


def served_targets(session: Session, ttl_seconds: float) -> dict[str, set[str]]:
    """Target → backend versions that live workers build it with."""
    served: dict[str, set[str]] = {}
    for row in live_workers(session, ttl_seconds):
        modules = (row.probe or {}).get("modules", {})
        for target in row.targets:
            module = BACKEND_MODULES[Target.parse(target).backend]
            served.setdefault(target, set())
            if modules.get(module):
                served[target].add(modules[module])
    return served


def served_bench_targets(session: Session, ttl_seconds: float) -> set[str]:
    """Targets whose engines some live worker can run, so benchmark."""
    return {t for row in live_workers(session, ttl_seconds) for t in (row.bench_targets or [])}


# --------------------------------------------------------------------------- tasks changing hands


def requeue_abandoned(session: Session, live_worker_ids: set[str]) -> tuple[list[BuildTaskRow], list[BenchmarkTaskRow]]:
    """Running tasks whose worker stopped sending heartbeats go back to the queue (to be published again)."""
    builds = [t for t in _in_state(session, BuildTaskRow, TaskState.RUNNING) if t.worker_id not in live_worker_ids]
    benches = [t for t in _in_state(session, BenchmarkTaskRow, TaskState.RUNNING) if t.worker_id not in live_worker_ids]
    abandoned: list[BuildTaskRow | BenchmarkTaskRow] = [*builds, *benches]
    for t in abandoned:
        t.error = abandoned_reason(t.worker_id)
        t.state, t.worker_id, t.started_at = TaskState.QUEUED.value, None, None
    return builds, benches


def requeue_abandoned_quantize(
    session: Session, live_worker_ids: set[str], max_attempts: int
) -> tuple[list[tuple[int, dict[str, Any]]], list[int]]:
    """Quantization stages running on a worker whose heartbeats stopped go back to the queue, as build tasks do;
    one whose worker was lost ``max_attempts`` times is failed with the reason, and the build's waiting tasks with it
    (a model whose calibration kills its worker must not loop forever). Returns (build id, the stage as requeued) for
    each stage requeued, and the build ids failed."""
    from storage.quantizing import fail_quantize

    requeued, failed = [], []
    for build in session.scalars(_waiting_builds().with_for_update()):
        stage = build.quantize or {}
        if stage.get("state") != TaskState.RUNNING.value or stage.get("worker_id") in live_worker_ids:
            continue
        attempts = int(stage.get("attempts") or 0) + 1
        if attempts >= max_attempts:
            build.quantize = {**stage, "attempts": attempts}
            fail_quantize(
                session,
                build.id,
                f"gave up after {attempts} attempts: each ended with its worker gone "
                f"(the last, {stage.get('worker_id')}, stopped sending heartbeats)",
            )
            failed.append(build.id)
        else:
            build.quantize = {
                **stage,
                "state": TaskState.QUEUED.value,
                "worker_id": None,
                "started_at": None,
                "error": abandoned_reason(stage.get("worker_id")),
                "attempts": attempts,
            }
            requeued.append((build.id, build.quantize))
    return requeued, failed


def abandoned_reason(worker_id: str | None) -> str:
    return f"requeued: worker {worker_id} stopped sending heartbeats"


def reclaim_tasks(session: Session, worker_id: str, build_ids: list[int], bench_ids: list[int]) -> int:
    """A worker that was only late (starved of CPU, paused) takes back the tasks it is still running that the
    reconciler requeued for its silence, unless another worker claimed them meanwhile. Only tasks requeued
    for this worker's silence: one put back in the queue for a retry must stay there for its new message."""
    taken = 0
    for table, ids in ((BuildTaskRow, build_ids), (BenchmarkTaskRow, bench_ids)):
        if ids:
            taken += cast(
                "CursorResult[Any]",
                session.execute(
                    update(table)
                    .where(
                        table.id.in_(ids),
                        table.state == TaskState.QUEUED.value,
                        table.worker_id.is_(None),
                        table.error == abandoned_reason(worker_id),
                    )
                    .values(state=TaskState.RUNNING.value, worker_id=worker_id, started_at=utcnow(), error=None)
                ),
            ).rowcount
    return taken


def release_tasks(
    session: Session,
    worker_id: str,
    reason: str,
    build_ids: list[int] | None = None,
    bench_ids: list[int] | None = None,
) -> list[Message]:
    """A stopping worker puts back in the queue the tasks still running under its id (only those of ``build_ids``
    and ``bench_ids`` where given), without counting the attempt: the task did not fail, its worker left. Returns
    the message of each, to publish again."""
    released: list[Message] = []
    for message, table, ids in ((Message.build, BuildTaskRow, build_ids), (Message.bench, BenchmarkTaskRow, bench_ids)):
        if ids is not None and not ids:
            continue
        mine = (table.state == TaskState.RUNNING.value) & (table.worker_id == worker_id)
        if ids is not None:
            mine = mine & table.id.in_(ids)
        rows = session.execute(select(table.id, table.target).where(mine).with_for_update()).all()
        if rows:
            session.execute(
                update(table)
                .where(mine, table.id.in_([r.id for r in rows]))
                .values(
                    state=TaskState.QUEUED.value,
                    worker_id=None,
                    started_at=None,
                    error=reason,
                    attempts=case((table.attempts > 0, table.attempts - 1), else_=0),
                )
            )
        released += [message(r.id, Target.parse(r.target)) for r in rows]
    return released


def release_quantize(session: Session, build_id: int, worker_id: str, reason: str) -> dict | None:
    """A stopping worker puts back in the queue the quantization stage it runs; returns the stage (which names its
    queue), None when it is not its own."""
    build = session.scalars(select(BuildRow).where(BuildRow.id == build_id).with_for_update()).first()
    stage = (build.quantize or {}) if build is not None else {}
    if stage.get("state") != TaskState.RUNNING.value or stage.get("worker_id") != worker_id:
        return None
    assert build is not None  # without a build the stage is empty, and returned above
    build.quantize = {**stage, "state": TaskState.QUEUED.value, "worker_id": None, "started_at": None, "error": reason}
    return dict(build.quantize)


def builds_pending(session: Session, worker_id: str, targets: list[str]) -> int:
    """Build tasks this worker is running, plus those queued for one of ``targets``."""
    clauses = [(BuildTaskRow.state == TaskState.RUNNING.value) & (BuildTaskRow.worker_id == worker_id)]
    if targets:
        clauses.append((BuildTaskRow.state == TaskState.QUEUED.value) & BuildTaskRow.target.in_(targets))
    return session.scalar(select(func.count()).select_from(BuildTaskRow).where(or_(*clauses))) or 0


def queued_since(
    session: Session, cutoff: datetime
) -> tuple[list[BuildTaskRow], list[BenchmarkTaskRow], list[BuildRow]]:
    """Build and benchmark tasks queued before ``cutoff``, and builds whose quantization is queued."""
    builds = _in_state(session, BuildTaskRow, TaskState.QUEUED, BuildTaskRow.queued_at < cutoff)
    benches = _in_state(session, BenchmarkTaskRow, TaskState.QUEUED, BenchmarkTaskRow.queued_at < cutoff)
    stages = session.scalars(_waiting_builds().where(BuildRow.created_at < cutoff))
    waiting = [b for b in stages if (b.quantize or {}).get("state") == TaskState.QUEUED.value]
    return builds, benches, waiting


def _in_state(session: Session, table: Any, state: TaskState, *where: Any) -> list[Any]:
    """The build or benchmark tasks in ``state`` (and ``where``)."""
    return list(session.scalars(select(table).where(table.state == state.value, *where)))


def _waiting_builds() -> Select[BuildRow]:
    """The builds with tasks waiting for an earlier stage."""
    waiting = select(BuildTaskRow.build_id).where(BuildTaskRow.state == TaskState.WAITING.value)
    return select(BuildRow).where(BuildRow.id.in_(waiting))

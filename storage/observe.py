"""What the farm's queues and workers look like right now, read from the catalog for /metrics.

The catalog, not the broker, is the record of every task (the broker holds only messages, and the embedded
farm's broker is the database itself), so queue depth and the oldest task's age per target come from the
``queued`` rows, and live workers from the heartbeats.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from enginefarm.core.domain import TaskState
from storage.db import as_utc
from storage.tables import BenchmarkTaskRow, BuildTaskRow, WorkerRow

KINDS: dict[str, type[BuildTaskRow] | type[BenchmarkTaskRow]] = {"build": BuildTaskRow, "benchmark": BenchmarkTaskRow}


@dataclass
class QueueState:
    waiting: dict[tuple[str, str], tuple[int, float]]  # (kind, target) -> queued tasks, age of the oldest (s)
    by_state: dict[tuple[str, str], int]  # (kind, state) -> tasks
    live_workers: dict[str, int]  # target -> workers that build it and beat within the TTL
    live_bench_workers: dict[str, int]  # target -> workers that benchmark it


def queue_state(session: Session, worker_ttl_s: float) -> QueueState:
    now = datetime.now(timezone.utc)
    waiting: dict[tuple[str, str], tuple[int, float]] = {}
    by_state: dict[tuple[str, str], int] = {}
    for kind, table in KINDS.items():
        rows = session.execute(
            select(table.target, func.count(), func.min(table.queued_at))
            .where(table.state == TaskState.QUEUED.value)
            .group_by(table.target)
        ).all()
        for target, count, oldest in rows:
            waiting[(kind, target)] = (count, max(0.0, (now - as_utc(oldest)).total_seconds()))
        for state, count in session.execute(select(table.state, func.count()).group_by(table.state)).all():
            by_state[(kind, state)] = count
    live: dict[str, int] = {}
    bench: dict[str, int] = {}
    cutoff = now - timedelta(seconds=worker_ttl_s)
    for targets, bench_targets in session.execute(
        select(WorkerRow.targets, WorkerRow.bench_targets).where(WorkerRow.last_seen >= cutoff)
    ).all():
        for t in targets or []:
            live[t] = live.get(t, 0) + 1
        for t in bench_targets or []:
            bench[t] = bench.get(t, 0) + 1
    return QueueState(waiting, by_state, live, bench)

"""What the catalog's query modules share: a row by id or NotFound, a model query limited to one project, and the
conditional claim of a queued task."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from sqlalchemy import CursorResult, update
from sqlalchemy.orm import Session

from enginefarm.core.domain import TaskState
from enginefarm.core.errors import NotFound
from storage.tables import ModelRow, utcnow

T = TypeVar("T")


def get_row(session: Session, table: type[T], ident: int, what: str) -> T:
    row = session.get(table, ident)
    if row is None:
        raise NotFound(f"no {what} with id {ident}")
    return row


def in_project(query, project: str | None):
    """``query`` (over ModelRow) limited to one project; ``None``: every project (a token of the whole farm)."""
    return query if project is None else query.where(ModelRow.project == project)


def claim_row(session: Session, table, task_id: int, worker_id: str, max_deliveries: int | None) -> bool:
    """Move a queued task to running for this worker (a conditional update: one claim wins). False if another
    worker has it or it is done, or when it was already delivered ``max_deliveries`` times: then it is
    failed with that reason, so a task that kills its worker cannot loop forever."""
    queued = (table.id == task_id) & (table.state == TaskState.QUEUED.value)
    if max_deliveries is not None and _updated(
        session,
        update(table)
        .where(queued, table.attempts >= max_deliveries)
        .values(
            state=TaskState.FAILED.value,
            finished_at=utcnow(),
            error=f"gave up after {max_deliveries} deliveries: each attempt ended without a result "
            f"(its worker died or it hit the hard time limit)",
        ),
    ):
        return False
    claimed = _updated(
        session,
        update(table)
        .where(queued)
        .values(state=TaskState.RUNNING.value, worker_id=worker_id, started_at=utcnow(), attempts=table.attempts + 1),
    )
    return claimed == 1


def _updated(session: Session, statement: Any) -> int:
    """The number of rows an UPDATE changed."""
    return cast("CursorResult[Any]", session.execute(statement)).rowcount

"""Accuracy references in the catalog: the ``.npz`` of a check's inputs and ONNX Runtime FP32's outputs on them,
one row per distinct set, and which benchmark tasks judge against it (worker/measure/reference.py writes them, the
API serves them to deploy machines)."""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage.tables import BenchmarkTaskRow, ReferenceRow


def find(session: Session, identity: str) -> ReferenceRow | None:
    return session.scalars(select(ReferenceRow).where(ReferenceRow.identity == identity)).first()


def add(
    session: Session, *, identity: str, model_id: int, blob_key: str, sha256: str, size: int, origin: str
) -> ReferenceRow:
    """The row of a reference whose blob is stored; the one already there when another worker was first."""
    found = find(session, identity)
    if found is not None:
        return found
    row = ReferenceRow(identity=identity, model_id=model_id, blob_key=blob_key, sha256=sha256, size=size, origin=origin)
    session.add(row)
    session.flush()
    return row


def link(session: Session, task_ids: list[int], reference_id: int) -> None:
    """These checks judge against this reference."""
    session.execute(update(BenchmarkTaskRow).where(BenchmarkTaskRow.id.in_(task_ids)).values(reference_id=reference_id))


def checks_without(session: Session, engine_id: int, project: str) -> list[BenchmarkTaskRow]:
    """The project's checks of the engine with an accuracy check and no reference yet."""
    rows = session.scalars(
        select(BenchmarkTaskRow).where(
            BenchmarkTaskRow.engine_id == engine_id,
            BenchmarkTaskRow.project == project,
            BenchmarkTaskRow.reference_id.is_(None),
        )
    )
    return [r for r in rows if r.build_spec.accuracy.enabled]


def of_engine(session: Session, engine_id: int, project: str) -> tuple[BenchmarkTaskRow, ReferenceRow] | None:
    """The project's latest check of the engine that has a reference, and that reference."""
    found = session.execute(
        select(BenchmarkTaskRow, ReferenceRow)
        .join(ReferenceRow, ReferenceRow.id == BenchmarkTaskRow.reference_id)
        .where(BenchmarkTaskRow.engine_id == engine_id, BenchmarkTaskRow.project == project)
        .order_by(BenchmarkTaskRow.id.desc())
        .limit(1)
    ).first()
    return (found[0], found[1]) if found else None

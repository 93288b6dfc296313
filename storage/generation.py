"""Each model's generation: a number the catalog raises whenever what /v1/resolve answers about it can change.

A resolve answer depends on the model's versions and on the engines of their bytes, with their benchmarks and
accuracy verdicts. Engines belong to a model's sha256 (identical bytes under another name share them), so a
change to an engine, one of its benchmarks or a verdict on it raises the generation of every model row with those
bytes. A new or removed version changes the set of rows itself. An answer's ETag is made from the rows' ids and
generations, so an answer cached or held by a client is current exactly while none of them moved.

The bump runs inside the same flush, so it commits or rolls back with the change it stands for. It is a session
event rather than a call at each write, so a new write path cannot forget it; a bulk ``update``/``delete`` of
engines or benchmarks (which skips the flush) must bump by hand with :func:`bump`.

Each process also counts the commits it made that changed a model row or a generation (:func:`local_changes`), and
on PostgreSQL such a commit notifies every API process (``storage.changes``): what an API process keeps of the
versions' generations (``api.services.versions``) is dropped when either moves.
"""

from __future__ import annotations

import itertools

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from storage.tables import BenchmarkRow, DeviceMeasurementRow, EngineRow, ModelRow, VerdictRow

CHANNEL = "enginefarm_resolve"  # PostgreSQL's NOTIFY channel for such commits (storage/changes.py)
_changes = itertools.count(1)
_committed = 0  # the number of this process's commits that changed what a resolve answers


def local_changes() -> int:
    """How many commits of this process changed model rows or their generations so far. Read it before a read of
    generations: a kept read is current only while this number has not moved (and the stated time has not passed)."""
    return _committed


def bump(session: Session, model_shas: set[str]) -> None:
    """Raise the generation of every model row holding these bytes."""
    if model_shas:
        _announce(session)
        session.connection().execute(
            update(ModelRow).where(ModelRow.sha256.in_(sorted(model_shas))).values(generation=ModelRow.generation + 1)
        )


def _touched(session: Session) -> set[str]:
    """The model bytes whose engines, benchmarks (the farm's or the fleet's) or verdicts this flush writes."""
    shas: set[str] = set()
    engine_ids: set[int] = set()
    for obj in (*session.new, *session.dirty, *session.deleted):
        if isinstance(obj, EngineRow):
            if obj in session.dirty and not session.is_modified(obj, include_collections=False):
                continue  # only its benchmarks list was touched: those rows are counted themselves
            shas.add(obj.model_sha256)
        elif isinstance(obj, (BenchmarkRow, VerdictRow, DeviceMeasurementRow)):
            engine = obj.__dict__.get("engine")  # set when the row was made with its engine; else by id
            if engine is not None:
                shas.add(engine.model_sha256)
            elif obj.engine_id is not None:
                engine_ids.add(obj.engine_id)
    if engine_ids:
        shas.update(
            session.connection()
            .execute(select(EngineRow.model_sha256).where(EngineRow.id.in_(sorted(engine_ids))))
            .scalars()
        )
    return shas


def before_flush(session: Session, _context, _instances) -> None:
    with session.no_autoflush:
        bump(session, _touched(session))
    if any(isinstance(obj, ModelRow) for obj in (*session.new, *session.dirty, *session.deleted)):
        _announce(session)  # a version added or removed changes the set of rows itself


def _announce(session: Session) -> None:
    """Mark this transaction as one that changes resolve answers: counted here at commit, and on PostgreSQL
    notified to every API process at commit (a NOTIFY is delivered only if its transaction commits)."""
    session.info["resolve_changed"] = True
    conn = session.connection()
    if conn.dialect.name == "postgresql":  # several in one transaction are delivered as one
        conn.exec_driver_sql(f"NOTIFY {CHANNEL}")


def after_commit(session: Session) -> None:
    """Count a commit that changed model rows or generations. (A flag left by a rolled-back flush only counts one
    change too many, which drops kept reads early: never wrong.)"""
    global _committed
    if session.info.pop("resolve_changed", False):
        _committed = next(_changes)

"""The engines the farm has built: recording one (its blob already stored), finding one by its content address,
listing them with the model version each is seen through, and reading them by id within a project."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError as SAIntegrityError
from sqlalchemy.orm import Session, joinedload

from enginefarm.core.domain import Backend, EngineDescriptor, TaskState
from enginefarm.core.errors import NotFound
from enginefarm.core.shapes import engine_profiles
from enginefarm.core.wanted import EngineFilter
from storage.rows import get_row, in_project
from storage.tables import BuildTaskRow, EngineRow, ModelRow, utcnow


def find_engine(
    session: Session, model_sha: str, spec_hash: str, target: str, backend_version: str | None
) -> EngineRow | None:
    """The engine already built for this content address, if any (newest backend version when unknown)."""
    query = select(EngineRow).where(
        EngineRow.model_sha256 == model_sha, EngineRow.spec_hash == spec_hash, EngineRow.target == target
    )
    if backend_version is not None:
        query = query.where(EngineRow.backend_version == backend_version)
    return session.scalars(query.order_by(EngineRow.id.desc())).first()


def record_engine(
    session: Session,
    task: BuildTaskRow,
    model: ModelRow,
    desc: EngineDescriptor,
    *,
    spec_hash: str,
    blob_key: str,
    build_seconds: float,
    worker_id: str,
    log_tail: str,
) -> EngineRow:
    """Catalogue a built engine (its blob is already stored and verified) and finish the task."""
    row = find_engine(session, model.sha256, spec_hash, desc.target, desc.backend_version)
    task.reused = row is not None  # another task built the same engine while this one did
    if row is None:
        facts = {**desc.facts(), "profiles": desc.profiles or _gpu_profiles(desc, task.build.spec, model.info)}
        row = EngineRow(
            model_id=model.id,
            model_sha256=model.sha256,
            spec_hash=spec_hash,
            **facts,
            blob_key=blob_key,
            build_seconds=build_seconds,
            built_by=worker_id,
        )
        try:
            with session.begin_nested():  # a savepoint: losing the race must not undo the whole transaction
                session.add(row)
        except SAIntegrityError:  # another task committed the same engine (the unique build key) first
            row = find_engine(session, model.sha256, spec_hash, desc.target, desc.backend_version)
            if row is None:
                raise
            task.reused = True
    task.state, task.engine_id, task.finished_at = TaskState.SUCCEEDED.value, row.id, utcnow()
    task.log_tail, task.error = log_tail, None
    return row


def _gpu_profiles(desc: EngineDescriptor, spec: dict, info: dict) -> list:
    """A GPU engine's optimization profiles; the ONNX Runtime artifact has none, as it runs any shape the model
    takes."""
    return [] if desc.backend == Backend.ONNXRUNTIME.value else engine_profiles(spec, info)


def list_engines(
    session: Session,
    filters: EngineFilter,
    *,
    limit: int = 50,
    offset: int = 0,
    project: str | None = None,
) -> tuple[list[tuple[EngineRow, ModelRow]], int]:
    """Engines with the model version they are listed under. An engine belongs to the model's bytes, so a
    model uploaded again under another name (or in another project) lists the engines its identical bytes
    already have."""
    model, version = filters.model, filters.version
    if model or version or project is not None:
        query = in_project(
            select(EngineRow, ModelRow).join(ModelRow, EngineRow.model_sha256 == ModelRow.sha256), project
        )
        query = query.where(ModelRow.name == model) if model else query
        query = query.where(ModelRow.version == version) if version else query
    else:
        query = select(EngineRow, ModelRow).join(ModelRow, EngineRow.model_id == ModelRow.id)
    for column, value in filters.columns().items():
        query = query.where(getattr(EngineRow, column) == value)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.execute(query.order_by(EngineRow.id, ModelRow.id).limit(limit).offset(offset)).all()
    return [(e, m) for e, m in rows], total


def get_engine(session: Session, engine_id: int, project: str | None = None) -> EngineRow:
    """The engine; NotFound when no model of ``project`` has the bytes it was built from."""
    return engine_in_project(session, engine_id, project)[0]


def engine_in_project(session: Session, engine_id: int, project: str | None = None) -> tuple[EngineRow, ModelRow]:
    """The engine and the model it is seen through: the one it was built for, unless that model is in another
    project; then the model of ``project`` last uploaded with the same bytes. An engine belongs to the bytes, so two
    projects can share one, but neither may learn the other's model names, versions or ids through it.
    NotFound when no model of ``project`` has those bytes."""
    row = get_row(session, EngineRow, engine_id, "engine")
    if project is None or row.model.project == project:
        return row, row.model
    model = session.scalars(
        select(ModelRow)
        .where(ModelRow.project == project, ModelRow.sha256 == row.model_sha256)
        .order_by(ModelRow.id.desc())
    ).first()
    if model is None:
        raise NotFound(f"no engine with id {engine_id}")
    return row, model


def engines_by_id(session: Session, engine_ids: list[int]) -> dict[int, EngineRow]:
    """The engines with these ids, in one query (a build's tasks, for instance)."""
    if not engine_ids:
        return {}
    return {row.id: row for row in session.scalars(select(EngineRow).where(EngineRow.id.in_(engine_ids)))}


def engines_of_models(session: Session, models: list[ModelRow]) -> list[EngineRow]:
    """The engines of these models' bytes (a model and those derived from it), with their benchmarks."""
    shas = {m.sha256 for m in models}
    # One statement (a join, not a second SELECT): an engine's benchmarks and accuracy are committed together,
    # and two statements could see one without the other.
    return list(
        session.scalars(
            select(EngineRow)
            .where(EngineRow.model_sha256.in_(shas))
            .options(joinedload(EngineRow.benchmarks))
            .order_by(EngineRow.target, EngineRow.id)
        ).unique()
    )

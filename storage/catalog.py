"""The catalog's models and builds: model versions (upload, lookup, samples, derived and previous versions), builds
and sweeps, and the life cycle of a build's tasks (admission, claim, reuse, failure, requeue).

Routes and tasks call these with a session from ``storage.db.session_scope``. The other tables have modules of their
own under ``storage`` (built engines, a project's checks, the quantization stage, workers and the tasks
that change hands, resolution's reads, tokens); only ``storage`` queries the tables.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache

from sqlalchemy import bindparam, func, select, text, update
from sqlalchemy.exc import IntegrityError as SAIntegrityError
from sqlalchemy.orm import Session, joinedload, selectinload

from enginefarm.core.domain import ModelInfo, Target, TaskState
from enginefarm.core.errors import Conflict, NotFound
from enginefarm.core.spec import BuildSpec
from storage.builtengines import find_engine
from storage.checks import ensure_benchmark_task
from storage.driverrows import driver_rows
from storage.rows import claim_row, get_row, in_project
from storage.tables import (
    BenchmarkTaskRow,
    BuildRow,
    BuildTaskRow,
    EngineRow,
    ModelRow,
    SweepRow,
    utcnow,
)

# --------------------------------------------------------------------------- models


def find_model_by_content(session: Session, name: str, sha256: str, project: str = "") -> ModelRow | None:
    return session.scalars(
        select(ModelRow).where(ModelRow.project == project, ModelRow.name == name, ModelRow.sha256 == sha256)
    ).first()


def find_derived(session: Session, source: ModelRow, sha256: str) -> ModelRow | None:
    """The model derived from ``source`` with these bytes. Each version has its own derived row even where two
    versions' bytes (and so their derived bytes) are the same: resolving a version reaches its engines through it."""
    return session.scalars(
        select(ModelRow).where(ModelRow.source_model_id == source.id, ModelRow.sha256 == sha256).order_by(ModelRow.id)
    ).first()


def add_model(
    session: Session,
    *,
    name: str,
    version: str | None,
    sha256: str,
    fmt: str,
    size: int,
    info: ModelInfo,
    blob_key: str,
    source: ModelRow | None = None,
    derivation: dict | None = None,
    project: str = "",
) -> ModelRow:
    """Insert a model version into a project ('' where the farm has none); the version defaults to the next
    integer under that name in the project. A derived model (``source``) shares its source's project and
    place in the version order."""
    project = source.project if source else project
    same_name = (ModelRow.project == project, ModelRow.name == name)
    seq = source.seq if source else (session.scalar(select(func.max(ModelRow.seq)).where(*same_name)) or 0) + 1
    version = version or str(seq)
    if session.scalars(select(ModelRow.id).where(*same_name, ModelRow.version == version)).first():
        raise Conflict(
            f"model {name!r} version {version!r} already exists with different bytes", name=name, version=version
        )
    row = ModelRow(
        project=project,
        name=name,
        version=version,
        seq=seq,
        sha256=sha256,
        format=fmt,
        size=size,
        info=info.to_dict(),
        blob_key=blob_key,
        source_model_id=source.id if source else None,
        derivation=derivation,
    )
    session.add(row)
    try:
        session.flush()
    except SAIntegrityError as exc:  # a concurrent upload took the same name and version
        raise Conflict(f"model {name!r} version {version!r} already exists", name=name, version=version) from exc
    return row


def get_model(session: Session, model_id: int, project: str | None = None) -> ModelRow:
    """The model; NotFound, as for one that does not exist, when it is outside ``project``."""
    row = get_row(session, ModelRow, model_id, "model")
    if project is not None and row.project != project:
        raise NotFound(f"no model with id {model_id}")
    return row


def list_models(
    session: Session,
    *,
    name: str | None = None,
    sha256: str | None = None,
    limit: int = 50,
    offset: int = 0,
    project: str | None = None,
    contains: str | None = None,
) -> tuple[list[ModelRow], int]:
    """Models (one row per version) by project, name and version; ``contains``: a part of the name (any case)."""
    query = in_project(select(ModelRow), project)
    if name:
        query = query.where(ModelRow.name == name)
    if contains:
        query = query.where(ModelRow.name.icontains(contains, autoescape=True))
    if sha256:
        query = query.where(ModelRow.sha256 == sha256)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(
        query.order_by(ModelRow.project, ModelRow.name, ModelRow.seq).limit(limit).offset(offset)
    ).all()
    return list(rows), total


def find_models(
    session: Session, name: str, version: str | None = None, project: str | None = None, *, columns: tuple | None = None
) -> list[ModelRow]:
    """Versions of a model, newest first, each source before the models derived from it; only the named
    version (and what was derived from it) when one is given. A name is looked up in ``project``; with
    ``None`` (a token of the whole farm) a name that several projects use is ambiguous, unless one of them
    is the farm's own (''). ``columns`` (which must include ``ModelRow.project``): plain rows of only these."""
    query = _models_query(version is not None, project is not None, columns)
    params = {"name": name, "version": version, "project": project}
    if columns:  # plain rows: on the driver's cursor, past SQLAlchemy's statement handling (resolve's hot path)
        rows = driver_rows(session.connection(), query, params)
    else:
        rows = list(session.execute(query, params).scalars().all())
    if len(projects := {r.project for r in rows}) > 1:
        if "" not in projects:
            raise Conflict(
                f"model {name!r} exists in several projects ({', '.join(sorted(projects))}): use a "
                f"token of one project",
                name=name,
            )
        rows = [r for r in rows if r.project == ""]
    if not rows:
        what = f"model {name!r}" + (f" version {version!r}" if version else "")
        raise NotFound(f"no {what} in the catalog")
    return rows


@cache
def _models_query(by_version: bool, by_project: bool, columns: tuple | None):
    """find_models' statement, built once per shape (building one costs more than running it)."""

    def scoped(query):
        return query.where(ModelRow.project == bindparam("project")) if by_project else query

    query = scoped(select(ModelRow).where(ModelRow.name == bindparam("name")))
    if by_version:
        named = scoped(
            select(ModelRow.id).where(ModelRow.name == bindparam("name"), ModelRow.version == bindparam("version"))
        )
        query = query.where((ModelRow.version == bindparam("version")) | ModelRow.source_model_id.in_(named))
    query = query.order_by(ModelRow.seq.desc(), ModelRow.source_model_id.is_not(None), ModelRow.id)
    return query.with_only_columns(*columns) if columns else query


def latest_of(rows: list[ModelRow]) -> list[ModelRow]:
    """The newest version and the models derived from it (``rows`` as find_models orders them)."""
    return [r for r in rows if r.seq == rows[0].seq] if rows else []


def set_samples(session: Session, model: ModelRow, *, sha256: str, key: str, info: dict) -> None:
    model.samples_sha256, model.samples_key, model.samples_info = sha256, key, info


def derived_models(session: Session, model: ModelRow) -> list[ModelRow]:
    return list(session.scalars(select(ModelRow).where(ModelRow.source_model_id == model.id).order_by(ModelRow.id)))


def previous_version(session: Session, model: ModelRow) -> ModelRow | None:
    """Version N-1 under the same name (an uploaded version, not a derived one)."""
    return session.scalars(
        select(ModelRow)
        .where(
            ModelRow.project == model.project,
            ModelRow.name == model.name,
            ModelRow.seq < model.seq,
            ModelRow.source_model_id.is_(None),
        )
        .order_by(ModelRow.seq.desc())
    ).first()


# --------------------------------------------------------------------------- builds and their tasks


def add_build(
    session: Session,
    model: ModelRow,
    spec: BuildSpec,
    targets: list[Target],
    backend_versions: dict[str, set[str]],
    *,
    waiting: bool = False,
    sweep_id: int | None = None,
    variant: str | None = None,
    token_id: int | None = None,
) -> tuple[BuildRow, list[BenchmarkTaskRow]]:
    """Record a build with one task per target. A target whose engine already exists for the backend
    version the live workers run is answered from the catalog: its task is born succeeded, and the engine
    is checked with this build's benchmark settings if it never was. ``waiting`` holds the tasks back for
    an earlier stage; ``token_id`` is the API token that asked. Returns the build and the benchmark tasks it
    queued (to publish after the commit)."""
    spec_hash = spec.spec_hash()
    build = BuildRow(
        model_id=model.id,
        spec=spec.stored(),
        spec_hash=spec_hash,
        targets=[str(t) for t in targets],
        sweep_id=sweep_id,
        variant=variant,
        token_id=token_id,
    )
    session.add(build)
    session.flush()
    checks: list[BenchmarkTaskRow] = []
    for target in targets:
        task = BuildTaskRow(
            build_id=build.id, target=str(target), state=(TaskState.WAITING if waiting else TaskState.QUEUED).value
        )
        if not waiting:
            reuse_engine(session, task, model, spec, spec_hash, backend_versions, checks)
        session.add(task)
    session.flush()
    return build, checks


def reuse_engine(
    session: Session,
    task: BuildTaskRow,
    model: ModelRow,
    spec: BuildSpec,
    spec_hash: str,
    backend_versions: dict[str, set[str]],
    checks: list[BenchmarkTaskRow],
) -> bool:
    """Answer ``task`` from the catalog where ``model``'s bytes have its engine for a backend version the live workers
    run (without any, the newest of any version): the task succeeds reusing it, and the engine's check with ``spec``'s
    benchmark settings, if it never had one, is appended to ``checks``. Returns whether the task was answered."""
    versions: Iterable[str | None] = backend_versions.get(task.target) or {None}
    existing = next((e for v in versions if (e := find_engine(session, model.sha256, spec_hash, task.target, v))), None)
    if existing is None:
        return False
    finish_task_reused(session, task, existing)
    task.started_at = task.finished_at
    if (check := ensure_benchmark_task(session, existing, spec, model.project)) is not None:
        checks.append(check)
    return True


# A PostgreSQL advisory lock key of our own ("admit"), held while a submission counts the queue and adds to it.
ADMISSION_LOCK = 0x61646D6974
PENDING_STATES = (TaskState.QUEUED.value, TaskState.WAITING.value)


def hold_admission(session: Session) -> None:
    """Serialize build submissions until this transaction ends, so that counting the queue and adding to it are
    one step and two submissions at a limit cannot both see room. PostgreSQL takes a transaction-level advisory
    lock. SQLite needs none: its one write lock is taken by the submission's first insert, before it counts."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": ADMISSION_LOCK})


def pending_tasks(session: Session, token_id: int | None = None) -> int:
    """Build tasks queued or waiting for an earlier stage: the farm's, or those of builds one token asked for."""
    query = select(func.count()).select_from(BuildTaskRow).where(BuildTaskRow.state.in_(PENDING_STATES))
    if token_id is not None:
        query = query.join(BuildRow, BuildTaskRow.build_id == BuildRow.id).where(BuildRow.token_id == token_id)
    return session.scalar(query) or 0


def get_build(session: Session, build_id: int, project: str | None = None) -> BuildRow:
    row = get_row(session, BuildRow, build_id, "build")
    if project is not None and row.model.project != project:
        raise NotFound(f"no build with id {build_id}")
    return row


def list_builds(
    session: Session,
    *,
    model_id: int | None = None,
    spec_hash: str | None = None,
    limit: int = 50,
    offset: int = 0,
    project: str | None = None,
) -> list[BuildRow]:
    query = select(BuildRow)
    if project is not None:
        query = query.join(ModelRow, BuildRow.model_id == ModelRow.id).where(ModelRow.project == project)
    if model_id is not None:
        query = query.where(BuildRow.model_id == model_id)
    if spec_hash:
        query = query.where(BuildRow.spec_hash == spec_hash)
    # Each answer lists the build's tasks and the precision its model lets each target build: one read for all.
    query = query.options(selectinload(BuildRow.tasks), joinedload(BuildRow.model))
    return list(session.scalars(query.order_by(BuildRow.id.desc()).limit(limit).offset(offset)).all())


def build_of_models(session: Session, build_id: int, model_ids: list[int]) -> BuildRow | None:
    """The build, if it is a build of one of these models."""
    build = session.get(BuildRow, build_id)
    return build if build is not None and build.model_id in model_ids else None


def latest_task_per_target(
    session: Session, model_ids: list[int], spec_hash: str | None = None
) -> dict[str, BuildTaskRow]:
    """Target → its task in the newest build of these models (with this spec, where given) that has one."""
    query = select(BuildRow).where(BuildRow.model_id.in_(model_ids))
    if spec_hash:
        query = query.where(BuildRow.spec_hash == spec_hash)
    tasks: dict[str, BuildTaskRow] = {}
    for build in session.scalars(query.order_by(BuildRow.id.desc())):
        for task in build.tasks:
            tasks.setdefault(task.target, task)
    return tasks


def get_task(session: Session, task_id: int) -> BuildTaskRow:
    return get_row(session, BuildTaskRow, task_id, "build task")


def claim_task(session: Session, task_id: int, worker_id: str, max_deliveries: int | None = None) -> bool:
    return claim_row(session, BuildTaskRow, task_id, worker_id, max_deliveries)


def finish_task_reused(session: Session, task: BuildTaskRow, engine: EngineRow) -> None:
    task.state, task.engine_id, task.reused, task.finished_at = TaskState.SUCCEEDED.value, engine.id, True, utcnow()
    task.log_tail = f"identical build already in the catalog: engine {engine.id}"


def fail_task(session: Session, task_id: int, error: str, log_tail: str | None = None) -> None:
    session.execute(
        update(BuildTaskRow)
        .where(BuildTaskRow.id == task_id)
        .values(state=TaskState.FAILED.value, error=error, log_tail=log_tail, finished_at=utcnow())
    )


def requeue_task(session: Session, task_id: int, reason: str) -> None:
    session.execute(
        update(BuildTaskRow)
        .where(BuildTaskRow.id == task_id, BuildTaskRow.state == TaskState.RUNNING.value)
        .values(state=TaskState.QUEUED.value, worker_id=None, started_at=None, error=reason)
    )


def find_open_task(session: Session, model_id: int, spec_hash: str, target: str) -> BuildTaskRow | None:
    """A queued or running task already building this model, spec and target."""
    return session.scalars(
        select(BuildTaskRow)
        .join(BuildRow, BuildTaskRow.build_id == BuildRow.id)
        .where(
            BuildRow.model_id == model_id,
            BuildRow.spec_hash == spec_hash,
            BuildTaskRow.target == target,
            BuildTaskRow.state.in_([TaskState.QUEUED.value, TaskState.RUNNING.value]),
        )
        .order_by(BuildTaskRow.id.desc())
    ).first()


def latest_build(
    session: Session, model_ids: list[int], *, spec_hash: str | None = None, precision: str | None = None
) -> BuildRow | None:
    """The newest build of these model versions, optionally of one spec or one precision: where a build
    for a newly asking machine takes its spec from."""
    query = select(BuildRow).where(BuildRow.model_id.in_(model_ids)).order_by(BuildRow.id.desc())
    if spec_hash:
        query = query.where(BuildRow.spec_hash == spec_hash)
    for row in session.scalars(query):
        if precision is None or row.spec.get("precision") == precision:
            return row
    return None


# --------------------------------------------------------------------------- sweeps


def add_sweep(session: Session, model: ModelRow, axes: dict, targets: list[str]) -> SweepRow:
    row = SweepRow(model_id=model.id, axes=axes, targets=targets)
    session.add(row)
    session.flush()
    return row


def get_sweep(session: Session, sweep_id: int, project: str | None = None) -> SweepRow:
    row = get_row(session, SweepRow, sweep_id, "sweep")
    if project is not None and get_model(session, row.model_id).project != project:
        raise NotFound(f"no sweep with id {sweep_id}")
    return row


def builds_by_spec(session: Session, model_ids: list[int]) -> dict[str, BuildRow]:
    """The newest build of each spec hash among these models: where an engine's spec and variant label live."""
    out: dict[str, BuildRow] = {}
    for row in session.scalars(select(BuildRow).where(BuildRow.model_id.in_(model_ids)).order_by(BuildRow.id)):
        out[row.spec_hash] = row
    return out

"""Catalog service functions: the only place that queries the tables.

Routes and tasks call these with a session from ``storage.db.session_scope``.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError as SAIntegrityError
from sqlalchemy.orm import Session, selectinload

from enginefarm.compat import Choice, Evidence, Option, Wanted, choose
from enginefarm.domain import (
    BACKEND_MODULES,
    BuildSpec,
    EngineDescriptor,
    Machine,
    ModelInfo,
    Target,
    TaskState,
)
from enginefarm.errors import Conflict, NoCompatibleEngine, NotFound
from storage.db import as_utc
from storage.tables import DEFAULT_SHAPE_KEY, BuildRow, BuildTaskRow, EngineRow, ModelRow, WorkerRow, utcnow

# --------------------------------------------------------------------------- models


def find_model_by_content(session: Session, name: str, sha256: str) -> ModelRow | None:
    return session.scalars(select(ModelRow).where(ModelRow.name == name, ModelRow.sha256 == sha256)).first()


def add_model(session: Session, *, name: str, version: str | None, sha256: str, fmt: str, size: int,
              info: ModelInfo, blob_key: str) -> ModelRow:
    """Insert a model version; the version defaults to the next integer under that name."""
    seq = (session.scalar(select(func.max(ModelRow.seq)).where(ModelRow.name == name)) or 0) + 1
    version = version or str(seq)
    if session.scalars(select(ModelRow.id).where(ModelRow.name == name, ModelRow.version == version)).first():
        raise Conflict(f"model {name!r} version {version!r} already exists with different bytes", name=name, version=version)
    row = ModelRow(name=name, version=version, seq=seq, sha256=sha256, format=fmt, size=size,
                   info=info.to_dict(), blob_key=blob_key)
    session.add(row)
    try:
        session.flush()
    except SAIntegrityError as exc:  # a concurrent upload took the same name and version
        raise Conflict(f"model {name!r} version {version!r} already exists", name=name, version=version) from exc
    return row


def get_model(session: Session, model_id: int) -> ModelRow:
    row = session.get(ModelRow, model_id)
    if row is None:
        raise NotFound(f"no model with id {model_id}")
    return row


def list_models(session: Session, *, name: str | None = None, limit: int = 50, offset: int = 0) -> tuple[list[ModelRow], int]:
    query = select(ModelRow)
    if name:
        query = query.where(ModelRow.name == name)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(ModelRow.name, ModelRow.seq).limit(limit).offset(offset)).all()
    return list(rows), total


def find_models(session: Session, name: str, version: str | None = None) -> list[ModelRow]:
    """Versions of a model, newest first; only the named version when one is given."""
    query = select(ModelRow).where(ModelRow.name == name)
    if version is not None:
        query = query.where(ModelRow.version == version)
    rows = list(session.scalars(query.order_by(ModelRow.seq.desc())).all())
    if not rows:
        what = f"model {name!r}" + (f" version {version!r}" if version else "")
        raise NotFound(f"no {what} in the catalog")
    return rows


# --------------------------------------------------------------------------- builds


def find_engine(session: Session, model_sha: str, spec_hash: str, target: str, backend_version: str | None) -> EngineRow | None:
    """The engine already built for this content address, if any (newest backend version when unknown)."""
    query = select(EngineRow).where(EngineRow.model_sha256 == model_sha, EngineRow.spec_hash == spec_hash,
                                    EngineRow.target == target)
    if backend_version is not None:
        query = query.where(EngineRow.backend_version == backend_version)
    return session.scalars(query.order_by(EngineRow.id.desc())).first()


def add_build(session: Session, model: ModelRow, spec: BuildSpec, targets: list[Target],
              backend_versions: dict[str, set[str]]) -> BuildRow:
    """Record a build with one task per target. A target whose engine already exists for the backend
    version the live workers run is answered from the catalog: its task is born succeeded."""
    spec_hash = spec.spec_hash()
    build = BuildRow(model_id=model.id, spec=spec.canonical(), spec_hash=spec_hash, targets=[str(t) for t in targets])
    session.add(build)
    session.flush()
    for target in targets:
        task = BuildTaskRow(build_id=build.id, target=str(target), state=TaskState.QUEUED.value)
        versions = backend_versions.get(str(target)) or {None}
        existing = next((e for v in versions if (e := find_engine(session, model.sha256, spec_hash, str(target), v))), None)
        if existing is not None:
            now = utcnow()
            task.state, task.engine_id, task.reused = TaskState.SUCCEEDED.value, existing.id, True
            task.started_at = task.finished_at = now
            task.log_tail = f"identical build already in the catalog: engine {existing.id}"
        session.add(task)
    session.flush()
    return build


def get_build(session: Session, build_id: int) -> BuildRow:
    row = session.get(BuildRow, build_id)
    if row is None:
        raise NotFound(f"no build with id {build_id}")
    return row


def list_builds(session: Session, *, model_id: int | None = None, spec_hash: str | None = None, limit: int = 50,
                offset: int = 0) -> list[BuildRow]:
    query = select(BuildRow)
    if model_id is not None:
        query = query.where(BuildRow.model_id == model_id)
    if spec_hash:
        query = query.where(BuildRow.spec_hash == spec_hash)
    return list(session.scalars(query.order_by(BuildRow.id.desc()).limit(limit).offset(offset)).all())


def get_task(session: Session, task_id: int) -> BuildTaskRow:
    row = session.get(BuildTaskRow, task_id)
    if row is None:
        raise NotFound(f"no build task with id {task_id}")
    return row


def claim_task(session: Session, task_id: int, worker_id: str) -> bool:
    """Move a queued task to running for this worker. False if another worker has it or it is done."""
    result = session.execute(
        update(BuildTaskRow)
        .where(BuildTaskRow.id == task_id, BuildTaskRow.state == TaskState.QUEUED.value)
        .values(state=TaskState.RUNNING.value, worker_id=worker_id, started_at=utcnow(),
                attempts=BuildTaskRow.attempts + 1)
    )
    return result.rowcount == 1


def record_engine(session: Session, task: BuildTaskRow, model: ModelRow, desc: EngineDescriptor, *,
                  spec_hash: str, blob_key: str, build_seconds: float, worker_id: str, log_tail: str) -> EngineRow:
    """Catalogue a built engine (its blob is already stored and verified) and finish the task."""
    row = find_engine(session, model.sha256, spec_hash, desc.target, desc.backend_version)
    if row is None:
        row = EngineRow(
            model_id=model.id, model_sha256=model.sha256, spec_hash=spec_hash, target=desc.target,
            backend=desc.backend, backend_version=desc.backend_version, precision=desc.precision,
            compute_capability=desc.compute_capability, compute_capabilities=desc.compute_capabilities,
            gpu_name=desc.gpu_name, platform=desc.platform, trt_version=desc.trt_version,
            cuda_version=desc.cuda_version, driver_version=desc.driver_version,
            hardware_compat=desc.hardware_compat, version_compatible=desc.version_compatible,
            sha256=desc.sha256, size=desc.size, blob_key=blob_key, build_seconds=build_seconds, built_by=worker_id,
        )
        session.add(row)
        session.flush()
    task.state, task.engine_id, task.finished_at = TaskState.SUCCEEDED.value, row.id, utcnow()
    task.log_tail, task.error = log_tail, None
    return row


def finish_task_reused(session: Session, task: BuildTaskRow, engine: EngineRow) -> None:
    task.state, task.engine_id, task.reused, task.finished_at = TaskState.SUCCEEDED.value, engine.id, True, utcnow()
    task.log_tail = f"identical build already in the catalog: engine {engine.id}"


def fail_task(session: Session, task_id: int, error: str, log_tail: str | None = None) -> None:
    session.execute(
        update(BuildTaskRow).where(BuildTaskRow.id == task_id)
        .values(state=TaskState.FAILED.value, error=error, log_tail=log_tail, finished_at=utcnow())
    )


def requeue_task(session: Session, task_id: int, reason: str) -> None:
    session.execute(
        update(BuildTaskRow).where(BuildTaskRow.id == task_id, BuildTaskRow.state == TaskState.RUNNING.value)
        .values(state=TaskState.QUEUED.value, worker_id=None, started_at=None, error=reason)
    )


# --------------------------------------------------------------------------- engines


ENGINE_FILTERS = ("target", "backend", "compute_capability", "trt_version", "precision", "spec_hash")


def list_engines(session: Session, *, model: str | None = None, version: str | None = None, limit: int = 50,
                 offset: int = 0, **filters: Any) -> tuple[list[tuple[EngineRow, ModelRow]], int]:
    """Engines with the model version they are listed under. An engine belongs to the model's bytes, so a
    model uploaded again under another name lists the engines its identical bytes already have."""
    if model or version:
        query = select(EngineRow, ModelRow).join(ModelRow, EngineRow.model_sha256 == ModelRow.sha256)
        query = query.where(ModelRow.name == model) if model else query
        query = query.where(ModelRow.version == version) if version else query
    else:
        query = select(EngineRow, ModelRow).join(ModelRow, EngineRow.model_id == ModelRow.id)
    for name in ENGINE_FILTERS:
        if filters.get(name) is not None:
            query = query.where(getattr(EngineRow, name) == filters[name])
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.execute(query.order_by(EngineRow.id, ModelRow.id).limit(limit).offset(offset)).all()
    return [(e, m) for e, m in rows], total


def get_engine(session: Session, engine_id: int) -> EngineRow:
    row = session.get(EngineRow, engine_id)
    if row is None:
        raise NotFound(f"no engine with id {engine_id}")
    return row


def descriptor_of(row: EngineRow) -> EngineDescriptor:
    return EngineDescriptor(
        target=row.target, backend=row.backend, backend_version=row.backend_version, precision=row.precision,
        platform=row.platform, compute_capability=row.compute_capability,
        compute_capabilities=list(row.compute_capabilities or []), gpu_name=row.gpu_name, trt_version=row.trt_version,
        cuda_version=row.cuda_version, driver_version=row.driver_version, hardware_compat=row.hardware_compat,
        version_compatible=row.version_compatible, size=row.size, sha256=row.sha256,
        device_memory_bytes=row.device_memory_bytes,
    )


# --------------------------------------------------------------------------- resolution


def _evidence(row: EngineRow, machine: Machine) -> Evidence:
    """Accuracy, and the best median latency at the default shape measured on the asking GPU model."""
    accuracy = None if row.accuracy_pass is None else ("pass" if row.accuracy_pass else "fail")
    same_gpu = [b for b in row.benchmarks if b.shape_key == DEFAULT_SHAPE_KEY and machine.gpu_name
                and b.gpu_name == machine.gpu_name]
    best = min(same_gpu, key=lambda b: b.median_ms, default=None)
    return Evidence(accuracy, best.median_ms if best else None, best.gpu_name if best else None)


def resolve(session: Session, machine: Machine, *, model: str, version: str | None = None,
            wanted: Wanted | None = None) -> tuple[Choice, dict[int, EngineRow], dict[str, ModelRow]]:
    """Judge and rank every engine of this model (one version, the newest with ``version="latest"``, or all)
    for this machine. Returns the choice, the engine rows by id, and the model version of each model sha."""
    models = find_models(session, model, None if version == "latest" else version)
    if version == "latest":
        models = models[:1]
    # Engines belong to the model's bytes: identical bytes under another name share them.
    owner: dict[str, ModelRow] = {}
    for m in models:
        if m.sha256 not in owner or m.seq > owner[m.sha256].seq:
            owner[m.sha256] = m
    rows = session.scalars(select(EngineRow).where(EngineRow.model_sha256.in_(owner))
                           .options(selectinload(EngineRow.benchmarks))).all()
    options = [Option(r.id, descriptor_of(r), owner[r.model_sha256].seq, r.spec_hash, _evidence(r, machine))
               for r in rows]
    return choose(options, machine, wanted), {r.id: r for r in rows}, owner


def no_fit_error(choice: Choice, rows: dict[int, EngineRow], model: str, version: str | None) -> NoCompatibleEngine:
    what = model + (f" version {version}" if version else "")
    if not rows:
        return NoCompatibleEngine(f"no engines of {what} are built yet")
    runs = f"only the CPU artifact of {what} runs" if choice.ranked else f"none of the {len(rows)} engines of {what} runs"
    return NoCompatibleEngine(
        f"{runs} on this machine",
        problems=[{"engine_id": j.option.id, "target": rows[j.option.id].target, "rule": j.verdict.rule,
                   "reason": j.verdict.reason} for j in choice.rejected],
    )


def find_open_task(session: Session, model_id: int, spec_hash: str, target: str) -> BuildTaskRow | None:
    """A queued or running task already building this model, spec and target."""
    return session.scalars(
        select(BuildTaskRow).join(BuildRow, BuildTaskRow.build_id == BuildRow.id)
        .where(BuildRow.model_id == model_id, BuildRow.spec_hash == spec_hash, BuildTaskRow.target == target,
               BuildTaskRow.state.in_([TaskState.QUEUED.value, TaskState.RUNNING.value]))
        .order_by(BuildTaskRow.id.desc())
    ).first()


def latest_build(session: Session, model_ids: list[int], *, spec_hash: str | None = None,
                 precision: str | None = None) -> BuildRow | None:
    """The newest build of these model versions, optionally of one spec or one precision: where a build
    for a newly asking machine takes its spec from."""
    query = select(BuildRow).where(BuildRow.model_id.in_(model_ids)).order_by(BuildRow.id.desc())
    if spec_hash:
        query = query.where(BuildRow.spec_hash == spec_hash)
    for row in session.scalars(query):
        if precision is None or row.spec.get("precision") == precision:
            return row
    return None


# --------------------------------------------------------------------------- workers


def heartbeat(session: Session, worker_id: str, hostname: str, targets: list[str], probe: dict) -> None:
    row = session.get(WorkerRow, worker_id)
    if row is None:
        session.add(WorkerRow(id=worker_id, hostname=hostname, targets=targets, probe=probe))
    else:
        row.targets, row.probe, row.last_seen = targets, probe, utcnow()


def remove_worker(session: Session, worker_id: str) -> None:
    row = session.get(WorkerRow, worker_id)
    if row is not None:
        session.delete(row)


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

"""Public API schemas: what clients see. Built from catalog rows, never exposing them directly."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from storage.db import as_utc
from storage.tables import BuildRow, BuildTaskRow, EngineRow, ModelRow, WorkerRow

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class ModelOut(BaseModel):
    id: int
    name: str
    version: str
    sha256: str
    format: str
    size: int
    opset: int
    ir_version: int
    producer: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    has_qdq: bool
    external_data: bool
    created_at: datetime

    @classmethod
    def of(cls, row: ModelRow) -> ModelOut:
        info = row.info
        return cls(id=row.id, name=row.name, version=row.version, sha256=row.sha256, format=row.format, size=row.size,
                   opset=info["opset"], ir_version=info["ir_version"], producer=info["producer"],
                   inputs=info["inputs"], outputs=info["outputs"], has_qdq=info.get("has_qdq", False),
                   external_data=info.get("external_data", False), created_at=as_utc(row.created_at))


class BuildRequest(BaseModel):
    model_id: int
    targets: list[str] = Field(min_length=1, max_length=1000)
    spec: dict[str, Any] = Field(default_factory=dict)


class TaskOut(BaseModel):
    id: int
    target: str
    state: str
    engine_id: int | None
    reused: bool
    worker_id: str | None
    attempts: int
    error: str | None
    status_detail: str | None
    log_tail: str | None
    queued_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    wait_seconds: float | None
    run_seconds: float | None

    @classmethod
    def of(cls, row: BuildTaskRow, detail: str | None) -> TaskOut:
        q, s, f = as_utc(row.queued_at), as_utc(row.started_at), as_utc(row.finished_at)
        return cls(id=row.id, target=row.target, state=row.state, engine_id=row.engine_id, reused=row.reused,
                   worker_id=row.worker_id, attempts=row.attempts, error=row.error, status_detail=detail,
                   log_tail=row.log_tail, queued_at=q, started_at=s, finished_at=f,
                   wait_seconds=(s - q).total_seconds() if s else None,
                   run_seconds=(f - s).total_seconds() if f and s else None)


class BuildOut(BaseModel):
    id: int
    model_id: int
    spec: dict[str, Any]
    spec_hash: str
    targets: list[str]
    state: str
    created_at: datetime
    tasks: list[TaskOut]


class EngineOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: int
    model_id: int
    model_name: str
    model_version: str
    model_sha256: str
    spec_hash: str
    target: str
    backend: str
    backend_version: str
    precision: str
    compute_capability: str | None
    compute_capabilities: list[str]
    gpu_name: str | None
    platform: str
    trt_version: str | None
    cuda_version: str | None
    driver_version: str | None
    hardware_compat: str
    version_compatible: bool
    sha256: str
    size: int
    build_seconds: float
    built_by: str | None
    created_at: datetime

    @classmethod
    def of(cls, row: EngineRow) -> EngineOut:
        fields = {k: getattr(row, k) for k in cls.model_fields if k not in ("model_name", "model_version")}
        return cls(**fields, model_name=row.model.name, model_version=row.model.version)


class CandidateOut(BaseModel):
    engine_id: int
    target: str
    match: str | None
    reason: str
    unchecked: list[str] = []


class ResolveOut(BaseModel):
    engine: EngineOut
    match: str
    reason: str
    unchecked: list[str]
    download_url: str
    fallbacks: list[CandidateOut]
    rejected: list[CandidateOut]


class WorkerOut(BaseModel):
    id: str
    hostname: str
    targets: list[str]
    started_at: datetime
    last_seen: datetime
    probe: dict[str, Any]

    @classmethod
    def of(cls, row: WorkerRow) -> WorkerOut:
        return cls(id=row.id, hostname=row.hostname, targets=row.targets, started_at=as_utc(row.started_at),
                   last_seen=as_utc(row.last_seen), probe=row.probe)


def build_state(tasks: list[BuildTaskRow]) -> str:
    states = {t.state for t in tasks}
    for state in ("running", "queued"):
        if state in states:
            return state
    return "failed" if "failed" in states else ("cancelled" if states == {"cancelled"} else "succeeded")


def build_out(row: BuildRow, details: dict[int, str | None]) -> BuildOut:
    return BuildOut(id=row.id, model_id=row.model_id, spec=row.spec, spec_hash=row.spec_hash, targets=row.targets,
                    state=build_state(row.tasks), created_at=as_utc(row.created_at),
                    tasks=[TaskOut.of(t, details.get(t.id)) for t in row.tasks])

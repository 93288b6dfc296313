"""Public API schemas: what clients see. Built from catalog rows, never exposing them directly.

Here: pages, errors, models, engines and workers. Resolve's question and answers are in ``api.schemas.resolve``;
builds and sweeps in ``builds``, tokens in ``tokens``, fleet figures in ``fleet``, the int8 and fp16 stages in
``int8``, report rows in ``reports``, the gate in ``gate``."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, create_model

from api.schemas.int8 import PrecisionStage
from api.schemas.reports import ReportRow
from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.wanted import EngineFilter
from storage.db import as_utc
from storage.tables import EngineRow, ModelRow, WorkerRow

if TYPE_CHECKING:
    from sqlalchemy import Row

    from storage.resolution import Parsed

T = TypeVar("T")


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    limit: int
    offset: int


class ErrorOut(BaseModel):
    """A 4xx or 5xx body: the farm's own errors name their kind; a request that fails validation lists why."""

    model_config = ConfigDict(extra="allow")

    error: str | None = Field(None, description="the error's kind, e.g. SpecInvalid; absent for request validation")
    detail: str | list[dict[str, Any]] = Field(description="what is wrong: a message, or one entry per invalid field")
    problems: list[dict[str, Any]] | None = Field(None, description="every problem at once, where there are several")


class ModelOut(BaseModel):
    id: int
    project: str | None = Field(None, description="the project that owns the model (none where the farm has none)")
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
    source_model_id: int | None = Field(None, description="the model this one was derived from (int8 Q/DQ)")
    derivation: dict[str, Any] | None = None
    samples: dict[str, Any] | None = Field(None, description="the sample inputs stored with the model, if any")

    @classmethod
    def of(cls, row: ModelRow) -> ModelOut:
        info = row.info
        samples = {"sha256": row.samples_sha256, **(row.samples_info or {})} if row.samples_sha256 else None
        return cls(
            id=row.id,
            project=row.project or None,
            name=row.name,
            version=row.version,
            sha256=row.sha256,
            format=row.format,
            size=row.size,
            opset=info["opset"],
            ir_version=info["ir_version"],
            producer=info["producer"],
            inputs=info["inputs"],
            outputs=info["outputs"],
            has_qdq=info.get("has_qdq", False),
            external_data=info.get("external_data", False),
            created_at=as_utc(row.created_at),
            source_model_id=row.source_model_id,
            derivation=row.derivation,
            samples=samples,
        )


class _EngineListing(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: int
    model_id: int
    model_name: str
    model_version: str
    model_seq: int = Field(description="order of the model's versions: newer is larger")
    variant_of: str | None = Field(
        None,
        description="for an engine of a derived model (int8 Q/DQ): the version it "
        "is a variant of; it is not a newer version",
    )
    model_sha256: str
    spec_hash: str


def _fact_fields() -> dict[str, Any]:
    """EngineDescriptor's fields as an answer's: each required, but for those that may be unknown (their default)."""
    hints = get_type_hints(EngineDescriptor)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(EngineDescriptor):
        doc = f.metadata.get("doc")
        if not f.metadata.get("optional"):
            out[f.name] = (hints[f.name], Field(description=doc))
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = (hints[f.name], Field(default_factory=f.default_factory, description=doc))
        else:
            out[f.name] = (hints[f.name], Field(f.default, description=doc))
    return out


# The engine's facts come from EngineDescriptor, the one list of them. The class is made at run time; the checker
# sees the same fields through the descriptor.
if TYPE_CHECKING:

    class _EngineFacts(_EngineListing, EngineDescriptor):
        pass

else:
    _EngineFacts = create_model("_EngineFacts", __base__=_EngineListing, **_fact_fields())


class EngineOut(_EngineFacts):
    """An engine as the API answers it: the version it is listed under, its facts (the fields of the farm's engine
    descriptor), how it was built, and the asking project's check of it."""

    build_seconds: float
    built_by: str | None
    created_at: datetime
    accuracy_pass: bool | None = Field(
        None,
        description="whether it passed the accuracy check of the project asking (null: that project never checked it)",
    )
    accuracy: dict[str, Any] | None = Field(None, description="that check's per-output metrics")
    checks: dict[str, Any] | None = Field(
        None, description="where the benchmark and accuracy check stand: state and, while pending or failed, why"
    )

    @classmethod
    def of(
        cls,
        row: EngineRow | Parsed,
        model: ModelRow | Row[Any] | None = None,
        checks: dict[str, Any] | None = None,
        variant_of: Any = ...,
        verdict: Any = None,
    ) -> EngineOut:
        """``model``: the version it is listed under, when not the one it was first built for (same bytes).
        ``row`` and ``model`` may be plain rows of the same columns; then ``variant_of`` is given. ``verdict``: the
        asking project's verdict on it (a VerdictRow), if any."""
        fields = {
            k: getattr(row, k)
            for k in cls.model_fields
            if k
            not in (
                "model_id",
                "model_name",
                "model_version",
                "model_seq",
                "checks",
                "profiles",
                "variant_of",
                "accuracy",
                "accuracy_pass",
            )
        }
        fields["profiles"] = row.profiles or []
        m = model or row.model
        if variant_of is ...:
            variant_of = m.source.version if m.source is not None else None
        return cls(
            **fields,
            model_id=m.id,
            model_name=m.name,
            model_version=m.version,
            model_seq=m.seq,
            variant_of=variant_of,
            checks=checks,
            accuracy=verdict.accuracy if verdict else None,
            accuracy_pass=verdict.accuracy_pass if verdict else None,
        )


class ModelReportOut(BaseModel):
    """GET /v1/models/{id}/report: one row per engine and measured shape (or per engine not measured yet, with
    why), the change against version N-1, the int8 stage of each int8 engine the farm quantized, and the fp16
    accuracy repair of each fp16 engine whose build ran one."""

    model: dict[str, Any] = Field(description="id, name, version, sha256 of the version reported on")
    previous: dict[str, Any] | None = Field(description="version N-1, the baseline of each row's regression")
    rows: list[ReportRow] = Field(
        description="per engine and measured shape: target, variant, shape_key, device, status, latency_ms "
        "(median, p90, p99, ...), throughput_qps, accuracy, size, regression against N-1"
    )
    checks_in_progress: list[int] = Field(description="engines whose benchmark a live worker is still running")
    int8: list[PrecisionStage] = Field(
        default_factory=list,
        description="per int8 engine made from the farm's own quantization: the CPU candidates measured, the "
        "accuracy repair when the spec asked for one, and the fp32/int8 latency measured",
    )
    fp16: list[PrecisionStage] = Field(
        default_factory=list,
        description="per fp16 engine of a build that asked accuracy_repair: its build's fp16 repair "
        "(precision fp16, the nodes ranked and kept in fp32, the gate before and after)",
    )


class WorkerOut(BaseModel):
    id: str
    hostname: str
    targets: list[str]
    bench_targets: list[str] = Field(default_factory=list, description="targets whose engines it benchmarks")
    started_at: datetime
    last_seen: datetime
    probe: dict[str, Any]

    @classmethod
    def of(cls, row: WorkerRow) -> WorkerOut:
        return cls(
            id=row.id,
            hostname=row.hostname,
            targets=row.targets,
            bench_targets=row.bench_targets or [],
            started_at=as_utc(row.started_at),
            last_seen=as_utc(row.last_seen),
            probe=row.probe,
        )


class EngineQuery(EngineFilter):
    """GET /v1/engines's query: the filters and the page."""

    limit: int = Field(50, description="engines per page, at most 500")
    offset: int = Field(0, description="engines skipped before the page")

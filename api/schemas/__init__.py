"""Public API schemas: what clients see. Built from catalog rows, never exposing them directly.

Here: pages, errors, models, engines, resolution and workers; builds and sweeps are in ``buildschemas``, tokens in
``tokenschemas``."""

from __future__ import annotations

import copy
import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, Strict, create_model, field_validator
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo

from api.schemas.int8 import PrecisionStage
from api.schemas.reports import ReportRow
from enginefarm.core.domain import EngineDescriptor
from enginefarm.core.machine import SHORT_NAMES, Machine
from enginefarm.core.shapes import shape_request
from enginefarm.core.text import CatalogText, VersionText
from enginefarm.core.wanted import EngineFilter, Wanted
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


class ResolveRequest(Wanted):
    """POST /v1/resolve: the model, the machine as JSON, and the filters (``Wanted``)."""

    model: CatalogText = Field(min_length=1, max_length=200)
    version: VersionText | None = Field(None, description='a model version, or "latest"')
    machine: Machine = Field(default_factory=Machine)
    explain: bool = Field(False, strict=True, description="return every candidate with every check")
    build: bool = Field(False, strict=True, description="when nothing fits, build the target this machine needs (202)")


# GET /v1/resolve's shape parameters, in trtexec's syntax; they become the machine's ``shapes``.
SHAPE_PARAMETERS = {
    "shapes": "trtexec syntax: images:1x3x640x640",
    "min_shapes": "with max_shapes (and opt_shapes): a range",
    "opt_shapes": "the shapes you will run most",
    "max_shapes": "with min_shapes: the range you will run",
}
# Repeatable query parameters that also take a comma-separated list (precisions=fp16,fp32).
# GET /v1/resolve's repeatable parameters (precisions=fp16&precisions=fp32, or precisions=fp16,fp32).
LISTS = ("precisions", "accept")


def _as_parameter(info: FieldInfo) -> tuple[Any, FieldInfo]:
    """A body field as a query parameter: the same type, constraints, default and description, parsed from text
    (strictness dropped: "true" and "5" are what a query string holds)."""
    lax = copy.copy(info)
    lax.metadata = [m for m in info.metadata if not isinstance(m, Strict)]
    return info.annotation, lax


def _machine_fields() -> dict[str, FieldInfo]:
    """The fields of the machine's fingerprint, as pydantic made them. ``Machine`` is a pydantic dataclass; the
    check narrows it, for the type checker, to the type that declares ``__pydantic_fields__``."""
    if not is_pydantic_dataclass(Machine):
        raise TypeError("Machine is not a pydantic dataclass")
    return Machine.__pydantic_fields__


# GET /v1/resolve's query: ResolveRequest's fields with the machine's flattened under their short names
# (``enginefarm.core.machine.SHORT_NAMES``) and its shapes as trtexec-style text. Derived, not written again.
def _query_fields() -> dict[str, Any]:
    body = ResolveRequest.model_fields
    return {
        "model": _as_parameter(body["model"]),
        "version": _as_parameter(body["version"]),
        **{
            SHORT_NAMES.get(name, name): _as_parameter(info)
            for name, info in _machine_fields().items()
            if name != "shapes"
        },
        **{
            name: (str | None, Field(None, max_length=10_000, description=words))
            for name, words in SHAPE_PARAMETERS.items()
        },
        **{name: _as_parameter(info) for name, info in body.items() if name not in ("model", "version", "machine")},
    }


def _lists(cls: Any, value: Any) -> Any:
    """A repeatable parameter's values, each split at commas (precisions=fp16,fp32)."""
    if isinstance(value, list):
        return [part for item in value for part in (item.split(",") if isinstance(item, str) else [item]) if part]
    return value


if TYPE_CHECKING:

    class ResolveQuery(BaseModel):
        """What the checker sees of the class made below: the fields the routes read by name."""

        build: bool
        shapes: str | None

else:
    ResolveQuery = create_model(
        "ResolveQuery",
        # A parameter it does not know is refused, not ignored: a misspelt filter (precison=int8, trt_version=10.3)
        # would otherwise change the answer without a word.
        __config__=ConfigDict(extra="forbid"),
        __validators__={"lists": field_validator(*LISTS, mode="before")(_lists)},
        **_query_fields(),
    )


def request_of(query: BaseModel) -> ResolveRequest:
    """The ResolveRequest a GET's validated query asks. Raises ValueError for shapes trtexec would not read, and
    ValidationError where the fingerprint's own rules refuse the combination."""
    values = dict(query)
    shapes = shape_request(*(values.pop(name) for name in SHAPE_PARAMETERS))
    machine = {name: values.pop(SHORT_NAMES.get(name, name)) for name in _machine_fields() if name != "shapes"}
    return ResolveRequest.model_validate({**values, "machine": {**machine, "shapes": shapes}}, strict=False)


class CheckOut(BaseModel):
    rule: str
    outcome: str
    detail: str


class CandidateOut(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    engine_id: int
    target: str
    model_version: str
    precision: str
    spec_hash: str
    rank: int | None = Field(None, description="1 for the chosen engine, 2.. for fallbacks; null when excluded")
    match: str | None
    rule: str | None = Field(None, description="the rule that excluded it")
    reason: str
    unchecked: list[str] = []
    accuracy: str | None = None
    latency_ms: float | None = None
    latency_on: str | None = None
    profiles: list[dict[str, dict[str, list[int]]]] = Field(
        default_factory=list, description="its optimization profiles"
    )
    checks: list[CheckOut] | None = Field(None, description="every check, with explain=true")


class MeasuredOut(BaseModel):
    source: Literal["farm", "fleet"] = Field(description="the farm's workers, or deploy machines that posted it")
    device_class: str
    on: str = Field(description="e.g. NVIDIA GeForce RTX 4090, or 3 machines of class NVIDIA GeForce RTX 4090")
    latency_ms: float
    machines: int | None = Field(None, description="for the fleet's figure: how many machines its median is of")


class ResolveOut(BaseModel):
    model: str
    machine: Machine
    engine: EngineOut
    match: str
    reason: str
    unchecked: list[str]
    accuracy: Literal["pass", "fail", "unchecked"] = Field(
        description="the chosen engine's accuracy check against ONNX Runtime FP32"
    )
    download_url: str
    fallbacks: list[CandidateOut]
    excluded: dict[str, int] = Field(default_factory=dict, description="how many engines each rule excluded")
    rejected: list[CandidateOut] | None = Field(
        None, description="the excluded engines, each with its rule and reason, with explain=true"
    )
    candidates: list[CandidateOut] | None = Field(
        None, description="the full table, ranked then excluded, with explain=true"
    )
    ranked_by: str = Field(
        "",
        description="how the chosen engine won over the others that run: the latencies compared, and on which device",
    )
    measured: list[MeasuredOut] = Field(
        default_factory=list,
        description="the chosen engine's latencies on this machine's classes (its GPU model, compute capability, "
        "CPU), the farm's and the fleet's side by side, nearest first",
    )


class BuildForMachineOut(BaseModel):
    """202 from /v1/resolve?build=true: nothing fits yet, and this build will make what does."""

    detail: str
    build_id: int
    target: str
    spec_hash: str
    spec_from: str = Field(description="whose spec it builds: the model's latest build's (of the precision asked)")
    precision: str = Field(description="the precision it builds")
    state: str
    status_detail: str | None
    already_building: bool
    reasons: list[dict[str, Any]] = Field(description="why each engine built so far does not fit")
    fallback: CandidateOut | None = Field(None, description="the CPU artifact that runs meanwhile, if any")


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

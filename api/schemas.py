"""Public API schemas: what clients see. Built from catalog rows, never exposing them directly."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Generic, Literal, TypeVar, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, create_model, field_validator

from enginefarm.domain import EngineDescriptor, ModelInfo, TaskState
from enginefarm.spec import BuildSpec
from enginefarm.machine import Machine
from enginefarm.text import CatalogText
from enginefarm.validation import project_problem, target_precision
from enginefarm.storage.db import as_utc
from enginefarm.storage.tables import ApiTokenRow, BuildRow, BuildTaskRow, EngineRow, ModelRow, WorkerRow
from enginefarm.storage.tokens import lifetime_problem, token_state

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
        return cls(id=row.id, project=row.project or None, name=row.name, version=row.version, sha256=row.sha256,
                   format=row.format, size=row.size,
                   opset=info["opset"], ir_version=info["ir_version"], producer=info["producer"],
                   inputs=info["inputs"], outputs=info["outputs"], has_qdq=info.get("has_qdq", False),
                   external_data=info.get("external_data", False), created_at=as_utc(row.created_at),
                   source_model_id=row.source_model_id, derivation=row.derivation, samples=samples)


# JSON bodies take ids, numbers and flags only as JSON numbers and booleans (Strict*): lax parsing would read true
# as 1 (model 1) and "1" as 1, hiding a client's mistake behind a request that looks valid.
class BuildRequest(BaseModel):
    model_id: StrictInt
    targets: list[str] = Field(min_length=1, max_length=1000)
    spec: BuildSpec = Field(default_factory=BuildSpec)
    queue_without_worker: StrictBool | None = Field(None, description="accept targets no live worker serves now; "
                                                                   "their tasks wait in the queue (default: the "
                                                                   "farm's setting)")


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
    check: dict[str, Any] | None = Field(None, description="the engine's benchmark and accuracy check: state, detail, "
                                                           "accuracy_pass")
    precision: str | None = Field(None, description="the precision this target builds: the spec's, or the nearest "
                                                    "one it can (see precision_note)")
    precision_note: str | None = Field(None, description="why this target builds another precision than the spec's")

    @classmethod
    def of(cls, row: BuildTaskRow, detail: str | None, check: dict[str, Any] | None = None,
           precision: tuple[str, str | None] | None = None) -> TaskOut:
        q, s, f = as_utc(row.queued_at), as_utc(row.started_at), as_utc(row.finished_at)
        return cls(id=row.id, target=row.target, state=row.state, engine_id=row.engine_id, reused=row.reused,
                   worker_id=row.worker_id, attempts=row.attempts, error=row.error, status_detail=detail,
                   log_tail=row.log_tail, queued_at=q, started_at=s, finished_at=f,
                   wait_seconds=(s - q).total_seconds() if s else None,
                   run_seconds=(f - s).total_seconds() if f and s else None, check=check,
                   precision=precision[0] if precision else None, precision_note=precision[1] if precision else None)


class BuildOut(BaseModel):
    id: int
    model_id: int
    spec: dict[str, Any]
    spec_hash: str
    targets: list[str]
    state: str
    summary: str = Field("", description="the build and its checks in one line: built, failed, checks passed, "
                                         "failed or pending")
    created_at: datetime
    tasks: list[TaskOut]
    sweep_id: int | None = None
    variant: str | None = None
    quantize: dict[str, Any] | None = Field(None, description="the int8 quantization stage, when the build has one")


class SweepRequest(BaseModel):
    model_id: StrictInt
    targets: list[str] = Field(min_length=1, max_length=1000)
    spec: BuildSpec = Field(default_factory=BuildSpec, description="the base spec every variant starts from")
    axes: dict[str, list[Any]] = Field(description="spec field -> values to try, e.g. "
                                                   "{\"precision\": [\"fp32\", \"fp16\"], \"optimization_level\": [3, 5]}")
    queue_without_worker: StrictBool | None = Field(None, description="accept targets no live worker serves now; "
                                                                   "their tasks wait in the queue (default: the "
                                                                   "farm's setting)")


class VariantOut(BaseModel):
    build_id: int
    variant: str
    spec_hash: str
    overrides: dict[str, Any]
    state: str
    engines: list[dict[str, Any]] = Field(description="per target: engine, median latency, accuracy, best")


class SweepOut(BaseModel):
    id: int
    model_id: int
    axes: dict[str, list[Any]]
    targets: list[str]
    created_at: datetime
    state: str
    variants: list[VariantOut]
    best: dict[str, int | None] = Field(description="target -> build id of the fastest variant that passed accuracy")


class _EngineListing(BaseModel):
    model_config = ConfigDict(protected_namespaces=())

    id: int
    model_id: int
    model_name: str
    model_version: str
    model_seq: int = Field(description="order of the model's versions: newer is larger")
    variant_of: str | None = Field(None, description="for an engine of a derived model (int8 Q/DQ): the version it "
                                                     "is a variant of; it is not a newer version")
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


# The engine's facts come from EngineDescriptor, the one list of them; typed Any, as a class made at run time is.
_EngineFacts: Any = create_model("_EngineFacts", __base__=_EngineListing, **_fact_fields())


class EngineOut(_EngineFacts):
    """An engine as the API answers it: the version it is listed under, its facts (the fields of the farm's engine
    descriptor), how it was built, and the asking project's check of it."""

    build_seconds: float
    built_by: str | None
    created_at: datetime
    accuracy_pass: bool | None = Field(None, description="whether it passed the accuracy check of the project "
                                                         "asking (null: that project never checked it)")
    accuracy: dict[str, Any] | None = Field(None, description="that check's per-output metrics")
    checks: dict[str, Any] | None = Field(None, description="where the benchmark and accuracy check stand: "
                                                            "state and, while pending or failed, why")

    @classmethod
    def of(cls, row: EngineRow, model: ModelRow | None = None, checks: dict[str, Any] | None = None,
           variant_of: Any = ..., verdict: Any = None) -> EngineOut:
        """``model``: the version it is listed under, when not the one it was first built for (same bytes).
        ``row`` and ``model`` may be plain rows of the same columns; then ``variant_of`` is given. ``verdict``: the
        asking project's verdict on it (a VerdictRow), if any."""
        fields = {k: getattr(row, k) for k in cls.model_fields
                  if k not in ("model_id", "model_name", "model_version", "model_seq", "checks", "profiles",
                               "variant_of", "accuracy", "accuracy_pass")}
        fields["profiles"] = row.profiles or []
        m = model or row.model
        if variant_of is ...:
            variant_of = m.source.version if m.source is not None else None
        return cls(**fields, model_id=m.id, model_name=m.name, model_version=m.version, model_seq=m.seq,
                   variant_of=variant_of, checks=checks, accuracy=verdict.accuracy if verdict else None,
                   accuracy_pass=verdict.accuracy_pass if verdict else None)


SPEC_HASH_PATTERN = r"^[0-9a-f]{64}$"
PRECISION_PATTERN = r"^(fp32|fp16|bf16|int8|fp8)$"
BACKEND_PATTERN = r"^(tensorrt|tensorrt-rtx|onnxruntime)$"
Precision = Literal["fp32", "fp16", "bf16", "int8", "fp8"]
Accept = Literal["unchecked", "failed", "cpu"]


class ResolveRequest(BaseModel):
    """POST /v1/resolve: the machine as JSON, plus the same filters GET takes as query parameters."""

    model_config = ConfigDict(extra="forbid")

    model: CatalogText = Field(min_length=1, max_length=200)
    version: CatalogText | None = Field(None, max_length=100, description='a model version, or "latest"')
    machine: Machine = Field(default_factory=Machine)
    precision: str | None = Field(None, pattern=PRECISION_PATTERN)
    spec_hash: str | None = Field(None, pattern=SPEC_HASH_PATTERN)
    accuracy: Literal["pass"] | None = Field(None, description="keep only engines that passed their accuracy gate")
    max_latency_ms: StrictFloat | None = Field(None, gt=0, le=1e7,
                                               description="measured median latency on your GPU model")
    backend: str | None = Field(None, pattern=BACKEND_PATTERN, description="keep only engines of this backend")
    accept: list[Accept] = Field(default_factory=list, max_length=3,
                                 description="'unchecked': also int8/fp8 engines whose accuracy was never checked; "
                                             "'failed': also engines whose accuracy check failed (ranked last); "
                                             "'cpu': also the ONNX Runtime CPU artifact on a machine that names a "
                                             "GPU runtime")
    explain: StrictBool = Field(False, description="return every candidate with every check")
    build: StrictBool = Field(False, description="when nothing fits, build the target this machine needs (202)")


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
    profiles: list[dict[str, dict[str, list[int]]]] = Field(default_factory=list,
                                                            description="its optimization profiles")
    checks: list[CheckOut] | None = Field(None, description="every check, with explain=true")


class ResolveOut(BaseModel):
    model: str
    machine: Machine
    engine: EngineOut
    match: str
    reason: str
    unchecked: list[str]
    accuracy: Literal["pass", "fail", "unchecked"] = Field(description="the chosen engine's accuracy check against "
                                                                       "ONNX Runtime FP32")
    download_url: str
    fallbacks: list[CandidateOut]
    excluded: dict[str, int] = Field(default_factory=dict, description="how many engines each rule excluded")
    rejected: list[CandidateOut] | None = Field(None, description="the excluded engines, each with its rule and "
                                                                  "reason, with explain=true")
    candidates: list[CandidateOut] | None = Field(None, description="the full table, ranked then excluded, with explain=true")
    ranked_by: str = Field("", description="how the chosen engine won over the others that run: the latencies "
                                           "compared, and on which device")


class BuildForMachineOut(BaseModel):
    """202 from /v1/resolve?build=true: nothing fits yet, and this build will make what does."""

    detail: str
    build_id: int
    target: str
    spec_hash: str
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
        return cls(id=row.id, hostname=row.hostname, targets=row.targets, bench_targets=row.bench_targets or [],
                   started_at=as_utc(row.started_at), last_seen=as_utc(row.last_seen), probe=row.probe)


def build_state(tasks: list[BuildTaskRow]) -> str:
    states = {t.state for t in tasks}
    for state in ("running", "queued", "waiting"):
        if state in states:
            return state
    return "failed" if "failed" in states else ("cancelled" if states == {"cancelled"} else "succeeded")


def build_summary(tasks: list[BuildTaskRow], checks: dict[int, dict[str, Any]]) -> str:
    """"3 of 5 targets built, 2 failed; checks: 1 passed, 1 accuracy failed, 1 failed, 0 pending"."""
    built = sum(t.state == TaskState.SUCCEEDED.value for t in tasks)
    failed = sum(t.state == TaskState.FAILED.value for t in tasks)
    parts = [f"{built} of {len(tasks)} targets built" + (f", {failed} failed" if failed else "")]
    counts: dict[str, int] = {}
    for check in checks.values():
        if check["state"] == "failed":
            kind = "check failed"
        elif check.get("accuracy_pass") is False:
            kind = "accuracy failed"
        elif check["state"] == "succeeded":
            kind = "passed"
        else:
            kind = "pending"
        counts[kind] = counts.get(kind, 0) + 1
    if counts:
        order = ("passed", "accuracy failed", "check failed", "pending")
        parts.append("checks: " + ", ".join(f"{counts[k]} {k}" for k in order if k in counts))
    return "; ".join(parts)


def _built_precisions(build: BuildRow) -> dict[int, tuple[str, str | None]]:
    """Per task, the precision its target builds for the build's spec, and why when it is not the spec's."""
    spec, info = build.build_spec, ModelInfo.from_dict(build.model.info)
    out = {}
    for task in build.tasks:
        precision, note = target_precision(spec, task.parsed_target, info)
        out[task.id] = (precision.value, note if precision is not spec.precision else None)
    return out


def build_out(row: BuildRow, details: dict[int, str | None], checks: dict[int, dict[str, Any]] | None = None) -> BuildOut:
    checks = checks or {}
    built = _built_precisions(row)
    return BuildOut(id=row.id, model_id=row.model_id, spec=row.spec, spec_hash=row.spec_hash, targets=row.targets,
                    state=build_state(row.tasks), summary=build_summary(row.tasks, checks),
                    created_at=as_utc(row.created_at),
                    tasks=[TaskOut.of(t, details.get(t.id), checks.get(t.id), built[t.id])
                           for t in row.tasks],
                    sweep_id=row.sweep_id, variant=row.variant, quantize=row.quantize)


class TokenIn(BaseModel):
    name: CatalogText = Field(min_length=1, max_length=100)
    scopes: list[str] = Field(min_length=1, max_length=3, description="read, build and/or admin")
    expires_in_days: StrictFloat | None = Field(default=None, description="1 second (1.16e-05 days) to 3650 days; "
                                                                        "none: until revoked")
    project: str | None = Field(default=None, description="limit the token to one project's models (none: the whole "
                                                          "farm); ASCII letters, digits, '-', '_' or '.'")

    @field_validator("expires_in_days")
    @classmethod
    def _lifetime(cls, days: float | None) -> float | None:
        if days is not None and (problem := lifetime_problem(days)):
            raise ValueError(problem)
        return days

    @field_validator("project")
    @classmethod
    def _project(cls, project: str | None) -> str | None:
        if project is not None and (problem := project_problem(project)):
            raise ValueError(problem)
        return project


class TokenOut(BaseModel):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    project: str | None
    state: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: ApiTokenRow) -> TokenOut:
        return cls(id=row.id, name=row.name, prefix=row.prefix, scopes=row.scopes, project=row.project, state=token_state(row),
                   created_at=as_utc(row.created_at), expires_at=as_utc(row.expires_at),
                   last_used_at=as_utc(row.last_used_at))


class NewTokenOut(TokenOut):
    token: str = Field(description="the token; it is not stored and cannot be shown again")

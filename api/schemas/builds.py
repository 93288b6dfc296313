"""Public API schemas of builds and sweeps: what POST /v1/builds and /v1/sweeps take, and what a build, its tasks
and a sweep look like to clients. Built from catalog rows, never exposing them directly."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, StrictBool, StrictInt

from enginefarm.core.domain import ModelInfo, TaskState
from enginefarm.core.spec import BuildSpec
from enginefarm.core.validation import target_precision
from storage.db import as_utc
from storage.tables import BuildRow, BuildTaskRow


# JSON bodies take ids, numbers and flags only as JSON numbers and booleans (Strict*): lax parsing would read true
# as 1 (model 1) and "1" as 1, hiding a client's mistake behind a request that looks valid.
class BuildRequest(BaseModel):
    model_id: StrictInt
    targets: list[str] = Field(min_length=1, max_length=1000)
    spec: BuildSpec = Field(default_factory=BuildSpec)
    queue_without_worker: StrictBool | None = Field(
        None,
        description="accept targets no live worker serves now; "
        "their tasks wait in the queue (default: the "
        "farm's setting)",
    )


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
    check: dict[str, Any] | None = Field(
        None, description="the engine's benchmark and accuracy check: state, detail, accuracy_pass"
    )
    precision: str | None = Field(
        None, description="the precision this target builds: the spec's, or the nearest one it can (see precision_note)"
    )
    precision_note: str | None = Field(None, description="why this target builds another precision than the spec's")

    @classmethod
    def of(
        cls,
        row: BuildTaskRow,
        detail: str | None,
        check: dict[str, Any] | None = None,
        precision: tuple[str, str | None] | None = None,
    ) -> TaskOut:
        q, s, f = as_utc(row.queued_at), as_utc(row.started_at), as_utc(row.finished_at)
        return cls(
            id=row.id,
            target=row.target,
            state=row.state,
            engine_id=row.engine_id,
            reused=row.reused,
            worker_id=row.worker_id,
            attempts=row.attempts,
            error=row.error,
            status_detail=detail,
            log_tail=row.log_tail,
            queued_at=q,
            started_at=s,
            finished_at=f,
            # A task answered from the catalog is started in the same moment it is queued, the two instants taken
            # in either order: never a negative wait ("-0.00").
            wait_seconds=max((s - q).total_seconds(), 0.0) if s and q else None,
            run_seconds=(f - s).total_seconds() if f and s else None,
            check=check,
            precision=precision[0] if precision else None,
            precision_note=precision[1] if precision else None,
        )


class BuildOut(BaseModel):
    id: int
    model_id: int
    spec: dict[str, Any]
    spec_hash: str
    targets: list[str]
    state: str
    summary: str = Field(
        "", description="the build and its checks in one line: built, failed, checks passed, failed or pending"
    )
    created_at: datetime
    tasks: list[TaskOut]
    sweep_id: int | None = None
    variant: str | None = None
    quantize: dict[str, Any] | None = Field(
        None,
        description="the int8 quantization stage, or the fp16 accuracy repair stage (kind fp16-repair: "
        "reports.<family>.repair, keep_fp32_layers), when the build has one",
    )


class SweepRequest(BaseModel):
    model_id: StrictInt
    targets: list[str] = Field(min_length=1, max_length=1000)
    spec: BuildSpec = Field(default_factory=BuildSpec, description="the base spec every variant starts from")
    axes: dict[str, list[Any]] = Field(
        description="spec field -> values to try, e.g. "
        "{\"precision\": [\"fp32\", \"fp16\"], \"optimization_level\": [3, 5]}"
    )
    queue_without_worker: StrictBool | None = Field(
        None,
        description="accept targets no live worker serves now; "
        "their tasks wait in the queue (default: the "
        "farm's setting)",
    )


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


def build_state(tasks: list[BuildTaskRow]) -> str:
    states = {t.state for t in tasks}
    for state in ("running", "queued", "waiting"):
        if state in states:
            return state
    return "failed" if "failed" in states else ("cancelled" if states == {"cancelled"} else "succeeded")


def build_summary(tasks: list[BuildTaskRow], checks: dict[int, dict[str, Any]]) -> str:
    """ "3 of 5 targets built, 2 failed; checks: 1 passed, 1 accuracy failed, 1 failed, 0 pending"."""
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


def build_out(
    row: BuildRow, details: dict[int, str | None], checks: dict[int, dict[str, Any]] | None = None
) -> BuildOut:
    checks = checks or {}
    built = _built_precisions(row)
    return BuildOut(
        id=row.id,
        model_id=row.model_id,
        spec=row.spec,
        spec_hash=row.spec_hash,
        targets=row.targets,
        state=build_state(row.tasks),
        summary=build_summary(row.tasks, checks),
        created_at=as_utc(row.created_at),
        tasks=[TaskOut.of(t, details.get(t.id), checks.get(t.id), built[t.id]) for t in row.tasks],
        sweep_id=row.sweep_id,
        variant=row.variant,
        quantize=row.quantize,
    )

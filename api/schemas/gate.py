"""The release gate's answer (GET /v1/models/{id}/gate): per target and check, pass, fail or pending, with why."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Verdict = Literal["pass", "fail", "pending"]
CheckName = Literal["build", "benchmark", "accuracy", "latency_regression"]
CHECKS: tuple[CheckName, ...] = ("build", "benchmark", "accuracy", "latency_regression")


class GateCheck(BaseModel):
    target: str
    check: CheckName
    verdict: Verdict
    in_progress: bool = Field(False, description="pending on work a live worker will finish: ask again later")
    reason: str
    numbers: dict[str, Any] = Field(default_factory=dict, description="the figures the verdict was made from")


class GateTarget(BaseModel):
    target: str
    verdict: Verdict
    build_id: int | None
    task_id: int | None
    engine_id: int | None
    spec_hash: str | None
    checks: list[GateCheck]


class GateModel(BaseModel):
    id: int
    name: str
    version: str


class GateOut(BaseModel):
    model: GateModel
    previous: GateModel | None = Field(
        description="version N-1, the latency baseline (derived int8 models are variants of a version, never versions)"
    )
    max_regression_pct: float
    pending: Literal["pass", "fail"] = Field(description="how a check waiting for hardware the farm lacks counts")
    verdict: Verdict = Field(
        description="fail if any check fails; pending while a build or a check is under way "
        "or a target is not built; else pass"
    )
    reason: str
    counts: dict[str, int] = Field(description="checks per verdict")
    targets: list[GateTarget]

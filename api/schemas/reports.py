"""A model report's rows as clients see them (GET /v1/models/{id}/report): one per engine and measured shape, or
per engine not measured yet, with why. Built by ``api.services.reports.model_report``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.schemas.fleet import FleetClassOut

LATENCY_KEYS = ("min", "mean", "median", "p90", "p95", "p99", "max", "count")


class Phase(BaseModel):
    """One phase's timings in ms (``count``: the timed runs), as trtexec reports them."""

    model_config = ConfigDict(extra="forbid")

    min: float | None = None
    mean: float | None = None
    median: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None
    count: int | None = None


class RowCheck(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: str = Field(description="the engine's check: pending, running, passed, failed, ...")
    detail: str | None = Field(description="why it is where it is")


class RowAccuracy(BaseModel):
    """The engine's accuracy check against ONNX Runtime fp32, as the model's project judged it."""

    model_config = ConfigDict(extra="forbid")

    pass_: bool | None = Field(alias="pass", serialization_alias="pass")
    metrics: dict[str, Any] = Field(description="the worst output's metrics (cosine, max abs, ...)")
    limits: dict[str, Any] = Field(description="the gate's limits")
    reference: Any = None
    inputs: Any = None
    error: str | None = None
    explained_by: Any = None
    note: str | None = None


class Regression(BaseModel):
    """The change against the same target and shapes in version N-1."""

    model_config = ConfigDict(extra="forbid")

    previous_engine_id: int
    median_ms: float
    median_ms_delta: float
    median_ratio: float | None
    p99_ms_delta: float | None
    throughput_delta: float | None
    size_delta: int
    cosine_delta: float | None


class ReportRow(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    engine_id: int
    target: str
    backend: str
    precision: str
    spec_hash: str
    variant: str = Field(description="the build's variant, or its precision and optimization level")
    best: bool | None = Field(description="the fastest passing engine of its target (None: none measured)")
    size: int | None
    profiles: list[dict[str, Any]]
    accuracy: RowAccuracy | None
    derived_from: int | None = Field(description="the source model's id, for an engine of a derived (int8) model")
    preparation: str | None = Field(description="what was done to the graph before the build")
    check: RowCheck
    status: Literal["measured", "pending", "failed"]
    detail: str | None
    shape_key: str | None
    shapes: dict[str, Any] | None = None
    batch: int | None
    device: str | None
    latency_ms: Phase | None = Field(description="end to end, as trtexec's latency")
    compute_ms: Phase | None
    h2d_ms: Phase | None
    d2h_ms: Phase | None
    throughput_qps: float | None
    stats: dict[str, Any] | None = None
    measured_at: str | None = None
    regression: Regression | None
    fleet: list[FleetClassOut] = Field(
        default_factory=list, description="what deploy machines measured of the engine, per device class"
    )

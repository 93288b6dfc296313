"""What GET /v1/engines/{id}/measurements answers: every figure of one engine, the farm's workers' and the fleet's
side by side, and the fleet's per device class as the resolver ranks by them."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

Source = Literal["farm", "fleet"]


class MeasurementOut(BaseModel):
    """One figure of an engine: a benchmark of the farm's workers, or one a deploy machine posted."""

    id: int = Field(description="the benchmark's id (source farm) or the posted measurement's (source fleet)")
    source: Source
    machine_id: str | None = Field(description="the posting machine's anonymous id (fleet only)")
    gpu_name: str | None
    compute_capability: str | None
    cpu_name: str | None
    runtime: str | None = Field(description="what ran it (fleet only)")
    runtime_version: str | None
    shape_key: str | None = Field(description="which of the build's shape sets the farm measured at (farm only)")
    shapes: dict[str, Any]
    median_ms: float
    p99_ms: float | None
    throughput_qps: float | None
    accuracy_pass: bool | None = Field(description="the device's own accuracy check (fleet only)")
    flagged: bool = Field(description="left out of its class's median: far off the other machines' figures")
    created_at: datetime


class FleetClassOut(BaseModel):
    """The fleet's figure of the engine on one device class: what the resolver ranks by for that class."""

    device_class: str = Field(description="fleet:gpu:<GPU model>, fleet:cc:<x.y> or fleet:cpu:<CPU model>")
    label: str = Field(description="e.g. 3 machines of class NVIDIA GeForce RTX 4090")
    median_ms: float
    machines: int
    shapes: dict[str, Any]
    flagged: list[str] = Field(description="machine ids left out as outliers")


class MeasurementsOut(BaseModel):
    engine_id: int
    items: list[MeasurementOut]
    fleet: list[FleetClassOut]


class ReferenceOut(BaseModel):
    """The reference outputs a deploy machine checks an engine against, and the limits of its precision's gate."""

    engine_id: int
    precision: str
    limits: dict[str, float] = Field(description="the gate the engine's precision is judged by (the farm's own)")
    inputs: str = Field(description="where the check's inputs came from: the model's samples or seeded random ones")
    sha256: str = Field(description="the reference file's sha256 (.npz, no pickles: enginefarm.measure.check)")
    size: int
    content: str = Field(description="where its bytes are")

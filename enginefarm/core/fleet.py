"""Figures from the fleet: latencies that deploy machines measured on their own GPUs (or CPUs) and posted back
(``POST /v1/engines/{id}/measurements``), summed up per device class the way the resolver ranks.

A device class is what a machine stands for when it asks: its GPU model ("gpu:<model>"), its compute capability
("cc:<x.y>") or, for the CPU artifact, its CPU model ("cpu:<model>"). The fleet's classes carry the prefix
``fleet:`` so that a figure of the farm's own workers and one of the fleet are never the same class: ranking
compares a group of engines on one class, so the two are shown side by side and never averaged together.

Per engine and class: each machine counts once (its latest figure), the class figure is the median over machines,
and with three machines or more one whose figure is more than ``OUTLIER_FACTOR`` times off that median, either
way, is flagged and left out (a throttled laptop, a busy box, or a hostile post). With two machines nothing is
flagged: there is no majority to tell which one is off."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from enginefarm.core.machine import Machine
from enginefarm.core.text import Name

FLEET = "fleet:"  # the prefix of a fleet device class
OUTLIER_FACTOR = 5.0  # a machine more than this many times off its class median is flagged
MIN_FOR_OUTLIERS = 3  # fewer machines than this: none is flagged


@dataclass(frozen=True)
class DeviceFigure:
    """One machine's latest figure for one engine: who measured it, on what, at which input shapes."""

    machine_id: str
    gpu_name: str | None
    compute_capability: str | None
    cpu_name: str | None
    shapes: str  # canonical shapes text (``enginefarm.core.shapes.shapes_key``)
    median_ms: float


@dataclass
class ClassFigure:
    """The fleet's figure of one engine on one device class, at one set of input shapes."""

    median_ms: float
    machines: int  # machines whose figure counts
    shapes: str
    flagged: list[str] = field(default_factory=list)  # machine ids left out as outliers


def classes_of(f: DeviceFigure) -> list[str]:
    """The fleet device classes a figure stands for: its GPU model and compute capability, or its CPU."""
    if f.gpu_name or f.compute_capability:
        return [
            c
            for c in (
                f.gpu_name and f"{FLEET}gpu:{f.gpu_name}",
                f.compute_capability and f"{FLEET}cc:{f.compute_capability}",
            )
            if c
        ]
    return [f"{FLEET}cpu:{f.cpu_name or 'unknown'}"]


def outliers(figures: dict[str, float]) -> list[str]:
    """The machines (of ``figures``: machine id -> median ms) more than OUTLIER_FACTOR off the median of all."""
    if len(figures) < MIN_FOR_OUTLIERS:
        return []
    middle = statistics.median(figures.values())
    return sorted(m for m, ms in figures.items() if ms > middle * OUTLIER_FACTOR or ms * OUTLIER_FACTOR < middle)


def class_figures(figures: list[DeviceFigure]) -> dict[str, ClassFigure]:
    """Per fleet device class, the median over machines of one engine's figures (each machine's latest: pass them
    oldest first), outliers flagged and left out. Where a class was measured at several input shapes, the shapes
    most machines measured at are the class's (a tie goes to the fastest), as the farm's own figures are compared."""
    latest: dict[str, DeviceFigure] = {f.machine_id: f for f in figures}
    by_class: dict[str, dict[str, dict[str, float]]] = {}  # class -> shapes -> machine -> ms
    for f in latest.values():
        for c in classes_of(f):
            by_class.setdefault(c, {}).setdefault(f.shapes, {})[f.machine_id] = f.median_ms
    out: dict[str, ClassFigure] = {}
    for c, by_shapes in by_class.items():
        shapes = max(by_shapes, key=lambda s: (len(by_shapes[s]), -min(by_shapes[s].values())))
        machines = by_shapes[shapes]
        flagged = outliers(machines)
        kept = [ms for m, ms in machines.items() if m not in flagged]
        out[c] = ClassFigure(statistics.median(kept), len(kept), shapes, flagged)
    return out


def describe_class(device_class: str, machines: int | None = None) -> str:
    """A fleet class in words: "3 machines of class NVIDIA GeForce RTX 4090", "machines of compute capability 8.6"."""
    kind, _, name = device_class.removeprefix(FLEET).partition(":")
    what = {"gpu": f"class {name}", "cc": f"compute capability {name}", "cpu": f"the CPU {name}"}.get(kind, name)
    many = "machines" if machines is None else f"{machines} machine{'s' if machines != 1 else ''}"
    return f"{many} of {what}"


Dims = Annotated[list[Annotated[int, Field(strict=True, ge=1, le=2**31 - 1)]], Field(min_length=1, max_length=16)]
Millis = Annotated[float, Field(gt=0, le=3.6e6, allow_inf_nan=False)]  # at most an hour


class Accuracy(BaseModel):
    """A device's accuracy check of an engine against the farm's fp32 reference outputs for the model's samples,
    by the farm's gate (the same metrics a farm check records)."""

    model_config = ConfigDict(extra="forbid")

    passed: bool = Field(description="whether the engine's outputs passed the gate of its precision")
    outputs: dict[Name, dict[Name, Annotated[float, Field(allow_inf_nan=False)]]] = Field(
        default_factory=dict, max_length=256, description="per output, its metrics (max_abs, cosine, ...)"
    )
    without_tf32: dict[Name, dict[Name, Annotated[float, Field(allow_inf_nan=False)]]] | None = Field(
        None,
        max_length=256,
        description="an fp32 engine run with TF32 whose figures miss the fp32 gate: its figures run again with TF32 "
        "off; it passes when these do (the differences are TF32's), as the farm's own check judges",
    )
    inputs: str | None = Field(None, max_length=500, description="where the check's inputs came from (the farm's)")
    reference: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="the reference file's sha256")


class Measurement(BaseModel):
    """What a deploy machine measured of one engine, as it posts it (POST /v1/engines/{id}/measurements)."""

    model_config = ConfigDict(extra="forbid")

    machine_id: str = Field(
        pattern=r"^[A-Za-z0-9_-]{8,64}$",
        description="the machine's stable anonymous id: the same machine posts the same id, and it names no host",
    )
    machine: Machine = Field(description="the fingerprint it was measured on (its compute capability must fit)")
    runtime: str = Field(
        pattern=r"^[A-Za-z0-9._/+-]{1,64}$", description="what ran it, e.g. onnxruntime/CPUExecutionProvider"
    )
    runtime_version: str = Field(pattern=r"^[A-Za-z0-9._+-]{1,64}$")
    shapes: dict[Name, Dims] = Field(default_factory=dict, max_length=256, description="per input, the dims run")
    median_ms: Millis = Field(description="end-to-end median latency, by the farm's trtexec rules")
    p99_ms: Millis | None = None
    throughput_qps: Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)] | None = None
    stats: dict[Name, Annotated[float, Field(ge=0, allow_inf_nan=False)]] = Field(default_factory=dict, max_length=64)
    accuracy: Accuracy | None = None

    @model_validator(mode="after")
    def _ordered(self) -> Measurement:
        if self.p99_ms is not None and self.p99_ms < self.median_ms:
            raise ValueError(f"p99_ms {self.p99_ms:g} is below median_ms {self.median_ms:g}: a p99 cannot be")
        return self

"""Resolve's schemas: the question a deploy machine asks (``ResolveRequest``, and ``ResolveQuery``, its GET form
derived from it) and the answers (``ResolveOut``, its candidates and measured figures, and ``BuildForMachineOut``)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, create_model, field_validator
from pydantic.dataclasses import is_pydantic_dataclass
from pydantic.fields import FieldInfo

from api.schemas import EngineOut
from enginefarm.core.machine import SHORT_NAMES, Machine
from enginefarm.core.shapes import shape_request
from enginefarm.core.text import CatalogText, VersionText
from enginefarm.core.wanted import Wanted


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

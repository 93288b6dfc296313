"""The caller's filters on top of the compatibility rules, as one model.

``Wanted`` is read by ``enginefarm.core.choose.choose``; POST /v1/resolve's body extends it
(``api.schemas.resolve.ResolveRequest``), and GET /v1/resolve's query parameters are derived from that body's
fields (``api.schemas.resolve.ResolveQuery``), so a filter, its constraint and its description are written here
and nowhere else. The offline client validates its filters with it too.
"""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from enginefarm.core.domain import Backend
from enginefarm.core.spec import PRECISIONS

SPEC_HASH_PATTERN = r"^[0-9a-f]{64}$"
PRECISION_PATTERN = rf"^({'|'.join(PRECISIONS)})$"
BACKEND_PATTERN = rf"^({'|'.join(b.value for b in Backend)})$"
Accept = Literal["unchecked", "failed", "cpu"]
ACCEPT: tuple[str, ...] = get_args(Accept)


class Wanted(BaseModel):
    """What the caller asks for beyond "runs here": each filter excludes the engines it does not match, with its
    rule and reason in the explanation."""

    model_config = ConfigDict(extra="forbid")

    precision: str | None = Field(None, pattern=PRECISION_PATTERN, description="keep only engines of this precision")
    spec_hash: str | None = Field(
        None, pattern=SPEC_HASH_PATTERN, description="keep only engines built from this spec (its sha256)"
    )
    accuracy: Literal["pass"] | None = Field(
        None, description="accuracy=pass keeps only engines that passed their accuracy gate"
    )
    max_latency_ms: float | None = Field(
        None, strict=True, gt=0, le=1e7, description="measured median latency on your GPU model"
    )
    backend: str | None = Field(None, pattern=BACKEND_PATTERN, description="keep only engines of this backend")
    accept: list[Accept] = Field(
        default_factory=list,
        max_length=3,
        description="'unchecked': also int8/fp8 engines whose accuracy was never checked; "
        "'failed': also engines whose accuracy check failed (ranked last); "
        "'cpu': also the ONNX Runtime CPU artifact on a machine that names a GPU runtime",
    )


# An engine listing's filter -> the engine row's column it compares with (the rest name the model).
ENGINE_COLUMNS = {
    "target": "target",
    "backend": "backend",
    "cc": "compute_capability",
    "trt": "trt_version",
    "precision": "precision",
    "spec_hash": "spec_hash",
}


class EngineFilter(BaseModel):
    """Which engines a listing shows (GET /v1/engines, the client's ``engines``, ``enginefarm ls engines``): each
    filter given keeps only the engines that match it exactly."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = Field(None, description="the model's name")
    version: str | None = Field(None, description="the model's version")
    target: str | None = Field(None, description="the target, e.g. tensorrt-rtx/sm86")
    backend: str | None = Field(None, description="tensorrt, tensorrt-rtx or onnxruntime")
    cc: str | None = Field(None, description="compute capability, e.g. 8.6")
    trt: str | None = Field(None, description="the TensorRT (or TensorRT-RTX) version it was built with")
    precision: str | None = Field(None, description=", ".join(PRECISIONS))
    spec_hash: str | None = Field(None, description="the build spec's sha256")

    def columns(self) -> dict[str, str]:
        """The engine row's columns and the values they must have."""
        return {column: value for name, column in ENGINE_COLUMNS.items() if (value := getattr(self, name)) is not None}

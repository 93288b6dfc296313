"""GET /v1/models/{id}/gate: the release gate of a model version (api/services/gate.py)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query

from api.http.auth import Tenant
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import ID_MAX, UNPROCESSABLE, RowId
from api.schemas.gate import GateOut
from api.services import gate

router = APIRouter(route_class=CatalogRoute, prefix="/v1/models", tags=["models"], responses=UNPROCESSABLE)


@router.get("/{model_id}/gate", response_model=GateOut)
def model_gate(
    model_id: RowId,
    tenant: Tenant,
    session: CatalogSession,
    settings: FarmSettings,
    max_regression_pct: float = Query(
        10.0,
        ge=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="the largest slowdown of the median latency against version N-1 "
        "(same target, spec, shape and GPU) that still passes, in percent",
    ),
    pending: Literal["pass", "fail"] = Query(
        "pass",
        description="how a check waiting for hardware the farm lacks counts (a GPU engine on a farm with no such GPU)",
    ),
    targets: list[str] | None = Query(
        None,
        max_length=1000,
        description="gate only these targets (repeat, or comma-separated); default: every target built",
    ),
    build_id: int | None = Query(
        None, ge=1, le=ID_MAX, description="gate this build's tasks; default: per target, the newest build of the model"
    ),
    spec_hash: str | None = Query(None, pattern=r"^[0-9a-f]{64}$", description="only builds of this spec"),
) -> GateOut:
    """Per target and check (build, benchmark, accuracy, latency regression against version N-1): pass, fail or
    pending, with the reason and the numbers; and the verdict over all of them."""
    return gate.evaluate(
        session,
        settings,
        model_id,
        tenant,
        max_regression_pct=max_regression_pct,
        pending=pending,
        targets=gate.parse_targets(targets),
        build_id=build_id,
        spec_hash=spec_hash,
    )

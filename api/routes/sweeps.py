"""POST/GET /v1/sweeps: a grid of build variants, each built, benchmarked and checked; the best marked."""

from __future__ import annotations

from fastapi import APIRouter

from api.http.auth import Authorized, Tenant
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import UNPROCESSABLE, RowId, check_body_id
from api.schemas.builds import SweepOut, SweepRequest
from api.services import admission, reports
from api.services import builds as services

router = APIRouter(route_class=CatalogRoute, prefix="/v1/sweeps", tags=["sweeps"], responses=UNPROCESSABLE)


@router.post("", status_code=202, response_model=SweepOut, responses=admission.RESPONSES)
def submit_sweep(
    body: SweepRequest, tenant: Tenant, principal: Authorized, session: CatalogSession, settings: FarmSettings
) -> SweepOut:
    """One build per combination of the axes' values (e.g. precision × optimization level × profile), on
    every target. The best variant per target is the fastest that passes the accuracy gate. The sweep is
    admitted whole or not at all, as one build is."""
    check_body_id("model_id", body.model_id)
    sweep_id = services.submit_sweep(
        settings,
        body.model_id,
        body.targets,
        body.spec,
        body.axes,
        tenant,
        token_id=principal.family_id,
        queue_without_worker=body.queue_without_worker,
    )
    return SweepOut(**reports.sweep_report(session, settings, sweep_id))


@router.get("/{sweep_id}", response_model=SweepOut)
def get_sweep(sweep_id: RowId, tenant: Tenant, session: CatalogSession, settings: FarmSettings) -> SweepOut:
    return SweepOut(**reports.sweep_report(session, settings, sweep_id, tenant))

"""GET /v1/workers."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.http.auth import authorize
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.schemas import WorkerOut
from storage import liveness

router = APIRouter(route_class=CatalogRoute, tags=["workers"])


@router.get("/v1/workers", response_model=list[WorkerOut], dependencies=[Depends(authorize)])
def list_workers(session: CatalogSession, settings: FarmSettings) -> list[WorkerOut]:
    """Workers that sent a heartbeat within the TTL, with the targets they build."""
    return [WorkerOut.of(r) for r in liveness.live_workers(session, settings.worker_ttl_seconds)]

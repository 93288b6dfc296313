"""GET /v1/workers."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from sqlalchemy.orm import Session

from api.auth import authorize
from api.deps import CatalogRoute, session_dep, settings_dep
from api.schemas import WorkerOut
from enginefarm.core.config import Settings
from storage import liveness

router = APIRouter(route_class=CatalogRoute, tags=["workers"])


@router.get("/v1/workers", response_model=list[WorkerOut], dependencies=[Depends(authorize)])
def list_workers(
    session: Session = Depends(session_dep, scope="function"), settings: Settings = Depends(settings_dep)
) -> list[WorkerOut]:
    """Workers that sent a heartbeat within the TTL, with the targets they build."""
    return [WorkerOut.of(r) for r in liveness.live_workers(session, settings.worker_ttl_seconds)]

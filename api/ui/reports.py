"""A model's report: the latency chart is drawn in the browser from the same JSON as GET /v1/models/{id}/report."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import RowId
from api.services import reports
from api.ui import session as ui_session
from api.ui.render import page
from enginefarm.core.repairs import repair_groups
from storage import catalog

router = APIRouter(prefix="/ui", route_class=CatalogRoute)


@router.get("/models/{model_id}/report")
def report_page(
    request: Request, model_id: RowId, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    report = reports.model_report(session, settings, model_id, principal.project)
    model = catalog.get_model(session, report["model"]["id"], principal.project)
    return page(request, "report.html", model=model, report=report, repairs=repair_groups(report))


@router.get("/models/{model_id}/report.json")
def report_json(
    model_id: RowId, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    body = reports.model_report(session, settings, model_id, principal.project)
    return JSONResponse(
        jsonable_encoder(body), headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    )

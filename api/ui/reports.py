"""A model's report: the latency chart is drawn in the browser from the same JSON as GET /v1/models/{id}/report."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from enginefarm.api import reports
from enginefarm.api.deps import CatalogRoute, session_dep, settings_dep
from enginefarm.api.routes import RowId
from enginefarm.api.ui import session as ui_session
from enginefarm.api.ui.render import page
from enginefarm.core.config import Settings
from enginefarm.storage import catalog
from enginefarm.storage.tokens import Principal

router = APIRouter(prefix="/ui", route_class=CatalogRoute)


@router.get("/models/{model_id}/report")
def report_page(
    request: Request,
    model_id: RowId,
    principal: Principal = Depends(ui_session.viewer),
    session: Session = Depends(session_dep, scope="function"),
    settings: Settings = Depends(settings_dep),
) -> Response:
    report = reports.model_report(session, settings, model_id, principal.project)
    model = catalog.get_model(session, report["model"]["id"], principal.project)
    return page(request, "report.html", model=model, report=report, repairs=repairs_of(report))


def repairs_of(report: dict) -> list[dict]:
    """The report's int8 stages that ran a repair and its fp16 repairs, one per build (the repair is found once for
    all its targets): build_id, variant, repair, and the stages of that build's engines."""
    variants = {r["engine_id"]: r["variant"] for r in report["rows"]}
    out: dict[int, dict] = {}
    for stage in [*(report.get("int8") or []), *(report.get("fp16") or [])]:
        if stage["repair"] is not None:
            group = out.setdefault(
                stage["build_id"],
                {
                    "build_id": stage["build_id"],
                    "variant": variants.get(stage["engine_id"]),
                    "repair": stage["repair"],
                    "stages": [],
                },
            )
            group["stages"].append(stage)
    return list(out.values())


@router.get("/models/{model_id}/report.json")
def report_json(
    model_id: RowId,
    principal: Principal = Depends(ui_session.viewer),
    session: Session = Depends(session_dep, scope="function"),
    settings: Settings = Depends(settings_dep),
) -> Response:
    body = reports.model_report(session, settings, model_id, principal.project)
    return JSONResponse(
        jsonable_encoder(body), headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
    )

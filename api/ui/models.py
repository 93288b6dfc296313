"""The models list (searchable), a model's page with its build matrix, uploads and builds from the browser, and a
model's report (its latency chart is drawn in the browser from the same JSON as GET /v1/models/{id}/report)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.http import buildwait
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import ID_MAX, RowId, page_offset
from api.http.upload import model_upload
from api.schemas import ModelOut
from api.services import builds as services
from api.services import reports
from api.ui import session as ui_session
from api.ui.buildform import form_fields, spec_from_form
from api.ui.matrix import model_matrix
from api.ui.render import is_fragment, page
from enginefarm.core.config import Settings
from enginefarm.core.repairs import repair_groups
from storage import catalog, liveness
from storage.db import session_scope
from storage.tokens import Principal

router = APIRouter(prefix="/ui", route_class=CatalogRoute)
PAGE = 50


@router.get("/models")
def models_page(
    request: Request, principal: ui_session.Viewer, session: CatalogSession, q: str = "", offset: int = 0
) -> Response:
    q = q.replace("\x00", "")[:200]
    offset = page_offset(offset)
    rows, total = catalog.list_models(session, contains=q or None, limit=PAGE, offset=offset, project=principal.project)
    context: dict[str, Any] = {
        "models": [ModelOut.of(r) for r in rows],
        "total": total,
        "q": q,
        "offset": offset,
        "page_size": PAGE,
    }
    return page(request, "fragments/model_rows.html" if is_fragment(request) else "models.html", **context)


@router.post("/models/upload")
async def upload(request: Request, principal: ui_session.Builder, settings: FarmSettings) -> Response:
    """The browser's upload (multipart, sent by a script with the CSRF header): the API's own upload."""
    model, created = await model_upload(request, principal.project, principal, settings)
    return JSONResponse(
        {"id": model.id, "name": model.name, "version": model.version, "url": f"/ui/models/{model.id}"},
        status_code=201 if created else 200,
    )


def _model_context(session: Session, settings: Settings, model_id: int, principal: Principal) -> dict:
    row = catalog.get_model(session, model_id, principal.project)
    matrix = model_matrix(session, settings, row, principal.project)
    return {"model": ModelOut.of(row), "matrix": matrix, "tag": buildwait.tag_of(matrix.state())}


@router.get("/models/{model_id}")
def model_page(
    request: Request, model_id: RowId, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    context = _model_context(session, settings, model_id, principal)
    served = liveness.served_targets(session, settings.worker_ttl_seconds)
    context.update(form=form_fields(context["model"]), served=sorted(served))
    return page(request, "model.html", **context)


@router.get("/models/{model_id}/matrix")
async def matrix_fragment(
    request: Request,
    model_id: RowId,
    principal: ui_session.Viewer,
    settings: FarmSettings,
    wait: float = buildwait.wait_query(),
    seen: str | None = buildwait.seen_query(),
    submitted: int | None = Query(
        None, ge=1, le=ID_MAX, description="a build this page submitted: its notice stays above the matrix"
    ),
) -> Response:
    """The model page's live part, by the same long poll as a build page's tasks (``api.ui.builds``): answered
    when a build of the model changes, or after ``wait`` s with the same matrix."""
    context = await buildwait.next_context(
        request,
        settings,
        lambda session: _model_context(session, settings, model_id, principal),
        lambda context: context["matrix"].state(),
        seen,
        wait,
    )
    return page(request, "fragments/matrix.html", submitted=submitted, **context)


@router.post("/models/{model_id}/builds")
async def submit_build(
    request: Request, model_id: RowId, principal: ui_session.Builder, settings: FarmSettings
) -> Response:
    """The build form: the same submission as POST /v1/builds; answers the matrix, which then updates itself."""
    form = await request.form()
    targets, spec, queue_anyway = spec_from_form(form)

    def submit_and_render() -> Response:
        build_id = services.submit_build(
            settings,
            model_id,
            targets,
            spec,
            principal.project,
            token_id=principal.family_id,
            queue_without_worker=queue_anyway or None,
        )
        with session_scope(settings) as s:  # the template renders here, while the rows are loaded
            return page(
                request, "fragments/matrix.html", submitted=build_id, **_model_context(s, settings, model_id, principal)
            )

    return await run_in_threadpool(submit_and_render)


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

"""POST/GET /v1/builds, and /v1/sweeps: a grid of build variants, each built, benchmarked and checked; the best
marked."""

from __future__ import annotations

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import Response

from api.http import buildwait
from api.http.auth import Authorized, Tenant
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import ID_MAX, UNPROCESSABLE, RowId, check_body_id, page_offset
from api.schemas.builds import BuildOut, BuildRequest, SweepOut, SweepRequest, build_out
from api.services import admission, reports
from api.services import builds as services
from api.services.answers import matches
from storage import catalog
from storage.db import session_scope
from storage.tables import BuildRow

router = APIRouter(route_class=CatalogRoute, prefix="/v1/builds", tags=["builds"], responses=UNPROCESSABLE)
sweeps = APIRouter(route_class=CatalogRoute, prefix="/v1/sweeps", tags=["sweeps"], responses=UNPROCESSABLE)


@router.post("", status_code=202, response_model=BuildOut, responses=admission.RESPONSES)
def submit_build(body: BuildRequest, tenant: Tenant, principal: Authorized, settings: FarmSettings) -> BuildOut:
    """Queue one build task per target; a target already built with identical inputs is answered at once.
    409 for a target no live worker serves unless ``queue_without_worker``; 429 past a queue limit."""
    check_body_id("model_id", body.model_id)

    def describe(row: BuildRow, served: dict[str, set[str]]) -> BuildOut:
        return build_out(row, {t.id: services.wait_reason(t.target, t.state, served, row.quantize) for t in row.tasks})

    return services.submit_build(
        settings,
        body.model_id,
        body.targets,
        body.spec,
        tenant,
        token_id=principal.family_id,
        queue_without_worker=body.queue_without_worker,
        describe=describe,
    )


@router.get("", response_model=list[BuildOut])
def list_builds(
    tenant: Tenant,
    session: CatalogSession,
    settings: FarmSettings,
    model_id: int | None = Query(None, ge=1, le=ID_MAX),
    spec_hash: str | None = Query(None, pattern=r"^[0-9a-f]{64}$"),
    limit: int = 50,
    offset: int = 0,
) -> list[BuildOut]:
    """Builds, newest first; optionally of one model version and one spec."""
    rows = catalog.list_builds(
        session,
        model_id=model_id,
        spec_hash=spec_hash,
        limit=max(1, min(limit, 500)),
        offset=page_offset(offset),
        project=tenant,
    )
    return [services.answer_of(session, settings, r) for r in rows]


@router.get(
    "/{build_id}",
    response_model=BuildOut,
    responses={304: {"description": "nothing changed since the answer whose ETag If-None-Match names, for `wait` s"}},
)
async def get_build(
    build_id: RowId,
    tenant: Tenant,
    request: Request,
    settings: FarmSettings,
    wait: float = Query(
        0,
        ge=0,
        le=buildwait.WAIT_MAX_S,
        allow_inf_nan=False,
        description="with If-None-Match: answer as soon as the build's answer differs from the one held, or 304 "
        "after this many seconds (a long poll; see the ETag of each answer)",
    ),
    seen: str | None = Query(
        None,
        max_length=100,
        description="the ETag held, for a client behind a caching proxy that drops If-None-Match (nginx's "
        "proxy_cache does): waits as If-None-Match does, and answers 200 with the same answer after the wait",
    ),
    if_none_match: str | None = Header(None),
) -> Response:
    """A build, its tasks and their checks, with an ETag. With ``wait`` and ``If-None-Match`` (or ``seen``), a
    long poll."""

    def read() -> bytes:
        with session_scope(settings) as session:
            return services.build_of(session, settings, build_id, tenant).model_dump_json().encode()

    held = if_none_match or seen
    body, tag = await buildwait.next_answer(read, held, wait, request.app.state.build_feed, request)
    if matches(if_none_match, tag):
        return Response(status_code=304, headers={"ETag": tag})
    return Response(body, media_type="application/json", headers={"ETag": tag})


@sweeps.post("", status_code=202, response_model=SweepOut, responses=admission.RESPONSES)
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


@sweeps.get("/{sweep_id}", response_model=SweepOut)
def get_sweep(sweep_id: RowId, tenant: Tenant, session: CatalogSession, settings: FarmSettings) -> SweepOut:
    return SweepOut(**reports.sweep_report(session, settings, sweep_id, tenant))

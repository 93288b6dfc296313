"""Workers and queues (live workers, what they serve, queue depth, tasks no worker can take) and tokens (admins)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import RedirectResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api.http.auth import revoke_now
from api.http.deps import CatalogRoute, CatalogSession, FarmSettings
from api.http.params import RowId
from api.schemas import WorkerOut
from api.schemas.tokens import TokenIn
from api.services import tokens
from api.ui import session as ui_session
from api.ui.render import HEADERS, page
from enginefarm.core.errors import SpecInvalid
from storage import liveness
from storage.observe import queue_state
from storage.tokens import Principal

router = APIRouter(prefix="/ui", route_class=CatalogRoute)


@router.get("/workers")
def workers_page(
    request: Request, principal: ui_session.Viewer, session: CatalogSession, settings: FarmSettings
) -> Response:
    workers = [WorkerOut.of(r) for r in liveness.live_workers(session, settings.worker_ttl_seconds)]
    state = queue_state(session, settings.worker_ttl_seconds)
    queues = []
    for (kind, target), (count, oldest) in sorted(state.waiting.items()):
        live = (state.live_workers if kind == "build" else state.live_bench_workers).get(target, 0)
        queues.append({"kind": kind, "target": target, "count": count, "oldest_s": oldest, "workers": live})
    targets = sorted(set(state.live_workers) | set(state.live_bench_workers))
    served = [
        {"target": t, "build": state.live_workers.get(t, 0), "bench": state.live_bench_workers.get(t, 0)}
        for t in targets
    ]
    return page(
        request,
        "workers.html",
        workers=workers,
        queues=queues,
        targets=served,
        orphans=[q for q in queues if not q["workers"]],
        now=datetime.now(timezone.utc),
        ttl=settings.worker_ttl_seconds,
    )


async def _admin_form(request: Request) -> Principal:
    principal = await ui_session.admin(request)
    await ui_session.check_csrf(request)
    return principal


AdminForm = Annotated[Principal, Depends(_admin_form)]


@router.get("/tokens")
def tokens_page(request: Request, principal: ui_session.Admin, session: CatalogSession) -> Response:
    return page(request, "tokens.html", tokens=tokens.listed(session, principal.project), made=None)


@router.post("/tokens")
async def make_token(request: Request, principal: AdminForm, session: CatalogSession) -> Response:
    form = await request.form()
    days = str(form.get("expires_in_days") or "").strip()
    try:
        body = TokenIn(
            name=str(form.get("name") or ""),
            scopes=[str(form.get("scope") or "read")],
            expires_in_days=float(days) if days else None,
            project=str(form.get("project") or "").strip() or None,
        )
    except (ValidationError, ValueError) as exc:
        raise SpecInvalid(f"the token form is not valid: {exc}") from None

    def make() -> Response:
        made = tokens.made(session, body, principal.project)
        session.commit()
        return page(request, "tokens.html", tokens=tokens.listed(session, principal.project), made=made)

    return await run_in_threadpool(make)


@router.post("/tokens/{token_id}/revoke")
async def revoke_token(request: Request, token_id: RowId, principal: AdminForm, session: CatalogSession) -> Response:
    def revoke() -> None:
        revoke_now(request.app.state.token_cache, session, token_id, principal.project)  # commits, then forgets

    await run_in_threadpool(revoke)
    return RedirectResponse("/ui/tokens", status_code=303, headers=HEADERS)

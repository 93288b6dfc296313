"""POST/GET/DELETE /v1/tokens: API tokens, for admins. The token itself is shown once, in the POST answer.
GET /v1/tokens/current: what the asking token may do, for any valid token."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.http.auth import Authorized, Tenant, revoke_now
from api.http.deps import CatalogRoute, CatalogSession
from api.http.params import UNPROCESSABLE, RowId
from api.schemas.tokens import CurrentTokenOut, NewTokenOut, TokenIn, TokenOut
from api.services import tokens as tokens_service

router = APIRouter(route_class=CatalogRoute, prefix="/v1/tokens", tags=["tokens"], responses=UNPROCESSABLE)


@router.post("", status_code=201, response_model=NewTokenOut)
def new_token(body: TokenIn, tenant: Tenant, session: CatalogSession) -> NewTokenOut:
    """A new token, shown once. An admin of one project makes tokens of that project only."""
    return tokens_service.made(session, body, tenant)


@router.get("/current", response_model=CurrentTokenOut)
def current_token(principal: Authorized) -> CurrentTokenOut:
    """The asking token's name, scope and project: what it may do, asked by any valid token. A client checks it
    before sending a large upload that the token may not make (the 403 would come only after the last byte)."""
    return CurrentTokenOut(
        name=principal.name, scope=principal.scope, project=principal.project, expires_at=principal.expires_at
    )


@router.get("", response_model=list[TokenOut])
def tokens(tenant: Tenant, session: CatalogSession) -> list[TokenOut]:
    return tokens_service.listed(session, tenant)


@router.delete("/{token_id}", response_model=TokenOut)
def revoke(token_id: RowId, tenant: Tenant, request: Request, session: CatalogSession) -> TokenOut:
    """Revoke a token, and the dashboard sessions it opened. Committed before it answers: this API process refuses
    the token in every request that starts after the answer; the farm's other API processes (``--workers N``,
    other replicas) as soon as the commit's notification reaches them on PostgreSQL, and within
    ENGINEFARM_TOKEN_CACHE_SECONDS (at most 5 s) on SQLite."""
    return TokenOut.of(revoke_now(request.app.state.token_cache, session, token_id, tenant))

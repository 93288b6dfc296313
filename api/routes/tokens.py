"""POST/GET/DELETE /v1/tokens: API tokens, for admins. The token itself is shown once, in the POST answer."""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from api.deps import session_dep
from api.routes import UNPROCESSABLE, RowId
from storage.db import as_utc
from storage.tables import ApiTokenRow
from storage.tokens import create_token, list_tokens, revoke_token, token_state

router = APIRouter(prefix="/v1/tokens", tags=["tokens"], responses=UNPROCESSABLE)


class TokenIn(BaseModel):
    name: str = Field(min_length=1, max_length=100, pattern=r"^[^\x00]*$")
    scopes: list[str] = Field(min_length=1, max_length=3, description="read, build and/or admin")
    expires_in_days: float | None = Field(default=None, gt=0, le=3650)


class TokenOut(BaseModel):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    state: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None

    @classmethod
    def of(cls, row: ApiTokenRow) -> TokenOut:
        return cls(id=row.id, name=row.name, prefix=row.prefix, scopes=row.scopes, state=token_state(row),
                   created_at=as_utc(row.created_at), expires_at=as_utc(row.expires_at),
                   last_used_at=as_utc(row.last_used_at))


class NewTokenOut(TokenOut):
    token: str = Field(description="the token; it is not stored and cannot be shown again")


@router.post("", status_code=201, response_model=NewTokenOut)
def new_token(body: TokenIn, session: Session = Depends(session_dep, scope="function")) -> NewTokenOut:
    expires = timedelta(days=body.expires_in_days) if body.expires_in_days else None
    row, token = create_token(session, body.name, body.scopes, expires)
    return NewTokenOut(**TokenOut.of(row).model_dump(), token=token)


@router.get("", response_model=list[TokenOut])
def tokens(session: Session = Depends(session_dep, scope="function")) -> list[TokenOut]:
    return [TokenOut.of(r) for r in list_tokens(session)]


@router.delete("/{token_id}", response_model=TokenOut)
def revoke(token_id: RowId, session: Session = Depends(session_dep, scope="function")) -> TokenOut:
    return TokenOut.of(revoke_token(session, token_id))

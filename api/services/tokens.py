"""API tokens for a project's admin: the list, and a new one (its secret shown once). Revoking goes through
``api.http.auth.revoke_now``, which also drops the token from the process's cache."""

from __future__ import annotations

from sqlalchemy.orm import Session

from api.schemas.tokens import NewTokenOut, TokenIn, TokenOut
from enginefarm.core.errors import Forbidden
from storage.tokens import create_token, lifetime, list_tokens


def listed(session: Session, project: str | None) -> list[TokenOut]:
    """Every token, or only the project's for an admin of one project."""
    return [TokenOut.of(r) for r in list_tokens(session, project)]


def made(session: Session, body: TokenIn, project: str | None) -> NewTokenOut:
    """A new token, shown once. An admin of one project makes tokens of that project only."""
    if project is not None and body.project not in (None, project):
        raise Forbidden(f"this token belongs to project {project!r}; it cannot make tokens of project {body.project!r}")
    row, token = create_token(
        session,
        body.name,
        body.scopes,
        lifetime(body.expires_in_days),
        project if project is not None else body.project,
    )
    return NewTokenOut(**TokenOut.of(row).model_dump(), token=token)

"""API tokens: made once, stored as a sha256, checked on every request.

A token is 32 random bytes (``secrets.token_urlsafe``) behind the ``ef_`` prefix, so a fast hash is the right
one: nobody can guess such a token from its hash, and checking it costs one indexed lookup. Scopes nest:
``admin`` can do what ``build`` can, and ``build`` what ``read`` can.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, or_, select, update
from sqlalchemy.orm import Session

from enginefarm.core.domain import SCOPES
from enginefarm.core.errors import NotFound, SignInsTooFast, SpecInvalid
from enginefarm.core.names import project_problem
from storage.db import as_utc
from storage.tables import ApiTokenRow, utcnow

TOKENS_CHANNEL = "enginefarm_tokens"  # PostgreSQL's NOTIFY channel for revocations (storage/changes.py)
TOKEN_PREFIX = "ef_"
MAX_TOKEN_CHARS = 200
# A token that is gone before a client can use it is a mistake.
MIN_LIFETIME = timedelta(seconds=1)
MAX_LIFETIME_DAYS = 3650
# Recording every use would be a write per request; once a minute is enough to tell stale tokens.
LAST_USED_RESOLUTION = timedelta(minutes=1)
SIGN_IN_WINDOW = timedelta(minutes=1)
# Live sessions one token may hold at once; signing in past it ends the oldest. With the sign-in rate and the
# removal of ended sessions, this bounds the rows sessions take: at most this many per token.
MAX_SESSIONS_PER_TOKEN = 50


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def rank(scope: str) -> int:
    return SCOPES.index(scope)


@dataclass(frozen=True)
class Principal:
    """Who a request acts as."""

    token_id: int | None
    name: str
    scope: str  # the highest scope the token has
    project: str | None = None  # None: the whole farm; else the one project whose models it sees
    expires_at: datetime | None = None  # None: until revoked
    parent_id: int | None = None  # a dashboard session: the token that opened it

    def allows(self, needed: str) -> bool:
        return rank(self.scope) >= rank(needed)

    @property
    def family_id(self) -> int | None:
        """The token whose quotas this one counts against: for a dashboard session, the token that opened it, so
        signing in again never buys a fresh allowance; for any other token, itself."""
        return self.parent_id or self.token_id


ANONYMOUS = Principal(None, "anonymous", "read")


def check_scopes(scopes: list[str]) -> str:
    """The highest of ``scopes``; a SpecInvalid naming any unknown one."""
    unknown = [s for s in scopes if s not in SCOPES]
    if unknown or not scopes:
        raise SpecInvalid(
            f"unknown scope {', '.join(map(repr, unknown))}: choose from {', '.join(SCOPES)}"
            if unknown
            else f"a token needs a scope: one of {', '.join(SCOPES)}"
        )
    return max(scopes, key=rank)


def check_project(project: str | None) -> str | None:
    """A project name as given, or a SpecInvalid that says what a name may hold."""
    if project is not None and (problem := project_problem(project)):
        raise SpecInvalid(problem)
    return project


def lifetime_problem(days: float) -> str | None:
    """Why a token cannot live ``days`` days, or None."""
    smallest = MIN_LIFETIME / timedelta(days=1)
    if math.isfinite(days) and smallest <= days <= MAX_LIFETIME_DAYS:
        return None
    return (
        f"a token must live at least {MIN_LIFETIME.total_seconds():g} second ({smallest:.3g} days) and at most "
        f"{MAX_LIFETIME_DAYS} days, not {days!r}; leave it out for a token that lasts until revoked"
    )


def lifetime(days: float | None) -> timedelta | None:
    """A token lifetime given in days (None: until revoked), or a SpecInvalid that says what is allowed."""
    if days is None:
        return None
    if problem := lifetime_problem(days):
        raise SpecInvalid(problem)
    return timedelta(days=days)


def create_token(
    session: Session,
    name: str,
    scopes: list[str],
    expires_in: timedelta | None = None,
    project: str | None = None,
    parent_id: int | None = None,
) -> tuple[ApiTokenRow, str]:
    """A new token; returns its row and the token itself, which is never stored and cannot be shown again.
    A token of a project sees and builds only that project's models; without one it acts on the whole farm.
    ``parent_id``: the token that opened this one (a dashboard session), whose revocation revokes it too."""
    check_scopes(scopes)
    check_project(project)
    if not name or len(name) > 100:
        raise SpecInvalid("a token name needs 1 to 100 characters")
    now = utcnow()
    expires_at = now + expires_in if expires_in is not None else None
    if expires_at is not None and expires_at <= now:
        assert expires_in is not None  # expires_at is set only from it
        raise SpecInvalid(
            f"a token's expiry must be in the future, and a lifetime of {expires_in.total_seconds():g} "
            f"seconds puts it at the moment it is made; give at least {MIN_LIFETIME.total_seconds():g} "
            "second, or none for a token that lasts until revoked"
        )
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiTokenRow(
        name=name,
        token_hash=hash_token(token),
        prefix=token[:10],
        scopes=sorted(set(scopes), key=rank),
        expires_at=expires_at,
        project=project,
        parent_id=parent_id,
    )
    session.add(row)
    session.flush()
    return row, token


def authenticate(session: Session, token: str) -> Principal | None:
    """The principal a token stands for; None if it is unknown, revoked or expired."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
        return None
    row = session.scalar(select(ApiTokenRow).where(ApiTokenRow.token_hash == hash_token(token)))
    now = utcnow()
    if row is None or row.revoked_at is not None or (row.expires_at and as_utc(row.expires_at) <= now):
        return None
    if row.last_used_at is None or as_utc(row.last_used_at) < now - LAST_USED_RESOLUTION:
        session.execute(update(ApiTokenRow).where(ApiTokenRow.id == row.id).values(last_used_at=now))
    return Principal(row.id, row.name, check_scopes(row.scopes), row.project, as_utc(row.expires_at), row.parent_id)


def open_session(
    session: Session, principal: Principal, name: str, lifetime: timedelta, per_minute: int
) -> tuple[ApiTokenRow, str]:
    """A dashboard session for ``principal``'s token family: a token of its own with the same scope and project,
    counted against the family's quotas. Raises SignInsTooFast (with the seconds to wait) once the family opened
    ``per_minute`` sessions in the last minute (signed out or not). Ended sessions older than that minute are
    removed first, and past ``MAX_SESSIONS_PER_TOKEN`` sessions the oldest are ended."""
    root = principal.family_id
    now = utcnow()
    # Sign-ins of one token take turns (a row lock on PostgreSQL; SQLite has one writer anyway), so two at once
    # cannot both pass the count.
    session.scalars(select(ApiTokenRow.id).where(ApiTokenRow.id == root).with_for_update()).first()
    # Sessions of the last minute stay, ended or not: signing out and in again must not reset the count.
    remove_ended_sessions(session, now, opened_before=now - SIGN_IN_WINDOW)
    opened = sorted(
        as_utc(t)
        for t in session.scalars(
            select(ApiTokenRow.created_at).where(
                ApiTokenRow.parent_id == root, ApiTokenRow.created_at > now - SIGN_IN_WINDOW
            )
        )
    )
    if len(opened) >= per_minute:
        wait = opened[len(opened) - per_minute] + SIGN_IN_WINDOW - now
        raise SignInsTooFast(
            f"token '{principal.name}' opened {len(opened)} sessions in the last minute, the most one "
            f"token may (ENGINEFARM_SIGNIN_PER_MINUTE_PER_TOKEN): sign in again later",
            retry_after=max(1, math.ceil(wait.total_seconds())),
        )
    live = list(
        session.scalars(
            select(ApiTokenRow.id)
            .where(ApiTokenRow.parent_id == root)
            .order_by(ApiTokenRow.id.desc())
            .offset(MAX_SESSIONS_PER_TOKEN - 1)
        )
    )
    if live:
        session.execute(delete(ApiTokenRow).where(ApiTokenRow.id.in_(live)))
    return create_token(session, name, [principal.scope], lifetime, principal.project, parent_id=root)


def remove_ended_sessions(session: Session, now: datetime | None = None, opened_before: datetime | None = None) -> int:
    """Delete dashboard sessions that were revoked or have expired (they can never be used again), only those
    opened before ``opened_before`` if given; returns how many. Tokens made by hand stay, listed as revoked or
    expired. Sign-in calls it; a periodic sweep may too."""
    now = now or utcnow()
    ended = delete(ApiTokenRow).where(
        ApiTokenRow.parent_id.is_not(None), or_(ApiTokenRow.revoked_at.is_not(None), ApiTokenRow.expires_at <= now)
    )
    if opened_before is not None:
        ended = ended.where(ApiTokenRow.created_at < opened_before)
    return cast("CursorResult[Any]", session.execute(ended)).rowcount or 0


def list_tokens(session: Session, project: str | None = None) -> list[ApiTokenRow]:
    """Every token, or only those of ``project`` (what a project's admin may see)."""
    query = select(ApiTokenRow).order_by(ApiTokenRow.id)
    return list(session.scalars(query if project is None else query.where(ApiTokenRow.project == project)))


def revoke_token(session: Session, token_id: int, project: str | None = None) -> ApiTokenRow:
    """Revoke a token and the dashboard sessions it opened. On PostgreSQL the commit also tells every API process
    (``NOTIFY enginefarm_tokens`` with the token's id, delivered only if the transaction commits), whose token
    caches drop it at once (``storage.changes``)."""
    row = session.get(ApiTokenRow, token_id)
    if row is None or (project is not None and row.project != project):
        raise NotFound(f"no token with id {token_id}")
    now = utcnow()
    if row.revoked_at is None:
        row.revoked_at = now
    # The dashboard sessions it opened end with it.
    session.execute(
        update(ApiTokenRow)
        .where(ApiTokenRow.parent_id == row.id, ApiTokenRow.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_notify(TOKENS_CHANNEL, str(row.id))))
    return row


def token_state(row: ApiTokenRow, now: datetime | None = None) -> str:
    now = now or utcnow()
    if row.revoked_at is not None:
        return "revoked"
    if row.expires_at is not None and as_utc(row.expires_at) <= now:
        return "expired"
    return "active"

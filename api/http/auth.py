"""Who may do what: every request but /healthz carries an API token (``Authorization: Bearer ef_…``).

Reads need ``read`` (or nothing, where the deployment sets ``ENGINEFARM_ANONYMOUS_READ``), a deploy machine's
measurements of an engine need ``measure``, other writes ``build``, managing tokens needs ``admin``. The check
runs before the body is read, so an unauthenticated upload is refused before a byte of it is stored.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from datetime import datetime, timezone
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from enginefarm.core.domain import SCOPES
from enginefarm.core.errors import Forbidden, Unauthorized
from storage.db import session_scope
from storage.tables import ApiTokenRow
from storage.tokens import ANONYMOUS, Principal, authenticate, hash_token, revoke_token

log = logging.getLogger(__name__)
bearer = HTTPBearer(auto_error=False, description=f"an API token: `enginefarm token create --scope {'|'.join(SCOPES)}`")
READ_METHODS = {"GET", "HEAD", "OPTIONS"}
READ_POSTS = {"/v1/resolve"}  # a query sent as a body: still a read
CURRENT_TOKEN = "/v1/tokens/current"
MEASUREMENTS = re.compile(r"/v1/engines/[0-9]+/measurements")


def needed_scope(request: Request) -> str:
    path = request.url.path
    if path == CURRENT_TOKEN:  # any valid token may ask what it may do
        return "read"
    if path.startswith("/v1/tokens"):
        return "admin"
    if request.method in READ_METHODS or path in READ_POSTS:
        return "read"
    if MEASUREMENTS.fullmatch(path):  # a deploy machine's figures of an engine
        return "measure"
    return "build"


class TokenCache:
    """Principals of tokens seen in the last ``seconds``, so a fleet's requests skip the token lookup.

    A revocation through this process (``revoke_now``) is refused by every request that starts after it answered:
    the cache forgets a token only once its revocation has committed, and a lookup takes a ``ticket`` before it
    reads the catalog, so ``put`` refuses what it read where the token (or the token that opened it) was forgotten
    since. Another process's revocation comes through the catalog's change feed on PostgreSQL (``storage.changes``
    calls ``forget``; a feed that reconnects calls ``forget_all``); on SQLite, and for a token's expiry, by time only,
    within ``seconds`` (ENGINEFARM_TOKEN_CACHE_SECONDS). Unknown tokens are never cached.

    A token in use is looked up again in the background in the last ``REFRESH_S`` of its entry's life
    (``refresh_soon``), one lookup at a time, so its entry does not lapse under a steady stream of requests; a
    refresh takes its ticket when it is due, so it never undoes a revocation either."""

    REFRESH_S = 1.0
    MAX_FORGOTTEN = 10_000  # revocations told apart; past it, a lookup older than all of them caches nothing

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._refreshing: dict[str, int] = {}  # token hash → the ticket its refresh took
        self._forgets = 0  # moves with every forget: a ticket is its value
        self._forgotten: dict[int, int] = {}  # token id → the value of _forgets its last forget gave
        self._floor = 0  # forgets up to this one are no longer told apart
        self._lock = threading.Lock()

    def get(self, token_hash: str) -> Principal | None:
        entry = self._entries.get(token_hash)
        if entry is None or entry[1] <= time.monotonic():
            return None
        return entry[0]

    def ticket(self) -> int:
        """Take one before reading the catalog, and pass it to ``put`` with what was read."""
        return self._forgets

    def put(self, token_hash: str, principal: Principal, ticket: int | None = None) -> bool:
        """Keep a principal read from the catalog; with ``ticket``, only if its token (or the token that opened
        it) has not been forgotten since the ticket was taken. Whether it was kept."""
        if self.seconds <= 0:
            return False
        keep = self.seconds
        if principal.expires_at is not None:  # never past the token's own expiry
            keep = min(keep, (principal.expires_at - datetime.now(timezone.utc)).total_seconds())
        with self._lock:  # the check and the insert, atomic with respect to forget
            if ticket is not None and self._forgotten_since(principal, ticket):
                return False
            if len(self._entries) > 10_000:  # tokens come and go: drop the stale ones now and then
                now = time.monotonic()
                self._entries = {k: v for k, v in self._entries.items() if v[1] > now}
            self._entries[token_hash] = (principal, time.monotonic() + keep)
            return True

    def _forgotten_since(self, principal: Principal, ticket: int) -> bool:
        if ticket < self._floor:  # older than the revocations still told apart: it may have missed one
            return True
        return any(
            token_id is not None and self._forgotten.get(token_id, -1) > ticket
            for token_id in (principal.token_id, principal.parent_id)
        )

    def due(self, token_hash: str) -> bool:
        """Whether this token's entry is in its last ``REFRESH_S`` and no refresh of it runs: then the caller
        refreshes it (and must call ``refreshed``)."""
        entry = self._entries.get(token_hash)
        if entry is None or entry[1] - time.monotonic() > min(self.REFRESH_S, self.seconds / 2):
            return False
        with self._lock:
            if token_hash in self._refreshing:
                return False
            self._refreshing[token_hash] = self._forgets  # its ticket: taken before the lookup reads
            return True

    def refreshed(self, token_hash: str, principal: Principal | None, looked_up: bool = True) -> None:
        """The outcome of a refresh: the principal as the catalog has it now, or None (revoked, expired); with
        ``looked_up`` false the lookup failed, and the entry is left to lapse."""
        with self._lock:
            began = self._refreshing.pop(token_hash, None)
            if principal is None and looked_up:
                self._entries.pop(token_hash, None)
        # A revocation through this process while the lookup ran is not undone by what the lookup read before it.
        if principal is not None and began is not None:
            self.put(token_hash, principal, began)

    def forget(self, token_id: int) -> None:
        """Drop a revoked token, and the dashboard sessions it opened, which its revocation revoked too; and refuse
        what any lookup that began before now reads of them. Call it once the revocation has committed."""
        with self._lock:
            self._forgets += 1
            if len(self._forgotten) >= self.MAX_FORGOTTEN:
                self._forgotten.clear()
                self._floor = self._forgets - 1  # a ticket older than the forgets cleared caches nothing
            self._forgotten[token_id] = self._forgets
            self._entries = {k: v for k, v in self._entries.items() if token_id not in (v[0].token_id, v[0].parent_id)}

    def forget_all(self) -> None:
        """Drop every entry, and refuse what any lookup that began before now reads: a revocation may have gone
        unheard (the change feed was not listening)."""
        with self._lock:
            self._forgets += 1
            self._forgotten.clear()
            self._floor = self._forgets
            self._entries = {}


def revoke_now(cache: TokenCache, session: Session, token_id: int, project: str | None = None) -> ApiTokenRow:
    """Revoke a token (and the dashboard sessions it opened), commit, then drop it from this process's cache:
    every revocation through the API process goes through here (DELETE /v1/tokens/{id}, the dashboard, signing
    out). Once it returns, no request that starts in this process accepts the token; other processes accept it
    for at most ``TokenCache.seconds`` more."""
    row = revoke_token(session, token_id, project)
    session.commit()  # before the cache forgets: a lookup in between would read the token valid and keep it
    cache.forget(token_id)
    return row


async def cached_principal(cache: TokenCache, settings, token: str) -> Principal | None:
    """The principal of a token (an API token or a dashboard session credential): from the cache, else looked
    up in the catalog (on a thread) and kept unless it was revoked while the lookup ran. None: unknown, revoked or
    expired. On the event loop."""
    key = hash_token(token)
    principal = cache.get(key)
    if principal is not None:
        refresh_soon(cache, settings, key, token)
        return principal
    ticket = cache.ticket()  # before the catalog is read
    principal = await anyio.to_thread.run_sync(_lookup, settings, token)
    if principal is not None:
        cache.put(key, principal, ticket)
    return principal


def refresh_soon(cache: TokenCache, settings, token_hash: str, token: str) -> None:
    """Look the token up again in the background if its entry is about to lapse (``TokenCache.due``); on the
    event loop."""
    if not cache.due(token_hash):
        return

    async def refresh() -> None:
        try:
            principal = await anyio.to_thread.run_sync(_lookup, settings, token)
        except Exception:  # the catalog unavailable: the entry lapses as it would have
            log.debug("token refresh failed", exc_info=True)
            cache.refreshed(token_hash, None, looked_up=False)
        else:
            cache.refreshed(token_hash, principal)

    task = asyncio.get_running_loop().create_task(refresh())
    _REFRESHES.add(task)  # a task nobody holds may be collected before it ends
    task.add_done_callback(_REFRESHES.discard)


_REFRESHES: set[asyncio.Task] = set()


def _challenge(message: str) -> Unauthorized:
    exc = Unauthorized(message)
    exc.headers = {"WWW-Authenticate": 'Bearer realm="enginefarm"'}
    return exc


def _lookup(settings, token: str) -> Principal | None:
    with session_scope(settings) as session:
        return authenticate(session, token)


async def authorize(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
    """The request's principal, or a 401/403 that says what is missing. Never echoes the token.

    On the event loop: a token in the cache costs no thread hop; only a lookup in the catalog takes a thread."""
    settings = request.app.state.settings
    needed = needed_scope(request)
    header = request.headers.get("authorization")
    if credentials is None:
        if header is not None:
            raise _challenge("the Authorization header must be 'Bearer <token>'")
        if needed == "read" and settings.anonymous_read:
            return ANONYMOUS
        raise _challenge(
            f"this request needs an API token with scope '{needed}': send 'Authorization: Bearer "
            f"<token>' (an admin makes one with `enginefarm token create --scope {needed}`)"
        )
    principal = await cached_principal(request.app.state.token_cache, settings, credentials.credentials)
    if principal is None:
        raise _challenge("the API token is not valid: it is unknown, revoked or expired")
    require(principal, needed, f"{request.method} {request.url.path}")
    return principal


async def project_dep(principal: Principal = Depends(authorize)) -> str | None:
    """The project a request is limited to: its token's (``None`` for a token of the whole farm)."""
    return principal.project


# The request's principal (``authorize``).
Authorized = Annotated[Principal, Depends(authorize)]
# A route's ``tenant``: pass it to every catalog lookup, which then sees only that project's models.
Tenant = Annotated[str | None, Depends(project_dep)]


def require(principal: Principal, needed: str, what: str) -> None:
    if not principal.allows(needed):
        raise Forbidden(f"token '{principal.name}' has scope '{principal.scope}'; {what} needs '{needed}'")

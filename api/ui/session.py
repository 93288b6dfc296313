"""Browser sessions for the dashboard: sign-in, the session cookie, and CSRF tokens.

A session is an API token of its own, made at sign-in (``storage.tokens.open_session``) with the signing-in token's
scope and project, for at most ``SESSION_HOURS`` and never past that token's own expiry. The typed token is never
stored in the browser; the session is looked up, cached and revoked as any token is, and ends when the user signs
out or the token that opened it is revoked. Its cookie is HttpOnly, SameSite=Strict, scoped to ``/ui``, and Secure
where the client reached the farm over https (the request's scheme, which uvicorn takes from ``X-Forwarded-Proto``
only from ``ENGINEFARM_FORWARDED_ALLOW_IPS``, or an https ``ENGINEFARM_API_URL``).

Sign-in is rate-limited: per token (``ENGINEFARM_SIGNIN_PER_MINUTE_PER_TOKEN``, counted in the catalog) and per client
address (``ENGINEFARM_SIGNIN_PER_MINUTE_PER_ADDRESS``, counted by each API process); past either, a 429 with
Retry-After. A session counts against the quotas of the token that opened it (``Principal.family_id``).

CSRF: every form that changes anything carries ``csrf_token(session)``, an HMAC of a fixed label keyed by the
session credential, checked on POST. The sign-in form, which has no session yet, uses a double-submit value: a
random cookie the form repeats.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import socket
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated

import anyio
from fastapi import Depends, Request, Response
from starlette.datastructures import UploadFile

from api.http.auth import TokenCache, cached_principal, require, revoke_now
from enginefarm.core.errors import EnginefarmError, Forbidden, SignInsTooFast
from storage.db import session_scope
from storage.tables import utcnow
from storage.tokens import Principal, authenticate, open_session

COOKIE = "ef_session"
SIGNIN_COOKIE = "ef_signin"
CSRF_FIELD = "csrf"
CSRF_HEADER = "x-csrf-token"
SESSION_HOURS = 12
PATH = "/ui"
SESSION_PREFIX = "browser session of "


class SignInNeeded(EnginefarmError):
    """No valid session: a page redirects to the sign-in form, a fragment or an upload gets a 401."""

    status_code = 401


class CsrfRefused(Forbidden):
    """A form post without the session's CSRF token."""


def csrf_token(credential: str) -> str:
    return hmac.new(credential.encode(), b"enginefarm-ui-csrf", hashlib.sha256).hexdigest()


def _secure(request: Request) -> bool:
    """Whether the browser reached the farm over https (directly, or through a trusted TLS-terminating proxy)."""
    return request.url.scheme == "https" or request.app.state.settings.api_url.lower().startswith("https://")


def set_cookie(response: Response, request: Request, name: str, value: str, max_age: int, path: str = PATH) -> None:
    response.set_cookie(
        name, value, max_age=max_age, path=path, httponly=True, samesite="strict", secure=_secure(request)
    )


def clear_cookie(response: Response, request: Request, name: str, path: str = PATH) -> None:
    response.delete_cookie(name, path=path, httponly=True, samesite="strict", secure=_secure(request))


def new_signin_value() -> str:
    return secrets.token_urlsafe(24)


def check_signin_csrf(request: Request, submitted: str | None) -> None:
    expected = request.cookies.get(SIGNIN_COOKIE)
    if not expected or not submitted or not hmac.compare_digest(expected, submitted):
        raise CsrfRefused("the sign-in form is stale or did not come from this site: reload the sign-in page")


class AddressLimiter:
    """Sign-in attempts per client over the last minute, in this API process, in bounded memory and time.

    A client is its address for IPv4 (and an IPv4-mapped IPv6 address) and its /64 prefix for IPv6, which whoever
    holds one address usually holds whole. At most ``max_keys`` clients are tracked, each with the times of at most
    ``per_minute`` attempts, ordered by their latest attempt, so an attempt's work is O(1).

    When the table is full of clients that tried within the minute, clients it does not hold share one budget,
    ``overflow_per_minute`` attempts a minute: each one admitted evicts the client whose latest attempt is oldest,
    and past the budget they get a 429 (and evict nothing). So a flood of addresses can neither lock out the
    clients in the table nor make more than ``overflow_per_minute`` counts a minute forget.
    """

    WINDOW = 60.0
    MAX_KEYS = 10_000
    OVERFLOW_PER_MINUTE = 600
    # Entries quiet for a minute dropped from the table's old end per attempt, at most: a constant, so no attempt
    # pays for a sweep; one that finds the table full drops a quiet oldest entry before it evicts a live one.
    _EXPIRE_PER_ATTEMPT = 2
    _V4_MAPPED = bytes(10) + b"\xff\xff"  # the first 12 bytes of an IPv4-mapped IPv6 address

    def __init__(
        self,
        max_keys: int = MAX_KEYS,
        overflow_per_minute: int = OVERFLOW_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_keys = max_keys
        self.overflow_per_minute = overflow_per_minute
        self._clock = clock
        self._seen: OrderedDict[str, deque[float]] = OrderedDict()  # by latest counted attempt, oldest first
        self._overflow: deque[float] = deque()  # attempts admitted past a full table in the last minute
        self._lock = threading.Lock()

    @staticmethod
    def key(address: str) -> str:
        """The client an address counts for: the address itself for IPv4, its /64 prefix for IPv6."""
        if ":" not in address:
            return address  # IPv4, or no address ("unknown", a test client's name): itself
        try:
            packed = socket.inet_pton(socket.AF_INET6, address.partition("%")[0])  # without a zone ("%eth0")
        except (OSError, ValueError):
            return address
        if packed[:12] == AddressLimiter._V4_MAPPED:
            return socket.inet_ntop(socket.AF_INET, packed[12:])
        return socket.inet_ntop(socket.AF_INET6, packed[:8] + bytes(8)) + "/64"

    def attempt(self, address: str, per_minute: int) -> None:
        """Count one attempt from ``address``'s client; SignInsTooFast if it already made ``per_minute`` this
        minute, or if the table is full, the client not in it, and the overflow budget spent."""
        client = self.key(address)
        with self._lock:
            now = self._clock()
            horizon = now - self.WINDOW
            seen = self._seen
            for _ in range(self._EXPIRE_PER_ATTEMPT):
                if not seen or next(iter(seen.values()))[-1] > horizon:
                    break
                seen.popitem(last=False)
            times = seen.get(client)
            if times is not None:
                while times and times[0] <= horizon:
                    times.popleft()
                if len(times) >= per_minute:
                    raise SignInsTooFast(
                        f"{len(times)} sign-ins from {client} in the last minute, the most one client address (an "
                        "IPv6 one's /64) may (ENGINEFARM_SIGNIN_PER_MINUTE_PER_ADDRESS): try again later",
                        retry_after=max(1, math.ceil(times[0] + self.WINDOW - now)),
                    )
                times.append(now)
                seen.move_to_end(client)
                return
            if len(seen) >= self.max_keys:
                if next(iter(seen.values()))[-1] <= horizon:
                    seen.popitem(last=False)  # the oldest was quiet for a minute: room without forgetting
                else:
                    self._admit_past_full_table(now, horizon)
                    seen.popitem(last=False)  # evict the live client whose latest attempt is oldest
            seen[client] = deque((now,))

    def _admit_past_full_table(self, now: float, horizon: float) -> None:
        overflow = self._overflow
        while overflow and overflow[0] <= horizon:
            overflow.popleft()
        if len(overflow) >= self.overflow_per_minute:
            raise SignInsTooFast(
                f"over {self.max_keys:,} client addresses tried to sign in within the last minute, and {len(overflow)} "
                "sign-ins came from addresses beyond them, the most this process admits a minute: try again later",
                retry_after=max(1, math.ceil(overflow[0] + self.WINDOW - now)),
            )
        overflow.append(now)


def _open(settings, token: str) -> tuple[Principal, str] | None:
    """Check the typed token and make the session credential; None when the token is not valid."""
    with session_scope(settings) as s:
        principal = authenticate(s, token.strip())
        if principal is None:
            return None
        lifetime = timedelta(hours=SESSION_HOURS)
        if principal.expires_at is not None:
            lifetime = min(lifetime, principal.expires_at - utcnow())
        # A session opened with a session belongs to the same token: revoking that one ends them all, and all
        # count against its quotas.
        _row, credential = open_session(
            s, principal, (SESSION_PREFIX + principal.name)[:100], lifetime, settings.signin_per_minute_per_token
        )
        return principal, credential


async def sign_in(request: Request, token: str) -> tuple[Principal, str] | None:
    """The principal and a new session credential for a typed API token, or None for a token that is not valid.
    Raises SignInsTooFast past the sign-in rate of the client's address or of the token."""
    settings = request.app.state.settings
    limiter = getattr(request.app.state, "signin_addresses", None)
    if limiter is None:
        limiter = request.app.state.signin_addresses = AddressLimiter()
    limiter.attempt(request.client.host if request.client else "unknown", settings.signin_per_minute_per_address)
    if not token or len(token) > 400:
        return None
    return await anyio.to_thread.run_sync(_open, settings, token)


def _close(settings, cache: TokenCache, credential: str) -> None:
    with session_scope(settings) as s:
        principal = authenticate(s, credential)
        if principal is not None and principal.token_id is not None:
            revoke_now(cache, s, principal.token_id)  # as any revocation: committed, then out of the cache


async def sign_out(request: Request) -> None:
    credential = request.cookies.get(COOKIE)
    if credential:
        await anyio.to_thread.run_sync(_close, request.app.state.settings, request.app.state.token_cache, credential)


async def current(request: Request) -> Principal | None:
    """The signed-in principal of this request, or None. Uses the API's token cache and its revocation rules
    (``api.http.auth.TokenCache``)."""
    credential = request.cookies.get(COOKIE)
    if not credential:
        return None
    principal = await cached_principal(request.app.state.token_cache, request.app.state.settings, credential)
    if principal is not None:
        request.state.csrf = csrf_token(credential)
        request.state.principal = principal
    return principal


async def viewer(request: Request) -> Principal:
    """Dependency of every page: the signed-in principal with at least ``read``."""
    principal = await current(request)
    if principal is None:
        raise SignInNeeded("sign in with an API token to see this page")
    require(principal, "read", f"{request.method} {request.url.path}")
    return principal


async def builder(request: Request) -> Principal:
    """Dependency of every form that changes something: a principal with ``build`` and the CSRF token."""
    principal = await viewer(request)
    await check_csrf(request)
    require(principal, "build", f"{request.method} {request.url.path}")
    return principal


async def admin(request: Request) -> Principal:
    principal = await viewer(request)
    require(principal, "admin", "managing tokens")
    return principal


# A page's principal; a form's that changes something; an admin's.
Viewer = Annotated[Principal, Depends(viewer)]
Builder = Annotated[Principal, Depends(builder)]
Admin = Annotated[Principal, Depends(admin)]


async def check_csrf(request: Request) -> None:
    """The CSRF token from the X-CSRF-Token header (htmx, uploads) or the form's hidden field."""
    submitted: str | UploadFile | None = request.headers.get(CSRF_HEADER)
    if submitted is None and request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        submitted = (await request.form()).get(CSRF_FIELD)
    expected = getattr(request.state, "csrf", None)
    if not expected or not isinstance(submitted, str) or not hmac.compare_digest(expected, submitted):
        raise CsrfRefused("this form did not carry the page's CSRF token: reload the page and submit it again")

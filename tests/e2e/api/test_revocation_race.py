"""A revoked token stops working in this API process as soon as the revocation has answered (api/http/auth.py,
TokenCache): no request sent after the answer is accepted, through the API's DELETE /v1/tokens/{id} or the
dashboard's revoke.

Two ways it went wrong: the cache forgot the token before the revocation committed, so a request in that gap read
the token as valid and cached it again (for ENGINEFARM_TOKEN_CACHE_SECONDS); and a lookup that read the catalog
before the revocation committed put its answer into the cache after the revocation had dropped it. The first
test races requests against revocations as a client would; the others force each interleaving with hooks.

On PostgreSQL (where API processes run) and on the embedded farm's SQLite.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event
from sqlalchemy.orm import Session

from api.app import create_app
from api.http import auth
from api.http.auth import TokenCache
from api.ui.session import COOKIE, csrf_token
from enginefarm.core.config import Settings
from server.embedded import issue_token
from storage.db import session_scope
from storage.tables import ApiTokenRow
from storage.tokens import Principal, create_token
from tests.helpers import unique_name

CURRENT = "/v1/tokens/current"
WAIT_S = 10.0  # for a hook's event: far longer than any step takes


@pytest.fixture
def farm(catalog_settings):
    """The app with an admin token, and a dashboard session of that admin (the client's cookie)."""
    settings = catalog_settings
    with TestClient(create_app(settings)) as http:
        admin = issue_token(settings, "revoker", ["admin"])
        http.headers["Authorization"] = f"Bearer {admin}"
        form = http.get("/ui/signin")
        signin = form.cookies.get("ef_signin")
        answer = http.post("/ui/signin", data={"token": admin, "csrf": signin}, follow_redirects=False)
        assert answer.status_code == 303, answer.text
        yield settings, http


def new_read_token(settings: Settings) -> tuple[int, str]:
    with session_scope(settings) as s:
        row, token = create_token(s, unique_name("reader"), ["read"])
        return row.id, token


def revoke(http: TestClient, token_id: int, path: str) -> None:
    """Revoke through the API or the dashboard; returns once the answer has been received."""
    if path == "api":
        answer = http.delete(f"/v1/tokens/{token_id}")
        assert answer.status_code == 200 and answer.json()["state"] == "revoked", answer.text
    else:
        csrf = csrf_token(http.cookies.get(COOKIE))
        answer = http.post(f"/ui/tokens/{token_id}/revoke", data={"csrf": csrf}, follow_redirects=False)
        assert answer.status_code == 303, answer.text


def use(http: TestClient, token: str) -> int:
    return http.get(CURRENT, headers={"Authorization": f"Bearer {token}"}).status_code


def hammer(http: TestClient, token: str, stop: threading.Event, answers: dict[int, list[float]]) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        answers.setdefault(use(http, token), []).append(sent)


def test_no_request_is_accepted_after_the_revocation_answered(farm):
    """Six threads use a read token while it is revoked, thirty times (half through the API, half through the
    dashboard); every request that was accepted must have been sent before the revocation's answer arrived."""
    settings, http = farm
    late: list[tuple[int, float]] = []  # (revocation, seconds after its answer that an accepted request was sent)
    refused_after = 0
    for i in range(30):
        token_id, token = new_read_token(settings)
        assert use(http, token) == 200  # in the cache now
        stop = threading.Event()
        answers: dict[int, list[float]] = {200: [], 401: []}  # status → when each request was sent
        threads = [threading.Thread(target=hammer, args=(http, token, stop, answers)) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(0.02)
        revoke(http, token_id, "api" if i % 2 == 0 else "dashboard")
        answered = time.monotonic()
        time.sleep(0.1)  # a token cached again after its revocation would be accepted all this time
        stop.set()
        for t in threads:
            t.join()
        assert set(answers) == {200, 401}, f"answers other than 200 and 401: {set(answers) - {200, 401}}"
        late += [(i, sent - answered) for sent in answers[200] if sent > answered]
        refused_after += sum(sent > answered for sent in answers[401])
        if use(http, token) != 401:
            late.append((i, time.monotonic() - answered))
    assert not late, f"{len(late)} requests accepted after their token's revocation answered: {late[:10]}"
    assert refused_after > 0  # the threads did use the token after its revocations


class Paused:
    """A hook that stops its thread at one point until the test lets it go on."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()

    def stop_here(self) -> None:
        self.reached.set()
        assert self.go.wait(WAIT_S), "the test never let the paused thread go on"


@pytest.mark.parametrize("path", ["api", "dashboard"])
def test_a_lookup_that_read_the_token_before_its_revocation_does_not_cache_it_after(farm, monkeypatch, path):
    """A request's token lookup reads the catalog (valid), the revocation commits and answers, then the lookup's
    answer reaches the cache: it must not stay there."""
    settings, http = farm
    token_id, token = new_read_token(settings)
    read = Paused()
    lookup = auth._lookup

    def paused_lookup(settings_, credential):
        principal = lookup(settings_, credential)
        if credential == token and not read.reached.is_set():
            read.stop_here()  # read as valid; not yet in the cache
        return principal

    monkeypatch.setattr(auth, "_lookup", paused_lookup)
    first: list[int] = []
    request = threading.Thread(target=lambda: first.append(use(http, token)))
    request.start()
    assert read.reached.wait(WAIT_S)
    revoke(http, token_id, path)
    read.go.set()
    request.join()
    assert first == [200]  # sent before the revocation: either answer is right, and this one read it valid
    assert use(http, token) == 401, "the token was cached again after its revocation had answered"


@pytest.mark.parametrize("path", ["api", "dashboard"])
def test_a_token_used_while_its_revocation_commits_is_not_cached_again(farm, path):
    """The revocation has written the token as revoked but not committed it; a request then reads it (still
    valid, to every other transaction) and caches it. Once the revocation has answered, the token must be
    refused."""
    settings, http = farm
    token_id, token = new_read_token(settings)
    assert use(http, token) == 200  # in the cache
    committing = Paused()

    def before_flush(session: Session, _context, _instances) -> None:
        if any(isinstance(o, ApiTokenRow) and o.id == token_id and o.revoked_at for o in session.dirty):
            session.info["revokes"] = True

    def before_commit(session: Session) -> None:
        if session.info.pop("revokes", False):
            committing.stop_here()

    event.listen(Session, "before_flush", before_flush)
    event.listen(Session, "before_commit", before_commit)
    try:
        revoking = threading.Thread(target=revoke, args=(http, token_id, path))
        revoking.start()
        assert committing.reached.wait(WAIT_S)
        # Not yet committed: accepted, from the cache or a lookup that reads it valid and caches it.
        assert use(http, token) == 200
        committing.go.set()
        revoking.join()
    finally:
        event.remove(Session, "before_flush", before_flush)
        event.remove(Session, "before_commit", before_commit)
    assert use(http, token) == 401, "the token was cached again after its revocation had answered"


def test_a_lookup_is_kept_unless_its_token_or_the_token_that_opened_it_was_forgotten_since_its_ticket():
    cache = TokenCache(5)
    session = Principal(8, "browser session of fleet", "read", parent_id=7)
    other = Principal(9, "other", "read")
    ticket = cache.ticket()
    cache.forget(9)  # another token's revocation does not hold this one back
    assert cache.put("s", session, ticket) and cache.get("s") == session
    ticket = cache.ticket()
    cache.forget(7)  # revoking the token that opened the session revoked the session too
    assert cache.get("s") is None
    assert not cache.put("s", session, ticket) and cache.get("s") is None
    assert not cache.put("o", other, ticket - 1)  # its ticket is from before 9's forget
    assert cache.put("o", other, cache.ticket())


def test_past_so_many_revocations_a_lookup_older_than_all_it_tells_apart_keeps_nothing(monkeypatch):
    monkeypatch.setattr(TokenCache, "MAX_FORGOTTEN", 3)
    cache = TokenCache(5)
    p = Principal(100, "fleet", "read")
    old = cache.ticket()
    for token_id in (1, 2, 3):
        cache.forget(token_id)
    recent = cache.ticket()
    cache.forget(4)  # clears what it knew of 1 to 3
    assert not cache.put("old", p, old)  # it may have read one of them before its revocation
    assert cache.put("recent", p, recent)  # taken after 1 to 3; 4 is still told apart
    assert not cache.put("recent", Principal(4, "four", "read"), recent)


def test_a_session_looked_up_before_it_signed_out_is_not_cached_after(farm, monkeypatch):
    """Signing out is a revocation too, and a dashboard session's lookup takes the same cache: a page request
    that read the session as valid before the sign-out committed does not keep it in the cache."""
    settings, http = farm
    reader_id, _token = new_read_token(settings)
    with session_scope(settings) as s:
        _row, credential = create_token(s, "browser session of reader", ["read"], timedelta(hours=1), None, reader_id)
    cookie = {"Cookie": f"{COOKIE}={credential}"}
    read = Paused()
    lookup = auth._lookup

    def paused_lookup(settings_, looked_up):
        principal = lookup(settings_, looked_up)
        if looked_up == credential and not read.reached.is_set():
            read.stop_here()
        return principal

    monkeypatch.setattr(auth, "_lookup", paused_lookup)
    first: list[int] = []
    page = threading.Thread(target=lambda: first.append(http.get("/ui/workers", headers=cookie).status_code))
    page.start()
    assert read.reached.wait(WAIT_S)
    signed_out = http.post(
        "/ui/signout", headers={**cookie, "X-CSRF-Token": csrf_token(credential)}, follow_redirects=False
    )
    assert signed_out.status_code == 303, signed_out.text
    read.go.set()
    page.join()
    assert first == [200]
    replay = http.get("/ui/workers", headers=cookie, follow_redirects=False)
    assert replay.status_code == 303 and replay.headers["location"].startswith("/ui/signin"), replay.text

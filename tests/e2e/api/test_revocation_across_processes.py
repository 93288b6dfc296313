"""A revocation reaches every API process at once, not after their token caches lapse (storage/changes.py,
``watch_revocations``): the revocation's commit notifies each process on PostgreSQL, whoever revoked the token
(another API process, or ``enginefarm token revoke`` against the catalog).

Two real API processes on one PostgreSQL catalog, each with the default 5 s token cache. Before the feed carried
revocations, the process that did not revoke went on accepting the token until its entry lapsed (about 4 s here).
"""

from __future__ import annotations

import time

import httpx
import pytest

from enginefarm.core.config import Settings
from server.embedded import Farm, free_port, issue_token
from storage.db import session_scope
from storage.tokens import create_token, revoke_token
from tests.helpers import unique_name

CURRENT = "/v1/tokens/current"
AT_ONCE_S = 1.0  # a NOTIFY arrives within milliseconds; the cache's own bound is 5 s


@pytest.fixture(scope="module")
def two_apis(own_pg, tmp_path_factory):
    data = tmp_path_factory.mktemp("apis")
    env = {
        "ENGINEFARM_DATA_DIR": str(data),
        "ENGINEFARM_BLOB_STORE": "local",
        "ENGINEFARM_DATABASE_URL": own_pg,
        "ENGINEFARM_RECONCILE_SECONDS": "0",
        "ENGINEFARM_GC_INTERVAL_SECONDS": "0",
    }
    settings = Settings(data_dir=data, database_url=own_pg)
    admin = issue_token(settings, "revoker", ["admin"])
    (data / "b").mkdir()
    with Farm(env, port=free_port(), log_dir=data) as a, Farm(env, port=free_port(), log_dir=data / "b") as b:
        a.start_api(timeout=60)
        b.start_api(timeout=60)
        yield settings, admin, a.url, b.url


def new_token(settings: Settings) -> tuple[int, str]:
    with session_scope(settings) as s:
        row, token = create_token(s, unique_name("reader"), ["read"])
        return row.id, token


def warm(urls: list[str], token: str) -> None:
    """Both processes have the token in their caches: each has accepted it."""
    for url in urls:
        for _ in range(3):
            answer = httpx.get(url + CURRENT, headers={"Authorization": f"Bearer {token}"}, timeout=10)
            assert answer.status_code == 200, answer.text


def refused_after(url: str, token: str, since: float, limit: float = 6.0) -> float:
    """Seconds from ``since`` to the first 401 this process gives the token (asked every 20 ms)."""
    with httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        while time.monotonic() - since < limit:
            if http.get(url + CURRENT).status_code == 401:
                return time.monotonic() - since
            time.sleep(0.02)
    return float("inf")


def test_a_revocation_through_one_api_process_reaches_the_other_at_once(two_apis):
    settings, admin, a, b = two_apis
    token_id, token = new_token(settings)
    warm([a, b], token)
    answer = httpx.delete(f"{a}/v1/tokens/{token_id}", headers={"Authorization": f"Bearer {admin}"}, timeout=10)
    assert answer.status_code == 200, answer.text
    revoked = time.monotonic()
    assert refused_after(a, token, revoked) < 0.1  # the process that revoked: at once, as before
    took = refused_after(b, token, revoked)
    assert took < AT_ONCE_S, f"the other API process accepted the revoked token for {took:.2f} s"


def test_a_revocation_made_outside_the_api_reaches_every_process_at_once(two_apis):
    """As `enginefarm token revoke` does it: a session on the catalog, no API process involved."""
    settings, _, a, b = two_apis
    token_id, token = new_token(settings)
    warm([a, b], token)
    with session_scope(settings) as s:
        revoke_token(s, token_id)
    revoked = time.monotonic()
    for url in (a, b):
        took = refused_after(url, token, revoked)
        assert took < AT_ONCE_S, f"{url} accepted the revoked token for {took:.2f} s"

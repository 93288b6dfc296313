"""A token in use is looked up again before its cache entry lapses, so a steady stream of requests never meets the
lapse all at once (api/http/auth.py, TokenCache); a refresh never undoes a revocation, and never stretches an entry on
a failed lookup."""

from __future__ import annotations

from api.http import auth
from api.http.auth import TokenCache
from storage.tokens import Principal

P = Principal(7, "fleet", "read")


def test_an_entry_is_due_for_a_refresh_once_in_its_last_second_and_one_refresh_at_a_time(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    cache = TokenCache(5)
    cache.put("h", P)
    assert not cache.due("h")  # 5 s left
    now[0] += 4.2
    assert cache.due("h") and not cache.due("h")  # the second caller leaves it to the first
    cache.refreshed("h", P)
    assert cache.get("h") == P and not cache.due("h")  # renewed: 5 s from the refresh
    now[0] += 4.9
    assert cache.get("h") == P


def test_a_refresh_that_finds_the_token_revoked_drops_it_and_a_failed_one_lets_it_lapse(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    cache = TokenCache(5)
    cache.put("h", P)
    now[0] += 4.5
    assert cache.due("h")
    cache.refreshed("h", None)
    assert cache.get("h") is None
    cache.put("h", P)
    now[0] += 4.5
    assert cache.due("h")
    cache.refreshed("h", None, looked_up=False)  # the catalog was unavailable
    assert cache.get("h") == P
    now[0] += 0.6
    assert cache.get("h") is None  # lapsed on time, not stretched


def test_a_refresh_never_undoes_a_revocation_through_this_process(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(auth.time, "monotonic", lambda: now[0])
    cache = TokenCache(5)
    cache.put("h", P)
    now[0] += 4.5
    assert cache.due("h")
    cache.forget(P.token_id)  # revoked while the lookup ran; the lookup read it before
    cache.refreshed("h", P)
    assert cache.get("h") is None

"""The reconciler removes dashboard sessions that ended, so api_tokens does not grow with every sign-in, and leaves
live sessions, recent ones and tokens made by hand. On both catalogs."""

from __future__ import annotations

from datetime import timedelta

from storage import tokens
from storage.db import session_scope
from storage.reconcile import reconcile_once
from storage.tables import ApiTokenRow, utcnow


def test_the_reconciler_removes_ended_sessions(settings):
    with session_scope(settings) as s:
        root, _ = tokens.create_token(s, "root", ["build"])
        live, _ = tokens.create_token(s, "live", ["build"], timedelta(hours=1), parent_id=root.id)
        old_out, _ = tokens.create_token(s, "signed-out", ["build"], timedelta(hours=1), parent_id=root.id)
        fresh_out, _ = tokens.create_token(s, "just-signed-out", ["build"], timedelta(hours=1), parent_id=root.id)
        hand, _ = tokens.create_token(s, "by-hand", ["read"], timedelta(hours=1))
        s.flush()
        ids = {
            n: r.id
            for n, r in (("root", root), ("live", live), ("old_out", old_out), ("fresh_out", fresh_out), ("hand", hand))
        }
        now = utcnow()
        for name, opened in (("old_out", now - timedelta(hours=2)), ("fresh_out", now)):
            row = s.get(ApiTokenRow, ids[name])
            row.created_at, row.revoked_at = opened, now
        s.get(ApiTokenRow, ids["hand"]).revoked_at = now  # revoked by hand: listed as revoked, kept
    assert reconcile_once(settings)["sessions_removed"] == 1
    with session_scope(settings) as s:
        left = {r.id for r in s.query(ApiTokenRow).filter(ApiTokenRow.id.in_(list(ids.values())))}
    assert left == {ids["root"], ids["live"], ids["fresh_out"], ids["hand"]}

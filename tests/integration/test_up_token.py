"""`enginefarm up`'s admin token across restarts: one token while the catalog holds it active, kept beside the catalog
for its owner only; a new one once it is revoked. In process, on SQLite."""

from __future__ import annotations

import stat

from enginefarm.core.config import Settings
from server.embedded import UP_TOKEN_FILE, up_token
from storage.db import session_scope
from storage.tokens import authenticate, list_tokens, revoke_token


def test_a_restart_reuses_the_token_until_it_is_revoked(tmp_path):
    settings = Settings(data_dir=tmp_path, blob_store="local")
    first, made = up_token(settings, "enginefarm up on here")
    again, made_again = up_token(settings, "enginefarm up on here")
    assert made and not made_again and again == first
    assert stat.S_IMODE((tmp_path / UP_TOKEN_FILE).stat().st_mode) == 0o600
    with session_scope(settings) as session:
        assert len(list_tokens(session)) == 1
        revoke_token(session, authenticate(session, first).token_id)
    third, made_third = up_token(settings, "enginefarm up on here")
    assert made_third and third != first
    with session_scope(settings) as session:
        assert authenticate(session, third).scope == "admin" and len(list_tokens(session)) == 2

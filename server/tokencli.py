"""``enginefarm token create|list|revoke``: API tokens, made and revoked on the catalog database directly (run where
the farm's settings are). Registered by ``server.cli``."""

from __future__ import annotations

import typer
from rich.table import Table

from enginefarm.client.terminal import console, err, fail
from enginefarm.core.config import Settings, get_settings
from enginefarm.core.domain import SCOPES

SCOPE_HELP = f"{', '.join(SCOPES[:-1])} or {SCOPES[-1]}, each allowing the ones before it (repeatable)"


def need_catalog(settings: Settings, why: str = "", or_else: str = "") -> None:
    """One line and exit 1 where the settings name no farm's catalog (a farm run with another data folder or
    database), instead of what the database driver says on the first query."""
    from storage.db import has_catalog

    if has_catalog(settings):
        return
    where = settings.database_url and "ENGINEFARM_DATABASE_URL's database" or f"{settings.data_dir / 'catalog.db'}"
    why, or_else = (f", {why}" if why else ""), (f", {or_else}" if or_else else "")
    err.print(
        f"error: no farm's catalog at {where}{why}. Run it where the farm's settings are (ENGINEFARM_DATA_DIR or "
        f"ENGINEFARM_DATABASE_URL, as the farm printed them){or_else}.",
        highlight=False,
    )
    raise typer.Exit(1)


def token_create(
    scope: list[str] = typer.Option(..., "--scope", help=SCOPE_HELP),
    name: str = typer.Option(..., help="who or what uses it"),
    expires_days: float | None = typer.Option(None, help="valid for this many days (default: until revoked)"),
    project: str | None = typer.Option(None, help="limit it to one project's models (default: the whole farm)"),
    init: bool = typer.Option(False, "--init", help="make the catalog first if none is there yet"),
) -> None:
    """Make an API token. It is printed once, alone on stdout, and only its hash is stored."""
    from enginefarm.core.errors import EnginefarmError
    from server.embedded import prepare
    from storage.db import session_scope
    from storage.tokens import create_token, lifetime

    settings = get_settings()
    if not init:
        need_catalog(settings, "so no farm would know this token", "or pass --init to start a new catalog there")
    prepare(settings)
    try:
        expires = lifetime(expires_days)
        with session_scope(settings) as session:
            row, token = create_token(session, name, scope, expires, project)
    except EnginefarmError as exc:
        fail(exc)
    where = f" in project {row.project}" if row.project else ""
    err.print(
        f"token {row.id} '{row.name}' with scope {', '.join(row.scopes)}{where}; keep it now, it cannot be shown again:"
    )
    print(token)


def token_list() -> None:
    """Tokens with their scopes and state (never the tokens themselves)."""
    from storage.db import session_scope
    from storage.tokens import list_tokens, token_state

    settings = get_settings()
    need_catalog(settings)
    table = Table(title="API tokens")
    for col in ("id", "name", "starts with", "scopes", "project", "state", "created", "last used"):
        table.add_column(col)
    with session_scope(settings) as session:
        for r in list_tokens(session):
            table.add_row(
                str(r.id),
                r.name,
                r.prefix + "…",
                ", ".join(r.scopes),
                r.project or "(all)",
                token_state(r),
                f"{r.created_at:%Y-%m-%d %H:%M}",
                f"{r.last_used_at:%Y-%m-%d %H:%M}" if r.last_used_at else "-",
            )
    console.print(table)


def token_revoke(token_id: int) -> None:
    """Revoke a token: requests with it get 401 from now on."""
    from enginefarm.core.errors import EnginefarmError
    from storage.db import session_scope
    from storage.tokens import revoke_token

    settings = get_settings()
    need_catalog(settings)
    try:
        with session_scope(settings) as session:
            row = revoke_token(session, token_id)
    except EnginefarmError as exc:
        fail(exc)
    console.print(f"token {row.id} '{row.name}' is revoked")

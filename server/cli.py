"""The farm's own commands: run the API, a worker, the reconciler and collector, an embedded farm, the demo, and
manage tokens. They need the server extras; ``enginefarm`` registers them through the ``enginefarm.commands``
entry point, and a command whose extra is missing says which to install."""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import NoReturn

import typer
from rich.table import Table

from enginefarm.client.terminal import console, err, fail, need
from enginefarm.core.config import Settings, get_settings
from enginefarm.core.domain import SCOPES
from server.metricsdir import metrics_dir
from server.workercli import worker

app = typer.Typer()
token_app = typer.Typer(
    help="API tokens (works on the catalog database directly: run it where the farm's settings are).",
    no_args_is_help=True,
)


# The extras each command needs besides [server].
# The checkout's top-level packages, each its own import name (docs/architecture.md, "The tree").
PACKAGES = ("enginefarm", "api", "worker", "storage", "server")
NEEDS = {"worker": ("server", "worker"), "up": ("server", "worker"), "demo": ("server", "worker")}


def _needing(extras: tuple[str, ...], fn):
    @functools.wraps(fn)
    def run(*args, **kwargs):
        need(*extras)
        return fn(*args, **kwargs)

    return run


def register(root: typer.Typer) -> None:
    """Add the server commands to the ``enginefarm`` command; each first checks that its extras are installed."""
    if any(group.name == "token" for group in root.registered_groups):
        return  # already added (the entry point loaded twice in one process)
    for command in app.registered_commands + token_app.registered_commands:
        assert command.callback is not None  # each is registered by decorating its function
        name = command.name or command.callback.__name__
        command.callback = _needing(NEEDS.get(name, ("server",)), command.callback)
    root.add_typer(token_app, name="token")
    root.registered_commands.extend(app.registered_commands)


# ------------------------------------------------------------------------------ tokens


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


@token_app.command("create")
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


@token_app.command("list")
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


@token_app.command("revoke")
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


# ------------------------------------------------------------------------------ services


@app.command()
def api(
    host: str = typer.Option("127.0.0.1", help="address to listen on"),
    port: int = typer.Option(8321, help="port to listen on"),
    workers: int = typer.Option(1, help="uvicorn worker processes"),
    log_level: str = typer.Option("info", "--log-level", help="uvicorn's: debug, info, warning or error"),
) -> None:
    """Run the REST API (OpenAPI at /docs): uvicorn, its connections with TCP_NODELAY (no 40 ms Nagle waits
    under several workers). /metrics sums its worker processes (prometheus-client's multiprocess mode)."""
    from server.serve import serve_api

    metrics_dir(get_settings().data_dir / "metrics" / f"api-{port}")
    serve_api(host, port, workers, log_level)


app.command()(worker)


@app.command()
def reconcile(
    loop: bool = typer.Option(
        False,
        "--loop",
        help="run as the farm's background service: reconcile "
        "every ENGINEFARM_RECONCILE_SECONDS and sweep blobs "
        "every ENGINEFARM_GC_INTERVAL_SECONDS",
    ),
) -> None:
    """Requeue tasks of workers that died and republish queued tasks whose broker message was lost. With --loop,
    the farm's background service: it works while it holds the farm's job lock, so any number of them (and of
    API processes, which run the same loop unless ENGINEFARM_RECONCILE_SECONDS=0) do the work once."""
    from storage.reconcile import Reconciler, reconcile_once

    settings = get_settings()
    if not loop:
        counts = reconcile_once(settings)
        console.print(
            f"requeued {counts['requeued']} task(s) of dead workers, republished {counts['republished']} "
            f"lost message(s)"
        )
        return
    if settings.reconcile_seconds <= 0:
        err.print("error: ENGINEFARM_RECONCILE_SECONDS is 0 here; give the service an interval, e.g. 15")
        raise typer.Exit(2)
    # Ctrl-C and SIGTERM are taken by sigtimedwait below, never raised as KeyboardInterrupt (``stop_on_sigterm`` in
    # server/embedded.py says why); the service's thread inherits the mask.
    stops = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stops)
    console.print(
        f"reconciling every {settings.reconcile_seconds:g} s and sweeping blobs every "
        f"{settings.gc_interval_seconds:g} s while this process holds the farm's job lock; Ctrl-C stops",
        highlight=False,
    )
    service = Reconciler(settings).start()
    try:
        while service.running():
            if signal.sigtimedwait(stops, 1.0) is not None:
                return
        err.print("error: the reconciler stopped by itself (its error is above)")
        raise typer.Exit(1)
    finally:
        service.stop()


@app.command()
def gc(
    grace_hours: float | None = typer.Option(
        None, help="keep unreferenced blobs younger than this (default ENGINEFARM_GC_GRACE_SECONDS, 24 h)"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="report what would go, delete nothing"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    allow_empty_catalog: bool = typer.Option(False, help="sweep even though no row references any blob"),
) -> None:
    """Delete blobs that no catalog row references, once older than the grace period (the API's background
    sweep does the same every ENGINEFARM_GC_INTERVAL_SECONDS). A referenced blob is never deleted."""
    from storage.gc import collect_garbage

    settings = get_settings()
    need_catalog(settings)
    grace = grace_hours * 3600 if grace_hours is not None else settings.gc_grace_seconds
    try:
        report = collect_garbage(
            settings, grace_seconds=grace, dry_run=dry_run, allow_empty_catalog=allow_empty_catalog
        )
    except Exception as exc:  # noqa: BLE001 - GcRefused, or the store or catalog unreachable
        fail(exc)
    if as_json:
        print(json.dumps(report.to_dict(), default=str))
    else:
        console.print(report.summary(), highlight=False)
    if report.errors:
        raise typer.Exit(1)


@app.command()
def migrate() -> None:
    """Create or upgrade the catalog's tables (the API also does this at start)."""
    from server.embedded import prepare

    prepare(get_settings())
    console.print("catalog is at the newest revision")


# ------------------------------------------------------------------------------ a farm that does not start


def farm_failed(exc: Exception, command: str) -> NoReturn:
    """End ``enginefarm COMMAND`` with why its farm did not start (``embedded.FarmError``, or a module of the
    package that would not import): one message, what to do where it is known, exit 1."""
    from rich.markup import escape

    text = str(exc)
    if isinstance(exc, ModuleNotFoundError):
        text = f"the farm's code would not import: {exc}"
    err.print(f"[red]error:[/red] enginefarm {command}: {escape(text)}", highlight=False, soft_wrap=True)
    raise typer.Exit(1)


def not_importable(exc: ModuleNotFoundError, command: str) -> NoReturn:
    """A module of this package that would not import (not a missing extra, which ``need`` reports first) ends the
    command as ``farm_failed`` does; any other missing module is raised again."""
    if (exc.name or "").split(".")[0] not in PACKAGES:
        raise exc
    farm_failed(exc, command)


@app.command()
def up(
    port: int = typer.Option(8321, help="the API's port"),
    workers: int = typer.Option(1, help="worker processes"),
    data_dir: Path | None = typer.Option(
        None,
        "--data-dir",
        envvar="ENGINEFARM_DATA_DIR",
        help="where the farm keeps its catalog and blobs (default ~/.enginefarm)",
    ),
) -> None:
    """Run an all-in-one farm (API + workers) with no external services, until Ctrl-C. A worker or API process
    that dies is started again; when this command ends, however it ends, they end with it. A process that fails
    while the farm starts ends the command with that process's own error, from its log."""
    import logging

    from server.demoserve import cli_exports
    from server.port import HOST, free_port_after, port_in_use

    if port and port_in_use(port, HOST):  # before anything is made; 2, as `make demo` and demo --serve exit
        other = free_port_after(port, HOST)
        instead = f"choose another, e.g. enginefarm up --port {other}" if other else "choose another with --port"
        err.print(f"[red]error:[/red] enginefarm up: port {port} on {HOST} is in use; {instead}", highlight=False)
        raise typer.Exit(2)
    try:
        from server.embedded import Farm, up_token
        from server.starterrors import FarmError
    except ModuleNotFoundError as exc:
        not_importable(exc, "up")

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    if data_dir is not None:  # the API and the workers read it from the environment they inherit
        os.environ["ENGINEFARM_DATA_DIR"] = str(data_dir.resolve())
        get_settings.cache_clear()
    settings = get_settings()
    metrics_dir(settings.data_dir / "metrics")  # one folder: the API's /metrics counts the workers' builds too
    try:
        token, new = up_token(settings, f"enginefarm up on {socket.gethostname()}")
        # Short enough that the workers and the API are stopped before a service manager's SIGKILL comes.
        farm = Farm(
            {},
            port=port,
            log_dir=settings.data_dir,
            token=token,
            stop_timeout=8,
            log_max_bytes=int(settings.log_max_mb * 2**20),
        )

        def announce() -> None:
            console.print(
                f"enginefarm is up at {farm.url} (the dashboard: {farm.url}/ui, the API's docs: {farm.url}/docs); "
                f"data in {settings.data_dir}. Ctrl-C stops it. "
                f"{'An admin API token was made for you' if new else 'Its admin API token, as at its last start'}; "
                f"in another shell:",
                highlight=False,
            )
            print(cli_exports(farm.url, token, settings.data_dir), flush=True)

        farm.serve({f"embedded-{i}": 1 for i in range(workers)}, announce)
    except KeyboardInterrupt:  # before the farm was serving
        pass
    except FarmError as exc:  # the farm's processes are stopped by now
        farm_failed(exc, "up")


# ------------------------------------------------------------------------------ client commands


@app.command()
def demo(
    data_dir: Path | None = typer.Option(None, help="where the demo farm keeps its data (default: a new temp dir)"),
    serve: bool = typer.Option(
        False,
        "--serve",
        help="after the demo, keep its farm running and print the dashboard's address and a token to sign in with",
    ),
    port: int = typer.Option(8321, help="with --serve: the API's port"),
) -> None:
    """Start an embedded farm, build a small model for 5 targets, print the catalog, fetch the sm86 engine; with
    --serve, then serve the dashboard (/ui) on that farm until Ctrl-C."""
    try:
        from server.demo import run_demo
        from server.demoserve import serve_demo
        from server.embedded import stop_on_sigterm
        from server.starterrors import FarmError
    except ModuleNotFoundError as exc:
        not_importable(exc, "demo")
    try:
        if serve:
            code = serve_demo(data_dir, console, port)
        else:
            with stop_on_sigterm():
                code = run_demo(data_dir, console)
    except FarmError as exc:
        farm_failed(exc, "demo")
    sys.exit(code)
